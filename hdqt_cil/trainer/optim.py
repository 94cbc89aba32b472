"""The optimizer protocol of every experience: fresh SGD state and a step lr schedule restarted at its start.

The HDQT authors' code (on PyCIL) builds a new SGD optimizer for every task; avalanche keeps momentum buffers
across experiences unless told otherwise. This plugin clears them at each experience start and applies the
MultiStepLR rule (lr = base · gamma^(milestones passed)) from avalanche's clock. Keeping it as plain numbers,
not a scheduler object, also keeps the optimizer out of checkpoints: torch's optimizer classes cannot be
pickled by dill, which avalanche checkpoints with.
"""
from bisect import bisect_right

from avalanche.core import SupervisedPlugin

from .. import wording


def sgd_settings(t) -> tuple[float, float, list]:
    """(momentum, weight decay, lr milestones) of trainer config `t`: its own, or with trainer.weight_update=authors
    the HDQT authors' update (QuantMomentumOptimizer): plain w ← w − lr·g at the base lr all experience long, their
    optimizer keeping no momentum, no weight decay and the lr it first saw."""
    if t.weight_update == "authors":
        return 0.0, 0.0, []
    return t.momentum, t.weight_decay, list(t.milestones)


class PerExperienceSGD(SupervisedPlugin):
    def __init__(self, base_lr: float, milestones=(), gamma: float = 0.1):
        super().__init__()
        self.base_lr = base_lr
        self.milestones = sorted(milestones)
        self.gamma = gamma

    def lr_after(self, epochs_done: int) -> float:
        return self.base_lr * self.gamma ** bisect_right(self.milestones, epochs_done)

    def _set_lr(self, strategy, lr):
        for group in strategy.optimizer.param_groups:
            group["lr"] = lr

    def before_training_exp(self, strategy, **kwargs):
        strategy.optimizer.state.clear()
        self._set_lr(strategy, self.base_lr)

    def after_training_epoch(self, strategy, **kwargs):
        self._set_lr(strategy, self.lr_after(strategy.clock.train_exp_epochs))

    def describe(self, epochs: int, preset: str | None = None, preset_epochs: int | None = None) -> list[str]:
        """What a run says of its schedule at its start: one line, and a second where a milestone never takes
        effect because it lies at or beyond the epochs a task (a shortened schedule with its own milestones)."""
        length = f"{wording.epochs(epochs)} a task"
        if preset is not None and preset_epochs not in (None, epochs):
            change = "shortened" if epochs < preset_epochs else "lengthened"
            length += f", {change} from {preset}'s {preset_epochs}"
        effective = [m for m in self.milestones if m < epochs]
        drops = (f"×{self.gamma:g} after epoch{'s' if len(effective) > 1 else ''} {', '.join(map(str, effective))}"
                 if effective else "constant")
        lines = [f"schedule: {length}; lr {self.base_lr:g}, {drops}"]
        beyond = [m for m in self.milestones if m >= epochs]
        if beyond:
            lines.append(f"trainer.milestones {beyond} lie at or beyond trainer.epochs={epochs}: the learning rate "
                         f"never drops there within a task (set milestones below {epochs}, or [])")
        return lines
