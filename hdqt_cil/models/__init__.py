"""Backbones split into a feature extractor and a linear classifier (iCaRL needs the split).

A backbone module registers `build(cfg, input_shape) -> feature extractor` (a module with `out_features`) with
`MODELS.register(name, SettingsClass)`; `build_model` puts the image normalisation in front and the classifier
behind it. A feature extractor may also say where it splits into shared lower blocks and an upper block:
`split() -> (trunk, branch)`, the two holding its own modules, `branch(trunk(x))` its features (MEMO shares the
trunk and grows a branch per experience: strategies/memo.py).
"""
from dataclasses import dataclass

import torch
from omegaconf import MISSING, OmegaConf
from torch import nn

from ..registry import Registry

MODELS = Registry("model")


@dataclass
class ModelConfig:
    name: str = MISSING


class Classifier(nn.Module):
    """features → classifier. The classifier is sized for every class of the benchmark from the start."""

    def __init__(self, features: nn.Module, num_classes: int):
        super().__init__()
        self.features = features
        self.classifier = nn.Linear(features.out_features, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))


class Blocks(nn.Sequential):
    """Modules applied in turn, with the width of the features they give (a split backbone's branch)."""

    def __init__(self, *modules: nn.Module, out_features: int):
        super().__init__(*modules)
        self.out_features = out_features


class ImageNormalize(nn.Module):
    """uint8 images → float, scaled to [0, 1] and normalised per channel (the model's own first step)."""

    def __init__(self, mean, std):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1))

    def forward(self, x):
        return (x.float() / 255.0 - self.mean) / self.std


class _Normalized(nn.Sequential):
    def __init__(self, normalize: nn.Module, features: nn.Module):
        super().__init__(normalize, features)
        self.out_features = features.out_features


def build_model(model, input_shape: tuple[int, ...], num_classes: int, input_norm: tuple | None = None) -> Classifier:
    """The backbone for inputs of `input_shape` (without the batch dimension): `model` is its settings (the
    `model` config group) or its name (its default settings); `input_norm` = (mean, std) per channel for uint8
    images."""
    name = model if isinstance(model, str) else model.name
    # the model's settings: its defaults, under what `model` gives (model=auto gives a name alone)
    given = {} if isinstance(model, str) else (OmegaConf.to_container(model, resolve=True)
                                              if OmegaConf.is_config(model) else vars(model))
    cfg = OmegaConf.merge(OmegaConf.structured(MODELS.settings(name)), given)
    features = MODELS.builder(name)(cfg, input_shape)
    if input_norm is not None:
        features = _Normalized(ImageNormalize(*input_norm), features)
    return Classifier(features, num_classes)


def split_features(features: nn.Module, needed_by: str) -> tuple[nn.Module, nn.Module]:
    """(trunk, branch) of a feature extractor `build_model` made (the image normalisation joins the trunk);
    ValueError naming the backbone where it has no `split()`."""
    normalize = None
    if isinstance(features, _Normalized):
        normalize, features = features
    if not callable(getattr(features, "split", None)):
        raise ValueError(f"{needed_by} shares a backbone's lower blocks and grows its upper block; the model's "
                         f"{type(features).__name__} does not say where it splits (a `split()` method: "
                         "hdqt_cil/models/__init__.py)")
    trunk, branch = features.split()
    return (trunk if normalize is None else nn.Sequential(normalize, trunk)), branch
