"""CIFAR ResNet-32 (He et al. 2016, section 4.2): 3 stages of 5 basic blocks, 16/32/64 channels.

Shortcuts are "option A": stride-2 subsampling plus zero-padded channels, so the network has no projection
convolutions and about 0.46 M parameters, as in the HDQT paper's backbone.
"""
from dataclasses import dataclass

import torch.nn.functional as F
from torch import nn

from . import MODELS, Blocks, ModelConfig


class _PadShortcut(nn.Module):
    """Option-A shortcut: subsample spatially and pad the new channels with zeros (parameter free)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.stride = stride
        self.pad = out_channels - in_channels

    def forward(self, x):
        x = x[:, :, :: self.stride, :: self.stride]
        half = self.pad // 2
        return F.pad(x, (0, 0, 0, 0, half, self.pad - half))


class _WithReLUModules(nn.Module):
    """A model unpickled from a checkpoint written while ResNet-32 applied F.relu gets its ReLU modules."""
    _relus: tuple[str, ...] = ()

    def __setstate__(self, state):
        super().__setstate__(state)
        for name in self._relus:
            self._modules.setdefault(name, nn.ReLU())


class BasicBlock(_WithReLUModules):
    _relus = ("relu1", "relu2")

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        needs_shortcut = stride != 1 or in_channels != out_channels
        self.shortcut = _PadShortcut(in_channels, out_channels, stride) if needs_shortcut else nn.Identity()
        self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()  # modules, so that a scheme can swap them (quant/compact.py)

    def forward(self, x):
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + self.shortcut(x))


class ResNetFeatures(_WithReLUModules):
    """Everything up to the global-average-pooled 64-d embedding (iCaRL's feature extractor)."""
    _relus = ("relu",)

    def __init__(self, in_channels: int = 3, blocks_per_stage: int = 5, widths=(16, 32, 64)):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU()
        stages, channels = [], widths[0]
        for i, width in enumerate(widths):
            blocks = []
            for j in range(blocks_per_stage):
                blocks.append(BasicBlock(channels, width, 2 if (i > 0 and j == 0) else 1))
                channels = width
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.out_features = channels
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.stages(x)
        return F.adaptive_avg_pool2d(x, 1).flatten(1)

    def split(self) -> tuple[nn.Module, Blocks]:
        """PyCIL's MEMO split of ResNet-32 (convs/memo_cifar_resnet.py): the stem and the first two stages
        shared, the last stage and the pooling the branch."""
        trunk = nn.Sequential(self.conv1, self.bn1, self.relu, self.stages[:-1])
        return trunk, Blocks(self.stages[-1], nn.AdaptiveAvgPool2d(1), nn.Flatten(1), out_features=self.out_features)


@dataclass
class ResNet32Config(ModelConfig):
    name: str = "resnet32"


@MODELS.register("resnet32", ResNet32Config)
def build(cfg, input_shape: tuple[int, ...]) -> ResNetFeatures:
    if len(input_shape) != 3:
        raise ValueError(f"model=resnet32 needs image inputs (C, H, W); the benchmark gives shape {input_shape}")
    return ResNetFeatures(in_channels=input_shape[0])
