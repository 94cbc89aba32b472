"""MEMO (Zhou et al., ICLR 2023, "A Model or 603 Exemplars: Towards Memory-Efficient Class-Incremental Learning")
as PyCIL (the HDQT authors' code base) trains it: DER (strategies/dyn_der.py) whose new extractor per experience is
the backbone's upper block alone.

The backbone splits (models/__init__.py, `split()`) into generalised lower blocks, one copy shared by every
experience, and a specialised upper block: ResNet-32's stem and first two stages against its last stage and the
pooling, as PyCIL's memo_resnet32; the MLP's hidden layers but the last against its last hidden layer. Each
experience adds a specialised block, initialised from the newest one, and freezes the older ones (their parameters
and their BatchNorm statistics), as PyCIL's train_adaptive=false. The shared blocks train on in every experience,
on the new data and the exemplars (PyCIL's train_base=true, exps/memo.json); with `train_base: false` they freeze
after the first. The rest is DER's: one classifier over the specialised blocks' concatenated features, rebuilt
wider with the old classes' weights; the auxiliary head (new classes + one "old") on the newest block's features,
its cross-entropy added with weight 1 (PyCIL's alpha_aux); the weight alignment after each experience but the
first; the herding memory on the concatenated features; scored by the classifier.

Quantization reaches the new blocks as DER's: the specialised block is a copy of a quantized one, and the run's
quantization plugin converts the new heads at the experience's start.
"""
from dataclasses import dataclass

from torch import nn

from ..models import split_features
from ..settings import BOOL, setting
from .base import STRATEGIES
from .dyn_der import ConcatenatedFeatures, DynDERConfig, expanding_strategy
from .rehearsal import needs_exemplar_per_class


class SharedTrunkFeatures(ConcatenatedFeatures):
    """The shared blocks once, then the specialised blocks side by side on what they give. `train_trunk`: the
    shared blocks keep training once a second specialised block is added."""

    def __init__(self, trunk: nn.Module, first: nn.Module, train_trunk: bool):
        super().__init__(first)
        self.trunk, self.train_trunk = trunk, train_trunk

    def forward(self, x):
        return super().forward(self.trunk(x))

    def frozen(self) -> list[nn.Module]:
        old = super().frozen()
        return old if self.train_trunk or not old else [self.trunk, *old]


@dataclass
class MemoConfig(DynDERConfig):
    name: str = "memo"
    train_base: bool = setting(True, BOOL)  # the shared blocks train in every experience (PyCIL: true); false: frozen


@STRATEGIES.register("memo", MemoConfig, fits=needs_exemplar_per_class("MEMO"), scenarios=("class", "task"))
def build(cfg, trainer, model, common, data):
    trunk, branch = split_features(model.features, "strategy=memo")
    return expanding_strategy(cfg, trainer, SharedTrunkFeatures(trunk, branch, cfg.train_base), common)
