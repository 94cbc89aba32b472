import torch
from avalanche.training.storage_policy import HerdingSelectionStrategy
from torch import nn

from hdqt_cil.strategies.icarl import DeviceHerding


def test_device_herding_gives_avalanches_order():
    model = nn.Sequential()
    model.features = nn.Identity()
    for seed, (n, d) in enumerate(((1, 4), (7, 3), (300, 64))):
        features = torch.randn(n, d, generator=torch.Generator().manual_seed(seed))
        reference = HerdingSelectionStrategy(model, "features").make_sorted_indices_from_features(features)
        got = DeviceHerding(model, "features").make_sorted_indices_from_features(features)
        assert got == reference and sorted(got) == list(range(n))
