"""Every strategy trains on a real (small) benchmark on the CPU and yields well-formed results."""
import errno
import json
import logging
import os
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from hdqt_cil import experiment
from hdqt_cil.trainer.cuda_graphs import CudaGraphPlugin
from hdqt_cil.experiment import run
from hdqt_cil.graph_replay import CapturedInference
from hdqt_cil.quant.schemes import SCHEMES, preset
from hdqt_cil import run_folder
from hdqt_cil.run_folder import RunFolder, RunInUse

STRATEGIES = ["naive", "lwf", "icarl", "bic", "joint", "replay", "der", "er_ace", "gdumb", "agem", "ewc", "si",
              "dyn_der"]
VARIANTS = {"bic": ["strategy.stage_2_epochs=2"], "icarl-bce": ["strategy.loss=bce", "strategy.eval_head=nme"],
            "bic-seen": ["strategy.stage_2_epochs=2", "strategy.ce_classes=seen"]}


@pytest.mark.parametrize("quant", ["fp32", "hdqt"])
@pytest.mark.parametrize("variant", [*STRATEGIES, "icarl-bce", "bic-seen"])
def test_strategy_runs_one_epoch_on_digits(make_cfg, tmp_path, variant, quant):
    strategy = variant.split("-")[0]
    cfg = make_cfg(f"strategy={strategy}", f"quant={quant}", "trainer.epochs=1", "trainer.device=cpu",
                   *VARIANTS.get(variant, []))
    summary = run(cfg, tmp_path / "run")
    steps = 1 if strategy == "joint" else 5
    acc = np.array(summary["acc_matrix"], dtype=float)
    assert acc.shape == (steps, 5)
    assert summary["status"] == "complete" and summary["steps_done"] == steps
    # Only seen experiences are evaluated: the upper triangle stays empty (joint has seen all).
    if strategy != "joint":
        assert np.isnan(acc[np.triu_indices(5, k=1)]).all()
        assert not np.isnan(acc[np.tril_indices(5)]).any()
    assert 0 <= summary["metrics"]["last_acc"] <= 100
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk["acc_matrix"] == summary["acc_matrix"]
    assert (tmp_path / "run" / "accuracy_matrix.csv").read_text().startswith("after_exp,exp0")


def test_finished_run_is_reused_and_different_config_refused(make_cfg, tmp_path):
    run_dir = tmp_path / "run"
    first = run(make_cfg("strategy=naive", "trainer.epochs=1"), run_dir)
    again = run(make_cfg("strategy=naive", "trainer.epochs=1", "logging.progress=on"), run_dir)
    assert again == first
    with pytest.raises(FileExistsError, match=r"different config \(trainer.epochs: 1 -> 2\).*tag="):
        run(make_cfg("strategy=naive", "trainer.epochs=2"), run_dir)



def test_summary_records_the_test_sizes_that_weight_the_tasks(make_cfg, tmp_path):
    """Digits' classes have unequal test sets: seen_acc is acc_matrix's row weighted by test_sizes, not its mean."""
    summary = run(make_cfg("strategy=naive", "trainer.epochs=1"), tmp_path / "run")
    sizes, acc = summary["test_sizes"], np.array(summary["acc_matrix"], dtype=float)
    assert sum(sizes) == 540 and len(set(sizes)) > 1
    weighted = [np.average(row[: k + 1], weights=sizes[: k + 1]) for k, row in enumerate(acc)]
    np.testing.assert_allclose(summary["seen_acc"], weighted, rtol=0, atol=1e-9)

