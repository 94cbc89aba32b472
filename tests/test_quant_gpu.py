"""CPU and GPU give the same bits: the reference primitives are exact or single-rounding elementwise ops."""
import pytest
import torch
from torch import nn

from hdqt_cil.quant import QuantSpec, block_hadamard, counter_uniform, preset, quantize, quantize_model, tiled_int_matmul
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
