"""QuantLinear / QuantConv2d: every product of the layer an integer product defined by a Scheme (docs/quant.md), or
a float-format one defined by a FloatScheme (quant/float_product.py).

A convolution is im2col (K in `F.unfold`'s (channel, kh, kw) order) followed by the products of a linear layer;
the input gradient goes back through col2im (the sum of overlapping patches in float, quant/im2col.py). Operands
are laid out as (batch, rows, K) with the contraction over the last dimension: the conv's backward products run
per sample (batch = the samples, as the authors vmap), a linear layer's as one batch entry. FP32 master weights
stay the parameters; bias, the sum of per-sample weight gradients and everything outside these layers stay float.
"""
import math

import torch
from torch import nn

from .backend import resolve_ops
from .float_product import FloatProduct
from .float_schemes import FloatScheme
from .im2col import conv_output_size
from . import operands
from .operands import Operand, backward_operand, forward_operand, hadamard_block
from .rounding import Counter
from .schemes import Product, Scheme
from .streams import layer_gradients

# role id = layer index * ROLE_STRIDE + code: every quantized tensor of a step draws its own random bits.
ROLE_STRIDE = 8
ROLE_CODES = {"input": 0, "weight": 1, "grad_input.grad_output": 2, "grad_input.weight": 3,
              "grad_weight.grad_output": 4, "grad_weight.input": 5, "lqs.grad_output": 6,
              "hadamard.signs": 7}
# Counted per layer on the device (row 0 hits, row 1 totals): saturated tile sums of each product, clipped values
# of each forward operand.
STATS = ("forward_saturated", "grad_input_saturated", "grad_weight_saturated", "input_clipped", "weight_clipped")
_STAT_ROW = {name: i for i, name in enumerate(STATS)}


def _capturing(device: torch.device) -> bool:
    """Whether `device`'s current stream is being captured into a CUDA graph (asked of that device: the thread
    running a backward may have another device current)."""
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


class NonFiniteError(FloatingPointError):
    """A NaN or Inf reached a quantizer; the message names the layer, the tensor role and the value."""


class QuantLayer:
    """What QuantLinear and QuantConv2d share: scheme, identity (name, index), step counter, statistics.

    Everything a training step changes lives on the layer's device (buffers `quant_step`, `quant_counts`,
    `quant_worst`), so that a step needs no host round trip and can be captured in a CUDA graph (graph_replay.py).
    `_extra_buffers` names buffers a subclass adds (HOT's layers, quant/hot.py), removed when `quantize_model`
    switches the class away."""
    _extra_buffers: tuple[str, ...] = ()
    # An observer's view of this layer's ops (trainer/diagnostics.py sets it on a copy of the model): ops → ops.
    ops_watch = None

    def _setup_quant(self, scheme: Scheme, name: str = "", index: int = 0, step: int = 0) -> None:
        self.scheme, self.quant_name, self.quant_index = scheme, name, index
        if "quant_step" not in self._buffers:
            device = self.weight.device
            self.register_buffer("quant_step", torch.zeros((), dtype=torch.int64, device=device), persistent=False)
            counts = torch.zeros(2, len(STATS), dtype=torch.int64, device=device)
            self.register_buffer("quant_counts", counts, persistent=False)
            # the largest scale of the forward's / backward's quantizers so far (NaN stays): what the finite checks read
            self.register_buffer("quant_worst", torch.zeros(2, device=device), persistent=False)
        self.step = step

    @property
    def step(self) -> int:
        """The training step the next forward quantizes with (its stochastic rounding draws from it)."""
        return int(self.quant_step)

    @step.setter
    def step(self, value: int) -> None:
        self.quant_step.fill_(value)

    def _step_for(self, training: bool) -> torch.Tensor:
        """This call's step as a device scalar; a training call advances the counter (one launch)."""
        if not training:
            return self.quant_step
        return self._ops(self.quant_step.device).advance_step(self.quant_step)

    def forward(self, x):
        if not self.scheme.quantizes or x.numel() == 0:  # an empty batch has nothing to quantize
            return super().forward(x)
        training = self.training and torch.is_grad_enabled()
        product = FloatProduct if isinstance(self.scheme, FloatScheme) else _QuantProduct
        y = product.apply(x, self.weight, self, self._step_for(training), training)
        return y if self.bias is None else y + self._bias_for(y)

    def _ops(self, device: torch.device):
        """The numeric ops of this layer's products on `device` (quant.backend), through `ops_watch` where set."""
        ops = resolve_ops(self.scheme.backend, device)
        return ops if self.ops_watch is None else self.ops_watch(ops)

    def _counter(self, role: str, step: torch.Tensor) -> Counter:
        return Counter(self.scheme.seed, step, self.quant_index * ROLE_STRIDE + ROLE_CODES[role])

    def _tally(self, stat: str) -> torch.Tensor:
        """`stat`'s (hits, total) pair in quant_counts: an int64 (2,) view that the ops add to on the device."""
        return self.quant_counts[:, _STAT_ROW[stat]]

    def _check_finite(self, checks: list, backward: bool) -> None:
        """All quantizers of one pass at once: raise naming the layer, the role and the value (one device sync).

        The quantizers raise the pass's `quant_worst` slot to their largest scale themselves (`worst`,
        quant/backend.py); scales are positive and the maximum keeps a NaN, so every scale so far is finite iff
        the slot is. While a CUDA graph is captured nothing may sync: `check_captured_steps` reads the slots after
        the replay."""
        if not checks:
            return
        worst = self.quant_worst[int(backward)]
        if worst.device.type == "cuda" and _capturing(worst.device) or math.isfinite(worst.item()):
            return
        for role, tensor, scale in checks:
            if not torch.isfinite(scale).all():
                bad = tensor[~torch.isfinite(tensor)]
                value = bad[0].item() if bad.numel() else float("nan")
                raise NonFiniteError(f"layer '{self.quant_name}': non-finite value {value} in the {role} "
                                     f"reaching its quantizer (scheme {self.scheme.name})")


