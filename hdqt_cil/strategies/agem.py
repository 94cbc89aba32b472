"""A-GEM (Chaudhry et al., ICLR 2019): a step whose gradient g would raise the loss on stored samples is projected
so that it does not: g − (gᵀg_ref / g_refᵀg_ref)·g_ref when gᵀg_ref < 0, else g as it is. The reference gradient
g_ref comes from `sample_size` stored samples (256 in the paper; the whole memory when it holds fewer), drawn
evenly from the past experiences, the memory holding trainer.memory_size / #experiences random samples of each
(avalanche's AGEMPlugin, as in the paper).

avalanche's plugin holds a live iterator over its memory, which a checkpoint can neither pickle nor resume: here it
is a ResumableCycle over the same loader (strategies/resumable_replay.py), dropped from boundary checkpoints and
started again by a restored plugin, and put back at its position by an epoch checkpoint."""
from dataclasses import dataclass

from avalanche.training.plugins import AGEMPlugin
from avalanche.training.templates import SupervisedTemplate

from ..settings import POSITIVE_INT, setting
from .base import STRATEGIES, StrategyConfig
from .rehearsal import needs_memory
from .resumable_replay import ResumableCycle


class CheckpointableAGEMPlugin(AGEMPlugin):
    def update_memory(self, dataset, num_workers=0, **kwargs):
        super().update_memory(dataset, num_workers=num_workers, **kwargs)
        self.buffer_dliter = ResumableCycle(self.buffer_dataloader)

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "buffer_dliter"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        loader = state.get("buffer_dataloader")
        self.buffer_dliter = ResumableCycle(loader) if loader is not None else iter([])

    def epoch_state(self):
        return self.buffer_dliter.position() if isinstance(self.buffer_dliter, ResumableCycle) else None

    def load_epoch_state(self, state) -> None:
        if isinstance(self.buffer_dliter, ResumableCycle):
            self.buffer_dliter.restore(state)


@dataclass
class AGEMConfig(StrategyConfig):
    name: str = "agem"
    sample_size: int = setting(256, POSITIVE_INT)  # stored samples behind each reference gradient


@STRATEGIES.register("agem", AGEMConfig, fits=needs_memory("agem"))
def build(cfg, trainer, model, common, data):
    agem = CheckpointableAGEMPlugin(max(1, trainer.memory_size // data.n_experiences), cfg.sample_size)
    return SupervisedTemplate(model=model, **{**common, "plugins": [*common["plugins"], agem]})
