"""The products of a layer whose operands are low-precision floats (FP8, MXFP4, NVFP4, the HDQT authors' float
quantizer): quant/float_schemes.py says which format each operand takes; docs/numerics.md "Float training" fixes
the arithmetic.

Every operand is rounded along the product's contraction K (its last dimension here), after a block Hadamard
transform along K where the product has one. Where one scale spans the operand (FP8's per-tensor scale, the authors'
unscaled quantizer), the backward re-quantizes what the forward's product saw, as the integer schemes do; a
block-scaled operand's scales run along the forward's K, so its backward re-quantizes the float tensor along the
backward's own K (as the MX and NVFP4 training recipes do).
"""
import math

import torch

from .backend import (authors_tile_sum, batch_sum, block_scaled_product, covered, e2m1_blocks, float_values,
                      fp8_matmul, on_fp8_tensor_cores, on_int8_tensor_cores, on_kernels)
from .floats import FloatFormat, FloatSpec, authors_float
from .hadamard import block_hadamard, hadamard_block_size
from .intmm import largest_magnitude
from .streams import layer_gradients


class FloatOperand:
    """Values on a format's grid with their scale (0-dim, or per block along K broadcast to the values) and that
    format (None where unknown: no FP8 tensor cores then)."""

    def __init__(self, values: torch.Tensor, scale: torch.Tensor, block: int | None, fmt: FloatFormat | None = None):
        self.values, self.scale, self.block, self.fmt = values, scale, block, fmt

    def dequantized(self) -> torch.Tensor:
        return self.values * self.scale

    def tile_scales(self, start: int, end: int, width: int) -> torch.Tensor:
        """The scale of each row's blocks of `width` from K index `start` to `end`, one tile a row of the result
        (..., tiles, rows)."""
        return self.scale[..., start:end:width].transpose(-1, -2)


def format_matmul(a: FloatOperand, b: FloatOperand, product, hadamard: int = 1, tally=None,
                  backend: str = "torch") -> torch.Tensor:
    """a (..., M, K) times bᵀ (b is (..., N, K)) as the format hardware sums it, / `hadamard` (the transform's n).

    Without block scales or an accumulator format: the values' products summed in float32 (torch.matmul), then
    scaled once. Otherwise K is cut into tiles (a block-scaled format's block, else `product.tile`, else the whole
    K); each tile's sum of value products is rounded to `product.acc` (the authors' quantizer) where there is one,
    scaled by the tile's scale pair where scales are per block, and the tiles are added in order. `tally`: an int64
    (2,) view to which (tile sums past the accumulator's largest value, tile sums) are added. Unscaled tiles under an
    accumulator format are rounded and added by the kernels where `backend` runs them (backend.authors_tile_sum)."""
    k = a.values.shape[-1]
    width = _tile_width(a, product, k)
    if width is None:
        out = torch.matmul(a.values, b.values.mT)
        return out * ((a.scale.reshape(()) * b.scale.reshape(())) / hadamard)
    out, saturated = 0, 0
    limit = product.acc_spec.largest if product.acc is not None else None
    fused = limit is not None and not a.block and on_kernels(backend, a.values.device)
    for start, end, partials in _tile_sum_chunks(a, b, width):
        if fused:
            out = authors_tile_sum(partials, out, product.acc, limit, None if tally is None else tally[0])
            continue
        if limit is not None:
            saturated = saturated + (partials.abs() > limit).sum()
            partials = authors_float(partials, product.acc.exp_bits, product.acc.man_bits)
        if a.block:
            partials = partials * (a.tile_scales(start, end, width).unsqueeze(-1)
                                   * b.tile_scales(start, end, width).unsqueeze(-2))
        for partial in partials.unbind(-3):
            out = out + partial
    if tally is not None and product.acc is not None:
        if not fused:  # the kernels counted into tally[0] themselves: no launch to add a 0
            tally[0].add_(saturated)
        tally[1].add_(out.numel() * math.ceil(k / width))
    if not a.block:
        out = out * (a.scale.reshape(()) * b.scale.reshape(()))
    return _over(out, hadamard)


def _over(out: torch.Tensor, hadamard: int) -> torch.Tensor:
    """out / hadamard (the transform's n), without a pass over the product where n is 1 (x / 1 is x)."""
    return out / hadamard if hadamard != 1 else out


def _tile_width(a: FloatOperand, product, k: int) -> int | None:
    """The K tile whose sums format_matmul scales or rounds one at a time (None: K is summed whole)."""
    width = a.block or (product.tile if product.acc is not None else None)
    if width is None and product.acc is None:
        return None
    return min(width or k, max(k, 1))


