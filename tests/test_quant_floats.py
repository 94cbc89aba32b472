"""The float formats' reference (quant/floats.py): torch's own float8 casts, hand-computed edges, the HDQT authors'
float quantizer on pinned values, unbiased stochastic rounding, and the scaled formats' contracts."""
import hashlib

import pytest
import torch

from hdqt_cil.quant.floats import (E2M1, E4M3, E5M2, FloatFormat, authors_float, microscaled, nvfp4, per_tensor,
                                   round_to_format, rounded_in_float32)
from hdqt_cil.quant.rounding import Counter

# The authors' `dynamic_fpQ` (QuantizedCIL quant.py at da4ce01) run on `_authors_inputs()`: the SHA-256 (first 32
# hex digits) of its float32 outputs in each format.
AUTHORS_DIGESTS = {"e5m2": "3c37511d59db53d294fd55cb8d156933", "e4m3": "89bb4ff704a7c1936dd22b26232fa7d3",
                   "e2m1": "b2cfd3e60db637a2daeb2fad0cd9a8c4", "e5m10": "c2f1f2377349732618f78c0b344ceb88",
                   "e3m2": "b4317fd1513d592f5659488b7b10c330"}
E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _random(n: int, seed: int, low: int, high: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * torch.pow(2.0, torch.randint(low, high, (n,), generator=g).float())


@pytest.mark.parametrize("fmt, dtype", [(E4M3, torch.float8_e4m3fn), (E5M2, torch.float8_e5m2)])
@pytest.mark.parametrize("seed", range(3))
def test_the_float32_rounding_equals_torchs_float8_casts_which_round_to_fp8(fmt, dtype, seed):
    """The exact float32 rule (every format, stochastic rounding too) and torch's cast (what nearest rounding to an
    FP8 format runs) give the same values; the ties between the largest values too, past which both saturate."""
    x = _random(50_000, seed, fmt.min_normal_exponent - fmt.man_bits - 3, 17).clamp(-fmt.max, fmt.max)
    grid = torch.arange(-2000, 2000, dtype=torch.float32) * fmt.smallest / 2  # every tie of the subnormal range
    top = fmt.max * (1 - 2.0 ** -(fmt.man_bits + 2) * torch.arange(-8, 9, dtype=torch.float32))  # ties near max
    for v in (x, grid, top):
        assert torch.equal(rounded_in_float32(v, fmt, "nearest", None), v.clamp(-fmt.max, fmt.max).to(dtype).float())
        assert torch.equal(round_to_format(v, fmt), rounded_in_float32(v, fmt, "nearest", None))


def test_e2m1_is_the_nearest_grid_value_ties_to_the_even_mantissa():
    x = torch.linspace(-7, 7, 2801)
    grid = torch.cat([-E2M1_GRID.flip(0), E2M1_GRID])
    distance = (x[:, None] - grid[None]).abs()
    nearest = grid[distance.argmin(dim=1)]
    tie = (distance.sort(dim=1).values[:, :2].diff(dim=1).squeeze(1) == 0) & (x.abs() < 6)
    got = round_to_format(x, E2M1)
    assert torch.equal(got[~tie], nearest[~tie].clamp(-6, 6))
    ties = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0}
    for value, expected in ties.items():
        assert round_to_format(torch.tensor([value, -value]), E2M1).tolist() == [expected, -expected]


@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M1])
def test_edges_saturate_keep_zero_subnormals_and_nan(fmt):
    tiny, min_normal = fmt.smallest, 2.0 ** fmt.min_normal_exponent
    x = torch.tensor([fmt.max, fmt.max * 1.01, 1e30, float("inf"), -float("inf"), 0.0, -0.0, min_normal, tiny,
                      tiny / 2, tiny * 0.75, float("nan")])
    got = round_to_format(x, fmt)
    expected = [fmt.max, fmt.max, fmt.max, fmt.max, -fmt.max, 0.0, -0.0, min_normal, tiny, 0.0, tiny]
    assert got[:-1].tolist() == expected and torch.isnan(got[-1])
    assert torch.signbit(got[6])  # -0 keeps its sign, as a cast does


def test_formats_refuse_impossible_widths():
    with pytest.raises(ValueError, match="exp_bits=0 must be an integer in 1..8"):
        FloatFormat("bad", 0, 2, 1.0)
    with pytest.raises(ValueError, match="man_bits=24 must be an integer in 0..23"):
        FloatFormat("bad", 5, 24, 1.0)


def _authors_inputs() -> torch.Tensor:
    """Random values over 24 decades, ± powers of two, their neighbours below, and mantissas 1.5, 1.25, 1.125,
    1.0625, 1.9, 1.99 over 81 binades."""
    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(1024, generator=g) * torch.pow(10.0, torch.randint(-12, 13, (1024,), generator=g).float())]
    powers = torch.pow(2.0, torch.arange(-40, 41).float())
    parts += [powers, -powers, torch.nextafter(powers, torch.zeros_like(powers))]
    parts += [powers * m for m in (1.5, 1.25, 1.125, 1.0625, 1.9, 1.99)] + [torch.zeros(3)]
    return torch.cat(parts)