class _QuantProduct(torch.autograd.Function):
    """y = x · Wᵀ as the scheme's forward product; its backward computes grad_input and grad_weight the same way."""

    @staticmethod
    def forward(ctx, x, weight, layer, step, training):
        scheme = layer.scheme
        ops = layer._ops(x.device)
        checks = []
        x_op, x_keep = forward_operand(layer, x, scheme.forward.left, "input", step, training, ops, checks)
        w_op, w_keep = forward_operand(layer, weight.reshape(weight.shape[0], -1), scheme.forward.right,
                                        "weight", step, training, ops, checks)
        layer._check_finite(checks, backward=False)
        rows = Operand(layer._forward_rows(x_op.values, ops), x_op.scale, x_op.bound)
        y_rows = operands.product(ops, rows, w_op, 1, scheme.forward,
                                  tally=layer._tally("forward_saturated") if training else None)
        ctx.save_for_backward(x_op.values, w_op.values, x_keep, w_keep)
        ctx.layer, ctx.scheme, ctx.step, ctx.x_shape, ctx.w_shape = layer, scheme, step, x.shape, weight.shape
        ctx.x_meta, ctx.w_meta = (x_op.scale, x_op.bound), (w_op.scale, w_op.bound)
        return layer._forward_output(y_rows, x.shape)

    @staticmethod
    def backward(ctx, grad_y):
        layer, scheme, step = ctx.layer, ctx.scheme, ctx.step
        x_values, w_values, x_keep, w_keep = ctx.saved_tensors
        x_op, w_op = Operand(x_values, *ctx.x_meta), Operand(w_values, *ctx.w_meta)
        ops = layer._ops(grad_y.device)
        g_rows, g_cols = layer._grad_output_layouts(grad_y.to(torch.float32))
        checks, need_x, need_w = [], ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        # a shared G is quantized once, in the grad_input layout (S, M, out), before the branches part
        shared_g = (backward_operand(layer, g_rows, scheme.grad_input.left, None, 1, "grad_input.grad_output", step,
                                     ops, checks) if scheme.shares_grad_output else None)

        def grad_output_operand(product: Product, g, block: int, role: str) -> Operand:
            if shared_g is None:
                return backward_operand(layer, g, product.left, None, block, role, step, ops, checks)
            return shared_g if g is g_rows else shared_g.transposed()

        def grad_input():
            product = scheme.grad_input
            block = hadamard_block(product, scheme.hadamard_cap, g_rows.shape[-1])
            qa = grad_output_operand(product, g_rows, block, "grad_input.grad_output")
            qb = backward_operand(layer, w_values.transpose(0, 1), product.right, w_op, block, "grad_input.weight",
                                   step, ops, checks)
            return layer._grad_input_of(ops, qa, qb, block, product, ctx.x_shape, x_keep,
                                        layer._tally("grad_input_saturated"))

        def grad_weight():
            product = scheme.grad_weight
            block = hadamard_block(product, scheme.hadamard_cap, g_cols.shape[-1])
            qa = grad_output_operand(product, g_cols, block, "grad_weight.grad_output")
            qb = backward_operand(layer, layer._input_columns(x_values, ops), product.right, x_op, block,
                                   "grad_weight.input", step, ops, checks)
            return operands.product(ops, qa, qb, block, product, sum_batch=True,
                                    tally=layer._tally("grad_weight_saturated"), keep=w_keep).reshape(ctx.w_shape)

        grad_x, grad_w = layer_gradients(grad_input, grad_weight, grad_y.device, need_x, need_w)
        layer._check_finite(checks, backward=True)
        return grad_x, grad_w, None, None, None


