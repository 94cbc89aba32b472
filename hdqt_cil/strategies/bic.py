"""BiC (Wu et al. 2019) on avalanche 0.6.0's plugin, with two of its defects mended.

1. Its bias-correction stage builds `MultiStepLR(..., verbose=False)`; torch removed `verbose`, so the stage
   crashes on current torch. We hand it a scheduler class that accepts and drops the argument.
2. Its distillation target is `softmax(old_logits / 2, dim=0)`: normalised over the *batch*, not over the
   classes, and with the temperature fixed at 2 whatever `T` says. The paper's (and FACIL's) loss is the
   cross-entropy between the temperature-softened class distributions of the old and new model, so we
   normalise over dim=1 and use `T`.
"""
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from avalanche.training.plugins import bic as avalanche_bic
from avalanche.training.templates import SupervisedTemplate
from torch.optim.lr_scheduler import MultiStepLR

from ..settings import FRACTION, NON_NEGATIVE, POSITIVE, POSITIVE_INT, Rule, setting
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


class BiCPlugin(avalanche_bic.BiCPlugin):
    def cross_entropy(self, new_outputs, old_outputs):
        soft_targets = F.softmax(old_outputs / self.T, dim=1)
        return F.cross_entropy(new_outputs / self.T, soft_targets)

    def bias_correction_step(self, strategy, **kwargs):
        with _scheduler_without_verbose():
            super().bias_correction_step(strategy, **kwargs)


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


def _fits(cfg, trainer, num_classes: int) -> None:
    held_out = int(cfg.val_percentage * trainer.memory_size)
    if held_out < num_classes:
        raise ValueError(f"BiC holds out val_percentage × memory_size = {held_out} exemplars for its bias layer, "
                         f"fewer than the {num_classes} classes; raise trainer.memory_size")


@STRATEGIES.register("bic", BiCConfig, teachers=("model_old",), fits=_fits, scenarios=("class", "task"))
def build(cfg, trainer, model, common, data):
    plugin = BiCPlugin(mem_size=trainer.memory_size, val_percentage=cfg.val_percentage, T=cfg.temperature,
                       stage_2_epochs=cfg.stage_2_epochs, lamb=cfg.lamb, lr=cfg.stage_2_lr)
    return SupervisedTemplate(model=model, **{**common, "plugins": [*common["plugins"], plugin]})
