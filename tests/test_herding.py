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


def test_herding_with_a_limit_picks_the_same_first_exemplars_and_orders_the_rest_by_index():
    model = nn.Sequential()
    model.features = nn.Identity()
    features = torch.randn(500, 32, generator=torch.Generator().manual_seed(3))
    full = DeviceHerding(model, "features").make_sorted_indices_from_features(features)
    for limit in (1, 20, 499, 500, 800):
        got = DeviceHerding(model, "features", limit).make_sorted_indices_from_features(features)
        picks = min(limit, 500)
        assert got[:picks] == full[:picks] and sorted(got) == list(range(500))
        assert got[picks:] == sorted(got[picks:])