@pytest.mark.parametrize("damaged", ["strategy.pkl", "progress.pt"])
def test_a_damaged_checkpoint_is_named_with_the_way_out(make_cfg, tmp_path, damaged):
    run_dir, cfg = tmp_path / "run", make_cfg("strategy=naive", "trainer.epochs=1")
    run(cfg, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    folder = run_dir / "checkpoints" / "exp002"
    folder.mkdir(parents=True)
    (run_dir / "checkpoints" / "latest").write_text("exp002\n")
    torch.save({"next_exp": 2}, folder / "progress.pt")
    (folder / "strategy.pkl").write_bytes(b"\x80\x04not a pickle")
    if damaged == "progress.pt":
        (folder / "strategy.pkl").unlink()
        (folder / "progress.pt").write_bytes((folder / "progress.pt").read_bytes()[:40])
    with pytest.raises(ValueError, match=rf"exp002/{damaged} is damaged or cut short .*resume=false starts the run "
                                         "over"):
        run(cfg, run_dir)


def test_a_results_folder_that_cannot_be_written_is_named_with_the_way_out(make_cfg, tmp_path, monkeypatch):
    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))
    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(ValueError, match=r"run cannot be written \(Read-only file system\); .*results_root=PATH"):
        run(make_cfg("strategy=naive", "trainer.epochs=1"), tmp_path / "run")


def test_a_checkpoint_pointer_to_a_missing_folder_is_named_and_the_run_starts_over(make_cfg, tmp_path, caplog):
    run_dir, cfg = tmp_path / "run", make_cfg("strategy=naive", "trainer.epochs=1")
    first = run(cfg, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "latest").write_text("exp003\n")  # its folder is gone
    with caplog.at_level("WARNING"):
        again = run(cfg, run_dir)
    assert "checkpoints/latest names" in caplog.text and "exp003, which is missing" in caplog.text
    assert again["acc_matrix"] == first["acc_matrix"] and again["status"] == "complete"


