"""Quantizers, the tiled integer product and the quantized layers under adversarial and extreme inputs.

Property-based (hypothesis) over finite float32 values of any magnitude (denormals, huge outliers, zeros),
plus the defined behaviour for all-zero tensors, ±Inf and NaN, empty batches and batches of one (docs/quant.md,
"Extreme inputs").
"""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch import nn

from hdqt_cil.quant import Counter, NonFiniteError, QuantSpec, preset, quantize, quantize_model, tiled_int_matmul
from hdqt_cil.quant.quantizers import level_range

FLOAT32 = st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True)
ADVERSARIAL = st.one_of(FLOAT32, st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 1e-38, 3.4e38, -3.4e38, 1.0, -1.0]))
SPECS = st.builds(QuantSpec, bits=st.integers(2, 8), signedness=st.sampled_from(["signed", "auto"]),
                  scale=st.sampled_from(["max", "sawb"]), clip=st.sampled_from([1.0, 0.975, 0.5]),
                  granularity=st.sampled_from(["tensor", "sample", "row"]),
                  rounding=st.sampled_from(["nearest", "stochastic"]))
TENSORS = hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=3, max_side=6), elements=ADVERSARIAL)


@settings(max_examples=300, deadline=None)
@given(values=TENSORS, spec=SPECS, seed=st.integers(0, 2**32 - 1))
def test_levels_are_bounded_integers_with_a_finite_positive_scale(values, spec, seed):
    t = torch.from_numpy(values)
    levels, scale = quantize(t, spec, Counter(seed, 0, 0))
    low, high = level_range(t, spec)
    assert torch.isfinite(scale).all() and (scale > 0).all()
    assert torch.equal(levels, levels.round()) and (levels >= low).all() and (levels <= high).all()
    v = t.double() / scale.double()
    if spec.rounding == "nearest":
        # the sign survives and no level is further than half a step from the (clamped) scaled value
        assert ((levels == 0) | (torch.sign(levels) == torch.sign(t))).all()
        clamped = v.clamp(float(low), float(high))
        assert ((levels.double() - clamped).abs() <= 0.5 + 1e-6 * clamped.abs() + 1e-6).all()
    else:
        # stochastic rounding picks one of the two neighbouring levels (inside the range); a draw of u = 0 rounds
        # up any fraction, so a tiny v may land a whole step away
        clamped = v.clamp(float(low), float(high))
        assert ((levels.double() - clamped).abs() <= 1 + 1e-6 * clamped.abs()).all()


def _tiled_reference(a: np.ndarray, b: np.ndarray, tile, acc_bits) -> np.ndarray:
    """The definition, loop by loop in int64."""
    k = a.shape[-1]
    width = k if tile is None else tile
    limit = None if acc_bits is None else 2 ** (acc_bits - 1) - 1
    out = np.zeros(a.shape[:-1] + b.shape[-1:], dtype=np.int64)
    for start in range(0, max(k, 1), width):
        part = a[..., start:start + width].astype(np.int64) @ b[..., start:start + width, :].astype(np.int64)
        out += part if limit is None else np.clip(part, -limit, limit)
    return out


@st.composite
def integer_operands(draw):
    batch, m, k, n = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 80)), draw(st.integers(1, 5))
    bound = draw(st.sampled_from([1, 7, 15, 127]))
    level = st.one_of(st.integers(-bound, bound), st.sampled_from([bound, -bound]))  # the extremes are favoured
    a = draw(hnp.arrays(np.int64, (batch, m, k), elements=level))
    b = draw(hnp.arrays(np.int64, (batch, k, n), elements=level))
    return a, b, bound


@settings(max_examples=300, deadline=None)
@given(operands=integer_operands(), tile=st.sampled_from([None, 1, 3, 16, 32, 33]),
       acc_bits=st.sampled_from([None, 2, 4, 8, 12, 16]))
