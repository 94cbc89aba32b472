"""logging.wandb=true: a run's metrics and config reach Weights & Biases, offline, without a network."""
import struct
import time

import dill
import pytest

from hdqt_cil.experiment import run

wandb_pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")


def wandb_records(path):
    """The protobuf records of an offline run's .wandb file (a 7-byte header, then LevelDB log blocks of 32 KiB:
    each chunk a 4-byte checksum, 2-byte length and 1-byte type; types 1 full, 2 first, 3 middle, 4 last)."""
    data, pos, chunks = path.read_bytes(), 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_pb.Record()
            record.ParseFromString(chunks)
            yield record
            chunks = b""


def test_an_offline_run_logs_its_metrics_and_config(make_cfg, tmp_path):
    summary = run(make_cfg("strategy=naive", "trainer.epochs=2", "trainer.device=cpu", "logging.wandb=true"),
                  tmp_path / "run")
    assert summary["status"] == "complete"
    (path,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 60
    while True:  # wandb's service process may still be writing the file: complete once it holds the exit record
        records = list(wandb_records(path))
        kinds = {record.WhichOneof("record_type") for record in records}
        if "exit" in kinds or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    history = {item.key or "/".join(item.nested_key)
               for r in records if r.HasField("history") for item in r.history.item}
    started = next((r.run for r in records if r.HasField("run")), None)
    assert started is not None, sorted(kinds)
    assert started.project == "hdqt-cil" and started.display_name == "digits-mlp/naive/fp32/seed0"
    assert any(u.key == "strategy" and '"naive"' in u.value_json for u in started.config.update)
    assert {"Top1_Acc_Epoch/train_phase/train_stream/Task000", "Loss_Epoch/train_phase/train_stream/Task000",
            "Top1_Acc_Exp/eval_phase/test_stream/Task000/Exp004"} <= history


def test_a_restored_logger_continues_the_same_wandb_run(tmp_path):
    """A checkpoint holds the logger (the strategy is pickled with dill): restored, it resumes its run's id once
    training starts again; a logger whose run never trained opens no W&B run."""
    from hdqt_cil.trainer.wandb_logger import ScalarWandBLogger

    logger = ScalarWandBLogger("hdqt-cil", "a/run", str(tmp_path), {"seed": 0}, "offline")
    assert not logger.started and not (tmp_path / "wandb").exists()
    logger.before_training(None)
    run_id = logger.init_kwargs["id"]
    assert logger.wandb.run.id == run_id
    restored = dill.loads(dill.dumps(logger))
    logger.finish()
    assert not restored.started and restored.init_kwargs["resume"] == "allow"
    restored.before_training(None)
    assert restored.wandb.run.id == run_id
    restored.finish()
