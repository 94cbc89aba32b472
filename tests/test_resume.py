"""Runs that survive: a real process killed with SIGKILL mid-experience resumes to the identical result."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import start_run
from hdqt_cil.experiment import run

ROOT = Path(__file__).resolve().parents[1]


def _args(results_root, *overrides):
    return [f"results_root={results_root}", "logging.progress=off", "trainer.device=cpu", *overrides]


def _cmd(results_root, *overrides):
    return [sys.executable, "run.py", *_args(results_root, *overrides)]


def _summary(results_root, strategy, quant="fp32"):
    return json.loads((results_root / f"digits-mlp/{strategy}/{quant}/seed0/summary.json").read_text())


def _kill_and_resume(tmp_path, make_cfg, strategy, quant, overrides, killable, log_says):
    """An uninterrupted run (in this process, on one thread as the command's are), then the same run in a process
    of its own (conftest.start_run: no command's imports to wait for), SIGKILLed once `killable()` sees its folder
    ready, and resumed by the command: the two accuracy matrices, losses and operation counts must be equal.
    Returns the resumed run's output."""
    cfg = make_cfg("trainer.device=cpu", *overrides)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        want = run(cfg, tmp_path / "ref")
    finally:
        torch.set_num_threads(threads)

    killed = tmp_path / "killed"
    run_dir = killed / f"digits-mlp/{strategy}/{quant}/seed0"
    proc = start_run(cfg, run_dir)
    deadline = time.time() + 300
    while not killable(run_dir / "checkpoints") and time.time() < deadline:
        time.sleep(0.005)  # a digits epoch takes tens of milliseconds: see the checkpoint before the run moves on
    assert proc.is_alive(), "the run finished before it could be killed"
    time.sleep(0.01)  # inside the next epoch; what is left of the run takes several times longer
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert proc.exitcode == -signal.SIGKILL

    resumed = subprocess.run(_cmd(killed, *overrides), cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert log_says in resumed.stderr + resumed.stdout
    got = _summary(killed, strategy, quant)
    assert got["status"] == "complete"
    np.testing.assert_array_equal(np.array(got["acc_matrix"], float), np.array(want["acc_matrix"], float))
    np.testing.assert_array_equal(np.array(got["class_acc"], float), np.array(want["class_acc"], float))
    assert got["train_loss"] == want["train_loss"]
    assert got["cost"]["experiences"] == want["cost"]["experiences"]  # every operation counted once
    assert got.get("diagnostics") == want.get("diagnostics")  # every diagnosed batch once
    return resumed.stderr + resumed.stdout


def _overrides(strategy, quant, *more):
    """Three experiences of digits (4, 4 and 2 classes; the killed one is the last or the one before it), 8 epochs
    each."""
    return [f"strategy={strategy}", f"quant={quant}", "benchmark.n_experiences=null", "benchmark.classes_per_exp=4",
            "trainer.epochs=8",
            "trainer.milestones=[6]",
            *(["strategy.stage_2_epochs=3"] if strategy == "bic" else []), *more]


@pytest.mark.parametrize("strategy,quant", [("bic", "hdqt")])
def test_sigkill_mid_experience_then_resume_matches_uninterrupted(tmp_path, make_cfg, strategy, quant):
    """From the last experience boundary: stochastic rounding draws from per-layer step counters, which must
    resume exactly too (HOT's LQS buffers and FP32: the epoch-checkpoint cases below)."""
    def in_experience_2(checkpoints):
        latest = checkpoints / "latest"
        return latest.exists() and latest.read_text().strip() == "exp002"

    _kill_and_resume(tmp_path, make_cfg, strategy, quant,
                     _overrides(strategy, quant, "diagnostics=light", "diagnostics.every=9"), in_experience_2,
                     "after experience 2")


# SI in FP32: on digits at lr 0.05 HDQT fine-tuning's loss already climbs to the hundreds in its second experience,
# and SI's penalty (strategies/si.py) tips it past the divergence check.
@pytest.mark.parametrize("strategy,quant,experience", [("icarl", "fp32", 2), ("lwf", "hot", 1), ("si", "fp32", 1),
                                                     ("der", "fp32", 2), ("er_ace", "fp32", 2), ("agem", "fp32", 2),
                                                     ("dyn_der", "hdqt", 2), ("memo", "fp32", 1)])
def test_sigkill_after_an_epoch_checkpoint_resumes_from_that_epoch(tmp_path, make_cfg, strategy, quant, experience):
    """trainer.checkpoint_every=2: the resumed run restarts at epoch 4 of the experience (the first one has no
    boundary checkpoint before it), before its learning rate drops at epoch 6, and still ends as the uninterrupted
    run (DER++, ER-ACE and A-GEM: with their memory batches drawn on from where they were,
    strategies/resumable_replay.py; dyn_der and memo: into a model expanded again before the epoch's weights are
    laid over it)."""
    diagnosed = ["diagnostics=light", "diagnostics.every=9"] if strategy == "dyn_der" else []
    output = _kill_and_resume(tmp_path, make_cfg, strategy, quant,
                              _overrides(strategy, quant, "trainer.checkpoint_every=2", *diagnosed),
                              _past_epoch_4(experience), f"after experience {experience}, epoch")
    # progress lines count each epoch of the experience's 8, the resumed one's too
    assert set(re.findall(r"epoch \d+/(\d+): mean training loss", output)) == {"8"}


def test_a_resumed_experience_replays_at_higher_precision_once_after_its_last_epoch(tmp_path, make_cfg):
    """strategy.hp_replay's phase follows the last of the experience's 8 epochs, in a run resumed at its epoch 4 too
    (which trains the 4 left): once, with the uninterrupted run's loss."""
    overrides = _overrides("icarl", "hdqt", "trainer.checkpoint_every=2", "strategy.hp_replay=20",
                           "trainer.memory_size=60")
    _kill_and_resume(tmp_path, make_cfg, "icarl", "hdqt", overrides, _past_epoch_4(2), "after experience 2, epoch")
    phases = [json.loads(next((tmp_path / name).rglob("hp_replay.json")).read_text()) for name in ("ref", "killed")]
    assert [p["experience"] for p in phases[1]] == [1, 2]
    assert phases[1] == phases[0]


def _past_epoch_4(experience):
    """Whether the run's checkpoints hold one of `experience` after its epoch 4."""
    def ready(checkpoints):
        return any(int(p.name.rsplit("epoch", 1)[1]) >= 4 for p in checkpoints.glob(f"exp{experience:03d}_epoch*"))
    return ready


def test_divergence_is_recorded_and_optionally_lets_a_sweep_go_on(tmp_path, run_in_process):
    """The stopped run through a real command (the error escapes to Hydra's report); the one that goes on, a run
    that ends as any other, in this process."""
    bad = ["strategy=naive", "quant=fp32", "trainer.epochs=2", "trainer.lr=1e30"]
    stopped = subprocess.run(_cmd(tmp_path / "a", *bad), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert stopped.returncode != 0
    summary = _summary(tmp_path / "a", "naive")
    assert summary["status"] == "diverged"
    assert summary["error"]["experience"] == 0 and summary["error"]["epoch"] == 1
    assert "non-finite" in summary["error"]["message"]
    assert "training diverged in experience 1, epoch 1" in stopped.stderr  # as the progress lines count

    going_on = run_in_process(*_args(tmp_path / "b", *bad, "on_divergence=continue"))
    assert going_on.returncode == 0, going_on.stderr
    assert "| digits | class | mlp | naive | fp32 | 2 | diverged | diverged |" in going_on.stdout
