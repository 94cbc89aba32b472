"""DER, dynamically expandable representation (Yan et al., CVPR 2021), as PyCIL (the HDQT authors' code base) trains
it. `der` is DER++ (dark experience replay), hence the name.

Each experience adds a feature extractor of the configured backbone, initialised from the previous one, and freezes
the older ones (their parameters and their BatchNorm statistics: they run in eval mode). One classifier over every
class seen so far reads the extractors' concatenated features; it is rebuilt wider at each experience with the old
classes' weights copied in (their weights on the new extractor's features start fresh). From the second experience
on, an auxiliary classifier on the new extractor's features alone tells the new classes apart from one "old" class,
and its cross-entropy is added to the main one (weight 1 in PyCIL). After each experience but the first, the new
classes' weight rows are scaled to the old rows' mean norm (PyCIL's `weight_align`, from WA), then the exemplar
memory is chosen by herding on the concatenated features, split evenly over the seen classes (PyCIL's
fixed_memory=false, as iCaRL here). Scored by the classifier ("CNN accuracy").

Not here: the paper's channel-level masks and pruning of each new extractor, which PyCIL does not implement either.

The model's training forward returns the classifier's logits followed by the auxiliary ones in one tensor, so that
a CUDA-graph replay of the whole step (trainer/cuda_graphs.py) carries both; the strategy splits them once the
plugins' after_forward has seen the model's output whole (as avalanche hands it to them: the gradient diagnostics
take G there, trainer/diagnostics.py), before the loss and the plugins' later callbacks. Quantization reaches the
new layers before their first forward: the extractor is a copy of a quantized one, and the run's quantization plugin
converts the new heads, in place, at the experience's start (quant/convert.py), the optimizer keeping the same
parameters.
"""
import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from avalanche.training.templates import SupervisedTemplate
from torch import nn

from ..settings import BOOL, NON_NEGATIVE, setting
from .base import STRATEGIES, StrategyConfig
from .icarl import HerdingMemory
from .rehearsal import needs_exemplar_per_class


def _head(in_features: int, out_features: int) -> nn.Linear:
    """A linear head initialised as PyCIL's SimpleLinear: Kaiming-uniform weights for a linear layer, zero bias."""
    head = nn.Linear(in_features, out_features)
    nn.init.kaiming_uniform_(head.weight, nonlinearity="linear")
    nn.init.zeros_(head.bias)
    return head


class ConcatenatedFeatures(nn.Module):
    """The extractors side by side: the concatenation of their features (what the classifier and herding read)."""

    def __init__(self, first: nn.Module):
        super().__init__()
        self.extractors = nn.ModuleList([first])

    def forward(self, x):
        return torch.cat([extractor(x) for extractor in self.extractors], dim=1)

    def frozen(self) -> list[nn.Module]:
        """The parts that train no more once a newer extractor is added: every extractor but the newest."""
        return list(self.extractors[:-1])


class ExpandableNet(nn.Module):
    """PyCIL's DERNet over the project's backbones: `features` (ConcatenatedFeatures, or a subclass that puts
    shared blocks in front: strategies/memo.py), `classifier` over the seen classes, `aux_classifier` (new classes
    + "old") on the newest extractor's features. Built by `expand`."""

    def __init__(self, features: ConcatenatedFeatures):
        super().__init__()
        self.features = features
        self.width = features.extractors[0].out_features
        self.classifier = None
        self.aux_classifier = None
        self.new_classes = 0  # the current experience's

    @property
    def known(self) -> int:
        """Classes seen before the current experience (the auxiliary head's "old" class)."""
        return self.classifier.out_features - self.new_classes

    def expand(self, new_classes: int) -> None:
        """Make room for `new_classes` more classes: after the first experience a new extractor, copied from the
        newest, the older ones frozen (`features.frozen()`); a wider classifier holding the old one's weights; a
        new auxiliary head."""
        extractors, self.new_classes = self.features.extractors, new_classes
        if self.classifier is None:
            self.classifier = _head(self.width, new_classes)
            return
        extractors.append(copy.deepcopy(extractors[-1]))
        for old in self.features.frozen():
            for p in old.parameters():
                p.requires_grad_(False)
                p.grad = None
            old.eval()
        old_head, known, device = self.classifier, self.classifier.out_features, self.classifier.weight.device
        self.classifier = _head(self.width * len(extractors), known + new_classes).to(device)
        with torch.no_grad():
            self.classifier.weight[:known, : old_head.in_features] = old_head.weight
            self.classifier.bias[:known] = old_head.bias
        self.aux_classifier = _head(self.width, new_classes + 1).to(device)

    def train(self, mode: bool = True):
        """The frozen parts stay in eval mode (PyCIL's `train`), so that their BatchNorm statistics hold."""
        super().train(mode)
        for old in self.features.frozen():
            old.eval()
        return self

    def forward(self, x):
        features = self.features(x)
        logits = self.classifier(features)
        if not self.training or self.aux_classifier is None:
            return logits
        return torch.cat([logits, self.aux_classifier(features[:, -self.width:])], dim=1)

    @torch.no_grad()
    def align_weights(self) -> None:
        """Scale the new classes' weight rows to the old rows' mean L2 norm (PyCIL's `weight_align`)."""
        weight, known = self.classifier.weight, self.known
        norms = weight.norm(dim=1)
        weight[known:] *= norms[:known].mean() / norms[known:].mean()


