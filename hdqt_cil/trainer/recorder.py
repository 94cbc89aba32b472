"""Collects every evaluation prediction, so that all metrics are computed from (label, prediction) pairs."""
import numpy as np
import torch
from avalanche.core import SupervisedPlugin


class PredictionRecorder(SupervisedPlugin):
    """After `strategy.eval(stream)`, `results[exp_id] = (labels, predictions)` for each evaluated experience.

    Predictions are the argmax over the classes seen so far (`seen_classes`, relabelled 0..n-1 in arrival
    order): the classifier is sized for all classes from the start, and a class-incremental learner must
    not be scored on logits of classes it has never been trained on (PyCIL's growing head has none).

    Task-incremental scoring (`task_classes`: each experience's (first, end) class range): the task label given
    at test time is the evaluated experience's, and the prediction is the argmax over that task's classes alone
    (a head per task, the other logits masked).
    """

    def __init__(self, task_classes: list[tuple[int, int]] | None = None):
        super().__init__()
        self.results: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.seen_classes: int | None = None
        self.task_classes = task_classes
        self._labels, self._preds = [], []

    def before_eval(self, strategy, **kwargs):
        self.results = {}

    def before_eval_exp(self, strategy, **kwargs):
        self._labels, self._preds = [], []

    def after_eval_iteration(self, strategy, **kwargs):
        self._labels.append(strategy.mb_y.detach().cpu())
        first, end = (0, self.seen_classes) if self.task_classes is None else \
            self.task_classes[strategy.experience.current_experience]
        self._preds.append(strategy.mb_output.detach()[:, first:end].argmax(dim=1).cpu() + first)

    def after_eval_exp(self, strategy, **kwargs):
        exp_id = strategy.experience.current_experience
        self.results[exp_id] = (torch.cat(self._labels).numpy(), torch.cat(self._preds).numpy())
