"""A-GEM (Chaudhry et al., ICLR 2019): a step whose gradient would raise the loss on stored samples is projected
so that it does not; the reference gradient comes from `sample_size` stored samples (256 in the paper), the memory
holding trainer.memory_size / #experiences samples of each experience (avalanche's AGEMPlugin).

avalanche's plugin holds a live iterator over its memory, which a checkpoint cannot pickle: here the checkpoint
keeps the memory's loader and a restored plugin starts a new iterator over it."""
from dataclasses import dataclass

from avalanche.training.plugins import AGEMPlugin
from avalanche.training.templates import SupervisedTemplate

from ..settings import POSITIVE_INT, setting
from .base import STRATEGIES, StrategyConfig
from .rehearsal import needs_memory


class CheckpointableAGEMPlugin(AGEMPlugin):
    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "buffer_dliter"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        loader = state.get("buffer_dataloader")
        self.buffer_dliter = iter(loader) if loader is not None else iter([])


@dataclass
class AGEMConfig(StrategyConfig):
    name: str = "agem"
    sample_size: int = setting(256, POSITIVE_INT)  # stored samples behind each reference gradient


@STRATEGIES.register("agem", AGEMConfig, fits=needs_memory("agem"))
def build(cfg, trainer, model, common, data):
    agem = CheckpointableAGEMPlugin(max(1, trainer.memory_size // data.n_experiences), cfg.sample_size)
    return SupervisedTemplate(model=model, **{**common, "plugins": [*common["plugins"], agem]})
