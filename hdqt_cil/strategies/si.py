"""Synaptic intelligence (Zenke et al., ICML 2017): a quadratic penalty c · Σ Ω_i (θ_i − θ*_i)², where Ω_i is
each weight's contribution to the loss decrease along its training path, divided by its total change squared
plus ξ. c = 0.5, ξ = 1 as Mammoth runs it on sequential CIFAR-10 (avalanche's SynapticIntelligencePlugin).

The path integral grows every iteration: an epoch checkpoint keeps it (epoch_state, trainer/checkpoint.py), so a
run resumed inside an experience penalises as the uninterrupted one."""
import copy
from dataclasses import dataclass

from avalanche.training.plugins import SynapticIntelligencePlugin
from avalanche.training.templates import SupervisedTemplate

from ..settings import NON_NEGATIVE, POSITIVE, setting
from .base import STRATEGIES, StrategyConfig


class CheckpointableSIPlugin(SynapticIntelligencePlugin):
    def epoch_state(self):
        return copy.deepcopy((self.syn_data, self.ewc_data))

    def load_epoch_state(self, state) -> None:
        self.syn_data, self.ewc_data = state


@dataclass
class SIConfig(StrategyConfig):
    name: str = "si"
    c: float = setting(0.5, NON_NEGATIVE)  # weight of the penalty
    xi: float = setting(1.0, POSITIVE)  # damping of the importance's denominator


@STRATEGIES.register("si", SIConfig)
def build(cfg, trainer, model, common, data):
    si = CheckpointableSIPlugin(si_lambda=cfg.c, eps=cfg.xi)
    return SupervisedTemplate(model=model, **{**common, "plugins": [*common["plugins"], si]})
