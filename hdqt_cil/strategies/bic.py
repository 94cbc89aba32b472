"""BiC (Wu et al. 2019) on avalanche 0.6.0's plugin, with two of its defects mended and its cross-entropy's
classes a setting.

1. Its bias-correction stage builds `MultiStepLR(..., verbose=False)`; torch removed `verbose`, so the stage
   crashes on current torch. We hand it a scheduler class that accepts and drops the argument.
2. Its distillation target is `softmax(old_logits / 2, dim=0)`: normalised over the *batch*, not over the
   classes, and with the temperature fixed at 2 whatever `T` says. The paper's (and FACIL's) loss is the
   cross-entropy between the temperature-softened class distributions of the old and new model, so we
   normalise over dim=1 and use `T`.

`ce_classes`: avalanche's BiC trains a cross-entropy over every output of the model's fixed classifier, so from the
first experience on it also pushes down the logits of classes not yet seen; the paper's network and PyCIL's
(`IncrementalNetWithBias`, the HDQT authors' code base) grow the classifier with the classes, so their
cross-entropy, and the bias stage's, runs over the classes seen so far. `ce_classes=seen` does that here (classes
arrive relabelled in order: the first outputs); evaluation scores over the seen classes either way.
"""
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional

import torch.nn.functional as F
from torch import nn
from avalanche.training.plugins import bic as avalanche_bic
from avalanche.training.templates import SupervisedTemplate
from torch.optim.lr_scheduler import MultiStepLR

from ..settings import FRACTION, NON_NEGATIVE, POSITIVE, POSITIVE_INT, Rule, one_of, optional, setting
from .base import STRATEGIES, StrategyConfig


class _MultiStepLR(MultiStepLR):
    def __init__(self, optimizer, milestones, gamma=0.1, verbose=None):
        super().__init__(optimizer, milestones, gamma)


@contextmanager
def _scheduler_without_verbose():
    saved = avalanche_bic.MultiStepLR
    avalanche_bic.MultiStepLR = _MultiStepLR
    try:
        yield
    finally:
        avalanche_bic.MultiStepLR = saved


class _SeenOutputs(nn.Module):
    """The model's outputs of the classes seen so far (the bias stage's view under `ce_classes=seen`)."""

    def __init__(self, model: nn.Module, seen: int):
        super().__init__()
        self.model, self.seen = model, seen

    def forward(self, x):
        return self.model(x)[:, : self.seen]


class BiCPlugin(avalanche_bic.BiCPlugin):
    seen_only = False  # what a plugin restored from a checkpoint written before the setting existed did

    def __init__(self, *args, seen_only: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen_only = seen_only

    def before_train_dataset_adaptation(self, strategy, **kwargs):
        self._check_held_out(strategy)
        super().before_train_dataset_adaptation(strategy, **kwargs)

    def _check_held_out(self, strategy) -> None:
        """avalanche's plugin holds out the first samples of each new class for the bias layer, as many as its share
        of val_percentage × mem_size over the classes seen so far; a class with no more leaves nothing to train on
        (and an experience of such classes ends in an IndexError inside avalanche's data loader)."""
        counts = Counter(int(t) for t in strategy.experience.dataset.targets)
        seen = set(self.seen_classes)
        seen.update(counts)
        held = dict(zip(seen, self.get_group_lengths(len(seen))))  # as the plugin pairs them
        for label, count in counts.items():
            if count <= held[label]:
                raise ValueError(
                    f"BiC holds out {held[label]} training samples of each class of experience "
                    f"{strategy.clock.train_exp_counter + 1} for its bias layer (strategy.val_percentage × "
                    f"trainer.memory_size = {int(self.val_percentage * self.mem_size)} over {len(seen)} classes "
                    f"seen), but class {label} has {count}: none would be left to train on; lower "
                    "strategy.val_percentage or trainer.memory_size")

    def cross_entropy(self, new_outputs, old_outputs):
        soft_targets = F.softmax(old_outputs / self.T, dim=1)
        return F.cross_entropy(new_outputs / self.T, soft_targets)

    def bias_correction_step(self, strategy, **kwargs):
        model = strategy.model
        if self.seen_only:
            strategy.model = _SeenOutputs(model, len(self.seen_classes))
        try:
            with _scheduler_without_verbose():
                super().bias_correction_step(strategy, **kwargs)
        finally:
            strategy.model = model


class BiCTemplate(SupervisedTemplate):
    """The training cross-entropy over the classes seen so far when the BiC plugin says `seen_only`; evaluation's
    loss, and everything else, as avalanche's template."""

    def criterion(self):
        bic = next(p for p in self.plugins if isinstance(p, BiCPlugin))
        if not (self.is_training and bic.seen_only):
            return super().criterion()
        return F.cross_entropy(self.mb_output[:, : len(bic.seen_classes)], self.mb_y)


@dataclass
class BiCConfig(StrategyConfig):
    name: str = "bic"
    val_percentage: float = setting(0.1, FRACTION)  # share of the exemplar memory held out to fit the bias layer
    temperature: float = setting(2.0, POSITIVE)
    stage_2_epochs: int = setting(200, POSITIVE_INT)
    stage_2_lr: float = setting(0.1, POSITIVE)
    # -1: distillation weighted by old/all classes, as in the paper
    lamb: Any = setting(-1, Rule(lambda v: v == -1 or NON_NEGATIVE.test(v),
                                   "-1 (old/all classes) or a non-negative number"))
    # the cross-entropy's classes: null, every output (avalanche's BiC); seen, those seen so far (the paper, PyCIL)
    ce_classes: Optional[str] = setting(None, optional(one_of("seen")))


def _fits(cfg, trainer, num_classes: int) -> None:
    held_out = int(cfg.val_percentage * trainer.memory_size)
    if held_out < num_classes:
        raise ValueError(f"BiC holds out val_percentage × memory_size = {held_out} exemplars for its bias layer, "
                         f"fewer than the {num_classes} classes; raise trainer.memory_size")


@STRATEGIES.register("bic", BiCConfig, teachers=("model_old",), fits=_fits, scenarios=("class", "task"))
def build(cfg, trainer, model, common, data):
    plugin = BiCPlugin(mem_size=trainer.memory_size, val_percentage=cfg.val_percentage, T=cfg.temperature,
                       stage_2_epochs=cfg.stage_2_epochs, lamb=cfg.lamb, lr=cfg.stage_2_lr,
                       seen_only=cfg.ce_classes == "seen")
    return BiCTemplate(model=model, **{**common, "plugins": [*common["plugins"], plugin]})
