"""What one call of a layer computes, counted from its shapes and its scheme: the work that integer training
hardware would do, forward and backward apart (docs/cost.md).

Counts are keyed by kind; each is a number of operations (or of bits, for `random_bit` and `saved_bit`):

    int_mac <a>x<b> acc<c>   multiply-accumulates of integer operands of a and b bits into a c-bit accumulator
                             (`accnone`: exact, never saturating; `acce5m2`: each tile's sum rounded to that float
                             format); log2-grid operands (LUQ's FP4) are `log<bits>`
    saturate                 clamps (or a float accumulator's roundings) of a tile's (or the whole K's) sum
    float_mac                float32 multiply-accumulates (FP32 training, HOT's forward, float operands)
    float_mac <a>x<b> acc<c> multiply-accumulates of float operands of formats a and b (e4m3, e2m1, ...) into a
                             c accumulator (fp32, or the format each K tile's sum is rounded to)
    float_op                 other float32 operations: scaling integer products back, col2im's additions, summing
                             per-sample weight gradients, the straight-through estimator's masks
    hadamard_add             additions / subtractions of block Hadamard transforms (n·log2(block) a block of n)
    quantize int<b>|log<b>   elements quantized to b-bit levels (a max, a division, a rounding and a clamp each)
    quantize <format>        elements rounded to a float format (e4m3, e5m2, e2m1, ...), the same operations
    random_bit               random bits drawn by stochastic rounding (24 an element)
    saved_bit <width>        bits of activations the forward keeps for the backward, by the width of an element
                             (`int4`, `e4m3`, `mask` for the straight-through estimator's 1-bit masks, `float32`)

The rules are the layers' own (quant/layers.py, quant/operands.py, quant/float_product.py, quant/hot.py), read
from the same scheme objects and helpers; tests/test_cost.py holds the counts equal to counters hooked into the
torch reference.
"""
import math
from collections import Counter

from torch import nn

from ..quant.compact import store_spec
from ..quant.float_product import transform_block
from ..quant.float_schemes import FloatScheme
from ..quant.floats import FloatSpec
from ..quant.hadamard import hadamard_block_size
from ..quant.hot import HotConv2d, HotLinear, _hla_shape
from ..quant.layers import QuantLayer
from ..quant.operands import hadamard_block
from ..quant.quantizers import QuantSpec

RANDOM_BITS = 24  # a stochastic rounding's uniform: 24 bits (quant/rounding.py counter_uniform)
FLOAT_BITS = 32


def level_name(spec: QuantSpec | FloatSpec) -> str:
    if isinstance(spec, FloatSpec):
        return spec.fmt.name
    return f"{'log' if spec.grid == 'log2' else 'int'}{spec.bits}"


def _log2(block: int) -> int:
    return block.bit_length() - 1


class Tally:
    """Counts of one call, forward and backward apart."""

    def __init__(self):
        self.forward, self.backward = Counter(), Counter()

    def quantize(self, phase: Counter, spec: QuantSpec | FloatSpec | None, elements: int, block: int = 1) -> None:
        """A tensor of `elements` transformed by a Hadamard block (1: none) and quantized by `spec` (None: left
        float, transformed only)."""
        phase["hadamard_add"] += elements * _log2(block)
        if spec is not None:
            phase[f"quantize {level_name(spec)}"] += elements
            if spec.rounding == "stochastic":
                phase["random_bit"] += RANDOM_BITS * elements

    def product(self, phase: Counter, left: QuantSpec | None, right: QuantSpec | None, entries: int, m: int, n: int,
                k: int, tile: int | None = None, acc_bits: int | None = None, summed: bool = False,
                acc_format=None) -> None:
        """`entries` products of (m, k) by (k, n): integer when both operands are quantized (then scaled back, one
        float multiply an output), float otherwise; `summed`: the entries' results added in float. The
        accumulator: acc_bits (integer), acc_format (float) or neither (exact)."""
        macs = entries * m * n * k
        if left is not None and right is not None:
            acc = acc_format.name if acc_format is not None else acc_bits or "none"
            phase[f"int_mac {level_name(left)}x{level_name(right)} acc{acc}"] += macs
            if acc_bits is not None or acc_format is not None:
                tiles = 1 if tile is None or tile >= k else math.ceil(k / tile)
                phase["saturate"] += entries * m * n * tiles
            phase["float_op"] += entries * m * n
        else:
            phase["float_mac"] += macs
        if summed:
            phase["float_op"] += (entries - 1) * m * n


