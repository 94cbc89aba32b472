"""CIFAR ResNet-32 (He et al. 2016, section 4.2): 3 stages of 5 basic blocks, 16/32/64 channels.

Shortcuts are "option A": stride-2 subsampling plus zero-padded channels, so the network has no projection
convolutions and about 0.46 M parameters, as in the HDQT paper's backbone.
"""
from dataclasses import dataclass

import torch.nn.functional as F
from torch import nn

from . import MODELS, ModelConfig


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


class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        needs_shortcut = stride != 1 or in_channels != out_channels
        self.shortcut = _PadShortcut(in_channels, out_channels, stride) if needs_shortcut else nn.Identity()

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNetFeatures(nn.Module):
    """Everything up to the global-average-pooled 64-d embedding (iCaRL's feature extractor)."""

    def __init__(self, in_channels: int = 3, blocks_per_stage: int = 5, widths=(16, 32, 64)):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
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
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.stages(x)
        return F.adaptive_avg_pool2d(x, 1).flatten(1)


@dataclass
class ResNet32Config(ModelConfig):
    name: str = "resnet32"


@MODELS.register("resnet32", ResNet32Config)
def build(cfg, input_shape: tuple[int, ...]) -> ResNetFeatures:
    if len(input_shape) != 3:
        raise ValueError(f"model=resnet32 needs image inputs (C, H, W); the benchmark gives shape {input_shape}")
    return ResNetFeatures(in_channels=input_shape[0])
