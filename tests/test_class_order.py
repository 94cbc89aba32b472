"""benchmark.class_order: a fixed class order (e.g. PyCIL's seed-1993 permutation) independent of the seed."""
import re

import numpy as np
import pandas as pd
import pytest

from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from hdqt_cil.config import comparable_config, validate
from hdqt_cil.benchmarks.split import build_benchmark, class_order

PYCIL_1993_HAPT = [4, 2, 7, 6, 0, 3, 5, 8, 10, 9, 1]  # np.random.seed(1993); np.random.permutation(11)


def test_fixed_order_wins_over_the_seed():
    classes = list(range(11))
    assert class_order(classes, PYCIL_1993_HAPT, shuffle=True, seed=0, name="hapt") == PYCIL_1993_HAPT
    assert class_order(classes, PYCIL_1993_HAPT, shuffle=False, seed=5, name="hapt") == PYCIL_1993_HAPT
    # Without one, the seed's permutation as before; PyCIL's order is that of seed 1993.
    assert class_order(classes, None, True, 0, "hapt") == np.random.RandomState(0).permutation(11).tolist()
    assert class_order(classes, None, True, 1993, "hapt") == PYCIL_1993_HAPT
    np.random.seed(1993)
    assert np.random.permutation(11).tolist() == PYCIL_1993_HAPT
    assert class_order(classes, None, False, 3, "hapt") == classes


@pytest.mark.parametrize("order", [[0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11]])
def test_an_order_that_is_not_a_permutation_of_the_classes_is_refused(order):
    with pytest.raises(ValueError, match=re.escape(f"benchmark.class_order={order} must be a permutation of 0..10")):
        class_order(list(range(11)), order, True, 0, "hapt")


@pytest.mark.parametrize("value,shown", [("[0,0,1]", "[0, 0, 1]"), ("[0,-1]", "[0, -1]"), ("[]", "[]")])
def test_bad_class_order_is_named_before_loading(make_cfg, value, shown):
    with pytest.raises(ValueError, match=re.escape(f"benchmark.class_order={shown} must be a list of distinct")):
        validate(make_cfg(f"benchmark.class_order={value}"))


@pytest.mark.parametrize("value", ["[0,1.5]", "3"])
def test_class_order_of_the_wrong_type_is_refused_when_composing(make_cfg, value):
    with pytest.raises(ConfigCompositionException, match="class_order"):
        make_cfg(f"benchmark.class_order={value}")


def test_a_run_made_before_class_order_existed_is_the_same_experiment(make_cfg):
    """Its config lacks the key; today's default is null: the two compare equal (claim_run_dir, tables)."""
    now = OmegaConf.to_container(make_cfg("benchmark=hapt"), resolve=True)
    assert now["benchmark"]["class_order"] is None
    before = {**now, "benchmark": {k: v for k, v in now["benchmark"].items() if k != "class_order"}}
    assert comparable_config(before) == comparable_config(now)
    fixed = {**now, "benchmark": {**now["benchmark"], "class_order": [4, 2, 7, 6, 0, 3, 5, 8, 10, 9, 1]}}
    assert comparable_config(fixed) != comparable_config(now)
    validate(make_cfg("benchmark=hapt", "benchmark.class_order=[4,2,7,6,0,3,5,8,10,9,1]"))


def test_benchmark_follows_the_fixed_order(make_cfg, tmp_path):
    rng = np.random.default_rng(0)
    rows = [(s, c) for s in range(1, 11) for c in (10, 20, 30, 40, 50) for _ in range(3)]
    subject, label = np.array(rows).T
    path = tmp_path / "t.csv"
    pd.DataFrame({"f": label + rng.normal(size=len(rows)), "label": label, "subject": subject}).to_csv(path, index=False)
    cfg = make_cfg("benchmark=features", f"benchmark.path={path}", "benchmark.n_experiences=null",
                   "benchmark.classes_per_exp=2", "benchmark.class_order=[3,0,4,1,2]")
    validate(cfg)
    for seed in (0, 7):
        bench = build_benchmark(cfg.benchmark, seed)
        assert bench.class_order == [3, 0, 4, 1, 2] and bench.classes_per_exp == [2, 2, 1]
        assert [bench.class_names[c] for c in bench.class_order] == ["40", "10", "50", "20", "30"]
        # Relabelled in arrival order: class k holds the windows of label [40, 10, 50, 20, 30][k] (feature ≈ label).
        means = {}
        for k, exp in enumerate(bench.scenario.train_stream):
            assert sorted(exp.classes_in_this_experience) == [2 * k, 2 * k + 1][: bench.classes_per_exp[k]]
            for x, y, *_ in exp.dataset:
                means.setdefault(int(y), []).append(float(x[0]))
        ranks = np.argsort([np.mean(means[k]) for k in range(5)]).tolist()
        assert ranks == np.argsort([40, 10, 50, 20, 30]).tolist()
