"""Domain-incremental learning (benchmark.scenario=domain): every class in every experience, the experiences told
apart by their inputs' domain (HAR subjects in groups; rotated images)."""
import numpy as np
import pandas as pd
import pytest
import torch

from hdqt_cil.benchmarks.split import build_benchmark
from hdqt_cil.experiment import run
from hdqt_cil.results.metrics import forgetting_by_experience

from test_cifar import write_torchvision_cifar


def write_table(path, n_subjects=9, per_class=6, classes=(1, 2, 3), seed=0):
    """A feature table in the `benchmark=features` format: every subject has rows of every class, and each
    subject's features are shifted by an amount of its own (a domain)."""
    rng = np.random.default_rng(seed)
    rows = [(s, c) for s in range(1, n_subjects + 1) for c in classes for _ in range(per_class)]
    subject, label = np.array(rows).T
    frame = pd.DataFrame({"a": label + subject * 0.7 + rng.normal(size=len(rows)), "b": rng.normal(size=len(rows)),
                          "label": label, "subject": subject})
    frame.to_csv(path, index=False)
    return path


def har_overrides(path, *more):
    return ["benchmark=features", f"benchmark.path={path}", "benchmark.scenario=domain", "benchmark.split=random",
            "benchmark.n_experiences=3", "benchmark.classes_per_exp=null", *more]


def groups_of(bench):
    """The subject groups a benchmark's split names, in experience order."""
    listed = bench.split.split("domains: [[")[1].rstrip("]").split("], [")
    return [sorted(int(s) for s in group.split(",")) for group in listed]


def test_har_domains_are_groups_of_subjects_each_with_every_class(make_cfg, tmp_path):
    path = write_table(tmp_path / "t.csv")
    cfg = make_cfg(*har_overrides(path))
    bench = build_benchmark(cfg.benchmark, seed=1)
    assert bench.classes_per_exp is None and bench.task_classes() == [(0, 3)] * 3
    train, test = bench.scenario.train_stream, bench.scenario.test_stream
    assert len(train) == len(test) == 3
    for t, e in zip(train, test):  # every class in every experience, training and test alike
        assert set(t.dataset.targets) == set(e.dataset.targets) == {0, 1, 2}
    groups = groups_of(bench)
    assert sorted(sum(groups, [])) == list(range(1, 10)) and all(len(g) == 3 for g in groups)
    assert groups_of(build_benchmark(cfg.benchmark, seed=2)) != groups  # drawn by the seed
    # experience k holds exactly group k's rows, split between training and test
    per_subject = pd.read_csv(path).groupby("subject").size()
    for k, group in enumerate(groups):
        assert len(train[k].dataset) + len(test[k].dataset) == per_subject[group].sum()


@pytest.mark.parametrize("strategy", ["naive", "replay", "der"])
@pytest.mark.parametrize("quant", ["fp32", "hdqt"])
def test_domain_incremental_runs_score_every_class_and_forget_by_experience(make_cfg, tmp_path, strategy, quant):
    path = write_table(tmp_path / "t.csv")
    summary = run(make_cfg(*har_overrides(path), f"strategy={strategy}", f"quant={quant}", "trainer.epochs=2",
                           "trainer.device=cpu", "trainer.memory_size=30"), tmp_path / "run")
    assert summary["status"] == "complete" and summary["run"]["scenario"] == "domain"
    acc = np.array(summary["acc_matrix"], dtype=float)
    assert acc.shape == (3, 3) and np.isnan(acc[np.triu_indices(3, 1)]).all()
    assert summary["metrics"]["forgetting"] == pytest.approx(forgetting_by_experience(acc))
    assert summary["classes_per_exp"] is None and "domains: [[" in summary["split"]


def test_forgetting_by_experience_is_the_best_so_far_minus_the_last():
    acc = [[80, np.nan, np.nan], [60, 90, np.nan], [70, 50, 85]]
    assert forgetting_by_experience(acc) == pytest.approx(((80 - 70) + (90 - 50)) / 2)
    assert np.isnan(forgetting_by_experience([[80]]))


def test_image_domains_are_rotations_of_disjoint_class_balanced_parts(make_cfg, tmp_path):
    write_torchvision_cifar(tmp_path / "data", "cifar10", per_class_train=4, per_class_test=2)
    cfg = make_cfg("benchmark=cifar10", "benchmark.verify=false", "benchmark.scenario=domain",
                   "benchmark.n_experiences=2")
    bench = build_benchmark(cfg.benchmark, seed=0)
    train = [e.dataset.eval() for e in bench.scenario.train_stream]  # eval: without the training augmentation
    test = [e.dataset.eval() for e in bench.scenario.test_stream]
    assert [len(d) for d in train] == [20, 20] and [len(d) for d in test] == [20, 20]
    for d in train:
        assert np.bincount(d.targets, minlength=10).tolist() == [2] * 10
    upright = {x.numpy().tobytes() for x, *_ in train[0]}
    assert not upright & {x.numpy().tobytes() for x, *_ in train[1]}
    # domain 1 is domain 0's test set turned by 90 degrees (anticlockwise)
    for (x0, y0, *_), (x1, y1, *_) in zip(test[0], test[1]):
        assert y0 == y1 and torch.equal(x1, torch.rot90(x0, 1, dims=(-2, -1)))
    assert "rotations by [0.0, 90.0] degrees" in bench.split


@pytest.mark.parametrize("overrides, message", [
    (["strategy=icarl"], r"strategy=icarl is made for benchmark.scenario=class\|task .* not domain; strategies for "
                         "domain: agem, der, er_ace, ewc, gdumb, joint, naive, replay, si"),
    (["strategy=bic"], r"strategy=bic is made for benchmark.scenario=class\|task"),
    (["strategy=lwf"], r"strategy=lwf is made for benchmark.scenario=class\|task"),
    (["benchmark.split=subject"], "set benchmark.split=random \\(or given\\), not subject"),
    (["benchmark.n_experiences=10"], "n_experiences=10 domains need at least as many distinct domains; features "
                                     "has 9"),
    (["benchmark.n_experiences=null", "benchmark.classes_per_exp=2"], "scenario=domain splits by domain, not by "
                                                                      "class: set benchmark.n_experiences"),
])
def test_domain_scenarios_that_cannot_be_built_are_refused_naming_why(make_cfg, tmp_path, overrides, message):
    path = write_table(tmp_path / "t.csv")
    with pytest.raises(ValueError, match=message):
        run(make_cfg(*har_overrides(path), *overrides, "trainer.device=cpu"), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_data_without_domains_is_refused(make_cfg, tmp_path):
    with pytest.raises(ValueError, match="digits has neither per-sample domains .* nor images to rotate"):
        run(make_cfg("benchmark=digits", "benchmark.scenario=domain", "trainer.device=cpu"), tmp_path / "run")
