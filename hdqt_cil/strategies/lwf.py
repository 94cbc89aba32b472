"""Learning without Forgetting for class-incremental learning, as the HDQT authors' code base (PyCIL) runs it.

avalanche's LwF adds its distillation to a cross-entropy over *all* logits, so the new classes' targets push
every old logit down and, without exemplars, the model ends up predicting only the newest classes: on HAPT
its accuracy equals plain fine-tuning. PyCIL's LwF, the baseline the paper reports, restricts the
cross-entropy to the current experience's classes and distils the old model's old-class logits:

    loss = CE(logits[:, current], y - known) + λ · KD_T(logits[:, old], old_model(x)[:, old])

with KD_T the soft cross-entropy between temperature-T softmaxes (λ = 3, T = 2 in PyCIL). Classes are
relabelled in arrival order (benchmarks/split.py), so old classes are 0..known-1.

PyCIL's iCaRL trains with the same distillation but a cross-entropy over every class seen so far (the exemplars
bring the old ones): `current_only=False`, λ = 1 (strategies/icarl.py). Both split the logits into old and new
classes, so neither is offered for domain-incremental learning (the same classes in every experience).
"""
import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from avalanche.core import SupervisedPlugin
from avalanche.training.templates import SupervisedTemplate

from ..settings import NON_NEGATIVE, POSITIVE, setting
from .base import STRATEGIES, StrategyConfig


def soft_cross_entropy(logits, teacher_logits, temperature: float):
    """Mean over the batch of −Σ softmax(teacher/T) · log_softmax(logits/T)."""
    target = F.softmax(teacher_logits / temperature, dim=1)
    return -(target * F.log_softmax(logits / temperature, dim=1)).sum(dim=1).mean()


class LwFPlugin(SupervisedPlugin):
    def __init__(self, lamb: float = 3.0, temperature: float = 2.0, current_only: bool = True):
        super().__init__()
        self.lamb = lamb
        self.temperature = temperature
        self.current_only = current_only
        self.old_model = None
        self.known = 0
        self.total = 0

    def before_training_exp(self, strategy, **kwargs):
        self.total = self.known + len(strategy.experience.classes_in_this_experience)

    def before_backward(self, strategy, **kwargs):
        logits = strategy.mb_output
        first = self.known if self.current_only else 0
        loss = F.cross_entropy(logits[:, first:self.total], strategy.mb_y - first)
        if self.old_model is not None:
            with torch.no_grad():
                old_logits = self.old_model(strategy.mb_x)[:, : self.known]
            loss = loss + self.lamb * soft_cross_entropy(logits[:, : self.known], old_logits, self.temperature)
        strategy.loss = loss

    def after_training_exp(self, strategy, **kwargs):
        self.known = self.total
        self.old_model = copy.deepcopy(strategy.model).eval()
        for p in self.old_model.parameters():
            p.requires_grad_(False)


@dataclass
class LwFConfig(StrategyConfig):
    name: str = "lwf"
    lamb: float = setting(3.0, NON_NEGATIVE)  # weight of the distillation loss
    temperature: float = setting(2.0, POSITIVE)


@STRATEGIES.register("lwf", LwFConfig, teachers=("old_model",), scenarios=("class", "task"))
def build(cfg, trainer, model, common, data):
    common = {**common, "plugins": [*common["plugins"], LwFPlugin(cfg.lamb, cfg.temperature)]}
    return SupervisedTemplate(model=model, **common)
