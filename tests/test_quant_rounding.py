import math

import pytest
import torch

from hdqt_cil.quant.rounding import (Counter, counter_key, counter_uniform, round_nearest, round_stochastic,
                                     round_stochastic_log2)

MASK = 0xFFFFFFFF


def reference_uniform(index, seed, step, role):
    """docs/numerics.md written out in Python integers."""
    def mix(x):
        x ^= x >> 16
        x = (x * 0x7FEB352D) & MASK
        x ^= x >> 15
        x = (x * 0x846CA68B) & MASK
        return x ^ (x >> 16)
    key = mix(seed ^ mix((step * 0x9E3779B9 + role) & MASK))
    return (mix(index ^ key) >> 8) * 2.0**-24


def test_counter_follows_the_contract():
    u = counter_uniform((3, 100_000), seed=7, step=123456, role=42)
    for index in [0, 1, 2, 99_999, 123_457, 299_999]:
        assert u.flatten()[index].item() == reference_uniform(index, 7, 123456, 42)
    assert counter_key(2**32 + 5, 0, 0) == counter_key(5, 0, 0)  # all arithmetic modulo 2^32


@pytest.mark.parametrize("step", [0, 1, 77, 2**31 + 5, 2**33 + 9])
def test_a_tensor_step_gives_the_int_steps_key_and_bits(step):
    """A layer's step counter lives on its device as an int64 tensor (so a CUDA graph replays fresh bits)."""
    for seed, role in [(0, 0), (7, 42), (2**32 + 5, 1000)]:
        key = counter_key(seed, torch.tensor(step), role)
        assert key.dtype == torch.int64 and key.item() == counter_key(seed, step, role)
    assert torch.equal(Counter(7, torch.tensor(step), 3).uniform((4, 50)), Counter(7, step, 3).uniform((4, 50)))


def test_counter_chunking_does_not_change_numbers():
    n = 2**18 + 1000  # crosses the CPU chunk boundary
    u = counter_uniform((n,), 1, 2, 3)
    for index in [2**18 - 1, 2**18, n - 1]:
        assert u[index].item() == reference_uniform(index, 1, 2, 3)


def test_counter_is_uniform_and_reproducible():
    u = Counter(3, 9, 1).uniform((200_000,))
    assert u.min() >= 0 and u.max() < 1 and u.dtype == torch.float32
    assert abs(u.mean().item() - 0.5) < 0.005 and abs(u.var().item() - 1 / 12) < 0.002
    assert torch.equal(u, Counter(3, 9, 1).uniform((200_000,)))


@pytest.mark.parametrize("other", [Counter(3, 10, 1), Counter(3, 9, 2), Counter(4, 9, 1)])
def test_other_step_role_or_seed_gives_other_bits(other):
    u, v = Counter(3, 9, 1).uniform((10_000,)), other.uniform((10_000,))
    assert (u == v).float().mean() < 0.01
    assert abs(torch.corrcoef(torch.stack([u, v]))[0, 1]) < 0.05


def test_nearest_ties_go_to_even():
    v = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4999998, 3.5000002])
    assert round_nearest(v).tolist() == [0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 2.0, 4.0]


def test_stochastic_rounding_is_unbiased():
    v = torch.tensor([0.0, 0.1, 0.5, 0.9, 2.25, -3.7, 6.999, -0.01, 5.0])
    draws = 4000
    total = torch.zeros_like(v)
    for step in range(draws):
        q = round_stochastic(v, Counter(0, step, 5).uniform(v.shape))
        assert torch.all((q == torch.floor(v)) | (q == torch.ceil(v)))
        total += q
    bound = 4 * 0.5 / math.sqrt(draws)
    assert torch.all((total / draws - v).abs() < bound)


def test_stochastic_rounding_keeps_integers():
    v = torch.arange(-7, 8).float()
    assert torch.equal(round_stochastic(v, torch.rand(v.shape)), v)


def test_log2_rounding_is_unbiased_and_on_the_grid():
    v = torch.tensor([0.0, 0.3, -0.8, 1.0, 1.5, -3.0, 5.0, 47.0, -64.0])
    draws = 4000
    grid = {0.0} | {sign * 2.0**k for k in range(7) for sign in (1, -1)}
    total = torch.zeros_like(v)
    for step in range(draws):
        q = round_stochastic_log2(v, Counter(1, step, 0).uniform(v.shape))
        assert set(q.tolist()) <= grid
        total += q
    spread = torch.clamp(v.abs(), min=1)  # the gap between the two neighbours is at most max(1, |v|)
    assert torch.all((total / draws - v).abs() < 4 * 0.5 * spread / math.sqrt(draws))
