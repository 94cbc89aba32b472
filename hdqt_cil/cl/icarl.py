"""iCaRL as the HDQT authors' code base (PyCIL) trains it, beside avalanche's original formulation.

avalanche's `ICaRL` is Rebuffi et al.'s: sigmoid binary cross-entropy whose old-class targets are the old model's
outputs, scored by the nearest mean of exemplars. PyCIL's iCaRL, which the paper reports, trains with
softmax cross-entropy over every class seen so far plus the old model's old-class logits distilled (λ = 1, T = 2),
on the new data joined with the exemplar memory (herding, the memory split evenly over the seen classes), and
is scored by its trained head ("CNN accuracy").
"""
import torch
from avalanche.core import SupervisedPlugin
from avalanche.training.storage_policy import HerdingSelectionStrategy, ParametricBuffer

from .lwf import LwFPlugin


class DeviceHerding(HerdingSelectionStrategy):
    """avalanche's herding order, computed the same way, without its two host round trips per step (the taken
    set indexed through a growing Python list, the argmin read back): on a GPU shared by several runs those
    made iCaRL's exemplar selection take longer than the experience's training."""

    @torch.no_grad()
    def make_sorted_indices_from_features(self, features: torch.Tensor) -> list[int]:
        center = features.mean(dim=0)
        current_center = center * 0
        taken = torch.zeros(len(features), dtype=torch.bool, device=features.device)
        order = torch.empty(len(features), dtype=torch.int64, device=features.device)
        for i in range(len(features)):
            candidate_centers = current_center * i / (i + 1) + features / (i + 1)
            distances = (candidate_centers - center).pow(2).sum(dim=1).masked_fill_(taken, float("inf"))
            best = distances.argmin()
            order[i] = best
            taken[best] = True
            current_center = candidate_centers[best]
        return order.tolist()


class HerdingMemory(SupervisedPlugin):
    """A class-balanced exemplar memory chosen by herding on `layer` features, joined to each experience's data."""

    def __init__(self, mem_size: int, model, layer: str = "features"):
        super().__init__()
        self.storage = ParametricBuffer(mem_size, groupby="class",
                                        selection_strategy=DeviceHerding(model, layer))

    def after_train_dataset_adaptation(self, strategy, **kwargs):
        if len(self.storage.buffer):
            strategy.adapted_dataset = strategy.adapted_dataset.concat(self.storage.buffer)

    def after_training_exp(self, strategy, **kwargs):
        self.storage.post_adapt(strategy, strategy.experience)


def pycil_icarl_plugins(model, memory_size: int, temperature: float) -> list:
    return [LwFPlugin(lamb=1.0, temperature=temperature, current_only=False), HerdingMemory(memory_size, model)]