def test_a_run_folder_is_written_by_one_process_at_a_time(make_cfg, tmp_path):
    """A second writer of one run is refused before it touches the folder; the holder's release (or its end)
    lets the run go on."""
    run_dir, cfg = tmp_path / "run", make_cfg("strategy=naive", "trainer.epochs=1")
    holder = RunFolder(run_dir)
    holder.claim({"other": "config"}, overwrite=False, data_fingerprint="x")
    with pytest.raises(RunInUse, match=re.escape(str(run_dir)) + r".*Within one sweep.*give them a tag= each"):
        run(cfg, run_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", "config.yaml", "data.json"]  # the holder's alone
    holder.release()
    assert run(make_cfg("strategy=naive", "trainer.epochs=1", "overwrite=true"), run_dir)["status"] == "complete"
    again = RunFolder(run_dir)  # released at the run's end
    assert again.claim({}, overwrite=True, data_fingerprint="x") == "new"
    again.release()


def test_a_folder_that_cannot_be_locked_still_runs_and_says_so(make_cfg, tmp_path, monkeypatch, caplog):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(run_folder.fcntl, "flock", no_locks)
    with caplog.at_level(logging.WARNING, logger="hdqt_cil.run_folder"):
        assert run(make_cfg("strategy=naive", "trainer.epochs=1"), tmp_path / "run")["status"] == "complete"
    assert "cannot be locked here (" in caplog.text and "No locks available" in caplog.text


@pytest.mark.parametrize("every, epochs, logged", [("auto", 3, [1, 2, 3]), ("auto", 25, [3, 6, 9, 12, 15, 18, 21, 24]),
                                                   (2, 5, [2, 4]), (0, 3, [])])
def test_epoch_progress_lines(make_cfg, tmp_path, caplog, every, epochs, logged):
    cfg = make_cfg("strategy=naive", f"trainer.epochs={epochs}", f"logging.epochs={every}",
                   "benchmark.n_experiences=2", "trainer.device=cpu")
    with caplog.at_level(logging.INFO, logger="hdqt_cil.trainer.monitor"):
        summary = run(cfg, tmp_path / "run")
    lines = [r.getMessage() for r in caplog.records if r.name == "hdqt_cil.trainer.monitor"]
    label = experiment.run_label(cfg, tmp_path / "run")
    expected = [f"{label}: experience {k}, epoch {e}/{epochs}: mean training loss "
                f"{summary['train_loss'][k - 1][e - 1]:.4f}" for k in (1, 2) for e in logged]
    assert [line.split(" (")[0] for line in lines] == expected
    assert all(re.search(r"\(\d+\.\d\d s an epoch\)$", line) for line in lines)


def test_progress_lines_name_the_run_by_its_folder_in_the_results_tree(make_cfg, tmp_path):
    """Below results_root the folder relative to it; elsewhere (a sweep writes its runs below its own folder) the
    run_path layout's four parts, so that packed runs' lines tell scheme and seed apart."""
    cfg = make_cfg(f"results_root={tmp_path / 'results'}")
    layout = "hapt-mlp/icarl/hdqt-acc12/seed2"
    assert experiment.run_label(cfg, tmp_path / "results" / layout) == layout
    assert experiment.run_label(cfg, tmp_path / "sweep" / "multirun" / layout) == layout


def test_deterministic_kernels_hold_for_the_run_only(make_cfg, tmp_path, monkeypatch):
    seen = []
    body = experiment._run

    def watched(*args):
        seen.append((torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled(), torch.backends.cudnn.deterministic,
                     torch.backends.cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG")))
        return body(*args)

    monkeypatch.setattr(experiment, "_run", watched)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark)
    cfg = ("strategy=naive", "trainer.epochs=1", "trainer.device=cpu", "benchmark.n_experiences=2")
    deterministic = run(make_cfg(*cfg, "trainer.deterministic=true"), tmp_path / "run")
    assert seen[0] == (True, True, True, False, ":4096:8")
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark) == before
    # a run-independent setting: the same folder serves either
    assert run(make_cfg(*cfg), tmp_path / "run") == deterministic
    assert seen[1][0] == before[0]


def test_cuda_graphs_on_the_cpu_are_refused_before_training(make_cfg, tmp_path):
    with pytest.raises(ValueError, match=r"trainer.cuda_graph=true needs a CUDA device; this run is on cpu"):
        run(make_cfg("trainer.cuda_graph=true", "trainer.device=cpu"), tmp_path / "run")
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.parametrize("overrides, message", [
    (("quant=hdqt",), "trainer.compile=true applies to quant=fp32 only; quant=hdqt runs its own kernels"),
    (("trainer.device=cpu",), "trainer.compile=true compiles the step that CUDA graphs replay; this run has "
                              "trainer.cuda_graph=auto on cpu"),
])
def test_compiling_a_step_that_is_not_fp32_on_cuda_graphs_is_refused(make_cfg, tmp_path, overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        run(make_cfg("trainer.compile=true", *overrides), tmp_path / "run")
    assert not (tmp_path / "run" / "summary.json").exists()


def test_cuda_graph_plugin_lends_the_old_models_out_for_an_experience_only():
    """The old model of LwF/iCaRL (`old_model`) and BiC (`model_old`) is called through CapturedInference while an
    experience trains (eagerly on the CPU: same outputs) and is a plain module again when it ends, for the
    checkpoint; a model the plugin replaced in the meantime is left alone."""
    lwf, bic = SimpleNamespace(old_model=nn.Linear(3, 2)), SimpleNamespace(model_old=nn.Linear(3, 2))
    old_lwf = lwf.old_model
    strategy = SimpleNamespace(model=nn.Linear(3, 2), forward=lambda: None, plugins=[lwf, bic], is_training=True)
    plugin = CudaGraphPlugin(("old_model", "model_old"))
    plugin.before_training_exp(strategy)
    assert isinstance(lwf.old_model, CapturedInference) and isinstance(bic.model_old, CapturedInference)
    x = torch.randn(4, 3)
    with torch.no_grad():
        assert torch.equal(lwf.old_model(x), old_lwf(x))
    assert lwf.old_model.weight is old_lwf.weight
    newer = nn.Linear(3, 2)
    bic.model_old = newer  # as BiC's own after_training_exp would, had it run first
    plugin.after_training_exp(strategy)
    assert lwf.old_model is old_lwf and bic.model_old is newer
    assert not plugin.teachers


def test_classes_not_divisible_by_tasks_is_refused_before_training(make_cfg, tmp_path):
    with pytest.raises(ValueError, match="n_experiences=3 does not divide the 10 classes"):
        run(make_cfg("benchmark.n_experiences=3"), tmp_path / "run")
    assert not (tmp_path / "run" / "summary.json").exists()


def test_seed_reproduces_and_changes_class_order(make_cfg, tmp_path):
    a = run(make_cfg("strategy=naive", "trainer.epochs=1", "seed=1"), tmp_path / "a")
    b = run(make_cfg("strategy=naive", "trainer.epochs=1", "seed=1"), tmp_path / "b")
    c = run(make_cfg("strategy=naive", "trainer.epochs=1", "seed=2"), tmp_path / "c")
    assert a["acc_matrix"] == b["acc_matrix"] and a["class_order"] == b["class_order"]
    assert a["class_order"] != c["class_order"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_hdqt_training_loss_decreases(make_cfg, tmp_path, strategy):
    extra = {"bic": ["strategy.stage_2_epochs=2"], "gdumb": ["trainer.memory_size=2000"]}  # GDumb: memory only
    cfg = make_cfg(f"strategy={strategy}", "quant=hdqt", "trainer.epochs=4", "benchmark.n_experiences=1",
                   *extra.get(strategy, []))
    summary = run(cfg, tmp_path / "run")
    losses = summary["train_loss"][0]
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0], losses
    assert (tmp_path / "run" / "quant_stats.json").exists()


def test_icarl_ce_kd_is_scored_by_its_head(make_cfg, tmp_path):
    with pytest.raises(ValueError, match="strategy.eval_head='nme' needs strategy.loss=bce"):
        run(make_cfg("strategy=icarl", "strategy.loss=ce_kd", "strategy.eval_head=nme"), tmp_path / "run")


def test_pycil_losses_by_hand():
    """LwF: CE over the current classes; iCaRL (current_only=False): CE over all seen classes; both + λ·KD_T."""
    import torch
    import torch.nn.functional as F
    from types import SimpleNamespace

    from hdqt_cil.strategies.lwf import LwFPlugin

    torch.manual_seed(0)
    old_model = torch.nn.Linear(4, 6)
    x, logits, y = torch.randn(5, 4), torch.randn(5, 6), torch.tensor([2, 3, 0, 3, 1])
    for current_only, first in ((True, 2), (False, 0)):
        plugin = LwFPlugin(lamb=0.5, temperature=2.0, current_only=current_only)
        plugin.known, plugin.total, plugin.old_model = 2, 4, old_model
        batch = SimpleNamespace(mb_output=logits, mb_y=y, mb_x=x, loss=None)
        if current_only:
            batch.mb_y = torch.tensor([2, 3, 2, 3, 2])
        plugin.before_backward(batch)
        teacher = F.softmax(old_model(x)[:, :2].detach() / 2, dim=1)
        kd = -(teacher * F.log_softmax(logits[:, :2] / 2, dim=1)).sum(1).mean()
        expected = F.cross_entropy(logits[:, first:4], batch.mb_y - first) + 0.5 * kd
        assert torch.allclose(batch.loss, expected)


def test_bic_cross_entropy_runs_over_the_seen_classes_when_asked(make_cfg, monkeypatch):
    """ce_classes=seen: training's cross-entropy over the first (seen) outputs and the bias stage's view of the
    model cut to them, the model handed back after; null: every output; evaluation's loss over every output."""
    import torch.nn.functional as F
    from avalanche.training.plugins import bic as avalanche_bic

    from hdqt_cil.models import build_model
    from hdqt_cil.strategies import DataFacts, build_strategy
    from hdqt_cil.strategies.bic import BiCPlugin

    torch.manual_seed(0)
    logits, y, x = torch.randn(6, 10), torch.tensor([0, 1, 2, 3, 0, 1]), torch.randn(2, 64)
    stage_outputs = []
    monkeypatch.setattr(avalanche_bic.BiCPlugin, "bias_correction_step",
                        lambda self, strategy, **kw: stage_outputs.append(strategy.model(x).shape[1]))
    for setting, classes in (("null", 10), ("seen", 4)):
        cfg = make_cfg("strategy=bic", f"strategy.ce_classes={setting}")
        model = build_model(cfg.model, (64,), 10)
        common = dict(optimizer=torch.optim.SGD(model.parameters(), lr=0.1), criterion=nn.CrossEntropyLoss(),
                      train_mb_size=8, train_epochs=1, eval_mb_size=8, device="cpu", plugins=[])
        strategy = build_strategy(cfg.strategy, cfg.trainer, model, common, DataFacts(False, 5))
        bic = next(p for p in strategy.plugins if isinstance(p, BiCPlugin))
        bic.seen_classes.update(range(4))
        strategy.mbatch, strategy.mb_output = [x, y, None], logits
        strategy.is_training = True
        assert torch.allclose(strategy.criterion(), F.cross_entropy(logits[:, :classes], y))
        strategy.is_training = False
        assert torch.allclose(strategy.criterion(), F.cross_entropy(logits, y))
        bic.bias_correction_step(strategy)
        assert stage_outputs[-1] == classes and strategy.model is model
    assert BiCPlugin.__new__(BiCPlugin).seen_only is False  # a plugin restored from before the setting existed


@pytest.mark.parametrize("name", ["lwf", "icarl", "bic"])
def test_each_distilling_strategy_names_the_teacher_its_plugins_hold(make_cfg, name):
    """What a strategy lends to CUDA-graph replay is an attribute one of its plugins really has."""
    from hdqt_cil.strategies import DataFacts, build_strategy, teachers
    from hdqt_cil.models import build_model

    cfg = make_cfg(f"strategy={name}")
    model = build_model(cfg.model, (64,), 10)
    common = dict(optimizer=torch.optim.SGD(model.parameters(), lr=0.1), criterion=nn.CrossEntropyLoss(),
                  train_mb_size=8, train_epochs=1, eval_mb_size=8, device="cpu", plugins=[])
    strategy = build_strategy(cfg.strategy, cfg.trainer, model, common, DataFacts(False, 5))
    assert teachers(name) and all(any(hasattr(p, t) for p in strategy.plugins) for t in teachers(name))


@pytest.mark.parametrize("strategy", ["naive", "icarl"])
def test_task_incremental_scoring_trains_alike_and_scores_within_each_task(make_cfg, tmp_path, strategy):
    """benchmark.scenario=task trains as class-incremental does (same losses) and predicts among the evaluated
    task's classes only: every accuracy is at least the class-incremental one, and a forgetting learner's old
    tasks score far higher."""
    common = [f"strategy={strategy}", "trainer.epochs=2", "trainer.device=cpu"]
    cil = run(make_cfg(*common), tmp_path / "class")
    til = run(make_cfg(*common, "benchmark.scenario=task"), tmp_path / "task")
    assert til["train_loss"] == cil["train_loss"] and til["run"]["scenario"] == "task"
    a, b = np.array(til["acc_matrix"], float), np.array(cil["acc_matrix"], float)
    seen = ~np.isnan(b)
    assert (a[seen] >= b[seen]).all() and (a[seen] > b[seen]).any()
    assert np.isnan(a[~seen]).all()


def copy_state(module: nn.Module) -> dict:
    return {k: v.clone() for k, v in module.state_dict().items()}


def _second_experience_of_two(make_cfg, tmp_path, monkeypatch, strategy: str) -> dict:
    """What a probe sees of an expanding strategy (strategies/dyn_der.py) in a 2-experience HDQT run on digits:
    the model at experience 2's start (after the run's plugins: expanded and quantized), the modes its extractors
    (and a shared trunk) train in, the first extractor's (and the trunk's) state before and after experience 2,
    the classifier after experience 1 and at experience 2's start."""
    from avalanche.core import SupervisedPlugin

    from hdqt_cil.quant.layers import QuantConv2d, QuantLinear

    seen = {}

    def trunk_of(model):
        return getattr(model.features, "trunk", None)

    class Probe(SupervisedPlugin):
        def before_training_exp(self, strategy, **kwargs):
            model = strategy.model
            if len(model.features.extractors) == 1:
                return
            layers = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
            seen["quantized"] = all(isinstance(m, (QuantLinear, QuantConv2d)) for m in layers)
            seen["layers"] = len(layers)
            seen["optimized"] = {id(p) for p in strategy.optimizer.param_groups[0]["params"]}
            seen["trainable"] = {id(p) for p in model.parameters() if p.requires_grad}
            seen["frozen_before"] = copy_state(model.features.extractors[0])
            if trunk_of(model) is not None:
                seen["trunk_before"] = copy_state(trunk_of(model))
                seen["trunk_parameters"] = {id(p) for p in trunk_of(model).parameters()}
            seen["new_head"] = model.classifier.weight.detach().clone(), model.classifier.bias.detach().clone()
            seen["aux_outputs"] = model.aux_classifier.out_features

        def after_training_iteration(self, strategy, **kwargs):
            features = strategy.model.features
            seen["modes"] = [e.training for e in features.extractors]
            seen["trunk_mode"] = getattr(trunk_of(strategy.model), "training", None)

        def after_training_exp(self, strategy, **kwargs):
            model = strategy.model
            if len(model.features.extractors) == 1:
                seen["old_head"] = model.classifier.weight.detach().clone(), model.classifier.bias.detach().clone()
            else:
                seen["frozen_after"] = model.features.extractors[0].state_dict()
                seen["extractors"] = len(model.features.extractors)
                if trunk_of(model) is not None:
                    seen["trunk_after"] = trunk_of(model).state_dict()

    build = experiment.build_strategy

    def with_probe(*args):
        strategy = build(*args)
        strategy.plugins.append(Probe())
        return strategy

    monkeypatch.setattr(experiment, "build_strategy", with_probe)
    cfg = make_cfg(f"strategy={strategy}", "quant=hdqt", "trainer.epochs=2", "trainer.device=cpu",
                   "benchmark.n_experiences=2")
    assert run(cfg, tmp_path / "run")["status"] == "complete"
    for name, before in seen["frozen_before"].items():
        assert torch.equal(before, seen["frozen_after"][name]), name
    (old_w, old_b), (new_w, new_b) = seen["old_head"], seen["new_head"]
    known, width = old_w.shape
    assert new_w.shape == (2 * known, 2 * width) and seen["aux_outputs"] == known + 1
    assert torch.equal(new_w[:known, :width], old_w) and torch.equal(new_b[:known], old_b)
    return seen


def test_dyn_der_expands_quantized_freezes_the_old_extractor_and_keeps_the_old_heads(make_cfg, tmp_path, monkeypatch):
    """Experience 2 under HDQT: a second extractor, every Linear of the model (both extractors, classifier,
    auxiliary head) a QuantLinear before the first forward, the optimizer over the trainable parameters alone; the
    old classes' classifier weights copied in, an auxiliary head over the new classes + "old"; the first extractor
    frozen (its state bit-identical, in eval mode while the new one trains)."""
    seen = _second_experience_of_two(make_cfg, tmp_path, monkeypatch, "dyn_der")
    assert seen["extractors"] == 2 and seen["layers"] == 2 * 2 + 2 and seen["quantized"]
    assert seen["optimized"] == seen["trainable"] and len(seen["trainable"]) == 2 + 4  # new extractor, two heads
    assert seen["modes"] == [False, True]


def test_memo_shares_the_trunk_expands_a_quantized_branch_and_freezes_the_old_one(make_cfg, tmp_path, monkeypatch):
    """MEMO, experience 2 under HDQT, on the MLP: one trunk (the first hidden layer, training on, in train mode),
    two branches (the last hidden layer each), every Linear a QuantLinear before the first forward, the optimizer
    over the trunk, the new branch and the heads; the old branch frozen and in eval mode, the old classes'
    classifier weights copied in, an auxiliary head over the new classes + "old"."""
    seen = _second_experience_of_two(make_cfg, tmp_path, monkeypatch, "memo")
    assert seen["extractors"] == 2 and seen["layers"] == 1 + 2 + 2 and seen["quantized"]
    assert seen["optimized"] == seen["trainable"] and len(seen["trainable"]) == 1 + 1 + 4
    assert seen["trunk_parameters"] <= seen["trainable"]
    assert seen["modes"] == [False, True] and seen["trunk_mode"] is True
    assert not all(torch.equal(v, seen["trunk_after"][k]) for k, v in seen["trunk_before"].items())


def test_dyn_der_freezes_batchnorm_of_the_old_resnet():
    """On a ResNet, the old extractor's BatchNorm statistics hold through training steps of the new one."""
    from hdqt_cil.models import build_model
    from hdqt_cil.strategies.dyn_der import ConcatenatedFeatures, ExpandableNet

    net = ExpandableNet(ConcatenatedFeatures(build_model("resnet32", (3, 8, 8), 4).features))
    net.expand(2)
    net.expand(2)
    net.train()
    old = {k: v.clone() for k, v in net.features.extractors[0].state_dict().items()}
    out = net(torch.randn(4, 3, 8, 8))
    assert out.shape == (4, 4 + 3)  # 4 classes seen, then the auxiliary head's 2 new + "old"
    out.sum().backward()
    assert all(torch.equal(v, net.features.extractors[0].state_dict()[k]) for k, v in old.items())
    assert all(p.grad is None for p in net.features.extractors[0].parameters())
    assert net.features.extractors[1].bn1.num_batches_tracked == 1


def _memo_net(features, train_base: bool = True):
    from hdqt_cil.models import split_features
    from hdqt_cil.strategies.dyn_der import ExpandableNet
    from hdqt_cil.strategies.memo import SharedTrunkFeatures

    return ExpandableNet(SharedTrunkFeatures(*split_features(features, "strategy=memo"), train_base))


@pytest.mark.parametrize("model,shape,norm", [("resnet32", (3, 8, 8), ((0.5,) * 3, (0.25,) * 3)),
                                              ("mlp", (6,), None)])
def test_each_backbone_splits_into_a_trunk_and_a_branch_that_compose_to_its_features(model, shape, norm):
    """ResNet-32: stem and stages 1-2, then stage 3 and the pooling; the MLP: its first hidden layer, then its last.
    The two hold the backbone's own modules (its parameters once each) and give its features."""
    from hdqt_cil.models import build_model, split_features

    features = build_model(model, shape, 4, norm).features.eval()
    x = torch.randint(0, 256, (3, *shape), dtype=torch.uint8) if norm else torch.randn(3, *shape)
    trunk, branch = split_features(features, "strategy=memo")
    assert torch.equal(branch(trunk(x)), features(x)) and branch.out_features == features.out_features
    parts = [id(p) for p in (*trunk.parameters(), *branch.parameters())]
    assert len(set(parts)) == len(parts) and set(parts) == {id(p) for p in features.parameters()}
    upper = [m for m in branch.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    assert len(upper) == (10 if model == "resnet32" else 1)  # stage 3's five blocks of two convs; one Linear


def test_memo_names_a_backbone_without_a_split():
    from hdqt_cil.strategies.memo import build

    class Unsplittable(nn.Module):
        out_features = 2

    with pytest.raises(ValueError, match=r"strategy=memo .* Unsplittable does not say where it splits"):
        build(None, None, SimpleNamespace(features=Unsplittable()), {}, None)


@pytest.mark.parametrize("train_base", [True, False])
def test_memo_freezes_the_old_branch_of_the_resnet_and_the_trunk_unless_it_trains_on(train_base):
    """After a second experience's expansion on ResNet-32: the old branch's parameters and BatchNorm statistics
    hold through a training step, the new branch's move; the trunk, one copy, trains on (PyCIL's train_base=true)
    or holds as the old branch."""
    from hdqt_cil.models import build_model

    net = _memo_net(build_model("resnet32", (3, 8, 8), 4).features, train_base)
    net.expand(2)
    net.expand(2)
    net.train()
    features = net.features
    old, trunk = (copy_state(m) for m in (features.extractors[0], features.trunk))
    out = net(torch.randn(4, 3, 8, 8))
    assert out.shape == (4, 4 + 3)  # 4 classes seen, then the auxiliary head's 2 new + "old"
    out.sum().backward()
    assert all(torch.equal(v, features.extractors[0].state_dict()[k]) for k, v in old.items())
    assert all(p.grad is None for p in features.extractors[0].parameters())
    assert features.extractors[1][0][0].bn1.num_batches_tracked == 1
    trunk_bn = features.trunk[1]
    assert features.trunk.training is train_base and trunk_bn.num_batches_tracked == int(train_base)
    assert all((p.grad is not None) is train_base for p in features.trunk.parameters())
    if not train_base:
        assert all(torch.equal(v, features.trunk.state_dict()[k]) for k, v in trunk.items())
    # the stem's and stages 1-2's once, two stage 3s: two a block
    assert sum(isinstance(m, nn.BatchNorm2d) for m in net.modules()) == 1 + 2 * 5 * 2 + 2 * 5 * 2


@pytest.mark.parametrize("name", SCHEMES.names())
def test_memo_new_branch_and_heads_run_the_scheme_before_their_first_forward(name):
    """Every scheme, on ResNet-32: the new branch is a copy of a quantized one, so it runs the scheme from the
    start; the run's quantization plugin, at the experience's start, converts the new heads; no layer is left in
    torch's classes."""
    from hdqt_cil.models import build_model
    from hdqt_cil.quant import quantize_model
    from hdqt_cil.quant.layers import QuantLayer

    scheme = preset(name)
    net = _memo_net(quantize_model(build_model("resnet32", (3, 8, 8), 4), scheme).features)
    net.expand(2)
    quantize_model(net, scheme)  # the plugin, at each training experience's start
    net.expand(2)
    new_branch = [m for m in net.features.extractors[1].modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    assert len(new_branch) == 10 and all(isinstance(m, QuantLayer) and m.scheme == scheme for m in new_branch)
    assert type(net.aux_classifier) is nn.Linear
    quantize_model(net, scheme)
    layers = [m for m in net.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    assert len(layers) == 1 + 2 * 2 * 5 + 2 * 2 * 5 + 2  # stem, stages 1-2, two stage 3s, classifier and aux head
    assert all(isinstance(m, QuantLayer) and m.scheme is scheme for m in layers)


def test_bic_refuses_a_hold_out_that_leaves_a_class_nothing_to_train_on(make_cfg, tmp_path):
    """BiC holds out val_percentage × memory_size samples over the classes seen for its bias layer, the first of each
    new class; where that is all of a class, the run stops naming the settings, not inside avalanche's loader."""
    cfg = make_cfg("strategy=bic", "trainer.epochs=1", "trainer.device=cpu", "trainer.memory_size=4000")
    with pytest.raises(ValueError, match=r"BiC holds out 200 training samples of each class of experience 1 .*"
                                         r"none would be left to train on; lower strategy.val_percentage"):
        run(cfg, tmp_path / "run")
