"""What HOT's neighbours keep for their backward (docs/quant.md "HOT", "What the forward keeps").

HOT's compressed copies save memory only where the float tensor they replace is no longer held by anyone else.
In a convnet the input of a conv is a ReLU's output, which torch's ReLU keeps for its own backward, and the
conv's output is BatchNorm's input, which BatchNorm keeps. So under `quant.abc=true` these keep compact forms:

    ReLU          a bit mask of y > 0, 8 to a byte        exact: the gradient is torch's, bit for bit
    MaxPool2d     each output's place in its window, uint8 exact: torch's backward on the indices rebuilt
                  (not the input and int64 indices)
    BatchNorm2d   x̂ = (x − mean)·invstd in `abc_bits`     the forward and running statistics are torch's; the
                  (`store`), invstd per channel           backward is BatchNorm's formula on the stored x̂
    LayerNorm     x̂ in `abc_bits`, rstd per row           as BatchNorm, over each row's normalized dimensions
    GELU          its input in `abc_bits`                 torch's GELU backward on the stored input
    k×k conv      its input in `abc_bits` (`store`)        the backward makes HOT's compressed operand from it
                                                           (quant/hot.py)

`store` is the one rule for an activation kept in low precision: signed levels ±(2^(b-1)-1), one max scale per
sample, nearest, in the narrowest integer type that holds them (int8 at 8 bits).
"""
import math
from contextlib import contextmanager

import torch
from torch import nn

from .backend import resolve_ops
from .quantizers import QuantSpec, dequantize

_INT_STORAGE = ((8, torch.int8), (16, torch.int16))


