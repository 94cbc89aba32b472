import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hdqt_cil.quant import (NonFiniteError, QuantConv2d, QuantLinear, col2im, im2col, preset, quant_stats,
                            quantize_model, reset_quant_stats, scheme_from_config)

F32 = torch.float32


pytestmark = pytest.mark.usefixtures("one_thread")


def reference_levels(t, signed, clip=0.975, bits=4):
    """HDQT's forward quantizer written out: s = clip * max|t| / qmax, round half to even, clamp."""
    qmax = 2 ** (bits - 1) - 1 if signed else 2**bits - 1
    scale = t.abs().max() * torch.tensor(clip, dtype=F32) / qmax
    return torch.clamp(torch.round(t / scale), -qmax if signed else 0, qmax), scale


def reference_tiled(a, b, tile=32, limit=127):
    """Σ over K tiles of the saturated tile products, one tile at a time."""
    return sum(torch.clamp(a[:, k:k + tile] @ b[k:k + tile], -limit, limit) for k in range(0, a.shape[1], tile))


def patches(x, kernel, padding):
    """im2col by Tensor.unfold (not F.unfold): rows (b, h, w), columns (c, kh, kw)."""
    x = F.pad(x, (padding,) * 4)
    p = x.unfold(2, kernel, 1).unfold(3, kernel, 1)  # B, C, Ho, Wo, kh, kw
    return p.permute(0, 2, 3, 1, 4, 5).reshape(-1, x.shape[1] * kernel * kernel)


def make_linear(scheme, in_features=70, out_features=24, seed=0):
    torch.manual_seed(seed)
    return quantize_model(nn.Linear(in_features, out_features), scheme)


def make_conv(scheme, seed=0):
    torch.manual_seed(seed)
    return quantize_model(nn.Conv2d(8, 8, 3, padding=1), scheme)


def test_linear_forward_equals_hand_composed_reference():
    layer = make_linear(preset("hdqt"))
    x = torch.relu(torch.randn(16, 70))
    xl, sx = reference_levels(x, signed=False)
    wl, sw = reference_levels(layer.weight.detach(), signed=True)
    expected = reference_tiled(xl, wl.T) * (sx * sw) + layer.bias
    assert torch.equal(layer(x), expected)


def test_conv_forward_equals_hand_composed_reference():
    layer = make_conv(preset("hdqt"))
    x = torch.randn(3, 8, 6, 6)
    xl, sx = reference_levels(x, signed=True)
    wl, sw = reference_levels(layer.weight.detach(), signed=True)
    rows = reference_tiled(patches(xl, 3, 1), wl.reshape(8, -1).T) * (sx * sw)  # K = 72: tiles 32, 32, 8
    expected = rows.reshape(3, 6, 6, 8).permute(0, 3, 1, 2) + layer.bias.view(1, -1, 1, 1)
    assert torch.equal(layer(x), expected)
    wide = scheme_from_config({"name": "hdqt", "acc_bits": None})  # no saturation: conv2d of the levels
    expected = F.conv2d(xl, wl, padding=1) * (sx * sw) + layer.bias.view(1, -1, 1, 1)
    torch.testing.assert_close(make_conv(wide)(x), expected)


@pytest.mark.parametrize("make", [make_linear, make_conv])
def test_fp32_scheme_gives_torch_gradients(make):
    layer, plain = make(preset("fp32")), make(preset("fp32"))
    plain.__class__ = nn.Linear if isinstance(plain, QuantLinear) else nn.Conv2d
    x = torch.randn(4, 70) if isinstance(layer, QuantLinear) else torch.randn(4, 8, 6, 6)
    for module in (layer, plain):
        xi = x.clone().requires_grad_()
        module(xi).square().sum().backward()
        module.x_grad = xi.grad
    assert torch.equal(layer.x_grad, plain.x_grad) and torch.equal(layer.weight.grad, plain.weight.grad)


