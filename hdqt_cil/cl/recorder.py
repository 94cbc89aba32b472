"""Collects every evaluation prediction, so that all metrics are computed from (label, prediction) pairs."""
import numpy as np
import torch
from avalanche.core import SupervisedPlugin


class PredictionRecorder(SupervisedPlugin):
    """After `strategy.eval(stream)`, `results[exp_id] = (labels, predictions)` for each evaluated experience."""

    def __init__(self):
        super().__init__()
        self.results: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._labels, self._preds = [], []

    def before_eval(self, strategy, **kwargs):
        self.results = {}

    def before_eval_exp(self, strategy, **kwargs):
        self._labels, self._preds = [], []

    def after_eval_iteration(self, strategy, **kwargs):
        self._labels.append(strategy.mb_y.detach().cpu())
        self._preds.append(strategy.mb_output.detach().argmax(dim=1).cpu())

    def after_eval_exp(self, strategy, **kwargs):
        exp_id = strategy.experience.current_experience
        self.results[exp_id] = (torch.cat(self._labels).numpy(), torch.cat(self._preds).numpy())
