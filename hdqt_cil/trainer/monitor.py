"""Watches training once per epoch: records the mean loss, logs progress, and stops a run that diverges, naming
where it was first seen: a loss or weights that are no longer finite, or a runaway loss (RUNAWAY_FACTOR). A NaN or
Inf that reaches a quantizer (quantized schemes check every pass) is the same divergence, seen earlier."""
import logging
import math
import time
from contextlib import contextmanager

import torch
from avalanche.core import SupervisedPlugin

from ..quant import NonFiniteError
from .checkpoint import experience_epochs

log = logging.getLogger(__name__)


# A runaway loss: an epoch's mean training loss above RUNAWAY_FACTOR times the larger of 1 and the experience's
# first-epoch mean. A cross-entropy loss that large means logits of that size: the weights are running away (seen:
# HDQT on a wide MLP at the trainer's defaults, 0.06 → 2.4e3 → 1.9e7, ending at chance yet finite).
RUNAWAY_FACTOR = 1e3


class Diverged(RuntimeError):
    """`experience` is 0-based (as the rows of the accuracy matrix, and in `details`), `epoch` counts from 1 within
    it, or within `phase`, a stage trained after the experience's epochs (the higher-precision replay); the message
    counts both from 1, as the progress lines do."""

    def __init__(self, experience: int, epoch: int, what: str, phase: str | None = None):
        place = (f"experience {experience + 1}, epoch {epoch}" if phase is None
                 else f"{phase} after experience {experience + 1}, its epoch {epoch}")
        super().__init__(f"training diverged in {place}: {what}")
        self.details = {"experience": experience, "epoch": epoch, "where": what, **({"phase": phase} if phase else {})}


def divergence(model, mean: float, first: float | None) -> str | None:
    """What shows that training diverged, or None: weights or an epoch's `mean` loss no longer finite, or a runaway
    loss over the experience's `first`-epoch mean (None: this is its first epoch). One rule for the epochs and for
    the phases after them."""
    for name, param in model.named_parameters():
        if not torch.isfinite(param).all():
            return f"non-finite weights in {name}"
    if not math.isfinite(mean):
        return "non-finite loss"
    first = mean if first is None else first
    if mean > RUNAWAY_FACTOR * max(1.0, first):
        return (f"runaway loss {mean:.3g} (above {RUNAWAY_FACTOR:g} × max(1, the experience's first-epoch loss "
                f"{first:.3g}))")
    return None


def training_place(strategy) -> tuple[int, int]:
    """The experience (0-based) and epoch (from 1) in training, or last trained in during a phase after an
    experience's epochs (BiC's bias stage, herding, an evaluation): avalanche's clock counts an epoch or an
    experience only once their hooks have run."""
    clock = strategy.clock
    experience = clock.train_exp_counter - (not strategy.is_training)
    return experience, min(clock.train_exp_epochs + 1, experience_epochs(strategy))


@contextmanager
def quantizer_checks_diverge(strategy):
    """A NaN or Inf that reaches a quantizer (mid-epoch, at the end of an epoch replayed from CUDA graphs, or in a
    later phase) raises Diverged where training is, as the monitor's own checks do."""
    try:
        yield
    except NonFiniteError as error:
        raise Diverged(*training_place(strategy), str(error)) from error


class TrainingMonitor(SupervisedPlugin):
    """Per-iteration work stays on the device (a check per step would synchronise the GPU every step); at an
    epoch's end one transfer gives the mean loss, and a non-finite or runaway loss or the first parameter holding
    NaN/Inf (by its qualified name, i.e. the layer) raises `Diverged`. `losses[k]` lists experience k's
    per-epoch mean training losses. Every `log_every` epochs (0: never) a log line gives the loss and the time
    an epoch takes, so a long experience shows progress where no progress bars are drawn (sweeps, clusters); it
    starts with the run's `label`, so that the lines of runs sharing one output (a packed sweep) tell whose they are.
    """
    label = ""  # a monitor restored from a checkpoint written before labels

    def __init__(self, log_every: int = 0, label: str = ""):
        super().__init__()
        self.log_every, self.label = log_every, label
        self.losses: list[list[float]] = []
        self._sum = self._count = None
        self._since = self._epochs_since = None

    def before_training_exp(self, strategy, **kwargs):
        self.losses.append([])
        self._since, self._epochs_since = time.perf_counter(), 0

    def epoch_state(self):
        """What an epoch checkpoint keeps of this plugin (trainer/checkpoint.py)."""
        return [list(epochs) for epochs in self.losses]

    def load_epoch_state(self, state) -> None:
        self.losses = state

    def before_training_epoch(self, strategy, **kwargs):
        self._sum = torch.zeros((), dtype=torch.float64, device=strategy.device)
        self._count = 0

    def after_training_iteration(self, strategy, **kwargs):
        self._sum += strategy.loss.detach().sum()
        self._count += 1

    def first_epoch_loss(self) -> float | None:
        """The mean loss of the experience's first epoch (None before it ends): what a runaway loss is judged by."""
        return self.losses[-1][0] if self.losses and self.losses[-1] else None

    def after_training_epoch(self, strategy, **kwargs):
        experience, epoch = training_place(strategy)
        mean = self._sum.item() / max(self._count, 1)
        what = divergence(strategy.model, mean, self.first_epoch_loss())
        if what is not None:
            raise Diverged(experience, epoch, what)
        self.losses[-1].append(mean)
        self._epochs_since += 1
        if self.log_every and epoch % self.log_every == 0:
            now = time.perf_counter()
            log.info("%sexperience %d, epoch %d/%d: mean training loss %.4f (%.2f s an epoch)",
                     f"{self.label}: " if self.label else "", experience + 1, epoch, experience_epochs(strategy), mean,
                     (now - self._since) / self._epochs_since)
            self._since, self._epochs_since = now, 0