class Geometry:
    """A layer's products for an input of `x_shape`: `entries` × (rows, k) · (k, out) in the forward; a
    convolution's backward runs per sample (entries = batch, rows = its positions L)."""

    def __init__(self, layer: nn.Module, x_shape: tuple):
        weight = layer.weight
        self.out, self.k = weight.shape[0], weight[0].numel()
        self.x_elements = math.prod(x_shape)
        if isinstance(layer, nn.Conv2d):
            h, w = x_shape[-2:]
            batch = x_shape[0] if len(x_shape) == 4 else 1
            positions = math.prod((size + 2 * p - d * (kk - 1) - 1) // s + 1 for size, kk, p, d, s in
                                  zip((h, w), layer.kernel_size, layer.padding, layer.dilation, layer.stride))
            self.conv, self.batch, self.positions = True, batch, positions
            self.rows = batch * positions
        else:
            self.conv, self.rows = False, self.x_elements // self.k
            self.batch, self.positions = 1, self.rows


def _float_tally(g: Geometry, bias: bool, input_grad: bool, training: bool) -> Tally:
    """torch's own Linear / Conv2d (a model in FP32, or a scheme that quantizes nothing)."""
    t = Tally()
    t.product(t.forward, None, None, 1, g.rows, g.out, g.k)
    t.forward["float_op"] += g.rows * g.out if bias else 0
    if input_grad:
        t.product(t.backward, None, None, 1, g.rows, g.k, g.out)
    if training:
        t.product(t.backward, None, None, 1, g.out, g.k, g.rows)
        t.backward["float_op"] += g.rows * g.out if bias else 0
        t.forward["saved_bit float32"] += FLOAT_BITS * g.x_elements
    return t


def quant_layer_tally(layer: QuantLayer, x_shape: tuple, input_grad: bool, training: bool) -> Tally:
    """One call of a QuantLinear / QuantConv2d (quant/layers.py) on an input of `x_shape`."""
    scheme, g = layer.scheme, Geometry(layer, x_shape)
    bias = layer.bias is not None
    if not scheme.quantizes:
        return _float_tally(g, bias, input_grad, training)
    t = Tally()
    fwd, bwd = t.forward, t.backward
    fwd["float_op"] += g.rows * g.out if bias else 0
    bwd["float_op"] += g.rows * g.out if bias and training else 0
    product = scheme.forward
    t.quantize(fwd, product.left, g.x_elements)
    t.quantize(fwd, product.right, g.out * g.k)
    t.product(fwd, product.left, product.right, 1, g.rows, g.out, g.k, product.tile, product.acc_bits,
              acc_format=product.acc_format)
    if not (training or input_grad):
        return t
    if training:
        _saved(fwd, product.left, g.x_elements)
    fwd["saved_bit mask"] += g.x_elements if scheme.ste != "none" else 0
    shared = scheme.shares_grad_output
    if shared:
        t.quantize(bwd, scheme.grad_input.left, g.rows * g.out)
    if input_grad:
        gi = scheme.grad_input
        block = hadamard_block(gi, scheme.hadamard_cap, g.out)
        if not shared:
            t.quantize(bwd, gi.left, g.rows * g.out, block)
        _backward_operand(t, bwd, gi.right, product.right, g.k * g.out, block)
        entries, rows = (g.batch, g.positions) if g.conv else (1, g.rows)
        t.product(bwd, gi.left, gi.right if gi.right is not None else product.right, entries, rows, g.k, g.out,
                  gi.tile, gi.acc_bits, acc_format=gi.acc_format)
        bwd["float_op"] += (g.rows * g.k if g.conv else 0) + (g.x_elements if scheme.ste != "none" else 0)
    if not training:
        return t
    gw = scheme.grad_weight
    contraction = g.positions if g.conv else g.rows
    block = hadamard_block(gw, scheme.hadamard_cap, contraction)
    if not shared:
        t.quantize(bwd, gw.left, g.rows * g.out, block)
    _backward_operand(t, bwd, gw.right, product.left, g.rows * g.k, block)
    t.product(bwd, gw.left, gw.right if gw.right is not None else product.left, g.batch, g.out, g.k, contraction,
              gw.tile, gw.acc_bits, summed=True, acc_format=gw.acc_format)
    bwd["float_op"] += g.out * g.k if scheme.ste != "none" else 0
    return t


