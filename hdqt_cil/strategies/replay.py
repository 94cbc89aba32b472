"""Experience replay: each training batch is joined by as many stored samples, the memory (trainer.memory_size
samples) split evenly over the experiences seen, a random subset of each that only shrinks as experiences come
(avalanche's Replay and its experience-balanced buffer, as they are). The stored samples are drawn in passes
over the memory, so the last batch of a pass holds what is left of it (a memory of 10, batches of 4: 4, 4, 2)."""
from dataclasses import dataclass

from avalanche.training import Replay

from .base import STRATEGIES, StrategyConfig
from .rehearsal import needs_memory


@dataclass
class ReplayConfig(StrategyConfig):
    name: str = "replay"


@STRATEGIES.register("replay", ReplayConfig, fits=needs_memory("replay"))
def build(cfg, trainer, model, common, data):
    return Replay(model=model, mem_size=trainer.memory_size, **common)
