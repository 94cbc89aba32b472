"""ER-ACE (Caccia et al., ICLR 2022): replay whose incoming batch is scored by a cross-entropy over the current
experience's classes only (the asymmetric cross-entropy), so that new classes do not push the stored ones' logits
down; the stored batch takes the full cross-entropy. A stored batch as large as the incoming one, as in the paper
(avalanche's ER_ACE)."""
from dataclasses import dataclass

from avalanche.training import ER_ACE

from .base import STRATEGIES, StrategyConfig
from .rehearsal import needs_memory
from .resumable_replay import ResumableReplay


@dataclass
class ERACEConfig(StrategyConfig):
    name: str = "er_ace"


@STRATEGIES.register("er_ace", ERACEConfig, fits=needs_memory("er_ace"))
def build(cfg, trainer, model, common, data):
    return ER_ACE(model=model, mem_size=trainer.memory_size, batch_size_mem=trainer.batch_size,
                  **{**common, "plugins": [*common["plugins"], ResumableReplay()]})
