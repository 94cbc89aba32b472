"""Which implementation runs the numeric primitives: the torch reference of this package or the CuPy kernels.

Both namespaces have the reference's signatures and give the same bits (docs/numerics.md, "Backends"):
`block_hadamard`, `hla_compress`, `quantize`, `tiled_int_matmul`, `im2col`, `col2im`, `advance_step`, and the fused
`hadamard_quantize`, `forward_quantize`, `scaled_int_matmul` and `col2im_int_matmul`, whose torch versions are
compositions of the reference functions. Where a launch would only multiply, the multiplication joins a kernel that
writes the operand: a quantizer's scale times a factor (`times`), a batch sum times a mask (`keep`).
What a layer records reaches device memory it owns from inside the ops (no launch of its own, docs/quant.md
"Statistics"): a quantizer given `worst` raises it to its largest scale, `forward_quantize` adds its clipped values
to a `tally`, and `scaled_int_matmul` its saturated tile sums. KERNEL_OPS resolves and
checks the arguments by the reference's rules, calls `hdqt_cil.kernels`, and runs the reference where the kernels do
not cover a call (`kernels.NotCovered`; with a warning where another setting would have run the kernels).
"""
import math
import warnings
from types import SimpleNamespace

import torch

from .. import kernels
from .floats import E2M1, E4M3, FP8_DTYPES, nvfp4_tensor_scale, quantize_float, unit_scale
from .hadamard import block_hadamard, checked_block
from .hla import hla_compress, hla_slots
from .im2col import col2im, conv_output_size, im2col
from .intmm import check_product, epilogue_block, sum_entries, tile_sums, tiled_int_matmul
from .quantizers import (quantize, reduction_dims, require_counter, sawb_moments, ste_keep, ste_threshold,
                         within_levels)


def _raise_worst(worst, scale) -> None:
    """worst = max(worst, max(scale)): NaN propagates, as in the kernels' maximum over the scales' bits."""
    if worst is not None:
        torch.maximum(worst, scale.amax(), out=worst)


def advance_step(counter):
    """A copy of a layer's int64 step counter (what this call's quantizers read), the counter then advanced by one."""
    step = counter.clone()
    counter.add_(1)
    return step


def reported_quantize(t, spec, counter=None, worst=None, times=None):
    """quantize(t, spec, counter), raising `worst` (a float32 0-dim tensor) to the largest scale; the scale returned
    times `times` (a one-element tensor: a re-quantized operand's earlier scale) where given."""
    levels, scale = quantize(t, spec, counter)
    _raise_worst(worst, scale)
    return levels, scale if times is None else scale * times


def hadamard_quantize(x, spec, counter=None, block=None, dim=-1, worst=None, times=None):
    """quantize(block_hadamard(x, dim, block), spec, counter): one call, so that a backend can fuse the two."""
    return reported_quantize(block_hadamard(x, dim, block), spec, counter, worst, times)


def forward_quantize(t, spec, counter, ste, tally, worst=None):
    """(levels, scale, keep): quantize(t, spec, counter) with what a training forward needs beside its levels,
    in one call so that a backend can do it in the quantizer's own pass: the straight-through estimator's keep
    mask (`quantizers.ste_keep`; None for 'none'), and the values outside the level range and the values seen added
    to `tally` (an int64 (2,) tensor)."""
    levels, scale = reported_quantize(t, spec, counter, worst)
    inside = within_levels(t, scale, spec)
    tally[0].add_((~inside).sum())
    tally[1].add_(t.numel())
    return levels, scale, ste_keep(t, inside, spec, ste)


def masked_col2im(rows, x_shape, kernel_size, padding, dilation, stride, keep=None):
    """col2im(...) * keep (the input gradient through the forward quantizer's straight-through estimator), in
    one call so that a backend can apply the mask where it writes the sum; keep None: col2im alone."""
    out = col2im(rows, x_shape, kernel_size, padding, dilation, stride)
    return out if keep is None else out * keep


def _check_keep(keep, sum_batch: bool) -> None:
    if keep is not None and not (sum_batch and keep.dtype == torch.bool):
        raise ValueError("scaled_int_matmul's keep is a bool mask of a batch sum (sum_batch=True); got "
                         f"{keep.dtype} with sum_batch={sum_batch}")