@pytest.mark.parametrize("make", [make_linear, make_conv])
def test_sixteen_bits_without_saturation_track_float(make):
    scheme = scheme_from_config({"name": "hdqt", "bits": 16, "acc_bits": None, "fwd_clip": 1.0})
    layer = make(scheme)
    plain = make(preset("fp32"))
    x = torch.randn(8, 70) if isinstance(layer, QuantLinear) else torch.randn(4, 8, 6, 6)
    grads = []
    for module in (layer, plain):
        xi = x.clone().requires_grad_()
        module(xi).sin().sum().backward()
        grads.append((xi.grad, module.weight.grad))
    for quantized, exact in zip(*grads):
        assert (quantized - exact).norm() < 1e-3 * exact.norm()


@pytest.mark.parametrize("kernel,stride,padding,dilation", [(3, 2, 1, 1), (3, 1, 2, 2), (1, 2, 0, 1), (5, 3, 2, 1)])
def test_conv_geometry_matches_unfold_fold_and_conv2d(kernel, stride, padding, dilation):
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 5, kernel, stride, padding, dilation)
    layer = quantize_model(nn.Conv2d(3, 5, kernel, stride, padding, dilation), preset("hdqt"))
    layer.load_state_dict(conv.state_dict())
    x = torch.randn(2, 3, 9, 11)
    geometry = dict(kernel_size=kernel, dilation=dilation, padding=padding, stride=stride)
    columns = F.unfold(x, **geometry)
    layout = (layer.kernel_size, layer.padding, layer.dilation, layer.stride)
    assert torch.equal(im2col(x, *layout, columns=True), columns)
    assert torch.equal(im2col(x, *layout), columns.transpose(1, 2))
    assert torch.equal(im2col(x.to(torch.int8), *layout), columns.transpose(1, 2).to(torch.int8))
    grad_x = col2im(columns.transpose(1, 2), x.shape, layer.kernel_size, layer.padding, layer.dilation, layer.stride)
    torch.testing.assert_close(grad_x, F.fold(columns, (9, 11), **geometry))
    wide = quantize_model(layer, scheme_from_config({"name": "hdqt", "bits": 16, "acc_bits": None, "fwd_clip": 1.0}))
    xi, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, expected = wide(xi), conv(xf)
    assert (y - expected).norm() < 1e-3 * expected.norm()
    y.backward(torch.ones_like(y))
    expected.backward(torch.ones_like(expected))
    assert (xi.grad - xf.grad).norm() < 1e-3 * xf.grad.norm()
    assert (wide.weight.grad - conv.weight.grad).norm() < 1e-3 * conv.weight.grad.norm()


def dequantized_reference_grads(layer, x, grad_y):
    """The quantized forward's gradient with a float backward (what unbiased SR should average to)."""
    xl, sx = reference_levels(x, signed=bool((x < 0).any()))
    wl, sw = reference_levels(layer.weight.detach(), signed=True)
    x_deq, w_deq = (xl * sx).requires_grad_(), (wl * sw).requires_grad_()
    y = F.linear(x_deq, w_deq) if isinstance(layer, QuantLinear) else F.conv2d(x_deq, w_deq, padding=1)
    y.backward(grad_y)
    return x_deq.grad, w_deq.grad


@pytest.mark.parametrize("make,x_shape", [(make_linear, (32, 70)), (make_conv, (4, 8, 6, 6))])
def test_hdqt_gradients_are_unbiased(make, x_shape):
    """Stochastic rounding on both sides of both backward products (no accumulator limit): the mean over many
    steps (fresh random bits each step) approaches the gradient of the quantized forward."""
    overrides = {"acc_bits": None, "rounding": {"bwd_weight": "stochastic"}}
    layer = make(scheme_from_config({"name": "hdqt", **overrides}))
    torch.manual_seed(1)
    x, grad_y = torch.randn(x_shape), None
    draws, sums, first = 300, None, None
    for _ in range(draws):
        xi = x.clone().requires_grad_()
        y = layer(xi)
        grad_y = torch.randn(y.shape, generator=torch.Generator().manual_seed(2)) if grad_y is None else grad_y
        layer.weight.grad = None
        y.backward(grad_y)
        current = (xi.grad, layer.weight.grad)
        first = first or current
        sums = current if sums is None else tuple(s + c for s, c in zip(sums, current))
    for total, single, exact in zip(sums, first, dequantized_reference_grads(layer, x, grad_y)):
        mean_error = ((total / draws - exact).norm() / exact.norm()).item()
        single_error = ((single - exact).norm() / exact.norm()).item()
        assert mean_error < 0.04 and mean_error < single_error / 5, (mean_error, single_error)


