"""strategy.hp_replay: after each experience past the first, N exemplars trained on at 8-bit operands and 16-bit
accumulators (the old model too), then training goes on at the scheme's own precision."""
import json
import pickle
import random
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from test_cifar import write_torchvision_cifar
from hdqt_cil.config import comparable_config
from hdqt_cil.experiment import run
from hdqt_cil.graph_replay import CapturedInference
from hdqt_cil.models import build_model
from hdqt_cil.quant import preset, quantize_model
from hdqt_cil.quant.layers import QuantLayer
from hdqt_cil.trainer.cuda_graphs import CudaGraphPlugin
from hdqt_cil.trainer.hp_replay import HigherPrecisionReplay, higher_precision_scheme, spread_over_classes
from hdqt_cil.trainer.monitor import Diverged

BASE = ("quant=hdqt", "trainer.epochs=2", "trainer.device=cpu", "benchmark.n_experiences=null",
        "benchmark.classes_per_exp=4", "trainer.memory_size=60")


@pytest.mark.parametrize("seed", range(5))
def test_the_exemplars_are_spread_evenly_over_the_classes_first_in_order(seed):
    rng = random.Random(seed)
    targets = [rng.randrange(rng.randint(1, 6)) for _ in range(rng.randint(1, 80))]
    size = rng.randint(1, 60)
    picked = spread_over_classes(targets, size)
    per_class = max(1, size // len(set(targets)))
    counts = Counter(targets)
    assert picked == sorted(picked)
    assert Counter(targets[i] for i in picked) == {c: min(n, per_class) for c, n in counts.items()}
    for c in counts:  # the first of each class
        of_class = [i for i, t in enumerate(targets) if t == c]
        assert [i for i in picked if targets[i] == c] == of_class[: min(len(of_class), per_class)]


def _bits(model) -> tuple:
    layer = next(m for m in model.modules() if isinstance(m, QuantLayer))
    return layer.scheme.forward.left.bits, layer.scheme.forward.acc_bits


def test_the_phase_trains_the_exemplars_at_higher_precision_uncounted(make_cfg, tmp_path, monkeypatch):
    seen = []
    original = HigherPrecisionReplay.after_training_iteration

    def spy(self, strategy, **kwargs):
        teacher = next(getattr(p, "old_model") for p in strategy.plugins if hasattr(p, "old_model"))
        seen.append((self._losses is not None, strategy.clock.train_exp_counter, len(strategy.mb_y),
                     _bits(strategy.model), None if teacher is None else _bits(teacher)))
        original(self, strategy, **kwargs)

    monkeypatch.setattr(HigherPrecisionReplay, "after_training_iteration", spy)
    replayed = run(make_cfg("strategy=icarl", *BASE, "strategy.hp_replay=20"), tmp_path / "hp")
    monkeypatch.undo()
    plain = run(make_cfg("strategy=icarl", *BASE), tmp_path / "plain")

    phase = [s for s in seen if s[0]]
    # experiences 2 and 3 (of 4, 4, 2 classes), 2 epochs each, one batch: 5 of each of the memory's 4 classes, then
    # 2 of each of its 8
    assert [(k, n) for _, k, n, _, _ in phase] == [(1, 20), (1, 20), (2, 16), (2, 16)]
    assert {(model, teacher) for *_, model, teacher in phase} == {((8, 16), (8, 16))}
    assert {model for inside, *_, model, _ in seen if not inside} == {(4, 8)}  # back to the scheme's own
    assert [e["steps"] for e in replayed["cost"]["experiences"]] == [e["steps"] for e in plain["cost"]["experiences"]]
    assert replayed["acc_matrix"][0] == plain["acc_matrix"][0]  # nothing changes before the first phase
    assert replayed["acc_matrix"][1:] != plain["acc_matrix"][1:]
    records = (tmp_path / "hp").rglob("hp_replay.json")
    assert len(list(records)) == 1


def test_the_phase_raises_an_old_model_that_cuda_graphs_hold():
    """While an experience trains under CUDA graphs the old model is its graphs' wrapper; the phase sets the graphs
    aside first, so the old model itself runs at the higher precision, and hands the wrapper back after."""
    model = quantize_model(build_model("mlp", (8,), 4), preset("hdqt"))
    old = SimpleNamespace(old_model=quantize_model(build_model("mlp", (8,), 4), preset("hdqt")))
    graphs = CudaGraphPlugin(("old_model",))
    phase = HigherPrecisionReplay(4, 1, higher_precision_scheme({"name": "hdqt"}, 8, 16), 8, 16, ("old_model",))
    strategy = SimpleNamespace(model=model, forward=lambda: None, plugins=[graphs, old, phase], is_training=True,
                               dataloader="the experience's")
    graphs.before_training_exp(strategy)
    wrapped = old.old_model
    assert isinstance(wrapped, CapturedInference)
    with phase._phase(strategy, "exemplars"):
        assert strategy.dataloader == "exemplars" and graphs.captured is None
        assert _bits(old.old_model) == _bits(model) == (8, 16)
    assert old.old_model is wrapped and _bits(wrapped.module) == _bits(model) == (4, 8)
    assert strategy.dataloader == "the experience's"


@pytest.mark.parametrize("quant, acc_bits, precision", [
    ("hdqt", 16, "8-bit operands and 16-bit accumulators"), ("int4", None, "8-bit operands and float accumulators"),
    ("fp32", 16, "fp32's own float precision")])
def test_the_phase_states_the_precision_it_runs_at(quant, acc_bits, precision):
    """A float run's phase is the same replay in float: its log line must not name the bits it does not use."""
    scheme = higher_precision_scheme({"name": quant}, 8, acc_bits)
    assert HigherPrecisionReplay(20, 2, scheme, 8, acc_bits).precision == precision


@pytest.mark.parametrize("overrides, message", [
    (("strategy=lwf", "strategy.hp_replay=20"), r"strategy=lwf keeps no exemplar memory"),
    (("strategy=icarl", "quant=hot", "strategy.hp_replay=20"), r"quant=hot has no bits and acc_bits to raise"),
    (("strategy=icarl", "strategy.hp_replay=20", "strategy.hp_replay_acc_bits=4"),
     r"strategy.hp_replay_acc_bits=4 is narrower than strategy.hp_replay_bits=8"),
    (("strategy=icarl", "strategy.hp_replay=0"), r"strategy.hp_replay=0"),
    (("strategy=icarl", "quant=luq", "strategy.hp_replay=20"),
     r"strategy.hp_replay_bits=8, hp_replay_acc_bits=16 under quant=luq: bits=8 is out of range; a log2 grid "
     r"allows 2..5 bits"),
])
def test_impossible_replays_are_refused_naming_the_setting(make_cfg, tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        run(make_cfg(*BASE[1:], *overrides), tmp_path / "run")
    assert not list((tmp_path / "run").rglob("config.yaml"))  # nothing left behind


def test_the_replay_settings_count_only_when_it_is_on():
    off = {"strategy": {"name": "icarl", "hp_replay": None, "hp_replay_epochs": 2}}
    older = {"strategy": {"name": "icarl"}}
    assert comparable_config(off) == comparable_config(older)
    on = {"strategy": {"name": "icarl", "hp_replay": 20, "hp_replay_epochs": 2}}
    assert comparable_config(on)["strategy"]["hp_replay_epochs"] == 2
    # the authors' BatchNorm mode is the replay's as it ran before the setting existed; eval is another run
    as_before = {"strategy": {**on["strategy"], "hp_replay_bn": "train"}}
    assert comparable_config(as_before) == comparable_config(on)
    assert comparable_config({"strategy": {**on["strategy"], "hp_replay_bn": "eval"}}) != comparable_config(on)


@pytest.mark.parametrize("bn", ["train", "eval"])
def test_the_phase_trains_batchnorm_or_keeps_its_running_statistics(make_cfg, tmp_path, monkeypatch, bn):
    """strategy.hp_replay_bn=train (the authors'): the phase's batches move BatchNorm's running statistics; eval:
    the layers normalise by them and leave them as training left them. Either way they train again after it."""
    write_torchvision_cifar(tmp_path / "data", "cifar10", per_class_train=4, per_class_test=2)
    kept, modes, after = [], [], []
    phase, iteration = HigherPrecisionReplay.after_training_epoch, HigherPrecisionReplay.after_training_iteration

    def norms(strategy):
        return [m for m in strategy.model.modules() if isinstance(m, nn.BatchNorm2d)]

    def spy_phase(self, strategy, **kwargs):
        before, count = [m.running_var.clone() for m in norms(strategy)], len(self.phases)
        phase(self, strategy, **kwargs)
        if len(self.phases) > count:
            kept.append([torch.equal(b, m.running_var) for b, m in zip(before, norms(strategy))])
            after.append({m.training for m in norms(strategy)})

    def spy_iteration(self, strategy, **kwargs):
        if self._losses is not None:
            modes.append({m.training for m in norms(strategy)})
        iteration(self, strategy, **kwargs)

    monkeypatch.setattr(HigherPrecisionReplay, "after_training_epoch", spy_phase)
    monkeypatch.setattr(HigherPrecisionReplay, "after_training_iteration", spy_iteration)
    run(make_cfg("benchmark=cifar10", "model=resnet32", "strategy=icarl", "benchmark.verify=false",
                 "benchmark.n_experiences=2", "trainer.epochs=1", "trainer.batch_size=8", "trainer.memory_size=20",
                 "trainer.device=cpu", "strategy.hp_replay=10", f"strategy.hp_replay_bn={bn}"), tmp_path / "run")
    assert len(kept) == 1 and len(kept[0]) == 31  # experience 2; ResNet-32's BatchNorm layers
    assert {k for layers in kept for k in layers} == {bn == "eval"}
    assert modes and all(m == {bn == "train"} for m in modes)
    assert after == [{True}]


def test_a_checkpoint_written_before_the_batchnorm_setting_resumes_the_authors_phase():
    """A plugin pickled without `bn` (an earlier version's checkpoint) replays with BatchNorm in train mode; one
    pickled with it keeps its own."""
    for bn in ("train", "eval"):
        plugin = HigherPrecisionReplay(20, 2, preset("hdqt"), 8, 16, bn=bn)
        assert pickle.loads(pickle.dumps(plugin)).bn == bn
    del plugin.__dict__["bn"]  # as an earlier version pickled it
    restored = pickle.loads(pickle.dumps(plugin))
    assert restored.bn == "train" and restored.size == 20


def test_a_phase_that_diverges_stops_the_run_as_diverged_naming_the_phase(make_cfg, tmp_path, monkeypatch):
    """A NaN loss in the phase stops the run there, before the experience's accuracy and checkpoint are taken from
    its weights, rather than being blamed on the next experience's first epoch."""
    original = HigherPrecisionReplay.after_training_iteration

    def nan_loss(self, strategy, **kwargs):
        if self._losses is not None:
            strategy.loss = strategy.loss * float("nan")
        original(self, strategy, **kwargs)

    monkeypatch.setattr(HigherPrecisionReplay, "after_training_iteration", nan_loss)
    with pytest.raises(Diverged, match=r"diverged in the higher-precision replay after experience 2, its epoch 1: "
                                       r"non-finite loss"):
        run(make_cfg("strategy=icarl", *BASE[1:], "strategy.hp_replay=20"), tmp_path / "run")
    summary = json.loads(next((tmp_path / "run").rglob("summary.json")).read_text())
    assert summary["status"] == "diverged"
    assert {k: summary["error"][k] for k in ("experience", "epoch", "phase")} == {
        "experience": 1, "epoch": 1, "phase": "the higher-precision replay"}
    assert len(summary["acc_matrix"]) == 1  # only the experience before the phase
