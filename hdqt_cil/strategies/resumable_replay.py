"""Replay batches that an epoch checkpoint can resume exactly.

DER++ and ER-ACE draw their stored batches from `cycle(DataLoader(memory, shuffle=True))`, a live generator held
by the strategy for the whole experience: a run resumed inside an experience would start it again from its first
batch, and its stored batches (and from them its losses) would part from the uninterrupted run's. `ResumableCycle`
yields exactly the batches of that generator and can be put back where it was: it keeps the random state at which
its current pass over the memory began (all of a shuffled loader's draws happen there) and how many batches it has
given since; restored, it replays the pass's draws from that state and skips as many batches.
`ResumableReplay` is the plugin that swaps it in and keeps its position in epoch checkpoints.
"""
import torch
from avalanche.core import SupervisedPlugin


class ResumableCycle:
    def __init__(self, loader):
        self.loader = loader
        self.iterator, self.start, self.taken = None, None, 0

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            if self.iterator is None:
                self.start, self.taken = torch.get_rng_state(), 0
                self.iterator = iter(self.loader)
            try:
                batch = next(self.iterator)
            except StopIteration:
                self.iterator = None
                continue
            self.taken += 1
            return batch

    def position(self):
        return None if self.iterator is None else (self.start, self.taken)

    def restore(self, position) -> None:
        """Back to `position` (from `position()`); the global random state is the caller's to restore after."""
        self.iterator = None
        if position is not None:
            self.start, taken = position
            torch.set_rng_state(self.start)
            self.iterator = iter(self.loader)
            for _ in range(taken):
                next(self.iterator)
            self.taken = taken


class ResumableReplay(SupervisedPlugin):
    """Replaces the strategy's `replay_loader` (avalanche's `cycle(loader)`, not yet started when the experience
    begins) by a ResumableCycle over the same loader, and keeps its position in epoch checkpoints."""

    def __init__(self):
        super().__init__()
        self.cycle = None

    def before_training_exp(self, strategy, **kwargs):
        started = strategy.replay_loader
        # an unstarted generator's frame holds its argument: avalanche's own loader
        self.cycle = None if started is None else ResumableCycle(started.gi_frame.f_locals["loader"])
        strategy.replay_loader = self.cycle

    def after_training_exp(self, strategy, **kwargs):
        self.cycle = None  # the strategy drops its loader too: a boundary checkpoint pickles neither

    def epoch_state(self):
        return None if self.cycle is None else self.cycle.position()

    def load_epoch_state(self, state) -> None:
        if self.cycle is not None:
            self.cycle.restore(state)
