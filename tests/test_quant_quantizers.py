import pytest
import torch

from hdqt_cil.quant.quantizers import (QuantSpec, compute_scale, dequantize, level_range, quantize, reduction_dims,
                                      sawb_moments)
from hdqt_cil.quant.rounding import Counter

F32 = torch.float32


def test_signed_max_rule_with_clip():
    t = torch.tensor([-2.0, 0.3, 1.0, -0.01])
    spec = QuantSpec(4, "auto", "max", 0.975)
    levels, scale = quantize(t, spec)
    expected_scale = (torch.tensor(2.0) * torch.tensor(0.975, dtype=F32)) / 7
    assert scale.item() == expected_scale.item()
    assert torch.equal(levels, torch.clamp(torch.round(t / expected_scale), -7, 7))
    assert levels[0] == -7  # clipped: |v| > 7


def test_auto_is_unsigned_without_negatives():
    t = torch.tensor([0.0, 0.5, 3.0, 1.2])
    levels, scale = quantize(t, QuantSpec(4, "auto", "max", 1.0))
    assert scale.item() == torch.tensor(3.0 / 15, dtype=F32).item()
    assert levels.max() == 15 and levels.min() == 0
    assert [x.item() for x in level_range(t, QuantSpec(4, "auto"))] == [0.0, 15.0]
    assert [x.item() for x in level_range(-t, QuantSpec(4, "auto"))] == [-7.0, 7.0]


def test_true_division_decides_ties():
    # A Hadamard-transformed integer operand with max 46: s = 46/7; -23 / s = -3.5 exactly -> -4 (half to even),
    # while -23 * (1/s) is -3.4999998 in float32 and would give -3.
    t = torch.tensor([-23.0, 46.0])
    levels, scale = quantize(t, QuantSpec(4, "signed", "max", 1.0))
    assert levels.tolist() == [-4.0, 7.0]
    assert torch.round(t[0] * (1 / scale)).item() == -3.0


@pytest.mark.parametrize("granularity,shape", [("tensor", (1, 1, 1)), ("sample", (3, 1, 1)), ("row", (3, 4, 1))])
def test_granularity_is_the_reduced_dims(granularity, shape):
    t = torch.randn(3, 4, 5)
    spec = QuantSpec(4, "signed", "max", 1.0, granularity)
    scale = compute_scale(t, spec)
    assert scale.shape == shape
    peak = t.abs().amax(dim={"tensor": (0, 1, 2), "sample": (1, 2), "row": (2,)}[granularity], keepdim=True)
    assert torch.equal(scale, peak / 7)
    levels, _ = quantize(t, spec)
    assert torch.equal(levels.abs().amax(dim=-1).amax(dim=-1) if granularity == "sample" else levels.abs().max(),
                       torch.full((3,), 7.0) if granularity == "sample" else torch.tensor(7.0))


def test_zero_tensor_has_scale_one():
    levels, scale = quantize(torch.zeros(4, 4), QuantSpec())
    assert torch.all(scale == 1) and torch.all(levels == 0)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("granularity", ["tensor", "sample", "row"])
def test_sawb_moments_written_into_a_buffer_are_the_pair(seed, granularity):
    g = torch.Generator().manual_seed(seed)
    shape = tuple(int(n) for n in torch.randint(1, 9, (int(torch.randint(1, 4, (), generator=g)),), generator=g))
    t = torch.randn(shape, generator=g) * 10 ** float(torch.randint(-3, 4, (), generator=g))
    dims = reduction_dims(t.dim(), granularity)
    out = torch.full((2, *QuantSpec(granularity=granularity).scale_shape(shape)), float("nan"))
    written = sawb_moments(t, dims, out)
    assert written is out
    for got, expected in zip(out, sawb_moments(t, dims)):
        assert torch.equal(got, expected)


def test_sawb_scale():
    t = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    alpha = 12.1 * t.square().mean().sqrt() - 12.2 * t.abs().mean()
    scale = compute_scale(t, QuantSpec(4, "signed", "sawb"))
    torch.testing.assert_close(scale, (alpha / 7).reshape(1), rtol=1e-5, atol=0)
    relu = t.clamp(min=0)  # unsigned: the grid spans [0, 2 alpha], never beyond max|t|
    alpha = 12.1 * relu.square().mean().sqrt() - 12.2 * relu.abs().mean()
    expected = torch.minimum(2 * alpha, relu.max()) / 15
    torch.testing.assert_close(compute_scale(relu, QuantSpec(4, "auto", "sawb")), expected.reshape(1))
    constant = torch.ones(8)  # alpha = -0.1 < 0: falls back to max|t|
    assert compute_scale(constant, QuantSpec(4, "signed", "sawb")).item() == pytest.approx(1 / 7)


def test_stochastic_levels_and_dequantize():
    t = torch.randn(64, 32)
    spec = QuantSpec(4, "signed", "max", 1.0, "tensor", "stochastic")
    levels, scale = quantize(t, spec, Counter(0, 0, 0))
    assert torch.equal(levels, levels.round()) and levels.abs().max() <= 7
    assert (dequantize(levels, scale) - t).abs().max() <= scale.max() + 1e-6
    assert torch.equal(levels, quantize(t, spec, Counter(0, 0, 0))[0])
    with pytest.raises(ValueError, match="needs a Counter"):
        quantize(t, spec)


def test_log2_grid_levels():
    t = torch.randn(1000)
    levels, scale = quantize(t, QuantSpec(4, "signed", "max", 1.0, "tensor", "stochastic", grid="log2"),
                             Counter(0, 0, 0))
    assert scale.item() == pytest.approx(t.abs().max().item() / 64)
    assert set(levels.abs().unique().tolist()) <= {0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0}


@pytest.mark.parametrize("kwargs,message", [
    ({"bits": 1}, "bits=1 is out of range"), ({"bits": 17}, "bits=17"), ({"bits": 6, "grid": "log2",
     "rounding": "stochastic"}, "log2 grid allows 2..5"), ({"clip": 0.0}, "clip=0.0"),
    ({"signedness": "both"}, "signedness='both'"), ({"granularity": "channel"}, "choose one of tensor, sample, row"),
    ({"grid": "log2"}, "stochastic rounding only"),
])
def test_bad_specs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        QuantSpec(**kwargs)