def scaled_int_matmul(a, b, scale_a, scale_b, block=1, tile=32, acc_bits=8, bounds=None, count_saturated=False,
                      sum_batch=False, tally=None, keep=None, acc_format=None):
    """float32(tiled_int_matmul(a, b)) * ((scale_a * scale_b) / block): the layers' product with its epilogue in
    one call (docs/numerics.md "Epilogue"), so that a backend can fuse the scaling into the GEMM; with sum_batch,
    summed over the batch by `sum_entries` (the weight gradient of per-sample products), times `keep` (a bool
    (M, N) mask: the straight-through estimator's) where given. tally: an int64 (2,) tensor to which (saturated
    tile sums, tile sums) are added; only the product is returned then. acc_format: a float accumulator instead
    of acc_bits (tiled_int_matmul)."""
    block = epilogue_block(block)
    _check_keep(keep, sum_batch)
    counting = count_saturated or tally is not None
    result = tiled_int_matmul(a, b, tile, acc_bits, bounds, counting, acc_format)
    acc, saturated = result if counting else (result, None)
    out = acc.to(torch.float32) * ((scale_a * scale_b) / block)
    out = sum_entries(out) if sum_batch else out
    out = out if keep is None else out * keep.reshape(out.shape)
    if tally is not None:
        tally[0].add_(saturated)
        tally[1].add_(tile_sums(a.shape, b.shape, tile, acc_bits, acc_format))
        return out
    return (out, saturated) if count_saturated else out


def col2im_int_matmul(a, b, scale_a, scale_b, block, tile, acc_bits, bounds, x_shape, kernel_size, padding,
                      dilation, stride, keep=None, tally=None, acc_format=None):
    """masked_col2im(scaled_int_matmul(a, b, ...), x_shape, ...): a convolution's input gradient from its integer
    operands, in one call so that a backend can fold the product into col2im (no (B, L, K) float rows)."""
    rows = scaled_int_matmul(a, b, scale_a, scale_b, block, tile, acc_bits, bounds, tally=tally, acc_format=acc_format)
    return masked_col2im(rows, x_shape, kernel_size, padding, dilation, stride, keep)


TORCH_OPS = SimpleNamespace(name="torch", block_hadamard=block_hadamard, hla_compress=hla_compress,
                            quantize=reported_quantize, advance_step=advance_step,
                            tiled_int_matmul=tiled_int_matmul, hadamard_quantize=hadamard_quantize,
                            forward_quantize=forward_quantize, scaled_int_matmul=scaled_int_matmul, im2col=im2col,
                            col2im=masked_col2im, col2im_int_matmul=col2im_int_matmul)


def covered(launch, reference):
    """launch(), or reference() where the kernels do not cover the call."""
    try:
        return launch()
    except kernels.NotCovered as miss:
        if miss.warn:
            warnings.warn(f"hdqt_cil.kernels: {miss}; using the torch reference", stacklevel=3)
        return reference()


def _as_float(t: torch.Tensor) -> torch.Tensor:
    """int8 levels as the reference holds them (float32; the values are equal)."""
    return t.float() if t.dtype == torch.int8 else t


def _given_moments(t, spec):
    """What the kernels take from the caller for a SAWB scale: torch's float sums on t as given, one (2, groups)
    tensor of (mean t², mean |t|) (max: None), written where it is returned (no stacking copy)."""
    if spec.scale == "max":
        return None
    out = torch.empty(2, *spec.scale_shape(t.shape), device=t.device)
    return sawb_moments(t.to(torch.float32), reduction_dims(t.dim(), spec.granularity), out).reshape(2, -1)


def _kernel_quantize(t, spec, counter=None, worst=None, times=None):
    require_counter(spec, counter)
    return covered(lambda: kernels.quantize(t, spec, counter, _given_moments(t, spec), worst, times),
                   lambda: reported_quantize(t, spec, counter, worst, times))


def _kernel_forward_quantize(t, spec, counter, ste, tally, worst=None):
    require_counter(spec, counter)
    stats = kernels.Stats(tally, ste, ste_threshold(spec))
    return covered(lambda: kernels.forward_quantize(t, spec, counter, _given_moments(t, spec), stats, worst),
                   lambda: forward_quantize(t, spec, counter, ste, tally, worst))


def _kernel_block_hadamard(x, dim=-1, block=None):
    block = checked_block(x.shape[dim], block)
    return covered(lambda: kernels.block_hadamard(x, dim, block), lambda: block_hadamard(x, dim, block))


