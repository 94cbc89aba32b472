"""BiC (Wu et al. 2019) on avalanche 0.6.0's plugin, with two of its defects mended.

1. Its bias-correction stage builds `MultiStepLR(..., verbose=False)`; torch removed `verbose`, so the stage
   crashes on current torch. We hand it a scheduler class that accepts and drops the argument.
2. Its distillation target is `softmax(old_logits / 2, dim=0)`: normalised over the *batch*, not over the
   classes, and with the temperature fixed at 2 whatever `T` says. The paper's (and FACIL's) loss is the
   cross-entropy between the temperature-softened class distributions of the old and new model, so we
   normalise over dim=1 and use `T`.
"""
from contextlib import contextmanager

import torch.nn.functional as F
from avalanche.training.plugins import bic as avalanche_bic
from torch.optim.lr_scheduler import MultiStepLR


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
