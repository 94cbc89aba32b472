"""ER-ACE (Caccia et al., ICLR 2022): replay whose incoming batch is scored by a cross-entropy over the classes
present in that batch only (the asymmetric cross-entropy), so that new classes do not push the stored ones' logits
down; the stored batch takes the full cross-entropy, over every output of the classifier (sized for all classes
here, so the unseen ones too, as in the authors' code). A stored batch as large as the incoming one, as in the
paper (avalanche's ER_ACE, which puts the whole experience's share of the class-balanced memory in before
training on it).

The loss is the paper's sum L_ACE(incoming) + L_CE(stored): avalanche's ACECriterion returns their mean, half the
gradient, so ER-ACE trained at half the learning rate of the other strategies (SGD). We mend that (SumACE).
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from avalanche.training import ACECriterion, ER_ACE

from .base import STRATEGIES, StrategyConfig
from .rehearsal import needs_memory
from .resumable_replay import ResumableReplay


class SumACE(ACECriterion):
    """The sum of the two cross-entropies, each from log-softmax: avalanche's ACE takes the log of a softmax, which
    rounds to 0 once a logit trails the batch's target by ~104 in float32, an infinite loss and a NaN gradient that
    stopped quantized runs whose logits had grown apart."""

    def __call__(self, out_in, target_in, out_buffer, target_buffer):
        present = torch.unique(target_in)  # sorted: a target's index among them is its searchsorted position
        incoming = F.cross_entropy(out_in[:, present], torch.searchsorted(present, target_in))
        return incoming + F.cross_entropy(out_buffer, target_buffer)


@dataclass
class ERACEConfig(StrategyConfig):
    name: str = "er_ace"


@STRATEGIES.register("er_ace", ERACEConfig, fits=needs_memory("er_ace"))
def build(cfg, trainer, model, common, data):
    strategy = ER_ACE(model=model, mem_size=trainer.memory_size, batch_size_mem=trainer.batch_size,
                      **{**common, "plugins": [*common["plugins"], ResumableReplay()]})
    strategy.ace_criterion = SumACE()
    return strategy