def _kernel_hla_compress(t, block, rank, dim=-1):
    """The transform and the row choice in one kernel where the blocks run along the contiguous last dim (the
    rows the reference's gather makes, in its layout), else the kernels' transform and the reference's gather
    (which also refuses a block that does not divide the dimension)."""
    if dim % t.dim() == t.dim() - 1 and 1 < block and rank < block and t.shape[-1] % block == 0:
        return covered(lambda: kernels.hla_compress(t, block, rank, hla_slots(block, rank, t.device)),
                       lambda: hla_compress(t, block, rank, dim, _kernel_block_hadamard))
    return hla_compress(t, block, rank, dim, _kernel_block_hadamard)


def _kernel_hadamard_quantize(x, spec, counter=None, block=None, dim=-1, worst=None, times=None):
    block = checked_block(x.shape[dim], block)
    require_counter(spec, counter)
    return covered(lambda: kernels.hadamard_quantize(x, spec, counter, block, dim, worst, times),
                   lambda: _kernel_quantize(_kernel_block_hadamard(x, dim, block), spec, counter, worst, times))


def _integer_sums(acc_format) -> None:
    """The GEMM kernels add integer tile sums only: a float accumulator is not covered (the reference runs it)."""
    if acc_format is not None:
        raise kernels.NotCovered(f"a {acc_format.name} accumulator")


def _kernel_tiled_int_matmul(a, b, tile=32, acc_bits=8, bounds=None, count_saturated=False):
    check_product(a, b, tile, acc_bits)
    return covered(lambda: kernels.tiled_int_matmul(a, b, tile, acc_bits, bounds, count_saturated),
                   lambda: tiled_int_matmul(_as_float(a), _as_float(b), tile, acc_bits, bounds, count_saturated))


def _kernel_scaled_int_matmul(a, b, scale_a, scale_b, block=1, tile=32, acc_bits=8, bounds=None,
                              count_saturated=False, sum_batch=False, tally=None, keep=None, acc_format=None):
    block = epilogue_block(block)
    _check_keep(keep, sum_batch)
    scale_a, scale_b = (s if torch.is_tensor(s) else torch.tensor(float(s), device=a.device)
                        for s in (scale_a, scale_b))
    check_product(a, b, tile, acc_bits, acc_format)

    def launch():
        _integer_sums(acc_format)
        return kernels.scaled_int_matmul(a, b, scale_a, scale_b, block, tile, acc_bits, bounds, count_saturated,
                                         sum_batch, tally=tally, keep=keep)
    return covered(launch,
                   lambda: scaled_int_matmul(_as_float(a), _as_float(b), scale_a, scale_b, block, tile, acc_bits,
                                             bounds, count_saturated, sum_batch, tally, keep, acc_format))


def _kernel_im2col(x, kernel_size, padding, dilation, stride, columns=False):
    out_size = conv_output_size(x.shape, kernel_size, padding, dilation, stride)
    return covered(lambda: kernels.im2col(x, kernel_size, padding, dilation, stride, columns, out_size),
                   lambda: im2col(x, kernel_size, padding, dilation, stride, columns))


def _kernel_col2im(rows, x_shape, kernel_size, padding, dilation, stride, keep=None):
    out_size = conv_output_size(x_shape, kernel_size, padding, dilation, stride)
    return covered(lambda: kernels.col2im(rows, x_shape, kernel_size, padding, dilation, stride, out_size, keep),
                   lambda: masked_col2im(rows, x_shape, kernel_size, padding, dilation, stride, keep))


def _kernel_col2im_int_matmul(a, b, scale_a, scale_b, block, tile, acc_bits, bounds, x_shape, kernel_size, padding,
                              dilation, stride, keep=None, tally=None, acc_format=None):
    block = epilogue_block(block)
    check_product(a, b, tile, acc_bits, acc_format)
    out_size = conv_output_size(x_shape, kernel_size, padding, dilation, stride)

    def launch():
        _integer_sums(acc_format)
        return kernels.col2im_int_matmul(a, b, scale_a, scale_b, block, tile, acc_bits, bounds, x_shape, kernel_size,
                                         padding, dilation, stride, out_size, keep, tally)
    return covered(launch,
                   lambda: _kernel_col2im(_kernel_scaled_int_matmul(a, b, scale_a, scale_b, block, tile, acc_bits,
                                                                    bounds, tally=tally, acc_format=acc_format),
                                          x_shape, kernel_size, padding, dilation, stride, keep))