def test_tiled_int_matmul_equals_its_definition(operands, tile, acc_bits):
    a, b, bound = operands
    out, saturated = tiled_int_matmul(torch.from_numpy(a).float(), torch.from_numpy(b).float(), tile, acc_bits,
                                      bounds=(bound, bound), count_saturated=True)
    assert np.array_equal(out.numpy().astype(np.int64), _tiled_reference(a, b, tile, acc_bits))
    if acc_bits is None:
        assert int(saturated) == 0


SCHEMES = ["hdqt", "int4", "luq"]


def _mlp(scheme):
    torch.manual_seed(0)
    return quantize_model(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)), preset(scheme))


def _cnn(scheme):
    torch.manual_seed(0)
    return quantize_model(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(100, 3)),
                          preset(scheme))


def _step(model, x):
    x = x.clone().requires_grad_(True)
    y = model(x)
    (y * torch.arange(1.0, 4.0)).sum().backward()  # output gradients of order 1: no float32 overflow of their own
    return y, x.grad


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("make,shape", [(_mlp, (0, 8)), (_cnn, (0, 3, 5, 5))])
def test_empty_batch_gives_empty_output_and_zero_weight_gradients(scheme, make, shape):
    model = make(scheme)
    y, grad = _step(model, torch.zeros(shape))
    assert y.shape == (0, 3) and grad.shape == shape
    assert all(float(p.grad.abs().sum()) == 0 for p in model.parameters())
    assert all(m.step == 0 for m in model.modules() if hasattr(m, "step"))  # no random bits were drawn


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("make,shape", [(_mlp, (1, 8)), (_cnn, (1, 3, 5, 5))])
def test_batch_of_one_trains(scheme, make, shape):
    model = make(scheme)
    y, grad = _step(model, torch.randn(shape))
    assert y.shape == (1, 3) and torch.isfinite(grad).all()
    assert all(torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("value", [0.0, 1e-42, 1e30])
def test_all_zero_denormal_and_huge_inputs_stay_finite(scheme, value):
    """A zero tensor quantizes with scale 1 to zero levels; denormal and huge magnitudes give finite results
    (as long as the float32 results themselves fit: 1e30 inputs times order-1 gradients do)."""
    model = _mlp(scheme)
    x = torch.full((4, 8), value)
    x[1, 3] = -value
    y, grad = _step(model, x)
    assert torch.isfinite(y).all() and torch.isfinite(grad).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("scheme", SCHEMES)
def test_one_huge_outlier_zeroes_the_rest_but_stays_finite(scheme):
    """Per-tensor scales: an outlier of 1e30 takes the whole grid, every ordinary value rounds to level 0."""
    levels, scale = quantize(torch.tensor([1e30, 1.0, -2.0, 3.0]), QuantSpec(4, "signed", "max"))
    assert levels.tolist() == [7.0, 0.0, 0.0, 0.0] and torch.isfinite(scale).all()
    model = _mlp(scheme)
    x = torch.randn(4, 8)
    x[2, 5] = 1e30
    y, grad = _step(model, x)
    assert torch.isfinite(y).all() and torch.isfinite(grad).all()


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("where", ["input", "weight"])
def test_non_finite_values_are_refused_naming_layer_and_role(scheme, bad, where):
    model = _mlp(scheme)
    x = torch.randn(4, 8)
    if where == "input":
        x[0, 2] = bad
    else:
        with torch.no_grad():
            model[2].weight[1, 4] = bad
    layer = "0" if where == "input" else "2"
    with pytest.raises(NonFiniteError, match=rf"layer '{layer}': non-finite value {bad} in the {where}"):
        _step(model, x)


def test_empty_tensor_quantizes_to_empty_levels():
    for granularity in ("tensor", "sample", "row"):
        levels, scale = quantize(torch.empty(0, 5), QuantSpec(4, granularity=granularity))
        assert levels.shape == (0, 5) and torch.isfinite(scale).all()
