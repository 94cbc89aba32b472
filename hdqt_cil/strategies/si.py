"""Synaptic intelligence (Zenke et al., ICML 2017): a quadratic penalty c · Σ Ω_i (θ_i − θ*_i)², with θ* the
weights after the last experience and Ω_i = Σ over experiences of ω_i / (Δ_i² + ξ): ω_i = −Σ_steps g_i · Δθ_i,
weight i's share of the decrease of the task loss along its training path (g the task loss's gradient, Δθ the
step taken), Δ_i its total change over the experience. c = 0.5, ξ = 1 as Mammoth runs it on sequential CIFAR-10
(Mammoth's penalty is c · Σ, as the paper's).

avalanche's SynapticIntelligencePlugin, with four defects mended:
1. on the CPU it keeps the weights (θ before and after each step, θ*) as views of the live parameters
   (`.cpu()` copies nothing there), so every step's Δθ, hence ω and Ω, is zero and θ* follows θ: SI trained as
   fine-tuning does. We keep copies;
2. it clips Ω at 0.001 from above, which flattens every important weight's Ω to one small value: Ω is not
   clipped;
3. its penalty is si_lambda/2 · Σ: we hand it si_lambda = 2c;
4. its ω takes the gradient of the whole loss, the SI penalty included: from the second experience on, pulling a
   weight back towards θ* lowered its importance. We take the penalty's gradient (2cΩ(θ − θ*) before the step)
   back out, so that g is the task loss's, as in the paper and its authors' code.

The path integral grows every iteration: an epoch checkpoint keeps it (epoch_state, trainer/checkpoint.py), so a
run resumed inside an experience penalises as the uninterrupted one."""
import copy
import math
from dataclasses import dataclass

from avalanche.training.plugins import SynapticIntelligencePlugin
from avalanche.training.templates import SupervisedTemplate

from ..settings import NON_NEGATIVE, POSITIVE, setting
from .base import STRATEGIES, StrategyConfig


class SIPlugin(SynapticIntelligencePlugin):
    def __init__(self, c: float, xi: float):
        super().__init__(si_lambda=2 * c, eps=xi)

    def _copy_weights(self, model, target) -> None:
        for name, param in self.allowed_parameters(model, self.excluded_parameters):
            target[name].data = param.detach().flatten().to("cpu", copy=True)

    def before_training_exp(self, strategy, **kwargs):
        super().before_training_exp(strategy, **kwargs)
        self._copy_weights(strategy.model, self.ewc_data[0])  # θ*

    def before_training_iteration(self, strategy, **kwargs):
        self._copy_weights(strategy.model, self.syn_data["old_theta"])

    def after_training_iteration(self, strategy, **kwargs):
        """ω's step −g·Δθ (kept negated, as avalanche does), g the task loss's gradient."""
        syn, (saved, importance) = self.syn_data, self.ewc_data
        self._copy_weights(strategy.model, syn["new_theta"])
        self.extract_grad(strategy.model, syn["grad"], self.excluded_parameters)
        for name, trajectory in syn["trajectory"].items():
            before = syn["old_theta"][name].data
            penalty_grad = self.si_lambda[-1] * importance[name].data * (before - saved[name].data)
            trajectory.data += (syn["grad"][name].data - penalty_grad) * (syn["new_theta"][name].data - before)

    def after_training_exp(self, strategy, **kwargs):
        self.update_ewc_data(strategy.model, self.ewc_data, self.syn_data, math.inf, self.excluded_parameters, 1,
                             eps=self.eps)

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
    si = SIPlugin(cfg.c, cfg.xi)
    return SupervisedTemplate(model=model, **{**common, "plugins": [*common["plugins"], si]})
