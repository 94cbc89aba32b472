"""The analytic operation counts (hdqt_cil/cost) against counters hooked into the torch reference: one training
step of small models under every scheme, the counted operations of every call of the reference's primitives
(quantizers, Hadamard transforms, integer products) and torch's own FLOP counter for the float products."""
import math
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from hdqt_cil.cost.counts import RANDOM_BITS, layer_tally, level_name
from hdqt_cil.quant import calibrate_lqs, layers, preset, quantize_model
from hdqt_cil.quant.backend import TORCH_OPS
from hdqt_cil.quant.hadamard import checked_block
from hdqt_cil.quant.hla import hla_compress


class CountingOps(SimpleNamespace):
    """TORCH_OPS, counting what each call computes from the tensors it is given."""

    def __init__(self):
        super().__init__(name="counting", tally=Counter(), im2col=TORCH_OPS.im2col, col2im=TORCH_OPS.col2im,
                         advance_step=TORCH_OPS.advance_step)

    def _quantized(self, t, spec):
        self.tally[f"quantize {level_name(spec)}"] += t.numel()
        if spec.rounding == "stochastic":
            self.tally["random_bit"] += RANDOM_BITS * t.numel()

    def quantize(self, t, spec, counter=None, worst=None, times=None):
        self._quantized(t, spec)
        return TORCH_OPS.quantize(t, spec, counter, worst, times)

    def forward_quantize(self, t, spec, counter=None, ste="none", tally=None, worst=None):
        self._quantized(t, spec)
        return TORCH_OPS.forward_quantize(t, spec, counter, ste, tally, worst)

    def block_hadamard(self, x, dim=-1, block=None):
        block = checked_block(x.shape[dim], block)
        self.tally["hadamard_add"] += x.numel() * (block.bit_length() - 1)
        return TORCH_OPS.block_hadamard(x, dim, block)

    def hadamard_quantize(self, x, spec, counter=None, block=None, dim=-1, worst=None, times=None):
        return self.quantize(self.block_hadamard(x, dim, block), spec, counter, worst, times)

    def hla_compress(self, t, block, rank, dim=-1):
        return hla_compress(t, block, rank, dim, self.block_hadamard)

    def scaled_int_matmul(self, a, b, scale_a, scale_b, block=1, tile=32, acc_bits=8, bounds=None,
                          count_saturated=False, sum_batch=False, tally=None, keep=None, acc_format=None):
        batch = math.prod(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        (m, k), n = a.shape[-2:], b.shape[-1]
        self.tally["int_mac"] += batch * m * n * k
        if acc_bits is not None or acc_format is not None:
            self.tally["saturate"] += batch * m * n * (1 if tile is None or tile >= k else math.ceil(k / tile))
        return TORCH_OPS.scaled_int_matmul(a, b, scale_a, scale_b, block, tile, acc_bits, bounds, count_saturated,
                                           sum_batch, tally, keep, acc_format)

    def col2im_int_matmul(self, a, b, scale_a, scale_b, block, tile, acc_bits, bounds, x_shape, kernel_size, padding,
                          dilation, stride, keep=None, tally=None, acc_format=None):
        rows = self.scaled_int_matmul(a, b, scale_a, scale_b, block, tile, acc_bits, bounds, tally=tally,
                                      acc_format=acc_format)
        return self.col2im(rows, x_shape, kernel_size, padding, dilation, stride, keep)


def mlp():
    return nn.Sequential(nn.Linear(40, 24, bias=False), nn.ReLU(), nn.Linear(24, 24, bias=False), nn.ReLU(),
                         nn.Linear(24, 5))


def convnet():
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 8, 3, stride=2, padding=1, bias=False),
                         nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 5))


def step_inputs(model_fn, batch):
    shape = (40,) if model_fn is mlp else (3, 8, 8)
    g = torch.Generator().manual_seed(batch)
    return torch.randn(batch, *shape, generator=g), torch.randint(0, 5, (batch,), generator=g)