def test_straight_through_estimators():
    x = torch.tensor([[0.5, -1.0, 10.0, 2.0]])
    grads = {}
    for ste in ("authors", "clip", "none"):
        layer = make_linear(scheme_from_config({"name": "hdqt", "ste": ste}), 4, 3)
        xi = x.clone().requires_grad_()
        layer(xi).sum().backward()
        grads[ste] = xi.grad[0]
    assert grads["authors"][2] == 0 and torch.all(grads["authors"][[0, 1, 3]] != 0)  # |x| > 7
    assert grads["clip"][2] == 0  # 10 is beyond 0.975 * max|x|
    assert torch.all(grads["none"] != 0)


def test_state_dict_parameters_and_idempotence():
    from hdqt_cil.models import build_model
    model = build_model("resnet32", (3, 32, 32), 10)
    keys, params = list(model.state_dict()), list(model.parameters())
    quantize_model(model, preset("hdqt"))
    assert list(model.state_dict()) == keys and all(a is b for a, b in zip(model.parameters(), params))
    layers = {name: (type(m), m.quant_index) for name, m in model.named_modules() if hasattr(m, "quant_index")}
    assert len(layers) == 32  # 31 convolutions (stem included) and the classifier
    quantize_model(model, preset("hdqt"))
    assert layers == {name: (type(m), m.quant_index) for name, m in model.named_modules() if hasattr(m, "quant_index")}
    model.features.conv1.step = 7
    model.classifier = nn.Linear(64, 20)  # as avalanche's IncrementalClassifier grows
    quantize_model(model, preset("int4"))
    assert isinstance(model.classifier, QuantLinear) and model.classifier.step == 7
    assert model.classifier.quant_name == "classifier" and model.features.conv1.scheme == preset("int4")


def test_grouped_and_reflect_padded_convs_stay_float():
    model = nn.Sequential(nn.Conv2d(8, 8, 3, groups=8), nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quantize_model(model, preset("hdqt"))
    assert type(model[0]) is nn.Conv2d and type(model[1]) is nn.Conv2d
    assert any("padding_mode='reflect'" in str(w.message) for w in caught)


def test_steps_advance_in_training_only_and_seed_decides_bits():
    def grads(seed):
        layer = make_linear(scheme_from_config({"name": "hdqt", "seed": seed}))
        layer(torch.randn(8, 70, generator=torch.Generator().manual_seed(0))).sum().backward()
        return layer.weight.grad, layer
    first, layer = grads(0)
    assert layer.step == 1
    with torch.no_grad():
        layer(torch.randn(2, 70))
    layer.eval()
    layer(torch.randn(2, 70))
    assert layer.step == 1
    assert torch.equal(first, grads(0)[0]) and not torch.equal(first, grads(1)[0])


def test_statistics_count_saturation_and_clipping():
    model = nn.Sequential(nn.Linear(256, 8), nn.ReLU(), nn.Linear(8, 4))
    quantize_model(model, preset("hdqt"))
    with torch.no_grad():
        model[0].weight.fill_(1.0)  # every tile sum of 32 ones times levels up to 15 saturates
    model(torch.rand(16, 256) + 1).sum().backward()
    stats = quant_stats(model)
    assert set(stats) == {"0", "2"}
    assert stats["0"]["forward_saturated"] == 1.0 and 0 < stats["0"]["input_clipped"] < 0.1
    assert set(stats["0"]) == {"forward_saturated", "grad_input_saturated", "grad_weight_saturated",
                               "input_clipped", "weight_clipped"}
    reset_quant_stats(model)
    assert all(v == 0 for layer in quant_stats(model).values() for v in layer.values())


def test_luq_layer_gradients_use_fp4_levels():
    layer = make_linear(preset("luq"))
    x = torch.randn(16, 70, requires_grad=True)
    layer(x).square().sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(layer.weight.grad).all()
    assert quant_stats(nn.Sequential(layer))["0"]["forward_saturated"] >= 0


def test_non_finite_input_names_the_layer():
    model = quantize_model(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), preset("hdqt"))
    with pytest.raises(NonFiniteError, match=r"layer '0': non-finite value nan in the input"):
        model(torch.tensor([[1.0, float("nan"), 0.0, 2.0]]))