class DynamicDER(SupervisedTemplate):
    """The expansion before each training experience's optimizer is made, the auxiliary loss, the weight alignment
    after training (before the exemplar memory is chosen)."""

    def __init__(self, *, model: ExpandableNet, aux_weight: float, weight_align: bool, **kwargs):
        super().__init__(model=model, **kwargs)
        self.aux_weight, self.weight_align = aux_weight, weight_align
        self.aux_output = None

    def model_adaptation(self, model=None):
        if self.is_training:
            self.model.expand(len(self.experience.classes_in_this_experience))
        return super().model_adaptation(model)

    def make_optimizer(self, **kwargs):
        """The optimizer over the trainable parameters alone, as PyCIL filters on requires_grad: the frozen
        extractors get no weight decay or momentum, and the old classifier is replaced by the wider one."""
        trainable = {name: p for name, p in self.model.named_parameters() if p.requires_grad}
        self.optimizer.param_groups[0]["params"] = list(trainable.values())
        self.optimizer.state.clear()
        self.optimized_param_id = trainable

    def _after_forward(self, **kwargs):
        super()._after_forward(**kwargs)  # the plugins first: they see the model's output whole (module docstring)
        if self.is_training:
            seen = self.model.classifier.out_features
            self.mb_output, self.aux_output = self.mb_output[:, :seen], self.mb_output[:, seen:]

    def criterion(self):
        loss = super().criterion()
        if not self.is_training or not self.model.known:
            return loss
        aux_targets = (self.mb_y - self.model.known + 1).clamp(min=0)  # every old class is class 0
        return loss + self.aux_weight * F.cross_entropy(self.aux_output, aux_targets)

    def _after_training_exp(self, **kwargs):
        if self.weight_align and self.model.known:
            self.model.align_weights()
        super()._after_training_exp(**kwargs)

    def _train_cleanup(self):
        super()._train_cleanup()
        self.aux_output = None  # a tensor in the autograd graph: checkpoints could not pickle it


@dataclass
class DynDERConfig(StrategyConfig):
    name: str = "dyn_der"
    aux_weight: float = setting(1.0, NON_NEGATIVE)  # weight of the auxiliary cross-entropy (PyCIL: 1)
    weight_align: bool = setting(True, BOOL)  # scale the new classes' weights after each experience (PyCIL does)


def expanding_strategy(cfg, trainer, features: ConcatenatedFeatures, common) -> DynamicDER:
    """The strategy around an ExpandableNet over `features`, with its herding memory (DER's and MEMO's)."""
    net = ExpandableNet(features)
    memory = HerdingMemory(trainer.memory_size, net)
    return DynamicDER(model=net, aux_weight=cfg.aux_weight, weight_align=cfg.weight_align,
                      **{**common, "plugins": [*common["plugins"], memory]})


@STRATEGIES.register("dyn_der", DynDERConfig, fits=needs_exemplar_per_class("DER"), scenarios=("class", "task"))
def build(cfg, trainer, model, common, data):
    return expanding_strategy(cfg, trainer, ConcatenatedFeatures(model.features), common)
