"""HOT's layers (docs/quant.md "HOT"): float forward, compressed saved input (ABC), integer backward products.

    forward   y   = x · Wᵀ (+ b)            torch's own op, bit for bit
    saved     ABC = Q8(HLA_L(x))            x as the weight gradient reads it, HLA along the tokens L, SAWB, nearest
    g_x       Q4(G·H_n) · Q4(H_n·W)ᵀ / n    Hadamard (block n = min(cap, largest power of two dividing O)) along
                                            the output channels O; G stochastic per tensor or per token (LQS),
                                            W SAWB nearest; no accumulator saturation
    g_W       Q8(P·G)ᵀ · ABC / L'           HLA (block L' = largest power of two dividing L, LP_L1 rows) along
                                            the tokens; G stochastic; per-sample products summed in float32 in
                                            sample order (sum_entries: in the GEMM's epilogue on the GPU)

Every operand is laid out (batch, rows, K) as in docs/numerics.md "Operand layouts", with the token dimension L:
a Linear on (M, C) is one batch entry with L = M (the samples: HLA mixes samples, as the authors' code does); a
Linear on (B, ..., C) has B entries with L the tokens of a sample; a convolution has B entries with L = Ho·Wo
and K = C·kh·kw (the im2col rows; the input gradient goes back through col2im). The weight gradient's operands
are compressed and quantized where they lie: token-major (B, L, C) for a Linear, token-last (B, C, L) for a
convolution (`_token_dim`); ABC keeps its levels token-last, rows padded to 16 bytes where that costs at most
1/8 more memory (the GEMM then reads them in place). With `sliced_unfold` a k×k conv unfolds a slice of samples at a
time (`_sample_slices`), so that no buffer k² times its input exists (the same numbers on the CPU; on a GPU, torch's
per-sample sums for x̃'s SAWB scale end in other bits over slices of other sizes); g_x's integer product is folded
into col2im for the whole batch where the kernels do that without float rows (`folds_col2im`).
Scales: ABC and G in g_W per entry (per sample with a token dimension, per tensor for 2-D inputs); G in g_x
per tensor or per (b, l) row.
All numeric rules are the package's own (block_hadamard, quantize with the max or SAWB scale, counter-based
stochastic rounding, the exact integer product with its float epilogue), run through the layer's ops
(`resolve_ops`) so that the CuPy kernels take them where they apply.
"""
import math

import torch
from torch import nn

from .backend import folds_col2im
from .hadamard import hadamard_block_size
from .compact import restore, storage, store
from .hla import hla_rank
from .layers import QuantConv2d, QuantLinear
from .operands import Operand, product as operand_product
from .schemes import Product
from .streams import layer_gradients

# The LQS choice of a layer, a buffer (state dict, checkpoints): not calibrated yet (per tensor), per tensor, per token.
LQS_UNSET, LQS_TENSOR, LQS_TOKEN = 0, 1, 2


def _hla_shape(layer, length: int) -> tuple[int, int]:
    """(block L', rank r) of HLA along a token dimension of `length`."""
    block = hadamard_block_size(length)
    scheme = layer.scheme
    return block, hla_rank(block, scheme.hla_rank, scheme.hla_rank_ratio)


def _tokens_last(t: torch.Tensor, token_dim: int) -> torch.Tensor:
    """(B, K, R) view of t, whose tokens lie along `token_dim`: how the weight gradient's product reads it."""
    return t if token_dim == -1 else t.transpose(-1, -2)


# ABC pads its rows to 16 elements (the GEMM kernel then reads the int8 levels in place, 16-byte aligned) only
# where that costs at most 1/8 more memory; shorter rows stay compact and the backward packs them.
_ABC_PAD_LIMIT = 9 / 8


