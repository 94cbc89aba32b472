"""Class-incremental metrics from (label, prediction) pairs. Accuracies are in percent.

After training step k the model is evaluated on the test data of every experience seen so far. From that:
- `acc_matrix[k, j]`: accuracy on experience j's test data after step k (NaN where j was not yet seen);
- `seen_acc[k]`: top-1 accuracy over all seen classes' test samples pooled (the paper's accuracy);
- `class_acc[k, c]`: accuracy on class c (NaN while c is unseen).
Summary: average incremental accuracy = mean_k seen_acc[k]; last = seen_acc[-1]; forgetting as the HDQT
authors define it (per seen class, best accuracy so far minus current, averaged over all seen classes, at the
last step); backward transfer (Lopez-Paz & Ranzato 2017) = mean_{j<T-1} acc_matrix[T-1, j] - acc_matrix[j, j].
"""
from dataclasses import dataclass, field

import numpy as np


@dataclass
class AccuracyHistory:
    n_tasks: int
    n_classes: int
    acc_matrix: list = field(default_factory=list)  # rows of length n_tasks
    seen_acc: list = field(default_factory=list)
    class_acc: list = field(default_factory=list)  # rows of length n_classes

    def add_step(self, per_experience: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """Record one evaluation: experience id → (labels, predictions)."""
        row = np.full(self.n_tasks, np.nan)
        class_row = np.full(self.n_classes, np.nan)
        labels = np.concatenate([y for y, _ in per_experience.values()])
        preds = np.concatenate([p for _, p in per_experience.values()])
        for j, (y, p) in per_experience.items():
            row[j] = 100.0 * np.mean(y == p) if len(y) else np.nan
        for c in np.unique(labels):
            class_row[c] = 100.0 * np.mean(preds[labels == c] == c)
        self.acc_matrix.append(row.tolist())
        self.class_acc.append(class_row.tolist())
        self.seen_acc.append(float(100.0 * np.mean(labels == preds)))

    @property
    def steps(self) -> int:
        return len(self.seen_acc)


def forgetting_per_step(class_acc) -> list[float]:
    """The authors' forgetting after each step (NaN after the first): mean over seen classes of max-so-far − now."""
    acc = np.asarray(class_acc, dtype=float)
    out = [float("nan")]
    for k in range(1, len(acc)):
        seen = ~np.isnan(acc[k])
        best = np.nanmax(acc[: k + 1, seen], axis=0)
        out.append(float(np.mean(best - acc[k, seen])))
    return out


def backward_transfer(acc_matrix) -> float:
    a = np.asarray(acc_matrix, dtype=float)
    t = a.shape[0]
    if t < 2 or a.shape[1] < t:
        return float("nan")
    return float(np.mean([a[t - 1, j] - a[j, j] for j in range(t - 1)]))


def forgetting_by_experience(acc_matrix) -> float:
    """Mean over the earlier experiences of their best accuracy so far − the last (domain-incremental learning,
    where every class is in every experience and a class's accuracy mixes domains)."""
    a = np.asarray(acc_matrix, dtype=float)
    earlier = len(a) - 1  # rows: steps so far; columns: every experience, NaN where not yet seen
    if earlier < 1:
        return float("nan")
    return float(np.mean(np.nanmax(a[:, :earlier], axis=0) - a[-1, :earlier]))


def summarize(history: AccuracyHistory, by_experience: bool = False) -> dict:
    """avg/last accuracy on the seen experiences' test data, forgetting (per class, the authors' definition; per
    experience with `by_experience`) and backward transfer."""
    if history.steps == 0:
        return {"avg_acc": float("nan"), "last_acc": float("nan"), "forgetting": float("nan"),
                "bwt": float("nan")}
    return {
        "avg_acc": float(np.mean(history.seen_acc)),
        "last_acc": history.seen_acc[-1],
        "forgetting": (forgetting_by_experience(history.acc_matrix) if by_experience
                       else forgetting_per_step(history.class_acc)[-1]),
        "bwt": backward_transfer(history.acc_matrix),
    }
