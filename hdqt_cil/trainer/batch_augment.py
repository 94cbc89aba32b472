"""Applies a batch augmentation to every training mini-batch after it reached the device."""
from avalanche.core import SupervisedPlugin


class BatchAugment(SupervisedPlugin):
    def __init__(self, augment):
        super().__init__()
        self.augment = augment

    def before_forward(self, strategy, **kwargs):
        strategy.mbatch[0] = self.augment(strategy.mbatch[0])
