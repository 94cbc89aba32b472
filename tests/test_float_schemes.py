"""The float-format schemes (fp8, mxfp4, nvfp4, fp) in the layers: each product against its definition written out
from the format functions (quant/floats.py), the accumulator's rounding on hand-computed sums, the settings'
refusals, and every scheme training a model on the CPU."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hdqt_cil.quant import preset, quantize_model, scheme_from_config
from hdqt_cil.quant.float_product import FloatOperand, format_matmul
from hdqt_cil.quant.float_schemes import FormatProduct
from hdqt_cil.quant.floats import E2M1, E4M3, E5M2, FloatSpec, authors_float, microscaled, per_tensor
from hdqt_cil.quant.layers import QuantLinear

FLOAT_SCHEMES = ["fp8", "mxfp4", "nvfp4", "fp"]


def _linear(name: str, inputs: int = 96, outputs: int = 24, **settings) -> QuantLinear:
    torch.manual_seed(1)
    scheme = scheme_from_config({"name": name, **settings}) if settings else preset(name)
    return QuantLinear(inputs, outputs, bias=False, scheme=scheme)


def test_fp8_products_are_the_e4m3_and_e5m2_operands_summed_in_float32():
    layer = _linear("fp8")
    x = torch.randn(16, 96, requires_grad=True)
    y = layer(x)
    (xv, xs), (wv, ws) = per_tensor(x.detach(), E4M3), per_tensor(layer.weight.detach(), E4M3)
    assert torch.equal(y, (xv @ wv.t()) * (xs.reshape(()) * ws.reshape(())))
    g = torch.randn_like(y)
    y.backward(g)
    gv, gs = per_tensor(g, E5M2)
    (wv2, ws2), (xv2, xs2) = per_tensor(wv * ws, E4M3), per_tensor(xv * xs, E4M3)  # re-rounded as the forward saw
    assert torch.equal(x.grad, (gv @ wv2) * (gs.reshape(()) * ws2.reshape(())))
    assert torch.equal(layer.weight.grad, (gv.t() @ xv2) * (gs.reshape(()) * xs2.reshape(())))
    assert (y - F.linear(x, layer.weight)).norm() < 0.1 * y.norm()


def test_mx_products_sum_each_block_exactly_and_scale_it_by_its_pair():
    torch.manual_seed(2)
    a, b = torch.randn(8, 100) * 3, torch.randn(5, 100)  # 100 = 3 blocks of 32 and one of 4
    spec = FloatSpec(E2M1, "mx")
    av, asc = microscaled(a, E2M1)
    bv, bsc = microscaled(b, E2M1)
    out = format_matmul(FloatOperand(av, asc, 32), FloatOperand(bv, bsc, 32), FormatProduct(spec, spec))
    exact = (av * asc).double() @ (bv * bsc).double().t()  # every partial product and block sum exact in float64
    assert torch.allclose(out.double(), exact, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(out, a @ b.t(), rtol=1e-2)  # the rounding is there


def test_the_accumulator_rounds_each_tile_sum_to_its_format():
    """Nine ones in each of two tiles of 32: 9 rounds to 8 in E5M2 (a tie to the even mantissa), so 16, where
    float32 sums give 18; a whole-K tile rounds 18 to 16 as well, 17 to 16."""
    ones = torch.zeros(1, 64)
    ones[0, :9] = ones[0, 32:41] = 1
    a = b = FloatOperand(ones, torch.ones(()), None)
    spec = FloatSpec(E5M2, "none")
    plain = FormatProduct(spec, spec)
    tiled = FormatProduct(spec, spec, acc=E5M2, tile=32)
    tally = torch.zeros(2, dtype=torch.int64)
    assert format_matmul(a, b, plain).item() == 18
    assert format_matmul(a, b, tiled, tally=tally).item() == 16 and tally.tolist() == [0, 2]
    assert format_matmul(a, b, FormatProduct(spec, spec, acc=E5M2)).item() == 16
    assert authors_float(torch.tensor([17.0]), 5, 2).item() == 16


def test_the_authors_float_scheme_is_their_quantizer_in_hdqts_structure():
    layer = _linear("fp", inputs=64, outputs=8)
    x = torch.randn(4, 64) * 4
    x[0, 0], x[1, 1], x[2, 2] = 100.0, 98.0, 97.0  # the estimator zeroes where |x| > 0.975 · max|x| = 97.5
    x.requires_grad_(True)
    y = layer(x)
    xq, wq = authors_float(x.detach(), 5, 2), authors_float(layer.weight.detach(), 5, 2)
    tiles = [authors_float(xq[:, i:i + 32] @ wq[:, i:i + 32].t(), 5, 2) for i in (0, 32)]
    assert torch.equal(y, tiles[0] + tiles[1])
    y.sum().backward()
    assert x.grad[0, 0] == x.grad[1, 1] == 0 and x.grad[2, 2] != 0 and (x.grad[3] != 0).all()


def test_every_float_scheme_trains_a_convnet_and_its_bits_depend_on_the_seed_only_where_it_rounds_stochastically():
    def step(name, seed):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 5))
        quantize_model(model, scheme_from_config({"name": name, "seed": seed}))
        x, target = torch.randn(6, 3, 8, 8), torch.randint(0, 5, (6,))
        F.cross_entropy(model(x), target).backward()
        return torch.cat([p.grad.reshape(-1) for p in model.parameters()])

    for name in FLOAT_SCHEMES:
        first, again, other = step(name, 0), step(name, 0), step(name, 1)
        assert torch.isfinite(first).all() and torch.equal(first, again), name
        assert torch.equal(first, other) == (name in ("fp8", "fp")), name


@pytest.mark.parametrize("settings,message", [
    ({"name": "fp8", "acc": "int"}, r"quant.acc='int' must be one of none, fp"),
    ({"name": "fp", "exp_bits": {"input": 9}}, r"quant.exp_bits.input=9 must be an integer in 1..8"),
    ({"name": "fp", "man_bits": {"grad_output": -1}}, r"quant.man_bits.grad_output=-1 must be an integer in 0..23"),
    ({"name": "mxfp4", "backend": "cupy"}, r"quant.backend='cupy' must be one of auto, torch"),
    ({"name": "mxfp4", "acc_bits": 8}, r"quant.acc_bits is not a setting of quant=mxfp4"),
])
def test_impossible_float_settings_are_refused_by_name(settings, message):
    with pytest.raises(ValueError, match=message):
        scheme_from_config(settings)
