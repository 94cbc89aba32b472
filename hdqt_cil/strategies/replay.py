"""Experience replay: each training batch is joined by an equal share of stored samples, the memory
(trainer.memory_size samples) split evenly over the experiences seen (avalanche's Replay and its
experience-balanced buffer, as they are)."""
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
