"""Watches training once per epoch: records the mean loss, and stops when the loss or the weights stop being
finite, naming where it was first seen."""
import math

import torch
from avalanche.core import SupervisedPlugin


class Diverged(RuntimeError):
    """`experience` is 0-based (as the rows of the accuracy matrix), `epoch` counts from 1 within it."""

    def __init__(self, experience: int, epoch: int, where: str):
        super().__init__(f"training diverged in experience {experience}, epoch {epoch}: non-finite {where}")
        self.details = {"experience": experience, "epoch": epoch, "where": where}


class TrainingMonitor(SupervisedPlugin):
    """Per-iteration work stays on the device (a check per step would synchronise the GPU every step); at an
    epoch's end one transfer gives the mean loss, and a non-finite loss or the first parameter holding
    NaN/Inf (by its qualified name, i.e. the layer) raises `Diverged`. `losses[k]` lists experience k's
    per-epoch mean training losses."""

    def __init__(self):
        super().__init__()
        self.losses: list[list[float]] = []
        self._sum = self._count = None

    def before_training_exp(self, strategy, **kwargs):
        self.losses.append([])

    def epoch_state(self):
        """What an epoch checkpoint keeps of this plugin (cl/checkpoint.py)."""
        return [list(epochs) for epochs in self.losses]

    def load_epoch_state(self, state) -> None:
        self.losses = state

    def before_training_epoch(self, strategy, **kwargs):
        self._sum = torch.zeros((), dtype=torch.float64, device=strategy.device)
        self._count = 0

    def after_training_iteration(self, strategy, **kwargs):
        self._sum += strategy.loss.detach().sum()
        self._count += 1

    def after_training_epoch(self, strategy, **kwargs):
        experience = strategy.clock.train_exp_counter
        epoch = strategy.clock.train_exp_epochs + 1  # the clock counts finished epochs after this callback
        for name, param in strategy.model.named_parameters():
            if not torch.isfinite(param).all():
                raise Diverged(experience, epoch, f"weights in {name}")
        mean = self._sum.item() / max(self._count, 1)
        if not math.isfinite(mean):
            raise Diverged(experience, epoch, "loss")
        self.losses[-1].append(mean)
