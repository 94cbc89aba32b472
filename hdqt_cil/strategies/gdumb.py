"""GDumb (Prabhu et al., ECCV 2020): keep a class-balanced memory of trainer.memory_size samples and train the
model from its initial weights on the memory alone at every experience (avalanche's GDumb).

avalanche's memory gives each class seen an equal quota (memory_size / #classes, the remainder to the first
classes) filled with a random subset of its samples, where the paper's greedy sampler keeps samples in stream
order and lets other classes fill the slots of a class with fewer samples than its quota: the same class counts
as long as every class has enough samples. "From scratch" is the same initial weights at each experience."""
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
