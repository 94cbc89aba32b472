"""Stops training when the loss or the weights stop being finite, naming where it was first seen."""
import torch
from avalanche.core import SupervisedPlugin


class Diverged(RuntimeError):
    """`experience` is 0-based (as the rows of the accuracy matrix), `epoch` counts from 1 within it."""

    def __init__(self, experience: int, epoch: int, where: str):
        super().__init__(f"training diverged in experience {experience}, epoch {epoch}: non-finite {where}")
        self.details = {"experience": experience, "epoch": epoch, "where": where}


class DivergenceGuard(SupervisedPlugin):
    """Checks once per epoch (a per-iteration check would synchronise the GPU every step).

    The loss flag is accumulated on the device every iteration; at the epoch's end a non-finite loss or the
    first parameter holding NaN/Inf (by its qualified name, i.e. the layer) raises `Diverged`.
    """

    def __init__(self):
        super().__init__()
        self._bad_loss = None

    def before_training_epoch(self, strategy, **kwargs):
        self._bad_loss = torch.zeros((), dtype=torch.bool, device=strategy.device)

    def after_training_iteration(self, strategy, **kwargs):
        self._bad_loss |= ~torch.isfinite(strategy.loss.detach()).all()

    def after_training_epoch(self, strategy, **kwargs):
        experience = strategy.clock.train_exp_counter
        epoch = strategy.clock.train_exp_epochs + 1  # the clock counts finished epochs after this callback
        for name, param in strategy.model.named_parameters():
            if not torch.isfinite(param).all():
                raise Diverged(experience, epoch, f"weights in {name}")
        if self._bad_loss.item():
            raise Diverged(experience, epoch, "loss")