@pytest.mark.parametrize("fmt", sorted(AUTHORS_DIGESTS))
def test_the_authors_float_quantizer_is_reproduced(fmt):
    got = authors_float(_authors_inputs(), int(fmt[1]), int(fmt[3:])).numpy()
    assert hashlib.sha256(got.tobytes()).hexdigest()[:32] == AUTHORS_DIGESTS[fmt]


def test_the_authors_quantizer_keeps_a_mantissa_outside_the_exponent_range_and_rounds_down_past_the_last():
    # E5M2, bias 15, exponents -15..16: 1.9 lies past 1.75, its binade's last mantissa; 1.5·2^-40 and 3e9
    # (1.397·2^31) keep their mantissas at the ends of the range; no subnormals, no saturation to one maximum
    got = authors_float(torch.tensor([1.9, 1.5 * 2**-40, 3e9, 2.0**40, 0.0]), 5, 2)
    assert got.tolist() == [1.75, 1.5 * 2**-15, 1.5 * 2**16, 2**16, 0.0]


@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M1])
def test_stochastic_rounding_is_unbiased_and_lands_on_the_neighbours(fmt):
    low = round_to_format(torch.tensor(1.0), fmt)
    high = low + 2.0 ** -fmt.man_bits
    value = low + 0.3 * (high - low)
    draws = torch.stack([round_to_format(value.expand(4096), fmt, "stochastic", Counter(7, step, 3))
                         for step in range(8)])
    assert set(draws.unique().tolist()) == {low.item(), high.item()}
    assert draws.mean().item() == pytest.approx(value.item(), abs=4 * 0.46 * (high - low).item() / 181)
    with pytest.raises(ValueError, match="needs a Counter"):
        round_to_format(value, fmt, "stochastic")


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
def test_per_tensor_scaling_maps_amax_to_the_formats_max(fmt):
    x = _random(4096, 3, -6, 6).reshape(64, 64)
    values, scale = per_tensor(x, fmt)
    assert values.abs().max() == fmt.max and scale.shape == (1, 1)
    assert torch.equal(round_to_format(values, fmt), values)  # on the grid
    relative = ((values * scale - x).abs() / x.abs().clamp(min=2.0 ** fmt.min_normal_exponent * scale)).max()
    assert relative <= 2.0 ** -(fmt.man_bits + 1) * 1.0001
    zeros, unit = per_tensor(torch.zeros(3, 4), fmt)
    assert torch.equal(zeros, torch.zeros(3, 4)) and unit.item() == 1


def test_mx_blocks_take_a_power_of_two_scale_from_their_largest_value():
    x = _random(8 * 96, 4, -8, 8).reshape(8, 96)
    x[2, 32:64] = 0  # an all-zero block
    values, scale = microscaled(x, E2M1, block=32, dim=1)
    assert values.shape == scale.shape == x.shape
    assert torch.equal(round_to_format(values, E2M1), values)
    assert torch.equal(torch.frexp(scale)[0], torch.full_like(scale, 0.5))  # powers of two
    blocks = scale.reshape(8, 3, 32)
    assert torch.equal(blocks, blocks[..., :1].expand_as(blocks))  # one scale a block
    amax = x.abs().reshape(8, 3, 32).amax(dim=-1)
    ratio = amax / blocks[..., 0]
    assert ((ratio >= 4) & (ratio < 8) | (amax == 0)).all()  # emax(E2M1) = 2: amax / 2^(floor(log2 amax) - 2)
    assert blocks[2, 1, 0] == 1 and torch.equal(values[2, 32:64], torch.zeros(32))
    by_columns, _ = microscaled(x.t().contiguous(), E2M1, block=32, dim=0)
    assert torch.equal(by_columns.t(), values)


def test_nvfp4_blocks_take_an_e4m3_scale_under_one_tensor_scale():
    x = _random(4 * 64, 5, -10, 10).reshape(4, 64)
    values, scale = nvfp4(x)
    tensor_scale = x.abs().max() / (448 * 6)
    block_scales = (scale.reshape(4, 4, 16)[..., 0] / tensor_scale)
    assert torch.allclose(block_scales, round_to_format(block_scales, E4M3), rtol=1e-6)
    assert torch.equal(round_to_format(values, E2M1), values)
    block_amax = x.abs().reshape(4, 4, 16).amax(dim=-1)
    assert torch.allclose((values.abs().reshape(4, 4, 16).amax(dim=-1) * scale.reshape(4, 4, 16)[..., 0]),
                          block_amax, rtol=0.3)  # the largest value of each block lands near 6 · its scale


def test_a_dimension_that_the_block_does_not_divide_ends_in_a_narrower_block():
    """48 values in blocks of 32: the last 16 share one scale taken from them alone, as a block of their own."""
    x = _random(2 * 48, 6, -8, 8).reshape(2, 48)
    values, scale = microscaled(x, E2M1)
    head, _ = microscaled(x[:, :32], E2M1)
    tail, tail_scale = microscaled(torch.cat([x[:, 32:], torch.zeros(2, 16)], dim=1), E2M1)
    assert torch.equal(values, torch.cat([head, tail[:, :16]], dim=1))
    assert torch.equal(scale[:, 32:], tail_scale[:, :16])
    by_rows, row_scale = nvfp4(x.t().contiguous(), dim=0)
    assert by_rows.shape == row_scale.shape == (48, 2)
