"""GDumb (Prabhu et al., ECCV 2020): greedily keep a class-balanced memory of trainer.memory_size samples and
train the model from its initial weights on the memory alone at every experience (avalanche's GDumb)."""
from dataclasses import dataclass

from avalanche.training import GDumb

from .base import STRATEGIES, StrategyConfig
from .rehearsal import needs_memory


@dataclass
class GDumbConfig(StrategyConfig):
    name: str = "gdumb"


@STRATEGIES.register("gdumb", GDumbConfig, fits=needs_memory("gdumb"))
def build(cfg, trainer, model, common, data):
    return GDumb(model=model, mem_size=trainer.memory_size, **common)