def float_layer_tally(layer: QuantLayer, x_shape: tuple, input_grad: bool, training: bool) -> Tally:
    """One call of a QuantLinear / QuantConv2d under a FloatScheme (quant/float_product.py): block-scaled inputs
    are rounded after im2col, the others before it; the backward keeps x in its format, or in float32 where its
    scales are per block."""
    scheme, g, t = layer.scheme, Geometry(layer, x_shape), Tally()
    fwd, bwd = t.forward, t.backward
    bias = g.rows * g.out if layer.bias is not None else 0
    product = scheme.forward
    blocked = product.left.block is not None
    _format_product(t, fwd, product, g.rows * g.k if blocked else g.x_elements, g.out * g.k, 1, g.rows, g.out, g.k)
    fwd["float_op"] += bias
    if not (training or input_grad):
        return t
    masks = g.x_elements if scheme.ste != "none" else 0
    fwd["saved_bit mask"] += masks
    if training:
        _saved(fwd, None if blocked else product.left, g.x_elements)
        bwd["float_op"] += bias
    if input_grad:
        entries, rows = (g.batch, g.positions) if g.conv else (1, g.rows)
        _format_product(t, bwd, scheme.grad_input, g.rows * g.out, g.k * g.out, entries, rows, g.k, g.out)
        bwd["float_op"] += (g.rows * g.k if g.conv else 0) + masks
    if not training:
        return t
    contraction = g.positions if g.conv else g.rows
    _format_product(t, bwd, scheme.grad_weight, g.rows * g.out, g.rows * g.k, g.batch, g.out, g.k, contraction,
                    summed=True)
    bwd["float_op"] += g.out * g.k if scheme.ste != "none" else 0
    return t


def _format_product(t: Tally, phase: Counter, product, left: int, right: int, entries: int, m: int, n: int, k: int,
                    summed: bool = False) -> None:
    """A FormatProduct of `entries` × (m, k) · (k, n) whose operands have `left` and `right` elements: their
    rounding, the multiply-accumulates, a scale pair per output and K block where scales are per block, one scale
    per output otherwise (format_matmul)."""
    block = transform_block(product, k)
    for spec, elements in ((product.left, left), (product.right, right)):
        phase["float_op"] += elements if product.random_signs and block > 1 else 0
        t.quantize(phase, spec, elements, block)
    acc = product.acc.name if product.acc is not None else "fp32"
    phase[f"float_mac {product.left.fmt.name}x{product.right.fmt.name} acc{acc}"] += entries * m * n * k
    outputs = entries * m * n
    phase["float_op"] += outputs * (2 * math.ceil(k / product.left.block) if product.left.block else 1)
    phase["float_op"] += (entries - 1) * m * n if summed else 0


