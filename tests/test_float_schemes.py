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
from hdqt_cil.quant.floats import (E2M1, E4M3, E5M2, FloatSpec, authors_float, microscaled, per_tensor,
                                   quantize_float)
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


def _tile_by_tile(a: FloatOperand, b: FloatOperand, product, width: int) -> torch.Tensor:
    """format_matmul's definition written out one K tile at a time: its sum, rounded to the accumulator, scaled by
    the tile's scale pair, added in K order."""
    out = 0
    for start in range(0, a.values.shape[-1], width):
        tile = slice(start, start + width)
        partial = a.values[..., tile] @ b.values[..., tile].mT
        if product.acc is not None:
            partial = authors_float(partial, product.acc.exp_bits, product.acc.man_bits)
        if a.block:
            partial = partial * (a.scale[..., start:start + 1] * b.scale[..., start:start + 1].mT)
        out = out + partial
    return out if a.block else out * (a.scale.reshape(()) * b.scale.reshape(()))


@pytest.mark.parametrize("kind", ["authors", "mx", "nv"])
@pytest.mark.parametrize("at_once", [1 << 26, 1, 250])  # all whole tiles in one matmul; one a matmul; two
def test_tile_sums_formed_together_equal_them_one_tile_at_a_time(kind, at_once, monkeypatch):
    """format_matmul forms a chunk's tile sums in one batched matmul (a narrower last tile on its own): bit for
    bit the sums one tile at a time, on random operands with batch dimensions and a K no tile divides."""
    from hdqt_cil.quant import float_product
    monkeypatch.setattr(float_product, "TILE_SUMS_AT_ONCE", at_once)
    torch.manual_seed(3)
    a, b = torch.randn(3, 7, 150) * 2e4, torch.randn(3, 5, 150)  # 7 x 5 outputs of 3 batches: 105 a tile
    if kind == "authors":
        spec, width = FloatSpec(E5M2, "none"), 32
        product = FormatProduct(spec, spec, acc=E5M2, tile=width)
        operands = [FloatOperand(authors_float(t, 5, 2), torch.ones(()), None) for t in (a, b)]
    else:
        spec = FloatSpec(E2M1, kind)
        width, product = spec.block, FormatProduct(spec, spec)
        operands = [FloatOperand(*quantize_float(t, spec), width, E2M1) for t in (a, b)]
    tally = torch.zeros(2, dtype=torch.int64)
    out = format_matmul(*operands, product, tally=tally)
    assert torch.equal(out, _tile_by_tile(*operands, product, width))
    if product.acc is not None:
        assert tally[1].item() == out.numel() * 5  # 150 = 4 tiles of 32 and one of 22
        sums = torch.cat([operands[0].values[..., t:t + 32] @ operands[1].values[..., t:t + 32].mT
                          for t in range(0, 150, 32)])
        assert tally[0].item() == (sums.abs() > product.acc_spec.largest).sum().item() > 0


def test_fp_on_the_kernels_path_equals_the_reference(monkeypatch):
    """quant=fp where the kernels run (here: their contract written in torch on the CPU) gives the reference's
    outputs, gradients and saturation shares: each chunk of tile sums goes to kernels.authors_tile_sum with the
    running sum and the layer's tally, each operand to kernels.authors_float, a weight gradient's batch to
    kernels.sum_entries. What the kernels compute is tests/test_kernels_gpu.py's."""
    from hdqt_cil import kernels
    from hdqt_cil.quant import backend, float_product, quant_stats
    from hdqt_cil.quant.intmm import sum_entries

    calls = {"authors_float": 0, "authors_tile_sum": 0, "sum_entries": 0}

    def tile_sum(partials, out, exp_bits, man_bits, limit, saturated=None):
        calls["authors_tile_sum"] += 1
        total = torch.zeros(partials.shape[:-3] + partials.shape[-2:]) if out is None else out.clone()
        for partial in partials.unbind(-3):
            total = total + authors_float(partial, exp_bits, man_bits)
        if saturated is not None:
            saturated += (partials.abs() > limit).sum()
        return total if out is None else out.copy_(total)

    def counted(name, fn):
        return lambda *args: calls.__setitem__(name, calls[name] + 1) or fn(*args)

    results = {}
    for path in ("kernels", "reference"):
        with monkeypatch.context() as patch:
            if path == "kernels":
                for module in (backend, float_product):
                    patch.setattr(module, "on_kernels", lambda backend, device: backend == "auto")
                patch.setattr(kernels, "authors_tile_sum", tile_sum)
                patch.setattr(kernels, "authors_float", counted("authors_float", authors_float))
                patch.setattr(kernels, "sum_entries", counted("sum_entries", sum_entries))
            torch.manual_seed(2)
            # the linear layer's K = 252: 7 tiles of 32 in one chunk, then one of 28 added to their running sum
            model = nn.Sequential(nn.Conv2d(3, 7, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(7 * 36, 5))
            quantize_model(model, scheme_from_config({"name": "fp", "backend": "auto"}))
            x = (torch.randn(4, 3, 6, 6) * 3e3).requires_grad_()
            y = model(x)
            (y * torch.randn(y.shape) * 1e3).sum().backward()  # large: weight-gradient tile sums saturate E5M2
            results[path] = ([y.detach(), x.grad, *(p.grad for p in model.parameters())], quant_stats(model))
    for got, reference in zip(*(results[p][0] for p in ("kernels", "reference"))):
        assert torch.equal(got, reference)
    assert results["kernels"][1] == results["reference"][1]
    assert any(share > 0 for stats in results["kernels"][1].values() for share in stats.values())
    assert calls["authors_tile_sum"] >= 6 and calls["authors_float"] >= 12 and calls["sum_entries"] >= 1


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
