"""The HAR backbone of the HDQT paper: Linear(d,d)+ReLU, Linear(d,d)+ReLU, then the classifier.

The hidden layers have no bias (as in the authors' network); d is the number of input features.
"""
import math
from dataclasses import dataclass
from typing import Optional

from torch import nn

from ..settings import POSITIVE_INT, optional, setting
from . import MODELS, Blocks, ModelConfig


class MLPFeatures(nn.Module):
    def __init__(self, in_features: int, hidden: int | None = None):
        super().__init__()
        hidden = hidden or in_features
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, hidden, bias=False),
            nn.ReLU(),
            nn.Linear(hidden, hidden, bias=False),
            nn.ReLU(),
        )
        self.out_features = hidden

    def forward(self, x):
        return self.net(x)

    def split(self) -> tuple[nn.Module, Blocks]:
        """Every hidden layer but the last shared, the last one (with its ReLU) the branch: as ResNet-32's last
        stage, the layer that gives the features."""
        return self.net[:-2], Blocks(*self.net[-2:], out_features=self.out_features)


@dataclass
class MLPConfig(ModelConfig):
    name: str = "mlp"
    # Width of the two hidden layers; null = the number of input features (the paper's HAR MLP).
    hidden: Optional[int] = setting(None, optional(POSITIVE_INT))


@MODELS.register("mlp", MLPConfig)
def build(cfg, input_shape: tuple[int, ...]) -> MLPFeatures:
    return MLPFeatures(math.prod(input_shape), cfg.hidden)
