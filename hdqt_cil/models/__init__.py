"""Backbones split into a feature extractor and a linear classifier (iCaRL needs the split)."""
import math

import torch
from torch import nn

from .mlp import MLPFeatures
from .resnet32 import ResNetFeatures

MODELS = ("resnet32", "mlp")


class Classifier(nn.Module):
    """features → classifier. The classifier is sized for every class of the benchmark from the start."""

    def __init__(self, features: nn.Module, num_classes: int):
        super().__init__()
        self.features = features
        self.classifier = nn.Linear(features.out_features, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))


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


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, hidden: int | None = None,
                input_norm: tuple | None = None) -> Classifier:
    """Build a backbone for inputs of `input_shape` (without the batch dimension); `input_norm` = (mean, std)
    for uint8 images."""
    if name == "resnet32":
        if len(input_shape) != 3:
            raise ValueError(f"model=resnet32 needs image inputs (C, H, W); the benchmark gives shape {input_shape}")
        features = ResNetFeatures(in_channels=input_shape[0])
        if input_norm is not None:
            features = _Normalized(ImageNormalize(*input_norm), features)
    elif name == "mlp":
        features = MLPFeatures(math.prod(input_shape), hidden)
    else:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return Classifier(features, num_classes)