def storage(levels: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """Levels in the narrowest integer dtype that holds them (int8 up to 8 bits): what is kept in memory."""
    for bits, dtype in _INT_STORAGE:
        if spec.bits <= bits:
            return levels if levels.dtype == dtype else levels.to(dtype)
    return levels


def store_spec(bits: int) -> QuantSpec:
    return QuantSpec(bits=bits, signedness="signed", scale="max", granularity="sample", rounding="nearest")


def store(t: torch.Tensor, bits: int, ops) -> tuple[torch.Tensor, torch.Tensor]:
    """(integer levels, float32 scale per sample) of t: an activation kept in `bits`."""
    spec = store_spec(bits)
    levels, scale = ops.quantize(t.detach(), spec)
    return storage(levels, spec), scale


def restore(levels: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return dequantize(levels.to(torch.float32), scale)


def _bit_weights(device) -> torch.Tensor:
    """1, 2, 4, ..., 128 made on `device` (a copy from the CPU would break CUDA-graph capture)."""
    return 2 ** torch.arange(8, dtype=torch.uint8, device=device)


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """A bool tensor as uint8, 8 entries a byte (the last byte padded with zeros)."""
    flat = mask.reshape(-1)
    flat = torch.cat([flat, flat.new_zeros(-flat.numel() % 8)]).view(-1, 8)
    return (flat.to(torch.uint8) * _bit_weights(mask.device)).sum(dim=1, dtype=torch.uint8)


def unpack_mask(packed: torch.Tensor, shape) -> torch.Tensor:
    bits = packed.unsqueeze(1).bitwise_and(_bit_weights(packed.device)).ne(0)
    return bits.reshape(-1)[:shape.numel()].view(shape)


class _MaskedReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.relu(x)
        ctx.shape = y.shape
        ctx.save_for_backward(pack_mask(y > 0))
        return y

    @staticmethod
    def backward(ctx, grad_y):
        mask = unpack_mask(ctx.saved_tensors[0], ctx.shape)
        return torch.where(mask, grad_y, grad_y.new_zeros(()))  # torch's ReLU backward: grad where y > 0, else 0


class CompactReLU(nn.ReLU):
    """nn.ReLU that keeps a bit mask for its backward instead of its float output (never in place)."""

    def forward(self, x):
        if not (torch.is_grad_enabled() and x.requires_grad):
            return torch.relu(x)
        return _MaskedReLU.apply(x)


class _WindowMaxPool(torch.autograd.Function):
    """torch's max pooling; keeps where in its window each maximum lies (kh·kw ≤ 256 places) and rebuilds torch's
    flat indices for torch's own backward, which reads the input's shape only."""

    @staticmethod
    def forward(ctx, x, pool):
        kernel, stride, padding = (_pair(v) for v in (pool.kernel_size, pool.stride or pool.kernel_size,
                                                       pool.padding))
        y, indices = torch.nn.functional.max_pool2d(x, kernel, stride, padding, 1, pool.ceil_mode, True)
        width = x.shape[-1]
        rows = torch.arange(y.shape[-2], device=x.device).view(-1, 1) * stride[0] - padding[0]
        cols = torch.arange(y.shape[-1], device=x.device).view(1, -1) * stride[1] - padding[1]
        place = (indices // width - rows) * kernel[1] + indices % width - cols
        ctx.geometry = (x.shape, x.dtype, kernel, stride, padding, pool.ceil_mode, rows, cols, width)
        ctx.save_for_backward(place.to(torch.uint8))
        return y

    @staticmethod
    def backward(ctx, grad_y):
        shape, dtype, kernel, stride, padding, ceil_mode, rows, cols, width = ctx.geometry
        place = ctx.saved_tensors[0].to(torch.int64)
        indices = (rows + place // kernel[1]) * width + cols + place % kernel[1]
        like = torch.zeros((), dtype=dtype, device=grad_y.device).expand(shape)
        grad_x = torch.ops.aten.max_pool2d_with_indices_backward(grad_y, like, list(kernel), list(stride),
                                                                 list(padding), [1, 1], ceil_mode, indices)
        return grad_x, None


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


class CompactMaxPool2d(nn.MaxPool2d):
    """nn.MaxPool2d that keeps each maximum's place in its window (uint8) for its backward instead of the float
    input and int64 indices; torch's module where that does not apply (dilation, returned indices, windows of
    more than 256 places, no gradient)."""

    def forward(self, x):
        kernel = _pair(self.kernel_size)
        plain = (_pair(self.dilation) != (1, 1) or self.return_indices or kernel[0] * kernel[1] > 256
                 or not (torch.is_grad_enabled() and x.requires_grad) or x.dim() != 4)
        return super().forward(x) if plain else _WindowMaxPool.apply(x, self)


class _StoredNorm(torch.autograd.Function):
    """y = the module's own torch forward (running statistics included); the backward is the normalization's
    formula with x̂ = (x − mean)·inv (over `dims`) read back from `bits`, M the size of `dims`:
        g_x = inv/M · (M·gγ − Σ gγ − x̂·Σ(gγ·x̂)) with gγ = g·γ,  g_γ = Σ(g·x̂),  g_β = Σg
    (g_γ and g_β summed to γ's shape, `gamma_shape`: (−1, 1, 1) for BatchNorm's channels)."""

    @staticmethod
    def forward(ctx, x, weight, bias, module, ops, dims, gamma_shape):
        y = TORCH_CLASSES[type(module)].forward(module, x)
        var, mean = torch.var_mean(x, dim=dims, unbiased=False, keepdim=True)
        inv = torch.rsqrt(var + module.eps)
        levels, scale = store((x - mean) * inv, module.bits, ops)
        ctx.dims, ctx.gamma_shape = dims, gamma_shape
        ctx.save_for_backward(levels, scale, inv, weight)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        levels, scale, inv, weight = ctx.saved_tensors
        x_hat, g, dims = restore(levels, scale), grad_y.to(torch.float32), ctx.dims
        gamma = None if weight is None else weight.view(ctx.gamma_shape)
        g_gamma = g if gamma is None else g * gamma
        count = math.prod(g.shape[d] for d in dims)
        grad_x = inv / count * (count * g_gamma - g_gamma.sum(dims, keepdim=True)
                                - x_hat * (g_gamma * x_hat).sum(dims, keepdim=True))
        grad_w = grad_b = None
        if gamma is not None:
            grad_w = (g * x_hat).sum_to_size(gamma.shape).view_as(weight)
            grad_b = g.sum_to_size(gamma.shape).view_as(weight)
        return grad_x.to(grad_y.dtype), grad_w, grad_b, None, None, None, None


class CompactBatchNorm2d(nn.BatchNorm2d):
    """nn.BatchNorm2d that keeps its normalized input in `bits` for the backward (training with batch statistics);
    in eval mode, or without a gradient to compute, it is torch's module. `backend`: the scheme's, for `store`."""
    backend, bits = "auto", 8

    def forward(self, x):
        batch_stats = self.training or not self.track_running_stats
        wants_grad = x.requires_grad or self.weight is not None and self.weight.requires_grad
        if not (batch_stats and torch.is_grad_enabled() and wants_grad):
            return super().forward(x)
        return _StoredNorm.apply(x, self.weight, self.bias, self, resolve_ops(self.backend, x.device), (0, 2, 3),
                                 (-1, 1, 1))


class CompactLayerNorm(nn.LayerNorm):
    """nn.LayerNorm that keeps its normalized input in `bits` for the backward; without a gradient to compute,
    torch's module. `backend`: the scheme's, for `store`."""
    backend, bits = "auto", 8

    def forward(self, x):
        wants_grad = x.requires_grad or self.weight is not None and self.weight.requires_grad
        if not (torch.is_grad_enabled() and wants_grad and x.dim() > len(self.normalized_shape)):
            return super().forward(x)
        dims = tuple(range(x.dim() - len(self.normalized_shape), x.dim()))
        return _StoredNorm.apply(x, self.weight, self.bias, self, resolve_ops(self.backend, x.device), dims,
                                 tuple(self.normalized_shape))


class _StoredGELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, module, ops):
        ctx.approximate = module.approximate
        ctx.save_for_backward(*store(x, module.bits, ops))
        return nn.GELU.forward(module, x)

    @staticmethod
    def backward(ctx, grad_y):
        x = restore(*ctx.saved_tensors).to(grad_y.dtype)
        return torch.ops.aten.gelu_backward(grad_y, x, approximate=ctx.approximate), None, None


class CompactGELU(nn.GELU):
    """nn.GELU that keeps its input in `bits` for torch's GELU backward. `backend`: the scheme's, for `store`."""
    backend, bits = "auto", 8

    def forward(self, x):
        if not (torch.is_grad_enabled() and x.requires_grad and x.dim() > 1):  # a scale per sample: a batch
            return super().forward(x)
        return _StoredGELU.apply(x, self, resolve_ops(self.backend, x.device))


COMPACT_CLASSES = {nn.ReLU: CompactReLU, nn.MaxPool2d: CompactMaxPool2d, nn.BatchNorm2d: CompactBatchNorm2d,
                   nn.LayerNorm: CompactLayerNorm, nn.GELU: CompactGELU}
TORCH_CLASSES = {compact: torch_class for torch_class, compact in COMPACT_CLASSES.items()}
STORING = (CompactBatchNorm2d, CompactLayerNorm, CompactGELU)  # keep a low-precision copy: need `bits`


def compact_neighbours(model: nn.Module, backend: str | None, bits: int | None = None) -> None:
    """Give every nn.ReLU and nn.MaxPool2d of `model` its compact class, and with `bits` every nn.BatchNorm2d,
    nn.LayerNorm and nn.GELU (quantizing with `backend`), or (backend None) their torch classes back, in place: no
    parameters or state-dict keys change."""
    for module in model.modules():
        torch_class = TORCH_CLASSES.get(type(module), type(module))
        if torch_class not in COMPACT_CLASSES:
            continue
        compact = COMPACT_CLASSES[torch_class]
        wanted = backend is not None and (bits is not None or compact not in STORING)
        module.__class__ = compact if wanted else torch_class
        if isinstance(module, STORING):
            module.backend, module.bits = backend, bits
        else:
            module.__dict__.pop("backend", None)
            module.__dict__.pop("bits", None)


@contextmanager
def torch_neighbours(model: nn.Module):
    """The compact modules of `model` as their torch classes for a while (LQS' full-precision pass)."""
    swapped = [(module, type(module)) for module in model.modules() if type(module) in TORCH_CLASSES]
    for module, compact in swapped:
        module.__class__ = TORCH_CLASSES[compact]
    try:
        yield
    finally:
        for module, compact in swapped:
            module.__class__ = compact