class QuantLinear(QuantLayer, nn.Linear):
    """nn.Linear whose products follow `scheme`; same parameters and state-dict keys as nn.Linear."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, scheme: Scheme, name: str = "",
                 device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self._setup_quant(scheme, name)

    def _bias_for(self, y):
        return self.bias

    def _forward_rows(self, x, ops):
        return x.reshape(-1, self.in_features)

    def _forward_output(self, y_rows, x_shape):
        return y_rows.reshape(*x_shape[:-1], self.out_features)

    def _grad_output_layouts(self, g):
        """(1, M, out) for grad_input, (1, out, M) for grad_weight."""
        rows = g.reshape(1, -1, self.out_features)
        return rows, rows.transpose(1, 2)

    def _input_columns(self, x, ops):
        return x.reshape(1, -1, self.in_features).transpose(1, 2)

    def _grad_input(self, rows, x_shape, ops, keep=None):
        grad = rows.reshape(x_shape)
        return grad if keep is None else grad * keep

    def _grad_input_of(self, ops, qa, qb, block, product, x_shape, keep, tally):
        """g_x from the grad_input product's operands, times the estimator's mask `keep` where given."""
        return self._grad_input(operands.product(ops, qa, qb, block, product, tally=tally), x_shape, ops, keep)


class QuantConv2d(QuantLayer, nn.Conv2d):
    """nn.Conv2d (groups=1, zero padding) as im2col + the products of a linear layer; same state-dict keys."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 bias: bool = True, *, scheme: Scheme, name: str = "", device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, bias=bias,
                         device=device, dtype=dtype)
        self._setup_quant(scheme, name)

    def forward(self, x):
        if x.dim() == 3:
            return super().forward(x.unsqueeze(0)).squeeze(0)
        return super().forward(x)

    def _bias_for(self, y):
        return self.bias.view(1, -1, 1, 1)

    def _output_size(self, x_shape):
        return conv_output_size(x_shape, self.kernel_size, self.padding, self.dilation, self.stride)

    def _im2col(self, x, ops, columns: bool):
        return ops.im2col(x, self.kernel_size, self.padding, self.dilation, self.stride, columns)

    def _forward_rows(self, x, ops):
        """(B·L, K) im2col rows; K in (channel, kh, kw) order as the weight's (out, K) view (and F.unfold)."""
        return self._im2col(x, ops, columns=False).reshape(-1, self.weight[0].numel())

    def _forward_output(self, y_rows, x_shape):
        """(B·L, out) rows as (B, out, H, W): a view whose memory is channels-last, as the rows are (no copy; the
        layers after it, BatchNorm's kernels among them, see this layout)."""
        batch, (height, width) = x_shape[0], self._output_size(x_shape)
        return y_rows.reshape(batch, height * width, self.out_channels).transpose(1, 2).reshape(
            batch, self.out_channels, height, width)

    def _grad_output_layouts(self, g):
        """(B, L, out) for grad_input, (B, out, L) for grad_weight: one product per sample."""
        cols = g.reshape(g.shape[0], self.out_channels, -1)
        return cols.transpose(1, 2), cols

    def _input_columns(self, x, ops):
        """(B, K, L): F.unfold's layout."""
        return self._im2col(x, ops, columns=True)

    def _grad_input(self, rows, x_shape, ops, keep=None):
        """col2im of (B, L, K) (quant/im2col.py), times the estimator's mask `keep` where given."""
        return ops.col2im(rows, x_shape, self.kernel_size, self.padding, self.dilation, self.stride, keep)

    def _grad_input_of(self, ops, qa, qb, block, product, x_shape, keep, tally):
        """col2im of the product, folded into it where the operands are integers (operands.product_col2im)."""
        fold = (x_shape, self.kernel_size, self.padding, self.dilation, self.stride)
        return operands.product_col2im(ops, qa, qb, block, product, fold, keep, tally)
