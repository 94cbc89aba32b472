"""The operands of a quantized layer's products: integer levels with their scale, or float tensors, and the
product of two of them scaled back (docs/quant.md: which operand each product takes, and how)."""
from typing import NamedTuple

import torch

from .hadamard import hadamard_block_size
from .quantizers import QuantSpec
from .schemes import Product


class Operand(NamedTuple):
    """One side of a product: integer levels with their scale (broadcastable), or a float tensor (scale None)."""
    values: torch.Tensor
    scale: torch.Tensor | None
    bound: float = 0.0  # the largest |level| it can hold (integer operands)

    @property
    def is_integer(self) -> bool:
        return self.scale is not None

    def transposed(self) -> "Operand":
        scale = None if self.scale is None else swap_last(self.scale)
        return Operand(self.values.transpose(-1, -2), scale, self.bound)

    def dequantized(self) -> torch.Tensor:
        return self.values if self.scale is None else self.values * self.scale


def swap_last(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(-1, -2) if t.dim() >= 2 else t


def _integer_product(a: Operand, bt: Operand, block: int, spec: Product) -> tuple:
    """The arguments (a, b, scale_a, scale_b, block, tile, acc_bits, bounds) of the ops' integer products."""
    return (a.values, bt.values.transpose(-1, -2), a.scale, swap_last(bt.scale), block, spec.tile, spec.acc_bits,
            (a.bound, bt.bound))


def product(ops, a: Operand, bt: Operand, block: int, product: Product, sum_batch: bool = False, tally=None,
            keep=None):
    """a (..., M, K) times btᵀ (K along bt's last dim too), scaled back by s_a · s_b / block; with sum_batch,
    summed over the leading dims (in order, `sum_entries`, for the integer product), times the bool mask `keep`
    where given. `tally`: an int64 (2,) view to which an integer product adds its saturated tile sums and its
    tile sums (float products count nothing).
    """
    if not (a.is_integer and bt.is_integer):
        out = torch.matmul(a.dequantized(), bt.dequantized().transpose(-1, -2))
        out = out / block if block > 1 else out
        out = out.sum(dim=0) if sum_batch else out
        return out if keep is None else out * keep
    return ops.scaled_int_matmul(*_integer_product(a, bt, block, product), sum_batch=sum_batch, tally=tally,
                                 keep=keep, acc_format=product.acc_format)


def product_col2im(ops, a: Operand, bt: Operand, block: int, spec: Product, fold: tuple, keep, tally):
    """A convolution's input gradient: col2im of product(ops, a, bt, block, spec) into the input's shape, times
    the estimator's mask `keep` where given; `fold` = (x_shape, kernel_size, padding, dilation, stride). Integer
    operands go to ops.col2im_int_matmul, which a backend can run without the (B, L, K) float rows."""
    if not (a.is_integer and bt.is_integer):
        return ops.col2im(product(ops, a, bt, block, spec, tally=tally), *fold, keep)
    return ops.col2im_int_matmul(*_integer_product(a, bt, block, spec), *fold, keep, tally,
                                 acc_format=spec.acc_format)


def forward_operand(layer, t, spec: QuantSpec | None, role: str, step, training: bool, ops, checks):
    """Quantize a forward operand per tensor; with training, count its clipped values and build the STE mask (in
    the quantizer's pass where the kernels run). Its scale raises the layer's forward `quant_worst`."""
    if spec is None:
        return Operand(t, None), None
    counter, worst = layer._counter(role, step), layer.quant_worst[0]
    if training:
        levels, scale, keep = ops.forward_quantize(t, spec, counter, layer.scheme.ste,
                                                   layer._tally(f"{role}_clipped"), worst)
    else:
        (levels, scale), keep = ops.quantize(t, spec, counter, worst=worst), None
    checks.append((role, t, scale))
    return Operand(levels, scale.reshape(()), spec.level_bound), keep


def backward_operand(layer, t, spec: QuantSpec | None, source: Operand | None, block: int, role: str,
                      step, ops, checks) -> Operand:
    """A backward operand, block-Hadamard-transformed along K (its last dim) when block > 1: re-quantized (the
    transform fused into the quantizer), or the forward's levels / floats transformed as they are.

    Re-quantized forward levels carry the product of both scales (s_requant · s_forward, float32; the quantizer
    writes it)."""
    if spec is None:
        t = ops.block_hadamard(t, -1, block) if block > 1 else t
        if source is None or not source.is_integer:
            return Operand(t, None)
        return Operand(t, source.scale, source.bound * block)
    counter, worst = layer._counter(role, step), layer.quant_worst[1]
    times = source.scale if source is not None and source.is_integer else None
    if block > 1:
        levels, scale = ops.hadamard_quantize(t, spec, counter, block, worst=worst, times=times)
    else:
        levels, scale = ops.quantize(t, spec, counter, worst=worst, times=times)
    checks.append((role, t, scale))
    return Operand(levels, scale, spec.level_bound)


def hadamard_block(product: Product, cap, k: int) -> int:
    """The Hadamard block along a backward product's K (1: no transform)."""
    return hadamard_block_size(k, cap) if product.hadamard else 1
