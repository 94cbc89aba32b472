"""Backbones split into a feature extractor and a linear classifier (iCaRL needs the split)."""
import math

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


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, hidden: int | None = None) -> Classifier:
    """Build a backbone for inputs of `input_shape` (without the batch dimension)."""
    if name == "resnet32":
        if len(input_shape) != 3:
            raise ValueError(f"model=resnet32 needs image inputs (C, H, W); the benchmark gives shape {input_shape}")
        features = ResNetFeatures(in_channels=input_shape[0])
    elif name == "mlp":
        features = MLPFeatures(math.prod(input_shape), hidden)
    else:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return Classifier(features, num_classes)