def analytic(model, x):
    """The cost module's counts of one training step: each layer's input shape taken by a hook; a frozen layer's
    weight gets no gradient."""
    shapes = {}

    def record(module, args):
        shapes.setdefault(module, (tuple(args[0].shape), args[0].requires_grad))

    hooks = [m.register_forward_pre_hook(record) for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    model.train()(x)  # with gradients on: a layer's input needs its gradient unless it is the data
    for h in hooks:
        h.remove()
    total = Counter()
    for layer, (shape, input_grad) in shapes.items():
        tally = layer_tally(layer, shape, input_grad, training=layer.weight.requires_grad)
        total.update(tally.forward)
        total.update(tally.backward)
    return total


def observed(model, x, y, monkeypatch):
    ops = CountingOps()
    monkeypatch.setattr(layers, "resolve_ops", lambda backend, device: ops)  # the HOT layers' too
    with FlopCounterMode(display=False) as flops:
        F.cross_entropy(model(x), y).backward()
    return ops.tally, flops.get_total_flops() // 2


@pytest.mark.parametrize("model_fn", [mlp, convnet])
@pytest.mark.parametrize("scheme", ["hdqt", "int4", "luq", "hot"])
@pytest.mark.parametrize("batch", [6, 8])
def test_counts_equal_the_reference_calls(model_fn, scheme, batch, monkeypatch):
    torch.manual_seed(0)
    model = quantize_model(model_fn(), preset(scheme))
    x, y = step_inputs(model_fn, batch)
    if scheme == "hot":
        calibrate_lqs(model, x, y, F.cross_entropy)
    counted = analytic(model, x)
    seen, _ = observed(model, x, y, monkeypatch)
    for kind in ("hadamard_add", "random_bit", "saturate") + tuple(k for k in counted if k.startswith("quantize")):
        assert counted[kind] == seen[kind], kind
    assert sum(v for k, v in counted.items() if k.startswith("int_mac")) == seen["int_mac"]
    assert seen["int_mac"] > 0 and (scheme == "hot" or seen["saturate"] > 0 or scheme == "luq")


@pytest.mark.parametrize("model_fn", [mlp, convnet])
@pytest.mark.parametrize("scheme", ["hdqt", "luq", "hot", "fp32"])
def test_a_frozen_middle_layer_counts_its_input_gradient_alone(model_fn, scheme, monkeypatch):
    """A frozen layer between trained ones (memo's old upper blocks) passes the gradient on: its input gradient's
    quantizers and product are counted, its weight gradient's are not, as the reference calls them."""
    torch.manual_seed(0)
    model = quantize_model(model_fn(), preset(scheme))
    x, y = step_inputs(model_fn, 6)
    if scheme == "hot":
        calibrate_lqs(model, x, y, F.cross_entropy)
    trained = analytic(model, x)
    model[2].weight.requires_grad_(False)
    counted = analytic(model, x)
    seen, macs = observed(model, x, y, monkeypatch)
    assert model[0].weight.grad is not None and model[2].weight.grad is None
    if scheme == "fp32":
        assert counted["float_mac"] == macs
        return
    for kind in ("hadamard_add", "random_bit", "saturate") + tuple(k for k in counted if k.startswith("quantize")):
        assert counted[kind] == seen[kind], kind
    int_macs = [sum(v for k, v in c.items() if k.startswith("int_mac")) for c in (counted, trained)]
    assert int_macs[0] == seen["int_mac"] and int_macs[0] < int_macs[1]  # the weight gradient's are what is missing


@pytest.mark.parametrize("model_fn", [mlp, convnet])
def test_float_products_equal_torchs_flop_count(model_fn, monkeypatch):
    """FP32 (quant=fp32 layers and a model left in float alike) and HOT's float forward."""
    x, y = step_inputs(model_fn, 7)
    for model in (model_fn(), quantize_model(model_fn(), preset("fp32"))):
        _, macs = observed(model, x, y, monkeypatch)
        assert analytic(model, x)["float_mac"] == macs
    hot_model = quantize_model(model_fn(), preset("hot"))
    calibrate_lqs(hot_model, x, y, F.cross_entropy)
    with FlopCounterMode(display=False) as flops:
        hot_model.train()(x)  # the forward alone: HOT's backward products are all integer
    assert analytic(hot_model, x)["float_mac"] == flops.get_total_flops() // 2


@pytest.mark.parametrize("model_fn", [mlp, convnet])
@pytest.mark.parametrize("scheme", ["fp8", "mxfp4", "nvfp4", "fp"])
def test_float_format_products_equal_torchs_flop_count(model_fn, scheme, monkeypatch):
    """A float scheme's products run on torch's matmul, tile by tile: their multiply-accumulates are torch's FLOPs."""
    x, y = step_inputs(model_fn, 6)
    model = quantize_model(model_fn(), preset(scheme))
    counted = analytic(model, x)
    _, macs = observed(model, x, y, monkeypatch)
    assert sum(n for kind, n in counted.items() if kind.startswith("float_mac ")) == macs > 0


def test_integer_products_are_keyed_by_operand_and_accumulator_bits():
    model = quantize_model(mlp(), preset("hdqt"))
    counted = analytic(model, step_inputs(mlp, 8)[0])
    forward_macs = 8 * (40 * 24 + 24 * 24 + 24 * 5)
    assert counted["int_mac int4xint4 acc8"] == forward_macs + 2 * forward_macs - 8 * 40 * 24  # no g_x of layer 1
    luq = analytic(quantize_model(mlp(), preset("luq")), step_inputs(mlp, 8)[0])
    assert luq["int_mac int4xint4 acc8"] == forward_macs and luq["int_mac log4xint4 accnone"] > 0


def test_saved_activations_by_width_and_the_energy_model():
    from hdqt_cil.cost.energy import EnergyTable

    x = step_inputs(convnet, 4)[0]
    hdqt_saved = analytic(quantize_model(convnet(), preset("hdqt")), x)
    fp32_saved = analytic(convnet(), x)
    inputs = 4 * (3 * 64 + 4 * 64 + 8 * 16)  # every layer's input elements
    assert hdqt_saved["saved_bit int4"] == 4 * inputs and hdqt_saved["saved_bit mask"] == inputs
    assert fp32_saved["saved_bit float32"] == 32 * inputs
    table = EnergyTable()
    assert table.per_op("int_mac int4xint4 acc8") == pytest.approx(0.2 * 16 / 64 + 0.03)
    assert table.per_op("int_mac int8xint8 accnone") == pytest.approx(0.2 + 0.12)
    assert table.per_op("int_mac log4xint4 accnone") == pytest.approx(0.015 + 0.12)  # a shift, costed as an add
    assert table.per_op("float_mac e4m3xe4m3 accfp32") == pytest.approx(3.7 * 16 / 576 + 0.9)
    assert table.per_op("float_mac e2m1xe2m1 acce5m2") == pytest.approx(3.7 * 4 / 576 + 0.9 / 4)
    assert table.joules({"float_mac": 1e12, "saved_bit int4": 1e12}) == pytest.approx(
        {"compute": 4.6, "saved activations": 61.0, "total": 65.6})
    with pytest.raises(KeyError, match="no energy for operations of kind 'teleport'"):
        table.per_op("teleport")


def test_a_float_accumulator_is_costed_as_a_float_add_of_its_width():
    from hdqt_cil.cost.energy import EnergyTable
    from hdqt_cil.quant.schemes import scheme_from_config

    table = EnergyTable()
    assert table.per_op("int_mac int4xint4 acce5m2") == pytest.approx(0.2 * 16 / 64 + 0.9 * 8 / 32)
    scheme = scheme_from_config({"name": "hdqt", "acc": "fp"})
    counted = analytic(quantize_model(mlp(), scheme), step_inputs(mlp, 8)[0])
    assert counted["int_mac int4xint4 acce5m2"] > 0 and not any(k.endswith("acc8") for k in counted)
    assert counted["saturate"] > 0
