"""DER++ (Buzzega et al., NeurIPS 2020): replay that also matches the logits the model gave a stored sample when
it was stored. loss = CE(new batch) + α·MSE(logits, stored logits) + β·CE(stored batch), the MSE averaged over the
batch and the logits (as the authors' code, Mammoth, whose α this is). α = 0.1, β = 0.5 as the paper's sequential
CIFAR-10 runs with a buffer of 200.

avalanche's DER departs from the paper in ways it names, kept here as variants: its buffer is class-balanced
(memory_size split evenly over the classes seen, a random subset of each) instead of a reservoir over the stream;
a sample's logits are recorded once, by the model at the end of its experience in eval mode, not along the
training trajectory when it enters the buffer; one stored batch serves both the logit and the label term (the
paper draws two), in one forward pass with the new batch."""
from dataclasses import dataclass

from avalanche.training import DER

from ..settings import NON_NEGATIVE, setting
from .base import STRATEGIES, StrategyConfig
from .rehearsal import needs_memory
from .resumable_replay import ResumableReplay


@dataclass
class DERConfig(StrategyConfig):
    name: str = "der"
    alpha: float = setting(0.1, NON_NEGATIVE)  # weight of the logit-matching loss on stored samples
    beta: float = setting(0.5, NON_NEGATIVE)  # weight of the cross-entropy on stored samples


@STRATEGIES.register("der", DERConfig, fits=needs_memory("der"))
def build(cfg, trainer, model, common, data):
    return DER(model=model, mem_size=trainer.memory_size, batch_size_mem=trainer.batch_size, alpha=cfg.alpha,
               beta=cfg.beta, **{**common, "plugins": [*common["plugins"], ResumableReplay()]})
