"""A checkpoint moves between devices: a run saved on one GPU of a machine resumes on another GPU of another machine
(fewer GPUs included) or on the CPU, with its tensors on the new device and its own generators' states."""
import random

import numpy as np
import pytest
import torch

from hdqt_cil.trainer import checkpoint


def _saved_as_if_on(location, monkeypatch, obj, path):
    """torch.save `obj` to `path` with every storage tagged as living on `location` (e.g. cuda:3)."""
    with monkeypatch.context() as patch:
        patch.setattr(torch.serialization, "location_tag", lambda storage: location)
        torch.save(obj, path)


def test_an_epoch_checkpoint_written_on_gpu3_resumes_on_the_cpu(tmp_path, monkeypatch):
    folder = tmp_path / "exp001_epoch0003"
    folder.mkdir()
    weights = torch.randn(4, 3)
    _saved_as_if_on("cuda:3", monkeypatch, {"clock": {"train_exp_epochs": 3}, "model": {"w": weights}},
                    folder / "state.pt")
    with pytest.raises(RuntimeError, match="CUDA"):  # what torch.load does without the mapping
        torch.load(folder / "state.pt", weights_only=False)

    epochs = checkpoint.EpochCheckpoints(tmp_path, every=3)
    assert epochs.arm(1, "cpu") == 3
    assert epochs.pending["model"]["w"].device.type == "cpu"
    assert torch.equal(epochs.pending["model"]["w"], weights)
    assert epochs.arm(2, "cpu") == 0 and epochs.pending is None  # no checkpoint of that experience


def test_cpu_storages_stay_on_the_cpu(tmp_path):
    state = torch.get_rng_state()  # the generators' states must stay CPU tensors wherever the run resumes
    torch.save({"rng": state}, tmp_path / "progress.pt")
    loaded = torch.load(tmp_path / "progress.pt", weights_only=False, map_location=checkpoint.onto("cuda:1"))
    assert loaded["rng"].device.type == "cpu" and torch.equal(loaded["rng"], state)


def _draws():
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_restored_generators_repeat_the_same_draws():
    saved = checkpoint._rng_states()
    first = _draws()
    _draws()
    checkpoint._restore_rng_states(saved)
    assert _draws() == first


class _FakeCuda:
    """torch.cuda on a machine with `count` GPUs, the current one `current`: generator states by device index."""

    def __init__(self, count, current):
        self.count, self.current = count, current
        self.states = {i: torch.tensor([i], dtype=torch.uint8) for i in range(count)}

    def install(self, monkeypatch):
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(cuda, "get_rng_state", self.get)
        monkeypatch.setattr(cuda, "set_rng_state", self.set)

    def get(self, device="cuda"):
        return self.states[self._index(device)].clone()

    def set(self, state, device="cuda"):
        self.states[self._index(device)] = state.clone()

    def _index(self, device):
        index = self.current if device == "cuda" else torch.device(device).index
        if index >= self.count:
            raise IndexError(f"no GPU {index} of {self.count}")
        return index


def test_a_run_saved_on_gpu3_of_four_resumes_on_gpu1_of_two_with_its_generator(monkeypatch):
    writer = _FakeCuda(count=4, current=3)
    writer.states[3] = torch.tensor([42], dtype=torch.uint8)  # the run's generator, advanced by its training
    writer.install(monkeypatch)
    saved = checkpoint._rng_states()

    reader = _FakeCuda(count=2, current=1)
    reader.install(monkeypatch)
    checkpoint._restore_rng_states(saved)
    assert reader.states[1].tolist() == [42]
    assert reader.states[0].tolist() == [0]  # another run's GPU is left alone


@pytest.mark.parametrize("current, expected", [(1, [11]), (0, [10])])
def test_a_checkpoint_holding_every_gpus_state_restores_this_devices_index(monkeypatch, current, expected):
    states = [torch.tensor([10 + i], dtype=torch.uint8) for i in range(4)]  # written on a machine with four GPUs
    reader = _FakeCuda(count=2, current=current)
    reader.install(monkeypatch)
    checkpoint._restore_rng_states({**checkpoint._rng_states(), "cuda": states})
    assert reader.states[current].tolist() == expected


def test_a_cpu_checkpoint_leaves_the_gpu_generators_alone(monkeypatch):
    saved = checkpoint._rng_states()  # no CUDA here: nothing of it saved
    assert saved["cuda"] is None
    reader = _FakeCuda(count=2, current=0)
    reader.install(monkeypatch)
    checkpoint._restore_rng_states(saved)
    assert [s.tolist() for s in reader.states.values()] == [[0], [1]]


def test_a_checkpoint_naming_a_class_the_code_no_longer_has_is_refused_with_the_way_out(tmp_path):
    """A mended strategy may rename its plugin (SI's CheckpointableSIPlugin became SIPlugin): resuming a checkpoint
    written before says so and how to start over, instead of unpickling's bare AttributeError."""
    import dill

    from hdqt_cil.strategies import si
    from hdqt_cil.trainer.checkpoint import ExperienceCheckpoints

    gone = type("CheckpointableSIPlugin", (), {"__module__": si.__name__})
    si.CheckpointableSIPlugin = gone
    try:
        folder = tmp_path / "checkpoints" / "exp001"
        folder.mkdir(parents=True)
        torch.save({"strategy": gone(), "exp_counter": 1}, folder / "strategy.pkl", pickle_module=dill)
    finally:
        del si.CheckpointableSIPlugin
    (tmp_path / "checkpoints" / "latest").write_text("exp001\n")
    with pytest.raises(RuntimeError, match="CheckpointableSIPlugin.*resume=false starts the run over"):
        ExperienceCheckpoints(tmp_path).load(object(), torch.device("cpu"))
