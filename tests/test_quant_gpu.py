"""CPU and GPU give the same bits: the reference primitives are exact or single-rounding elementwise ops."""
import pytest
import torch
from torch import nn

from hdqt_cil.quant import (QuantSpec, block_hadamard, counter_uniform, preset, quantize, quantize_model,
                            tiled_int_matmul)
from hdqt_cil.quant.rounding import Counter

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_block_hadamard_is_bit_identical():
    x = torch.randn(16, 3, 1024, generator=torch.Generator().manual_seed(0))
    for dim, block in ((-1, None), (-1, 16), (1, None)):
        assert torch.equal(block_hadamard(x, dim, block), block_hadamard(x.cuda(), dim, block).cpu())


def test_counter_uniform_is_bit_identical():
    for shape, step, role in (((1000,), 0, 0), ((64, 3, 32, 33), 123456789, 77), ((2**19 + 5,), 5, 2**20)):
        cpu = counter_uniform(shape, 11, step, role)
        assert torch.equal(cpu, counter_uniform(shape, 11, step, role, "cuda").cpu())


@pytest.mark.parametrize("spec", [
    QuantSpec(4, "auto", "max", 0.975),
    QuantSpec(4, "signed", "max", 1.0, "sample", "stochastic"),
    QuantSpec(8, "signed", "max", 1.0, "row", "stochastic"),
    QuantSpec(4, "signed", "max", 1.0, "tensor", "stochastic", grid="log2"),
])
def test_quantize_is_bit_identical(spec):
    t = torch.randn(32, 64, 40, generator=torch.Generator().manual_seed(1))
    t = block_hadamard(torch.round(t * 3), -1)  # integer operands after a transform: ties on .5 occur
    cpu = quantize(t, spec, Counter(3, 4, 5))
    gpu = quantize(t.cuda(), spec, Counter(3, 4, 5))
    assert torch.equal(cpu[0], gpu[0].cpu()) and torch.equal(cpu[1], gpu[1].cpu())


def test_tiled_int_matmul_is_identical_even_with_tf32():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randint(-7, 8, (4, 96, 200), generator=g).float(), torch.randint(0, 16, (200, 24), generator=g).float()
    wide_a, wide_b = a * 4000, b * 2000  # beyond TF32's exact integers
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        for x, y, tile, acc in ((a, b, 32, 8), (a, b, None, 12), (wide_a, wide_b, None, None)):
            assert torch.equal(tiled_int_matmul(x, y, tile, acc), tiled_int_matmul(x.cuda(), y.cuda(), tile, acc).cpu())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def test_layer_forward_identical_and_backward_close():
    torch.manual_seed(0)
    cpu = quantize_model(nn.Conv2d(16, 32, 3, padding=1), preset("hdqt"))
    gpu = quantize_model(nn.Conv2d(16, 32, 3, padding=1), preset("hdqt")).cuda()
    gpu.load_state_dict(cpu.state_dict())
    x = torch.randn(8, 16, 16, 16)
    results = []
    for layer, xi in ((cpu, x.clone()), (gpu, x.cuda())):
        xi.requires_grad_()
        y = layer(xi)
        y.backward(torch.ones_like(y))
        results.append((y.detach().cpu(), xi.grad.cpu(), layer.weight.grad.cpu()))
    (y_cpu, gx_cpu, gw_cpu), (y_gpu, gx_gpu, gw_gpu) = results
    assert torch.equal(y_cpu, y_gpu)
    torch.testing.assert_close(gx_gpu, gx_cpu)  # col2im and the per-sample sums are float sums in device order
    torch.testing.assert_close(gw_gpu, gw_cpu)


def _fp8_grid(shape, fmt, seed):
    """(values on fmt's grid, their per-tensor scale) of a random tensor, as the fp8 scheme rounds an operand."""
    from hdqt_cil.quant.floats import per_tensor

    t = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * torch.logspace(-2, 1, shape[-1])
    values, scale = per_tensor(t.cuda(), fmt)
    return values, scale