KERNEL_OPS = SimpleNamespace(name="cupy", block_hadamard=_kernel_block_hadamard, hla_compress=_kernel_hla_compress,
                             quantize=_kernel_quantize, advance_step=kernels.advance_step,
                             tiled_int_matmul=_kernel_tiled_int_matmul, hadamard_quantize=_kernel_hadamard_quantize,
                             forward_quantize=_kernel_forward_quantize, scaled_int_matmul=_kernel_scaled_int_matmul,
                             im2col=_kernel_im2col, col2im=_kernel_col2im,
                             col2im_int_matmul=_kernel_col2im_int_matmul)


def folds_col2im(ops: SimpleNamespace, width: int) -> bool:
    """Whether ops.col2im_int_matmul over a contraction of `width` folds the product into col2im without writing
    its (B, L, K) float rows: the kernels' fused op is built for that width (where a call's other arguments are not
    covered, it still runs, through the reference's composition). `ops` may be the diagnostics' watch over the
    kernels (trainer/diagnostics.py): a diagnosed copy then takes the path its training step took."""
    return ops.name == KERNEL_OPS.name and width in kernels.COL2IM_PRODUCT_WIDTHS


def resolve_ops(backend: str, device: torch.device) -> SimpleNamespace:
    """torch: the reference everywhere. cupy: the kernels (CUDA tensors only). auto: the kernels where they can run."""
    if backend == "torch":
        return TORCH_OPS
    if device.type != "cuda":
        if backend == "cupy":
            raise ValueError(f"quant.backend=cupy needs CUDA tensors; this layer runs on {device}")
        return TORCH_OPS
    if not kernels.available():
        if backend == "cupy":
            raise RuntimeError(f"quant.backend=cupy, but hdqt_cil.kernels cannot run here "
                               f"({kernels.unavailable_reason()}); use quant.backend=auto or torch")
        return TORCH_OPS
    return KERNEL_OPS


# ---------------------------------------------------------------------------------------------------------------
# float formats (quant/float_product.py's FloatOperands): fp8's products on the FP8 tensor cores, MXFP4's and
# NVFP4's on the int8 tensor cores, the authors' quantizer (fp) and its rounded tile sums by the kernels

def on_kernels(backend: str, device: torch.device) -> bool:
    """Whether a float scheme's primitives run on the kernels: quant.backend=auto on a GPU where they run."""
    return backend == "auto" and device.type == "cuda" and kernels.available()


def on_int8_tensor_cores(product, backend: str, device: torch.device) -> bool:
    """Whether a block-scaled E2M1 product (mxfp4, nvfp4) runs on the int8 tensor cores (where the kernels run, no
    accumulator format): E2M1 values doubled are integers within ±12, so each block's sum is exact there and its
    scale pair is applied in float as the reference does, bit for bit."""
    return (product.acc is None and product.left.fmt == E2M1 and product.right.fmt == E2M1
            and product.left.block in kernels.BLOCK_SCALED_SAT and on_kernels(backend, device))


def float_values(t: torch.Tensor, spec, counter, backend: str):
    """floats.quantize_float(t, spec, counter); the authors' quantizer (scaling none) by the kernels where they run."""
    if spec.scaling == "none" and on_kernels(backend, t.device):
        fmt = spec.fmt
        return covered(lambda: (kernels.authors_float(t, fmt.exp_bits, fmt.man_bits), unit_scale(t)),
                       lambda: quantize_float(t, spec, counter))
    return quantize_float(t, spec, counter)


def batch_sum(t: torch.Tensor, backend: str) -> torch.Tensor:
    """sum_entries(t), the batch of (..., M, N) added in order from +0, by the kernels where they run (one launch,
    where the reference adds one entry at a time)."""
    if on_kernels(backend, t.device):
        return covered(lambda: kernels.sum_entries(t), lambda: sum_entries(t))
    return sum_entries(t)


def authors_tile_sum(partials: torch.Tensor, out, fmt, limit: float, saturated) -> torch.Tensor:
    """`out` (0: none yet) plus authors_float(·, fmt) of each K tile's sums in `partials` (..., tiles, M, N) in tile
    order, by the kernels (one pass where the reference makes some twenty); the count of |partial| > limit added to
    `saturated` (an int64 element or None)."""
    return kernels.authors_tile_sum(partials, None if isinstance(out, int) else out, fmt.exp_bits, fmt.man_bits,
                                    limit, saturated)


