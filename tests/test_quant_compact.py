"""What HOT's neighbours keep (quant/compact.py): ReLU a bit mask with torch's gradient bit for bit, BatchNorm its
normalized input in 8 bits with torch's forward and BatchNorm's backward formula on that copy, and a ResNet-32
under quant=hot keeping at most 0.40 of FP32's saved bytes."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hdqt_cil.models import build_model
from hdqt_cil.quant import preset, quantize_model
from hdqt_cil.quant.backend import resolve_ops
from hdqt_cil.quant.compact import (CompactBatchNorm2d, CompactGELU, CompactLayerNorm, CompactMaxPool2d, CompactReLU,
                                    compact_neighbours, pack_mask, restore, store, unpack_mask)
from scripts.bench.hot import saved_bytes

TORCH_OPS = resolve_ops("torch", torch.device("cpu"))


@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (3, 5, 2), (2, 16, 9, 9)])
def test_masks_pack_eight_to_a_byte_and_unpack_to_themselves(shape):
    mask = torch.rand(shape) > 0.5
    packed = pack_mask(mask)
    assert packed.dtype == torch.uint8 and packed.numel() == -(-mask.numel() // 8)
    assert torch.equal(unpack_mask(packed, mask.shape), mask)


def test_compact_relu_gives_torch_gradients_bit_for_bit_and_keeps_a_bit_a_value():
    x = torch.randn(4, 6, 5, 5)
    x[0, 0, 0, :3] = torch.tensor([0.0, -0.0, float("inf")])
    g = torch.randn_like(x)
    g[1, 1, 1, 1] = float("nan")  # where y = 0 the gradient is 0, whatever arrives
    results = []
    for relu in (nn.ReLU(), CompactReLU()):
        xi = x.clone().requires_grad_()
        y = relu(xi)
        y.backward(g)
        results.append((y, xi.grad))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1].nan_to_num(7.0), results[1][1].nan_to_num(7.0))
    module = nn.Sequential(nn.Linear(6, 6), CompactReLU())  # the Linear's input is not the ReLU's to keep
    kept = saved_bytes(module, lambda: module(torch.randn(16, 6)).sum())
    assert kept["other"] == 16 * 6 // 8


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode, shape", [
    (3, 2, 1, False, (2, 3, 9, 9)), (2, 2, 0, False, (2, 3, 8, 8)), (3, 2, 0, True, (1, 2, 10, 7)),
    ((3, 2), (1, 2), (1, 0), False, (2, 2, 6, 9)), (3, None, 1, False, (1, 1, 7, 7))])
def test_compact_max_pool_gives_torchs_pooling_and_gradients_keeping_a_byte_an_output(kernel, stride, padding,
                                                                                      ceil_mode, shape):
    x = torch.randn(shape)
    x[..., 1, :] = x[..., 2, :]  # ties: the first maximum of a window wins in both
    results, g = [], None
    for cls in (nn.MaxPool2d, CompactMaxPool2d):
        pool = cls(kernel, stride, padding, ceil_mode=ceil_mode)
        xi = x.clone().requires_grad_()
        y = pool(xi)
        g = torch.randn_like(y) if g is None else g
        y.backward(g)
        results.append((y, xi.grad, saved_bytes(pool, lambda: pool(xi).sum())["other"]))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    assert results[1][2] == results[1][0].numel()  # one uint8 place a maximum (torch: the input and int64 indices)


def _batch_norm_pair(affine=True):
    torch.manual_seed(0)
    plain = nn.BatchNorm2d(6, affine=affine)
    if affine:
        nn.init.uniform_(plain.weight, 0.5, 1.5)
        nn.init.uniform_(plain.bias, -0.5, 0.5)
    compact = nn.BatchNorm2d(6, affine=affine)
    compact.load_state_dict(plain.state_dict())
    compact_neighbours(compact, "torch", 8)
    assert type(compact) is CompactBatchNorm2d
    return plain, compact


@pytest.mark.parametrize("affine", [True, False])
def test_compact_batch_norm_forward_is_torchs_and_backward_is_the_formula_on_the_8bit_copy(affine):
    plain, compact = _batch_norm_pair(affine)
    x, g = torch.randn(5, 6, 7, 7) * 3 + 1, torch.randn(5, 6, 7, 7)
    outs = []
    for module in (plain, compact):
        xi = x.clone().requires_grad_()
        y = module(xi)
        y.backward(g)
        outs.append((y, xi.grad, module.weight.grad if affine else None, module.bias.grad if affine else None))
    assert torch.equal(outs[0][0], outs[1][0])
    assert torch.equal(plain.running_mean, compact.running_mean) and torch.equal(plain.running_var, compact.running_var)
    assert plain.num_batches_tracked == compact.num_batches_tracked == 1

    var, mean = torch.var_mean(x, dim=(0, 2, 3), unbiased=False, keepdim=True)
    invstd = torch.rsqrt(var + compact.eps)
    x_hat = restore(*store((x - mean) * invstd, 8, TORCH_OPS))
    gamma = plain.weight.detach().view(1, -1, 1, 1) if affine else 1.0
    count = x.numel() // 6
    g_sum, g_dot = g.sum((0, 2, 3), keepdim=True), (g * x_hat).sum((0, 2, 3), keepdim=True)
    expected = gamma * invstd / count * (count * g - g_sum - x_hat * g_dot)
    torch.testing.assert_close(outs[1][1], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outs[1][1], outs[0][1], rtol=0.05, atol=0.02 * outs[0][1].abs().max().item())
    if affine:
        torch.testing.assert_close(outs[1][3], outs[0][3])  # Σg: no x̂ in it
        torch.testing.assert_close(outs[1][2], outs[0][2], rtol=0.02, atol=0.02 * outs[0][2].abs().max().item())


def test_compact_batch_norm_in_eval_mode_is_torchs():
    plain, compact = _batch_norm_pair()
    plain.eval(), compact.eval()
    x = torch.randn(3, 6, 4, 4, requires_grad=True)
    assert torch.equal(plain(x), compact(x))


def _hot(**changes):
    return dataclasses.replace(preset("hot"), backend="torch", **changes)


def test_quantize_model_gives_the_neighbours_compact_classes_only_under_hot_abc_true():
    model = build_model("resnet32", (3, 32, 32), 10)
    keys = list(model.state_dict())

    def kinds():
        return {type(m) for m in model.modules() if isinstance(m, (nn.ReLU, nn.BatchNorm2d))}
    quantize_model(model, _hot())
    assert kinds() == {CompactReLU, CompactBatchNorm2d}
    quantize_model(model, _hot(abc_bits=None))  # nothing kept in low precision: BatchNorm is torch's
    assert kinds() == {CompactReLU, nn.BatchNorm2d}
    for scheme in (_hot(abc="columns"), _hot(abc=False), preset("hdqt")):
        quantize_model(model, _hot())
        quantize_model(model, scheme)
        assert kinds() == {nn.ReLU, nn.BatchNorm2d}
        assert not any("backend" in vars(m) for m in model.modules())
    assert list(model.state_dict()) == keys


def test_resnet32_under_hot_keeps_at_most_0_40_of_fp32s_saved_bytes_and_trains():
    torch.manual_seed(0)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    saved = {}
    for abc in (None, True, "columns"):
        torch.manual_seed(0)
        model = build_model("resnet32", (3, 32, 32), 10)
        if abc is not None:
            quantize_model(model, _hot(abc=abc))
        saved[abc] = saved_bytes(model, lambda: F.cross_entropy(model(x), y))["distinct"]
    assert saved[True] <= 0.40 * saved[None]
    assert saved["columns"] > saved[None]  # the compressed im2col copies come on top of the float activations
    quantize_model(model, _hot())
    F.cross_entropy(model(x), y).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_lqs_chooses_the_same_with_compact_neighbours():
    from hdqt_cil.quant import calibrate_lqs
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    choices = {}
    for abc in (True, "columns"):
        torch.manual_seed(0)
        model = quantize_model(build_model("resnet32", (3, 32, 32), 10), _hot(abc=abc))
        choices[abc] = calibrate_lqs(model, x, y, F.cross_entropy)
    assert choices[True] == choices["columns"]


def test_a_resnet32_pickled_without_relu_modules_gets_them(tmp_path):
    import pickle
    model = build_model("resnet32", (3, 32, 32), 10)
    x = torch.randn(2, 3, 32, 32)
    expected = model.eval()(x)
    for module in list(model.modules()):
        for name in ("relu", "relu1", "relu2"):
            module._modules.pop(name, None)
    restored = pickle.loads(pickle.dumps(model))
    assert torch.equal(restored(x), expected)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_compact_gelu_is_torchs_backward_on_the_stored_input(approximate):
    x, g = torch.randn(3, 5, 16) * 2, torch.randn(3, 5, 16)
    gelu = nn.GELU(approximate)
    compact_neighbours(gelu, "torch", 8)
    assert type(gelu) is CompactGELU
    xi = x.clone().requires_grad_()
    y = gelu(xi)
    y.backward(g)
    assert torch.equal(y, F.gelu(x, approximate=approximate))
    stored = restore(*store(x, 8, TORCH_OPS))
    assert torch.equal(xi.grad, torch.ops.aten.gelu_backward(g, stored, approximate=approximate))


def test_compact_layer_norm_forward_is_torchs_and_backward_is_the_formula_on_the_8bit_copy():
    torch.manual_seed(0)
    plain = nn.LayerNorm(24)
    nn.init.uniform_(plain.weight, 0.5, 1.5)
    nn.init.uniform_(plain.bias, -0.5, 0.5)
    compact = nn.LayerNorm(24)
    compact.load_state_dict(plain.state_dict())
    compact_neighbours(compact, "torch", 8)
    assert type(compact) is CompactLayerNorm
    x, g = torch.randn(4, 7, 24) * 3 + 1, torch.randn(4, 7, 24)
    outs = []
    for module in (plain, compact):
        xi = x.clone().requires_grad_()
        y = module(xi)
        y.backward(g)
        outs.append((y, xi.grad, module.weight.grad, module.bias.grad))
    assert torch.equal(outs[0][0], outs[1][0])
    var, mean = torch.var_mean(x, dim=-1, unbiased=False, keepdim=True)
    rstd = torch.rsqrt(var + compact.eps)
    x_hat = restore(*store((x - mean) * rstd, 8, TORCH_OPS))
    gg = g * plain.weight.detach()
    expected = rstd / 24 * (24 * gg - gg.sum(-1, keepdim=True) - x_hat * (gg * x_hat).sum(-1, keepdim=True))
    torch.testing.assert_close(outs[1][1], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outs[1][2], (g * x_hat).sum((0, 1)), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[1][3], outs[0][3])
    torch.testing.assert_close(outs[1][1], outs[0][1], rtol=0.05, atol=0.02 * outs[0][1].abs().max().item())


def test_a_vit_size_linear_stack_under_hot_keeps_at_most_0_40_of_fp32s_saved_bytes():
    from scripts.bench.hot import linear_stack
    x = torch.randn(2, 64, 48)
    saved = {}
    for hot in (False, True):
        torch.manual_seed(0)
        model = linear_stack(2, 48, 192)
        if hot:
            quantize_model(model, _hot())
            assert {type(m) for m in model.modules()} >= {CompactLayerNorm, CompactGELU}
        saved[hot] = saved_bytes(model, lambda: model(x).square().mean())["distinct"]
    assert saved[True] <= 0.40 * saved[False]