def test_non_finite_gradient_names_the_layer():
    layer = make_linear(preset("hdqt"), 4, 4)
    layer.quant_name = "features.fc"
    y = layer(torch.randn(2, 4))
    with pytest.raises(NonFiniteError, match=r"layer 'features.fc': non-finite value inf .*grad_output"):
        y.backward(torch.tensor([[1.0, float("inf"), 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))


def test_conv_keeps_the_layouts_the_layers_around_it_see():
    """Values and memory layouts both decide the bits of the float ops around a layer (BatchNorm picks its kernels
    by layout): the forward's output is a channels-last view of the product's rows, the input gradient with the
    estimator's mask is contiguous, and without a mask it is the interior view of col2im's padded buffer."""
    torch.manual_seed(0)
    for ste, x_grad_contiguous in (("authors", True), ("none", False)):
        scheme = dataclasses.replace(preset("hdqt"), ste=ste)
        conv = QuantConv2d(4, 8, 3, padding=1, bias=False, scheme=scheme)
        x = torch.randn(2, 4, 6, 6, requires_grad=True)
        seen = []
        x.register_hook(seen.append)  # the gradient as the layer returns it (a leaf's .grad is laid out anew)
        y = conv(x)
        assert y.stride() == (288, 1, 48, 8)
        y.backward(torch.randn(2, 8, 6, 6))
        assert seen[0].is_contiguous() == x_grad_contiguous, ste


def test_reference_ops_multiply_where_they_write():
    """The reference's `times`, `keep` and `advance_step`: what the layers once did with a torch op of their own."""
    from hdqt_cil.quant.backend import TORCH_OPS
    from hdqt_cil.quant import QuantSpec, quantize
    from hdqt_cil.quant.rounding import Counter

    g = torch.Generator().manual_seed(5)
    t, factor = torch.randn(6, 40, generator=g), torch.rand((), generator=g)
    spec = QuantSpec(4, "signed", "max", 1.0, "sample", "stochastic")
    counter = Counter(1, 2, 3)
    levels, scale = TORCH_OPS.quantize(t, spec, counter, times=factor)
    ref_levels, ref_scale = quantize(t, spec, counter)
    assert torch.equal(levels, ref_levels) and torch.equal(scale, ref_scale * factor)

    a, b = torch.randint(-7, 8, (3, 5, 64), generator=g).float(), torch.randint(-7, 8, (3, 64, 4), generator=g).float()
    sa, sb = torch.rand(3, 1, 1, generator=g) - 0.5, torch.rand((), generator=g)
    keep = torch.rand(5, 4, generator=g) > 0.5
    summed = TORCH_OPS.scaled_int_matmul(a, b, sa, sb, 2, sum_batch=True)
    assert torch.equal(TORCH_OPS.scaled_int_matmul(a, b, sa, sb, 2, sum_batch=True, keep=keep), summed * keep)
    with pytest.raises(ValueError, match="keep"):
        TORCH_OPS.scaled_int_matmul(a, b, sa, sb, 2, keep=keep)

    counter_t = torch.tensor(7)
    assert TORCH_OPS.advance_step(counter_t).item() == 7 and counter_t.item() == 8