def e2m1_blocks(t, spec, counter=None):
    """(int8 levels, the values doubled; float32 scales, one a block) of `t` (..., K) rounded as
    floats.quantize_float(t, spec, counter) rounds it (spec: E2M1 with mx or nv scaling), by the kernels."""
    tensor_scale = nvfp4_tensor_scale(t) if spec.scaling == "nv" else None
    return kernels.e2m1_quantize(t, spec.block, tensor_scale, counter if spec.rounding == "stochastic" else None)


def block_scaled_product(a, b, block: int, hadamard: int, sum_batch: bool) -> torch.Tensor:
    """a (..., M, K) times b (..., N, K)ᵀ / `hadamard` from their e2m1_blocks (levels, scales) pairs: the reference's
    format_matmul (summed over the batch by sum_entries with sum_batch) by the block-scaled GEMM."""
    return kernels.block_scaled_matmul(a[0], b[0].mT, a[1], b[1], block, epilogue_block(hadamard), sum_batch)


# The formats the FP8 tensor cores multiply (torch._scaled_mm; one operand at least must be E4M3).
_FP8_ALIGN = 16  # _scaled_mm's operands: both sides multiples of 16 (zero padding adds nothing to a sum)


def has_fp8_tensor_cores(device: torch.device | None = None) -> bool:
    """Whether a CUDA GPU (default: the current one) has FP8 tensor cores: sm_89 and later."""
    return torch.cuda.get_device_capability(device) >= (8, 9)


def on_fp8_tensor_cores(a, b, product, backend: str, sum_batch: bool) -> bool:
    """Whether a product runs on the GPU's FP8 tensor cores (quant.backend=auto on an sm_89+ GPU): one scale an
    operand, FP8 values (not both E5M2), no accumulator format, b one matrix or, with sum_batch, a batch."""
    values = a.values
    return (backend == "auto" and values.is_cuda and product.acc is None and a.block is None and b.block is None
            and a.fmt in FP8_DTYPES and b.fmt in FP8_DTYPES and E4M3 in (a.fmt, b.fmt)
            and (b.values.dim() == 2 or sum_batch and b.values.dim() == values.dim() == 3)
            and has_fp8_tensor_cores(values.device))


def fp8_matmul(a, b, sum_batch: bool = False) -> torch.Tensor:
    """(a.values · b.valuesᵀ) · (a.scale · b.scale) by torch._scaled_mm, summed by the FP8 tensor cores'
    accumulator (docs/numerics.md "Float training": fewer bits than float32). a (..., M, K) and b (N, K); with
    sum_batch a (B, M, K) and b (B, N, K), summed over B as one product along the joined B·K (one scale a tensor
    spans every entry)."""
    if sum_batch:
        left, right, row_dims = a.values.transpose(0, 1), b.values.transpose(0, 1), 1
    else:
        left, right, row_dims = a.values, b.values, a.values.dim() - 1
    packed_a, rows = _fp8_matrix(left, row_dims, FP8_DTYPES[a.fmt])
    packed_b, n = _fp8_matrix(right, 1, FP8_DTYPES[b.fmt])
    out = torch._scaled_mm(packed_a, packed_b.t(), scale_a=a.scale.reshape(()).float(),
                           scale_b=b.scale.reshape(()).float(), out_dtype=torch.float32, use_fast_accum=False)
    return out[:rows, :n].unflatten(0, left.shape[:row_dims])


def _fp8_matrix(t: torch.Tensor, row_dims: int, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    """(t cast to `dtype` as a row-major matrix, its leading `row_dims` dims the rows and the rest the columns,
    zero-padded to multiples of 16; its rows). The cast is exact: the values lie on the format's grid."""
    rows, k = math.prod(t.shape[:row_dims]), math.prod(t.shape[row_dims:])
    padded = (-(-rows // _FP8_ALIGN) * _FP8_ALIGN, -(-k // _FP8_ALIGN) * _FP8_ALIGN)
    out = (torch.empty if padded == (rows, k) else torch.zeros)(padded, dtype=dtype, device=t.device)
    out[:rows, :k].unflatten(0, t.shape[:row_dims]).unflatten(-1, t.shape[row_dims:]).copy_(t)
    return out, rows