def _saved(phase: Counter, spec: QuantSpec | FloatSpec | None, elements: int) -> None:
    """`elements` kept for the backward as `spec`'s levels (None: float32)."""
    if spec is None:
        phase["saved_bit float32"] += FLOAT_BITS * elements
    else:
        phase[f"saved_bit {level_name(spec)}"] += spec.bits * elements


def _backward_operand(t: Tally, phase: Counter, spec, source, elements: int, block: int) -> None:
    """A backward operand (operands.backward_operand): re-quantized by `spec`, or the forward's levels (`source`)
    or floats transformed as they are."""
    if spec is not None or block > 1:
        t.quantize(phase, spec, elements, block)


def hot_layer_tally(layer, x_shape: tuple, input_grad: bool, training: bool) -> Tally:
    """One call of a HotLinear / HotConv2d (quant/hot.py): float forward; ABC, g_x and g_W."""
    scheme, g, t = layer.scheme, Geometry(layer, x_shape), Tally()
    fwd, bwd = t.forward, t.backward
    t.product(fwd, None, None, 1, g.rows, g.out, g.k)
    fwd["float_op"] += g.rows * g.out if layer.bias is not None else 0
    if input_grad:
        n = hadamard_block_size(g.out, scheme.hadamard_cap)
        g_spec = scheme.grad_output_spec(layer.lqs_per_token)
        t.quantize(bwd, g_spec, g.rows * g.out, n)
        w_spec = scheme.weight_spec if g_spec is not None else None
        t.quantize(bwd, w_spec, g.k * g.out, n)
        t.product(bwd, g_spec, w_spec, 1, g.rows, g.k, g.out)
        bwd["float_op"] += g.rows * g.k if g.conv else 0
    if not training:
        return t
    if isinstance(layer, HotLinear) and len(x_shape) > 2:
        entries, tokens = x_shape[0], g.rows // x_shape[0]
    else:
        entries, tokens = (g.batch, g.positions) if g.conv else (1, g.rows)
    block, rank = _hla_shape(layer, tokens)
    kept = tokens // block * rank
    input_spec = scheme.input_spec
    keeps = layer._keeps()  # the compressed operand, made in the forward (ABC) or from x kept in float / 8 bits
    compressing = fwd if keeps == "compressed" else bwd
    t.quantize(compressing, input_spec, entries * g.k * kept)
    compressing["hadamard_add"] += entries * g.k * tokens * _log2(block)
    if keeps == "compressed":
        _saved(fwd, input_spec, entries * g.k * kept)
    else:
        stored = store_spec(scheme.abc_bits) if keeps == "stored" else None
        t.quantize(fwd, stored, g.x_elements)
        _saved(fwd, stored, g.x_elements)
    gw_spec = scheme.grad_weight_spec
    t.quantize(bwd, gw_spec, entries * g.out * kept)
    bwd["hadamard_add"] += entries * g.out * tokens * _log2(block)
    t.product(bwd, gw_spec, input_spec if gw_spec is not None else None, entries, g.out, g.k, kept, summed=True)
    if layer.bias is not None:
        bwd["float_op"] += g.rows * g.out
    return t


def layer_tally(layer: nn.Module, x_shape: tuple, input_grad: bool, training: bool) -> Tally:
    """The counts of one call of any Linear / Conv2d layer (quantized or not) on an input of `x_shape`.
    `training`: the weight trains (its gradient, and what the forward keeps for it); `input_grad`: the input's
    gradient is computed, whether or not the weight trains (a frozen layer between trained ones passes it on)."""
    if isinstance(layer, (HotLinear, HotConv2d)):
        return hot_layer_tally(layer, x_shape, input_grad, training)
    if isinstance(layer, QuantLayer) and isinstance(layer.scheme, FloatScheme):
        return float_layer_tally(layer, x_shape, input_grad, training)
    if isinstance(layer, QuantLayer):
        return quant_layer_tally(layer, x_shape, input_grad, training)
    return _float_tally(Geometry(layer, x_shape), layer.bias is not None, input_grad, training)
