"""The HAR backbone of the HDQT paper: Linear(d,d)+ReLU, Linear(d,d)+ReLU, then the classifier.

The hidden layers have no bias (as in the authors' network); d is the number of input features.
"""
from torch import nn


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