@pytest.mark.parametrize("left_shape, right_shape, sum_batch, formats", [
    ((70, 45), (33, 45), False, ("e4m3", "e4m3")),
    ((3, 70, 561), (100, 561), False, ("e5m2", "e4m3")),
    ((5, 40, 197), (5, 30, 197), True, ("e5m2", "e4m3")),
    ((128, 64, 16), (128, 144, 16), True, ("e4m3", "e5m2")),
], ids=str)
def test_fp8_tensor_cores_stay_within_their_accumulator_bound(left_shape, right_shape, sum_batch, formats):
    """fp8_matmul (torch._scaled_mm) against the reference's float32 matmul of the same grid values, ragged shapes
    padded: each element within K·2⁻¹³·Σ|a b| (docs/numerics.md: the FP8 tensor cores keep about 14 significant
    bits of a running sum; a wrong scale, transpose or padding is off by far more)."""
    from hdqt_cil.quant.backend import FP8_DTYPES, has_fp8_tensor_cores, on_fp8_tensor_cores
    from hdqt_cil.quant.float_product import FloatOperand, float_matmul, format_matmul
    from hdqt_cil.quant.float_schemes import FormatProduct
    from hdqt_cil.quant.floats import FORMATS, FloatSpec
    from hdqt_cil.quant.intmm import sum_entries

    if not has_fp8_tensor_cores():
        pytest.skip("no FP8 tensor cores")
    fa, fb = (FORMATS[f] for f in formats)
    (av, asc), (bv, bsc) = _fp8_grid(left_shape, fa, 5), _fp8_grid(right_shape, fb, 6)
    a, b = FloatOperand(av, asc, None, fa), FloatOperand(bv, bsc, None, fb)
    product = FormatProduct(FloatSpec(fa), FloatSpec(fb))
    assert on_fp8_tensor_cores(a, b, product, "auto", sum_batch) and fa in FP8_DTYPES
    assert not on_fp8_tensor_cores(a, b, product, "torch", sum_batch)
    got = float_matmul(a, b, product, "auto", sum_batch=sum_batch)
    reference = format_matmul(a, b, product)
    magnitude = (av.abs() @ bv.abs().mT) * (asc * bsc)
    if sum_batch:
        reference, magnitude = sum_entries(reference), magnitude.sum(0)
    k = av.shape[-1] * (av.shape[0] if sum_batch else 1)
    assert got.shape == reference.shape and got.dtype == torch.float32
    bound = k * 2.0**-13 * magnitude + 2.0**-23 * reference.abs()
    assert ((got - reference).abs() <= bound).all(), (got - reference).abs().max()


def test_fp8_layers_on_tensor_cores_round_as_the_reference():
    """quant=fp8, backend auto against torch on the same GPU: a conv's and a linear layer's outputs and gradients
    within FP32 matmul tolerance, 1e-3 of the largest (one layer each, on the same input, with a loss linear in
    the output: every operand is rounded the same on both backends, only the sums' order differs)."""
    from hdqt_cil.quant import scheme_from_config

    cases = ((lambda: nn.Conv2d(3, 16, 3, padding=1), (32, 3, 8, 8)), (lambda: nn.Linear(561, 100), (64, 561)))
    for make, shape in cases:
        outputs = {}
        for backend in ("auto", "torch"):
            torch.manual_seed(3)
            layer = nn.Sequential(make()).cuda()
            quantize_model(layer, scheme_from_config({"name": "fp8", "backend": backend}))
            x = torch.randn(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(4), requires_grad=True)
            y = layer(x)
            (y * torch.randn(y.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(5))).sum().backward()
            outputs[backend] = [y.detach(), x.grad, *(p.grad for p in layer.parameters())]
        for got, reference in zip(outputs["auto"], outputs["torch"]):  # sums of up to 2,048 terms in other orders
            torch.testing.assert_close(got, reference, rtol=1e-3, atol=1e-3 * reference.abs().max().item())