TILE_SUMS_AT_ONCE = 1 << 26  # float32 tile sums one batched matmul forms: 256 MiB


def _tile_sum_chunks(a: FloatOperand, b: FloatOperand, width: int):
    """(start, end, the float32 sums of the value products of each K tile from `start` to `end`, (..., tiles, M,
    N)), in K order: the whole tiles of a chunk are one batched matmul (not one matmul and its rounding a tile, a
    product's launches many times over), chunks as many tiles as TILE_SUMS_AT_ONCE holds; a last, narrower tile
    is a chunk of its own."""
    k = a.values.shape[-1]
    whole = k - k % width
    batch = torch.broadcast_shapes(a.values.shape[:-2], b.values.shape[:-2]).numel()
    step = width * max(TILE_SUMS_AT_ONCE // max(batch * a.values.shape[-2] * b.values.shape[-2], 1), 1)
    chunks = [(start, min(start + step, whole), width) for start in range(0, whole, step)]
    for start, end, tile in chunks + ([(whole, k, k - whole)] if whole < k else []):
        left, right = (t.values[..., start:end].unflatten(-1, (-1, tile)).transpose(-3, -2) for t in (a, b))
        yield start, end, torch.matmul(left, right.mT)


def largest_format_tile_sum(a: FloatOperand, b: FloatOperand, product) -> torch.Tensor:
    """max |tile sum| of format_matmul's K tiles before its accumulator rounds them (what it compares with the
    format's largest value), a float64 0-dim tensor on the values' device; 0 for an empty product."""
    width = _tile_width(a, product, a.values.shape[-1])
    if width is None or not (a.values.numel() and b.values.numel()):
        return torch.zeros((), dtype=torch.float64, device=a.values.device)
    return torch.stack([largest_magnitude(partials) for *_, partials in _tile_sum_chunks(a, b, width)]).amax().double()


def float_matmul(a: FloatOperand, b: FloatOperand, product, backend: str, hadamard: int = 1, tally=None,
                 sum_batch: bool = False) -> torch.Tensor:
    """format_matmul (with sum_batch: summed over the batch by backend.batch_sum), on the FP8 tensor cores where the
    backend's `on_fp8_tensor_cores` says they compute it."""
    if on_fp8_tensor_cores(a, b, product, backend, sum_batch):
        return _over(fp8_matmul(a, b, sum_batch), hadamard)
    out = format_matmul(a, b, product, hadamard, tally, backend)
    return batch_sum(out, backend) if sum_batch else out


def _layer_matmul(layer, a: FloatOperand, b: FloatOperand, product, hadamard: int = 1, tally=None,
                  sum_batch: bool = False) -> torch.Tensor:
    """float_matmul of one of a layer's products; its largest tile sum goes to the layer's diagnostics watch where
    one is set and the product has an accumulator format."""
    if layer.ops_watch is not None and product.acc is not None and tally is not None:
        layer.ops_watch.tile_sum(tally, largest_format_tile_sum(a, b, product), product.acc_spec.largest)
    return float_matmul(a, b, product, layer.scheme.backend, hadamard, tally, sum_batch)


def transform_block(product, k: int) -> int:
    """The Hadamard block along a product's K (1: none)."""
    return hadamard_block_size(k, product.hadamard_cap) if product.hadamard else 1


def random_signs(layer, step, k: int, device) -> torch.Tensor:
    """±1 along K from the layer's counter (one draw a layer and step): both operands of a product are multiplied by
    them before the transform, which leaves the product unchanged and makes the Hadamard basis random (NVFP4's
    weight-gradient product)."""
    return torch.where(layer._counter("hadamard.signs", step).uniform((k,), device) < 0.5, -1.0, 1.0)


def _transformed(t: torch.Tensor, block: int, signs: torch.Tensor | None, transform=block_hadamard) -> torch.Tensor:
    """float32 `t` (..., rows, K) times `signs`, transformed along K over blocks of `block` (1: not)."""
    t = t.to(torch.float32)
    t = t * signs if signs is not None else t
    return transform(t, -1, block) if block > 1 else t


def _rounding_counter(layer, spec: FloatSpec, role: str, step):
    return layer._counter(role, step) if spec.rounding == "stochastic" else None


def quantize_operand(layer, t: torch.Tensor, spec: FloatSpec, role: str, step, block: int = 1,
                     signs: torch.Tensor | None = None, transform=block_hadamard) -> FloatOperand:
    """`t` (..., rows, K) signed by `signs`, transformed along K by `block`, rounded to spec (its scales along K);
    the values it rounds to 0 reported to the layer's diagnostics watch where one is set (`ops_watch`)."""
    t = _transformed(t, block, signs, transform)
    values, scale = float_values(t, spec, _rounding_counter(layer, spec, role, step), layer.scheme.backend)
    if layer.ops_watch is not None:
        layer.ops_watch.underflow(role, t, values)
    return FloatOperand(values, scale, spec.block, spec.fmt)


def _product(layer, left, right, product, roles, step, tally=None, sum_batch=False):
    """The product of float tensors left (..., M, K) and right (..., N, K) as `product` computes it: a block-scaled
    E2M1 product on the int8 tensor cores where `on_int8_tensor_cores` says so and no diagnostics watch wants the
    values (the kernels' transform, rounding and GEMM, the reference's bits); the Hadamard transform is the layer's
    ops' (quant.backend) either way."""
    ops = layer._ops(left.device)
    k = left.shape[-1]
    block = transform_block(product, k)
    signs = random_signs(layer, step, k, left.device) if product.random_signs and block > 1 else None
    operands = ((left, product.left, roles[0]), (right, product.right, roles[1]))

    def reference():
        a, b = (quantize_operand(layer, t, spec, role, step, block, signs, ops.block_hadamard)
                for t, spec, role in operands)
        return _layer_matmul(layer, a, b, product, block, tally, sum_batch)

    def on_int8():
        a, b = (e2m1_blocks(_transformed(t, block, signs, ops.block_hadamard), spec,
                            _rounding_counter(layer, spec, role, step)) for t, spec, role in operands)
        return block_scaled_product(a, b, product.left.block, block, sum_batch)
    if layer.ops_watch is None and on_int8_tensor_cores(product, layer.scheme.backend, left.device):
        return covered(on_int8, reference)
    return reference()


class FloatProduct(torch.autograd.Function):
    """y = x · Wᵀ as a FloatScheme's forward product; its backward computes g_x and g_W the same way."""

    @staticmethod
    def forward(ctx, x, weight, layer, step, training):
        scheme, product, ops = layer.scheme, layer.scheme.forward, layer._ops(x.device)
        w = weight.reshape(weight.shape[0], -1)
        tally = layer._tally("forward_saturated") if training else None
        if product.left.block:  # scales per block along K: the input is cut into blocks after im2col
            y = _product(layer, layer._forward_rows(x, ops), w, product, ("input", "weight"), step, tally)
            seen_x, seen_w = x, weight
        else:  # one scale an operand: x is rounded once, before im2col, as the integer schemes do
            xq = quantize_operand(layer, x, product.left, "input", step)
            wq = quantize_operand(layer, w, product.right, "weight", step)
            rows = FloatOperand(layer._forward_rows(xq.values, ops), xq.scale, None, xq.fmt)
            y = _layer_matmul(layer, rows, wq, product, tally=tally)
            seen_x, seen_w = xq.dequantized(), wq.dequantized().reshape(weight.shape)
        x_keep, w_keep = (scheme.keep(x), scheme.keep(weight)) if training else (None, None)
        ctx.save_for_backward(seen_x, seen_w, x_keep, w_keep)
        ctx.layer, ctx.step, ctx.x_shape, ctx.w_shape = layer, step, x.shape, weight.shape
        return layer._forward_output(y, x.shape)

    @staticmethod
    def backward(ctx, grad_y):
        layer, step, scheme = ctx.layer, ctx.step, ctx.layer.scheme
        x, weight, x_keep, w_keep = ctx.saved_tensors
        g_rows, g_cols = layer._grad_output_layouts(grad_y.to(torch.float32))
        ops = layer._ops(grad_y.device)  # im2col and col2im: gathers and ordered sums, the same bits everywhere

        def grad_input():
            w_cols = weight.reshape(weight.shape[0], -1).t()  # (K, O): contraction over the outputs
            rows = _product(layer, g_rows, w_cols, scheme.grad_input, ("grad_input.grad_output", "grad_input.weight"),
                            step, layer._tally("grad_input_saturated"))
            return layer._grad_input(rows, ctx.x_shape, ops, x_keep)

        def grad_weight():
            grad_w = _product(layer, g_cols, layer._input_columns(x, ops), scheme.grad_weight,
                              ("grad_weight.grad_output", "grad_weight.input"), step,
                              layer._tally("grad_weight_saturated"), sum_batch=True).reshape(ctx.w_shape)
            return grad_w if w_keep is None else grad_w * w_keep

        grad_x, grad_w = layer_gradients(grad_input, grad_weight, grad_y.device, *ctx.needs_input_grad[:2])
        return grad_x, grad_w, None, None, None
