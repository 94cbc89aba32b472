"""Elastic weight consolidation (Kirkpatrick et al., PNAS 2017), online form (Schwarz et al., 2018): a quadratic
penalty λ/2 · Σ F_i (θ_i − θ*_i)² that holds each weight near its value after the last experience, weighted by its
diagonal Fisher information, accumulated over experiences with a decay γ. λ = 10, γ = 1 as Mammoth's online EWC
runs on sequential CIFAR-10 (avalanche's EWC)."""
from dataclasses import dataclass

from avalanche.training import EWC

from ..settings import NON_NEGATIVE, setting
from .base import STRATEGIES, StrategyConfig


@dataclass
class EWCConfig(StrategyConfig):
    name: str = "ewc"
    ewc_lambda: float = setting(10.0, NON_NEGATIVE)  # weight of the penalty
    decay: float = setting(1.0, NON_NEGATIVE)  # γ: the older experiences' Fisher information kept (online mode)


@STRATEGIES.register("ewc", EWCConfig)
def build(cfg, trainer, model, common, data):
    return EWC(model=model, ewc_lambda=cfg.ewc_lambda, mode="online", decay_factor=cfg.decay, **common)