def _abc_layout(t: torch.Tensor, token_dim: int) -> torch.Tensor:
    """What ABC keeps of integer levels: t as (B, K, R), R contiguous, in rows padded to a multiple of 16 elements
    where that costs at most 1/8 more memory (`_ABC_PAD_LIMIT`), else compact; copied here, in the forward, if t
    is not so."""
    view = _tokens_last(t, token_dim)
    tokens = view.shape[-1]
    padded = -(-tokens // 16) * 16
    row = padded if padded <= tokens * _ABC_PAD_LIMIT else tokens
    if view.stride(-1) == 1 and (view.shape[-2] == 1 or view.stride(-2) == row):
        return view
    rows = view.new_empty(*view.shape[:-1], row)[..., :tokens]
    return rows.copy_(view)


def compressed_input(layer, x: torch.Tensor, step, count: bool, ops, checks: list, worst: torch.Tensor):
    """ABC: (values (B, K, R), scale or None, block, rank) of x as the weight gradient reads it, made a slice of
    samples at a time where the layer unfolds its input in slices (`_sample_slices`; x̃'s scales are per sample).
    `worst`: the layer's `quant_worst` slot of the pass that runs it, raised to the largest scale.

    values are int8 levels (abc_bits <= 8) with a per-entry float32 scale, or float32 when abc_bits is None."""
    parts = [_compressed_slice(layer, x[s], step, count, ops, checks, worst) for s in layer._sample_slices(x.shape)]
    values, scale, block, rank = parts[0]
    if len(parts) > 1:
        values = torch.cat([part[0] for part in parts])
        scale = None if scale is None else torch.cat([part[1] for part in parts])
    if scale is None:  # float32, read by torch's matmul in any layout
        return _tokens_last(values, layer._token_dim), None, block, rank
    return _abc_layout(values, layer._token_dim), scale, block, rank


def _compressed_slice(layer, x: torch.Tensor, step, count: bool, ops, checks: list, worst: torch.Tensor):
    """(values in the layer's token layout, scale or None, block, rank) of compressed_input for the samples x."""
    spec = layer.scheme.input_spec
    columns, dim = layer._hot_columns(x, ops), layer._token_dim
    block, rank = _hla_shape(layer, columns.shape[dim])
    compressed = ops.hla_compress(columns, block, rank, dim)
    if spec is None:
        return compressed, None, block, rank
    levels, scale = _counted_quantize(layer, compressed, spec, "grad_weight.input", "input_clipped", step, count,
                                      ops, worst)
    checks.append(("input", x, scale))
    return storage(levels, spec), scale, block, rank


def _counted_quantize(layer, t: torch.Tensor, spec, role: str, stat: str, step, count: bool, ops, worst):
    """(levels, scale) of t; with `count`, the values the quantizer clips added to the layer's `stat` in the
    quantizer's own pass (`forward_quantize`'s tally)."""
    counter = layer._counter(role, step)
    if not count:
        return ops.quantize(t, spec, counter, worst=worst)
    levels, scale, _ = ops.forward_quantize(t, spec, counter, "none", layer._tally(stat), worst)
    return levels, scale


# g_x's integer product: exact sums (no accumulator tile), the only Product setting operands.product reads.
_EXACT_SUMS = Product()


def grad_input(layer, g_rows: torch.Tensor, weight: torch.Tensor, per_token: bool, step, count: bool, ops,
               checks: list, x_shape) -> torch.Tensor:
    """g_x of shape x_shape: the product of G (B, L, O) and W (O, K), Hadamard-transformed along O and quantized,
    / n, folded back (col2im for a conv). A conv's integer product is folded into col2im for the whole batch where
    the kernels do that without the (B, L, K) float rows (`folds_col2im`); otherwise a layer that unfolds in slices
    makes and folds the rows a slice of samples at a time (each element of the product stands alone)."""
    scheme = layer.scheme
    out = weight.shape[0]
    block = hadamard_block_size(out, scheme.hadamard_cap)
    w_cols = weight.detach().reshape(out, -1).t().to(torch.float32)  # (K, O): O last, as G
    g_spec, w_spec = scheme.grad_output_spec(per_token), scheme.weight_spec
    w_had = ops.block_hadamard(w_cols, -1, block)
    if g_spec is None:
        g_had = ops.block_hadamard(g_rows, -1, block)
        return _folded_in_slices(layer, lambda samples: torch.matmul(g_had[samples], w_had.t()) / block, x_shape,
                                 g_rows, ops)
    worst = layer.quant_worst[1]
    g_levels, g_scale = ops.hadamard_quantize(g_rows, g_spec, layer._counter("grad_input.grad_output", step), block,
                                              worst=worst)
    w_levels, w_scale = _counted_quantize(layer, w_had, w_spec, "grad_input.weight", "weight_clipped", step, count,
                                          ops, worst)
    checks += [("output gradient", g_rows, g_scale), ("weight", w_had, w_scale)]
    w = Operand(w_levels, w_scale, w_spec.level_bound)
    g = Operand(g_levels, g_scale, g_spec.level_bound)
    if folds_col2im(ops, out):  # (a Linear's _grad_input_of: the product's rows as g_x)
        return layer._grad_input_of(ops, g, w, block, _EXACT_SUMS, x_shape, None, None)
    per_sample = g_scale.dim() > 0 and g_scale.shape[0] == g_levels.shape[0]  # per token: (B, L, 1)

    def product(samples):
        part = Operand(g_levels[samples], g_scale[samples] if per_sample else g_scale, g.bound)
        return operand_product(ops, part, w, block, _EXACT_SUMS)
    return _folded_in_slices(layer, product, x_shape, g_rows, ops)


def _folded_in_slices(layer, product, x_shape, g_rows: torch.Tensor, ops) -> torch.Tensor:
    """g_x from product(samples) → those samples' rows (b, L, K), folded back a slice of samples at a time."""
    slices = layer._sample_slices(x_shape)
    if len(slices) == 1:
        return layer._grad_input(product(slice(None)), x_shape, ops)
    grad_x = g_rows.new_empty(x_shape)
    for samples in slices:
        part = grad_x[samples]
        part.copy_(layer._grad_input(product(samples), part.shape, ops))
    return grad_x


def grad_weight_sum(layer, g: torch.Tensor, abc, step, ops, checks: list) -> torch.Tensor:
    """g_W (O, K): Σ over entries of Q(P·G) (B, O, R) times the ABC operand (B, K, R), / L'. g is the output
    gradient in the layer's token layout (`_token_dim`)."""
    x_values, x_scale, block, rank = abc
    g_spec, dim = layer.scheme.grad_weight_spec, layer._token_dim
    g_hla = ops.hla_compress(g, block, rank, dim)
    if g_spec is not None:
        g_levels, g_scale = ops.quantize(g_hla, g_spec, layer._counter("grad_weight.grad_output", step),
                                         worst=layer.quant_worst[1])
        checks.append(("output gradient", g, g_scale))
    if g_spec is not None and x_scale is not None:
        x_spec = layer.scheme.input_spec
        return ops.scaled_int_matmul(_tokens_last(g_levels, dim), x_values.transpose(-1, -2), g_scale, x_scale,
                                     block, None, None, bounds=(g_spec.level_bound, x_spec.level_bound),
                                     sum_batch=True)
    a = _tokens_last(g_hla if g_spec is None else g_levels * g_scale, dim)
    b = x_values if x_scale is None else x_values.to(torch.float32) * x_scale
    return (torch.matmul(a, b.transpose(-1, -2)) / block).sum(dim=0)


class _HotProduct(torch.autograd.Function):
    """y = x · Wᵀ + b in float; the backward is HOT's (module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer, step, training):
        y = layer._torch_class.forward(layer, x)
        ctx.layer, ctx.step, ctx.training, ctx.x_shape = layer, step, training, x.shape
        ctx.per_token = layer.lqs_per_token
        needs_x, needs_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        saved_w = weight if needs_x else None
        ctx.kept = kept = layer._keeps() if needs_w else None
        ops = layer._ops(x.device)
        if kept is None:
            ctx.save_for_backward(saved_w, None, None)
        elif kept == "compressed":
            checks = []
            values, scale, block, rank = compressed_input(layer, x, step, training, ops, checks,
                                                          layer.quant_worst[0])
            layer._check_finite(checks, backward=False)
            ctx.save_for_backward(saved_w, values, scale)
            ctx.abc = (block, rank)
        elif kept == "stored":
            ctx.save_for_backward(saved_w, *store(x, layer.scheme.abc_bits, ops))
        else:
            ctx.save_for_backward(saved_w, x, None)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        layer, step, count = ctx.layer, ctx.step, ctx.training
        weight, x_saved, x_scale = ctx.saved_tensors
        ops = layer._ops(grad_y.device)
        g_rows, g_tokens = layer._hot_grad_layouts(grad_y.to(torch.float32))
        checks, grad_b = [], None

        def input_gradient():
            return grad_input(layer, g_rows, weight, ctx.per_token, step, count, ops, checks, ctx.x_shape)

        def weight_gradient():
            if ctx.kept == "compressed":
                abc = (x_saved, x_scale, *ctx.abc)
            else:  # the compressed operand, computed now from the input kept in float or in 8 bits
                x_kept = restore(x_saved, x_scale) if ctx.kept == "stored" else x_saved
                abc = compressed_input(layer, x_kept, step, count, ops, checks, layer.quant_worst[1])
            return grad_weight_sum(layer, g_tokens, abc, step, ops, checks).reshape(layer.weight.shape)

        grad_x, grad_w = layer_gradients(input_gradient, weight_gradient, grad_y.device, *ctx.needs_input_grad[:2])
        if ctx.needs_input_grad[2]:
            grad_b = g_rows.sum(dim=(0, 1))
        layer._check_finite(checks, backward=True)
        return grad_x, grad_w, grad_b, None, None, None


class _HotLayer:
    """What HotLinear and HotConv2d add to QuantLinear / QuantConv2d: HOT's autograd Function, the LQS choice
    (buffer `lqs_choice`, mirrored in a Python int so that the backward never reads the device), and a float
    mode for LQS's calibration pass."""
    _extra_buffers = ("lqs_choice",)

    def _setup_quant(self, scheme, name: str = "", index: int = 0, step: int = 0) -> None:
        super()._setup_quant(scheme, name, index, step)
        if "lqs_choice" not in self._buffers:
            self.register_buffer("lqs_choice", torch.full((), LQS_UNSET, dtype=torch.int8, device=self.weight.device))
        self._lqs = int(self.lqs_choice)
        self.lqs_float = False

    @property
    def lqs_calibrated(self) -> bool:
        return self._lqs != LQS_UNSET

    @property
    def lqs_per_token(self) -> bool:
        return self._lqs == LQS_TOKEN

    def set_lqs(self, per_token: bool | None) -> None:
        """Record the LQS choice (None: back to not calibrated, per tensor)."""
        self._lqs = LQS_UNSET if per_token is None else LQS_TOKEN if per_token else LQS_TENSOR
        self.lqs_choice.fill_(self._lqs)

    def _sample_slices(self, x_shape) -> list[slice]:
        """The slices of the batch the backward unfolds one at a time: all of it (a Linear does not unfold)."""
        return [slice(None)]

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._lqs = int(self.lqs_choice)

    def forward(self, x):
        wants_grad = x.requires_grad or self.weight.requires_grad or self.bias is not None and self.bias.requires_grad
        if self.lqs_float or not torch.is_grad_enabled() or not wants_grad or x.numel() == 0:
            return self._torch_class.forward(self, x)  # no HOT backward to prepare (or an empty batch): torch's op
        return _HotProduct.apply(x, self.weight, self.bias, self, self._step_for(self.training), self.training)


class HotLinear(_HotLayer, QuantLinear):
    """nn.Linear trained by HOT; state-dict keys of nn.Linear plus `lqs_choice`."""
    _torch_class = nn.Linear
    _token_dim = -2  # the weight gradient's operands are token-major, (B, L, in) and (B, L, out)

    def _keeps(self) -> str:
        """What the forward keeps of x for g_W: 'compressed' (ABC) or 'float'."""
        return "float" if self.scheme.abc is False else "compressed"

    def _hot_columns(self, x, ops):
        """(B, L, in): L = the samples of a 2-D input (B = 1), else the tokens of each sample."""
        x = x.to(torch.float32)
        return x.reshape(1, -1, self.in_features) if x.dim() <= 2 else x.reshape(x.shape[0], -1, self.in_features)

    def _hot_grad_layouts(self, g):
        """(B, L, out) for g_x and, token-major too, for g_W."""
        rows = g.reshape(1, -1, self.out_features) if g.dim() <= 2 else g.reshape(g.shape[0], -1, self.out_features)
        return rows, rows


class HotConv2d(_HotLayer, QuantConv2d):
    """nn.Conv2d (groups=1, zero padding) trained by HOT; the backward through im2col / col2im."""
    _torch_class = nn.Conv2d
    _token_dim = -1  # the weight gradient's operands are token-last, (B, C·kh·kw, L) and (B, out, L)

    def _keeps(self) -> str:
        """What the forward keeps of x for g_W: 'compressed' (ABC: the HLA-compressed im2col matrix, 9·r/L'/4 of x
        for a 3×3 conv, so only for 1×1 convs unless abc=columns), 'stored' (x in abc_bits, abc=true) or 'float'."""
        abc = self.scheme.abc
        if abc == "columns" or abc in (True, "pointwise") and tuple(self.kernel_size) == (1, 1):
            return "compressed"
        return "stored" if abc is True and self.scheme.abc_bits is not None else "float"

    def forward(self, x):
        if x.dim() == 3 and not self.lqs_float:
            return super().forward(x.unsqueeze(0)).squeeze(0)
        return super().forward(x)

    def _hot_columns(self, x, ops):
        return self._input_columns(x.to(torch.float32), ops)

    def _sample_slices(self, x_shape) -> list[slice]:
        """Consecutive slices of the batch whose unfolded input (K·L elements a sample) is at most the layer's
        input in size: one slice without `sliced_unfold` or where unfolding does not grow the input (1×1 convs)."""
        batch = x_shape[0]
        unfolded = self.weight[0].numel() * math.prod(self._output_size(x_shape))
        size = max(1, batch * math.prod(x_shape[1:]) // unfolded) if self.scheme.sliced_unfold else batch
        return [slice(start, min(start + size, batch)) for start in range(0, batch, size)]

    def _hot_grad_layouts(self, g):
        return self._grad_output_layouts(g)


def hot_layers(model: nn.Module) -> list[tuple[str, _HotLayer]]:
    """(name, layer) of every HOT layer of `model`, in module order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, _HotLayer)]
