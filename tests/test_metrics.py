import math

import numpy as np
import pytest

from hdqt_cil.results.metrics import AccuracyHistory, backward_transfer, forgetting_per_step, summarize


def _step(*experiences):
    return {j: (np.array(y), np.array(p)) for j, (y, p) in enumerate(experiences)}


def test_history_by_hand():
    # 2 experiences of 2 classes each: exp0 = classes {0, 1}, exp1 = classes {2, 3}
    h = AccuracyHistory(n_tasks=2, n_classes=4)
    h.add_step(_step(([0, 0, 1, 1], [0, 0, 1, 0])))                        # class0 100, class1 50
    h.add_step(_step(([0, 0, 1, 1], [0, 2, 3, 3]), ([2, 2, 3, 3], [2, 2, 3, 3])))  # c0 50, c1 0, c2 100, c3 100
    assert h.acc_matrix[0][0] == 75.0 and math.isnan(h.acc_matrix[0][1])
    assert h.acc_matrix[1] == [25.0, 100.0]
    assert h.seen_acc == [75.0, 62.5]
    assert h.class_acc[1] == [50.0, 0.0, 100.0, 100.0]
    s = summarize(h)
    assert s["avg_acc"] == pytest.approx(68.75)
    assert s["last_acc"] == 62.5
    # authors' forgetting: mean over the 4 seen classes of best-so-far − now = (50 + 50 + 0 + 0) / 4
    assert s["forgetting"] == pytest.approx(25.0)
    assert s["bwt"] == pytest.approx(25.0 - 75.0)


def test_forgetting_uses_best_past_accuracy_not_first():
    class_acc = [[60, np.nan], [90, 80], [30, 80]]
    f = forgetting_per_step(class_acc)
    assert math.isnan(f[0])
    assert f[1] == pytest.approx(0.0)
    assert f[2] == pytest.approx((90 - 30 + 0) / 2)


def test_single_step_has_no_forgetting_or_bwt():
    h = AccuracyHistory(n_tasks=2, n_classes=2)
    h.add_step(_step(([0], [0]), ([1], [0])))
    s = summarize(h)
    assert s["last_acc"] == 50.0 and math.isnan(s["forgetting"]) and math.isnan(backward_transfer(h.acc_matrix))
