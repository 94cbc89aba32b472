"""CuPy RawKernels for the numerics of `hdqt_cil.quant`, bit-identical to that torch reference (docs/kernels.md).

    available() -> bool               CUDA, CuPy and a kernel compile all work here
    OPS                               what `hdqt_cil.quant.backend` dispatches to (quant.backend=auto|cupy)
    quantize(t, spec, counter)        -> (int8 levels, float32 scale): the reference's quantize
    block_hadamard(x, dim, block)     -> float32: the reference's block_hadamard
    hadamard_quantize(x, spec, counter, block, dim)
                                      -> quantize(block_hadamard(x, dim, block), spec, counter) in one kernel pair,
                                         the transformed tensor never written (dim must be the last)
    tiled_int_matmul(a, b, tile, acc_bits, bounds, count_saturated)
                                      -> the reference's tiled_int_matmul on the int8 tensor cores
    scaled_int_matmul(a, b, scale_a, scale_b, block, tile, acc_bits, bounds, count_saturated, sum_batch)
                                      -> float32(tiled_int_matmul(a, b)) * ((scale_a * scale_b) / block), with the
                                         scaling fused into the GEMM's epilogue (the layers' product, one pass);
                                         sum_batch: summed over the batch in the reference's order, in the
                                         epilogue too where M x N fills the GPU
    sum_entries(t)                    -> the reference's sum_entries (the batch of (..., M, N) in order from +0)
    im2col(x, kernel_size, padding, dilation, stride, columns)
                                      -> the reference's im2col (rows or columns, int8 or float32) in one launch
    col2im(rows, x_shape, kernel_size, padding, dilation, stride)
                                      -> the reference's col2im, the patches added in its order

Everything takes and returns torch CUDA tensors on torch's current stream. Levels are int8 (the reference holds
them as float32; the values are equal). What the kernels do not cover (level ranges beyond int8, tiles that are
not multiples of 32, Hadamard blocks above 8192, tensors of 2^31 elements or more) runs the reference, the tile
case with a warning.
"""
import math
import warnings
from functools import lru_cache
from types import SimpleNamespace

import torch

from . import _runtime as rt

MAX_HADAMARD_BLOCK = 8192
_MAX_ELEMENTS = 2**31 - 1
_INT8_BOUND = 127
_INT32_EXACT = 2**31
_FLOAT32_EXACT = 2**24


# ---------------------------------------------------------------------------------------------------------------
# availability


@lru_cache(maxsize=1)
def _probe() -> str:
    """'' when the kernels can run here, else why not."""
    try:
        import cupy  # noqa: F401, PLC0415
    except Exception as err:  # noqa: BLE001 (any import failure means: not available)
        return f"CuPy cannot be imported ({err})"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        rt.function("quant.cu", "quantize_f32_nearest")
    except Exception as err:  # noqa: BLE001
        return f"the kernels do not compile or load ({type(err).__name__}: {err})"
    return ""


def available() -> bool:
    """Whether CUDA, CuPy and the kernels work in this process (checked once)."""
    return _probe() == ""


def unavailable_reason() -> str:
    return _probe()


def _require_cuda(*tensors) -> None:
    for t in tensors:
        if not t.is_cuda:
            raise ValueError(f"hdqt_cil.kernels runs on CUDA tensors; got a tensor on {t.device}")
    reason = _probe()
    if reason:
        raise RuntimeError(f"hdqt_cil.kernels cannot run: {reason}")


def _reference():
    from hdqt_cil import quant  # noqa: PLC0415 (the reference imports its config helpers)

    return quant


class _on_device:
    """Make `t`'s device current for CuPy (a no-op when it already is)."""

    def __init__(self, t: torch.Tensor):
        self.index = t.device.index
        self.guard = None

    def __enter__(self):
        if self.index is not None and self.index != torch.cuda.current_device():
            self.guard = torch.cuda.device(self.index)
            self.guard.__enter__()

    def __exit__(self, *exc):
        if self.guard is not None:
            self.guard.__exit__(*exc)


# ---------------------------------------------------------------------------------------------------------------
# flat kernels: quantize, Hadamard, both


def _empty(shape, dtype, device) -> torch.Tensor:
    """An output buffer; filled with poison (NaN, or 0x7f bytes for integers) when rt.POISON is set (tests): every
    element a kernel fails to write then shows."""
    out = torch.empty(shape, dtype=dtype, device=device)
    if rt.POISON:
        if dtype.is_floating_point:
            out.fill_(float("nan"))
        else:
            out.view(torch.uint8).fill_(0x7F) if dtype in (torch.int8, torch.uint8) else out.fill_(0x7F7F7F7F)
    return out


def _flat_input(t: torch.Tensor) -> torch.Tensor:
    """float32 or int8, contiguous, 16-byte aligned (the kernels' inputs)."""
    if t.dtype not in (torch.float32, torch.int8):
        t = t.to(torch.float32)
    t = t.contiguous()
    if t.data_ptr() % 16:
        t = t.clone()
    return t


def _suffix(t: torch.Tensor) -> str:
    return "f32" if t.dtype == torch.float32 else "i8"


# Flat kernels with a Hadamard transform on tensors of at least this many elements hold 4 runs of 8 a thread
# (quant.cu's absmax4 / quantize4 / hadamard4: +15-20 % on 64 MiB, kernel_notes v14); the others one run (a
# quarter of the warps was 1.7-2x slower on the MLP's 70K-element tensors).
FLAT_RUNS_FROM = 1 << 22


def _flat_per_thread(n_el: int, logn: int) -> int:
    """Elements a thread of the flat kernels holds: 4 runs of 8 or one."""
    return 32 if logn and n_el >= FLAT_RUNS_FROM else 8


def _flat_name(kind: str, per_thread: int) -> str:
    """quant.cu's name of a flat kernel ("absmax", "quantize", "hadamard") holding per_thread elements a thread."""
    return kind if per_thread == 8 else f"{kind}4"


def _transform(logn: int, per_thread: int) -> str:
    """quant.cu's name prefix for a Hadamard block of 2^logn: none, any block, or one filling a warp's elements
    (32 threads' per_thread: every in-warp butterfly stage runs, no branch between them)."""
    return "" if not logn else "hadw_" if (1 << logn) >= 32 * per_thread else "had_"


def _exchange_smem(threads: int, logn: int, per_thread: int) -> int:
    """Shared bytes of the butterfly's exchange buffer (8 floats a thread), for blocks beyond a warp's elements."""
    return threads * 8 * 4 if (1 << logn) > 32 * per_thread else 0


def _flat_grid(n_el: int, logn: int, per_thread: int, *fns) -> tuple[int, int, int, int]:
    """(ctas, threads, range, shared bytes) for passes of the kernels `fns` over n_el elements with Hadamard blocks
    of 2^logn: at most one wave of the kernel with the lowest occupancy, so that two passes share their CTAs'
    ranges and the quantize pass, walking its range backwards, starts in what the absmax pass read last (in L2)."""
    threads = max(256, (1 << logn) // per_thread)
    step = threads * per_thread
    steps = -(-n_el // step)
    smem = _exchange_smem(threads, logn, per_thread)
    ctas = min(steps, rt.sm_count() * min(rt.ctas_per_sm(fn, threads, smem) for fn in fns))
    per_cta = -(-steps // ctas)
    ctas = -(-steps // per_cta)
    return ctas, threads, per_cta * step, smem


# Single-pass quantization (one CTA per scale group, the group in registers, 32 elements a thread): groups of
# GROUP_MIN..GROUP_MAX elements, or a whole tensor up to GROUP_MAX.
GROUP_MIN, GROUP_MAX = 1024, 32768
_GROUP_PER_THREAD = 32  # elements a thread holds (quant.cu GROUP_ROUNDINGS: 4 runs of 8)


def _group_threads(group: int) -> int:
    """Whole warps covering the group."""
    return 32 * -(-group // (32 * _GROUP_PER_THREAD))


def _group_size(shape, granularity: str) -> int:
    numel = math.prod(shape)
    if granularity == "tensor":
        return numel
    if granularity == "sample":
        return numel // shape[0]
    return shape[-1]


def _scale_shape(shape, granularity: str) -> tuple[int, ...]:
    if granularity == "tensor":
        return (1,) * len(shape)
    if granularity == "sample":
        return (shape[0],) + (1,) * (len(shape) - 1)
    return tuple(shape[:-1]) + (1,)


def _quantizable(t: torch.Tensor, spec) -> bool:
    """What the quantize kernels cover: levels that fit int8, 1 <= numel < 2^31, at least one dimension."""
    return spec.level_bound <= _INT8_BOUND and t.dim() >= 1 and 0 < t.numel() <= _MAX_ELEMENTS


_MASK32 = 0xFFFFFFFF


def _counter_args(counter, device: torch.device) -> tuple:
    """The kernels' (seed, role, step pointer, step) for `counter`'s key, computed on the device (the formula's one
    definition for the GPU, docs/numerics.md). A tensor step is read where it lies, so that a captured CUDA graph
    reads the layer's current step on every replay; None (nearest rounding) draws nothing."""
    if counter is None:
        return rt.u32(0), rt.u32(0), rt.ptr(None), rt.u32(0)
    step, on_device = counter.step, torch.is_tensor(counter.step)
    if on_device:
        step = step.to(device=device, dtype=torch.int64)
    return (rt.u32(counter.seed & _MASK32), rt.u32(counter.role & _MASK32), rt.ptr(step if on_device else None),
            rt.u32(0 if on_device else step & _MASK32))


_SIGN_MODES = {"signed": 0, "unsigned": 1, "auto": 2}


def _quantize_flat(x: torch.Tensor, shape, spec, counter, logn: int, original: torch.Tensor | None = None):
    """levels (int8, `shape`) and scale of the flat tensor x (already contiguous), transformed first when logn.
    `original`: the tensor as the caller gave it (SAWB's float sums then run in the reference's order)."""
    n_el = x.numel()
    group = _group_size(shape, spec.granularity)
    groups = n_el // group
    stochastic = spec.rounding != "nearest"
    rounding = "log2" if stochastic and spec.grid == "log2" else spec.rounding  # quant.cu's name suffix
    if stochastic and counter is None:
        raise ValueError("stochastic rounding needs a Counter (seed, step, role) for its random bits")
    key = _counter_args(counter if stochastic else None, x.device)
    sign_mode = _SIGN_MODES[spec.signedness]
    device = x.device
    levels = _empty(shape, torch.int8, device)
    scale_shape = _scale_shape(shape, spec.granularity)
    single_pass = (spec.scale == "max" and group <= GROUP_MAX and (group >= GROUP_MIN or groups == 1)
                   and (sign_mode != 2 or groups == 1))
    if single_pass:
        scale = _empty(groups, torch.float32, device)
        threads = _group_threads(group)
        fn = rt.function("quant.cu", f"group_{_transform(logn, _GROUP_PER_THREAD)}{_suffix(x)}_{rounding}")
        rt.launch(fn, (groups,), (threads,),
                  (rt.ptr(x), rt.u32(group), rt.i32(logn), rt.i32(sign_mode), rt.f32(spec.signed_max),
                   rt.f32(spec.unsigned_max), rt.f32(spec.clip), *key, rt.ptr(levels), rt.ptr(scale)),
                  _exchange_smem(threads, logn, _GROUP_PER_THREAD))
        return levels, scale.view(scale_shape)

    work = rt.ZEROS_I32.take(groups + 1, device)  # per-group max bits, then 'negative'
    peaks, negative = work[:groups], work[groups:]
    per_thread = _flat_per_thread(n_el, logn)
    suffix = _transform(logn, per_thread) + _suffix(x)
    absmax, quantize_levels = (rt.function("quant.cu", f"{_flat_name('absmax', per_thread)}_{suffix}"),
                               rt.function("quant.cu", f"{_flat_name('quantize', per_thread)}_{suffix}_{rounding}"))
    ctas, threads, span, smem = _flat_grid(n_el, logn, per_thread, absmax, quantize_levels)
    rt.launch(absmax, (ctas,), (threads,),
              (rt.ptr(x), rt.u32(n_el), rt.u32(group), rt.u32(span), rt.i32(logn), rt.ptr(peaks), rt.ptr(negative)),
              smem)
    if spec.scale == "max":
        scale, scale_in = _empty(groups, torch.float32, device), None
    else:  # SAWB: the scale from the reference's formula (float sums: torch's order), the levels from the kernel
        if logn:
            transformed = block_hadamard(x.view(shape), -1, 1 << logn)
        else:
            transformed = original if original is not None else x.view(shape)
        scale_in = _reference().compute_scale(transformed, spec).reshape(-1).contiguous()
        scale = scale_in
    rt.launch(quantize_levels, (ctas,), (threads,),
              (rt.ptr(x), rt.u32(n_el), rt.u32(group), rt.u32(span), rt.i32(logn), rt.ptr(peaks),
               rt.ptr(scale_in), rt.ptr(negative), rt.i32(sign_mode), rt.f32(spec.signed_max),
               rt.f32(spec.unsigned_max), rt.f32(spec.clip), *key, rt.ptr(levels),
               rt.ptr(None if scale_in is not None else scale)),
              smem)
    return levels, scale.view(scale_shape)


def quantize(t: torch.Tensor, spec, counter=None):
    """(levels, scale) as `hdqt_cil.quant.quantize`, levels as int8 (float32 from the reference where the
    levels do not fit int8)."""
    _require_cuda(t)
    if spec.rounding == "stochastic" and counter is None:
        raise ValueError("stochastic rounding needs a Counter (seed, step, role) for its random bits")
    if not _quantizable(t, spec):
        return _reference().quantize(t, spec, counter)
    with _on_device(t):
        return _quantize_flat(_flat_input(t), t.shape, spec, counter, 0, original=t)


def _checked_block(size: int, block: int | None) -> int:
    from hdqt_cil.quant.hadamard import hadamard_block_size  # noqa: PLC0415

    block = hadamard_block_size(size) if block is None else block
    if block < 1 or block & (block - 1) or size % block:
        raise ValueError(f"Hadamard block {block} must be a power of two dividing the dimension {size}")
    return block


def block_hadamard(x: torch.Tensor, dim: int = -1, block: int | None = None) -> torch.Tensor:
    """x transformed by I ⊗ H_block along `dim`, float32, as `hdqt_cil.quant.block_hadamard`."""
    _require_cuda(x)
    block = _checked_block(x.shape[dim], block)
    if block == 1:
        return x.to(torch.float32, copy=True)
    if block > MAX_HADAMARD_BLOCK or x.numel() > _MAX_ELEMENTS:
        return _reference().block_hadamard(x, dim, block)
    moved = x.movedim(dim, -1)
    with _on_device(x):
        flat = _flat_input(moved)
        out = _empty(moved.shape, torch.float32, x.device)
        logn = block.bit_length() - 1
        per_thread = _flat_per_thread(flat.numel(), logn)
        fn = rt.function("quant.cu", f"{_flat_name('hadamard', per_thread)}_{_suffix(flat)}")
        ctas, threads, span, smem = _flat_grid(flat.numel(), logn, per_thread, fn)
        rt.launch(fn, (ctas,), (threads,),
                  (rt.ptr(flat), rt.u32(flat.numel()), rt.u32(span), rt.i32(logn), rt.ptr(out)), smem)
    return out.movedim(-1, dim)


def hadamard_quantize(x: torch.Tensor, spec, counter=None, block: int | None = None, dim: int = -1):
    """quantize(block_hadamard(x, dim, block), spec, counter) without writing the transformed tensor."""
    _require_cuda(x)
    if dim not in (-1, x.dim() - 1):
        return quantize(block_hadamard(x, dim, block), spec, counter)
    block = _checked_block(x.shape[-1], block)
    if block == 1 or block > MAX_HADAMARD_BLOCK or not _quantizable(x, spec):
        return quantize(block_hadamard(x, -1, block), spec, counter)
    if spec.rounding == "stochastic" and counter is None:
        raise ValueError("stochastic rounding needs a Counter (seed, step, role) for its random bits")
    with _on_device(x):
        return _quantize_flat(_flat_input(x), x.shape, spec, counter, block.bit_length() - 1)


# ---------------------------------------------------------------------------------------------------------------
# integer GEMM


def _bounds(a: torch.Tensor, b: torch.Tensor, bounds):
    if bounds is not None:
        return float(bounds[0]), float(bounds[1])

    def peak(t):  # max|t| without abs() (abs of int8 -128 overflows)
        return torch.maximum(t.amax().float(), -t.amin().float())
    return tuple(torch.stack([peak(a), peak(b)]).tolist())


def _gemm_config(m: int, n: int, k: int, sat: int, count: bool, batch: int = 1) -> str:
    """The CTA tile for a problem (measured on an H100: docs/kernel_notes.md)."""
    if n <= 16:
        return "256x16"
    if n <= 32:
        return "256x32"
    if m <= 16:
        return "16x128"
    if m <= 32:
        return "32x128"
    ctas = batch * -(-m // 128) * -(-n // 128)
    if min(m, n) < 128 or ctas < rt.sm_count():
        return "64x64"
    return GEMM_LARGE[(sat in (2, 4), count)]


# Large problems: (tile-32 saturation, counting) -> config; from the benchmark's comparison (docs/kernel_notes.md).
GEMM_LARGE = {(False, False): "128x128x2", (False, True): "128x128x2", (True, False): "256x128",
              (True, True): "128x128"}
_PACKED_LIMIT = 2**15 - 1  # mode 4 keeps |tile sum| + L and the biased lane sums inside 16 bits


def _batch_stride(t: torch.Tensor, batch_shape) -> int | None:
    """Stride between consecutive matrices of t's leading dims flattened (0: one matrix broadcast), None when
    they are not one uniform stride or do not match the batch."""
    lead = t.shape[:-2]
    if math.prod(lead) == 1:
        return 0
    if tuple(lead) != tuple(batch_shape[len(batch_shape) - len(lead):]) or math.prod(lead) != math.prod(batch_shape):
        return None
    stride = t.stride(len(lead) - 1)
    expected = stride
    for dim in range(len(lead) - 1, 0, -1):
        expected *= lead[dim]
        if lead[dim - 1] > 1 and t.stride(dim - 1) != expected:
            return None
    return stride


def _operand(t: torch.Tensor, batch_shape, batch: int, rows: int, k: int, transposed: bool):
    """(int8 tensor, row stride, batch stride) with K contiguous, row and batch strides multiples of 16 bytes and
    an aligned base, `t` itself when it already is (`transposed`: t is (..., K, rows), the right factor)."""
    if t.dtype == torch.int8:
        k_stride, row_stride = (t.stride(-2), t.stride(-1)) if transposed else (t.stride(-1), t.stride(-2))
        batch_stride = _batch_stride(t, batch_shape)
        if (k_stride == 1 and batch_stride is not None and row_stride % 16 == 0 and batch_stride % 16 == 0
                and t.data_ptr() % 16 == 0):
            return t, row_stride, batch_stride
    lead = t.shape[:-2]
    full = t if math.prod(lead) == 1 else t.expand(*batch_shape, *t.shape[-2:])
    full = full.transpose(-1, -2) if transposed else full
    view = full.reshape(-1, rows, k)
    padded = -(-k // 16) * 16
    buffer = torch.empty(view.shape[0], rows, padded, dtype=torch.int8, device=t.device)
    if view.dtype == torch.int8 and view.stride(-2) == 1 and rows > 1:  # K-major levels: a transposing kernel
        _transpose_into(view, buffer)
    else:
        buffer[:, :, :k].copy_(view)  # integer-valued floats convert exactly
    return buffer, padded, (padded * rows if view.shape[0] > 1 else 0)


def _transpose_into(view: torch.Tensor, buffer: torch.Tensor) -> None:
    """buffer[b, :, :K] = view[b] for an int8 view (B, rows, K) whose rows are contiguous (a (K, rows) matrix)."""
    batch, rows, k = view.shape
    batch_stride = view.stride(0) if batch > 1 else 0
    with _on_device(view):
        rt.launch(rt.function("quant.cu", "transpose_i8"), (-(-rows // 64), -(-k // 64), batch), (64, 4),
                  (rt.ptr(view), rt.u32(k), rt.u32(rows), rt.u64(batch_stride), rt.u64(view.stride(-1)),
                   rt.ptr(buffer), rt.u64(buffer.stride(0)), rt.u64(buffer.stride(1))))


def _scale_operand(scale: torch.Tensor, batch_shape, batch: int, along_last: bool):
    """A float32 scale broadcastable to (..., rows, 1) (along_last=False) or (..., 1, cols) (True) as
    (tensor, batch stride, element stride)."""
    if scale.dtype != torch.float32:
        scale = scale.float()
    if scale.numel() == 1:
        return scale, 0, 0
    while scale.dim() < 2:
        scale = scale.unsqueeze(0)
    dim = -1 if along_last else -2
    element = scale.stride(dim) if scale.shape[dim] > 1 else 0
    batch_stride = _batch_stride(scale, batch_shape)
    if batch_stride is None:
        scale = scale.expand(*batch_shape, *scale.shape[-2:]).contiguous()
        element = scale.stride(dim) if scale.shape[dim] > 1 else 0
        batch_stride = _batch_stride(scale, batch_shape)
    return scale, batch_stride, element


def _int_matmul(a, b, tile, acc_bits, bounds, count_saturated, scales, config=None, packed=None, sum_batch=False):
    if tile is not None and tile < 1:
        raise ValueError(f"tile={tile} must be a positive number of K elements (or None for the whole K)")
    if acc_bits is not None and acc_bits < 1:
        raise ValueError(f"acc_bits={acc_bits} must be >= 1 (or None for no saturation)")
    if a.dim() < 2 or b.dim() < 2:
        raise ValueError(f"matrix operands need two dimensions; got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    k = a.shape[-1]
    if b.shape[-2] != k:
        raise ValueError(f"contraction sizes differ: a has K={k}, b has K={b.shape[-2]}")
    _require_cuda(a, b)
    m, n = a.shape[-2], b.shape[-1]
    batch_shape = a.shape[:-2] if a.shape[:-2] == b.shape[:-2] else torch.broadcast_shapes(a.shape[:-2],
                                                                                              b.shape[:-2])
    batch = math.prod(batch_shape)
    fallback = None
    if tile is not None and tile % 32 and tile < k and acc_bits is not None:
        fallback = f"tile={tile} is not a multiple of 32"
    elif min(m, n, k, batch) == 0:
        fallback = "empty operand"
    bound_a, bound_b = _bounds(a, b, bounds) if fallback is None else (0.0, 0.0)
    wide = bound_a * bound_b * k
    if fallback is None and max(bound_a, bound_b) > _INT8_BOUND + 1:
        fallback = "operands beyond int8"
    elif fallback is None and wide >= _INT32_EXACT and (acc_bits is None or acc_bits >= 32):
        fallback = "sums beyond int32"
    if fallback is not None:
        if fallback.startswith("tile"):
            warnings.warn(f"hdqt_cil.kernels: {fallback}; using the torch reference", stacklevel=3)
        return _reference_product(a, b, tile, acc_bits, bounds, count_saturated, scales, sum_batch)
    if batch > 1 and not sum_batch and math.prod(b.shape[:-2]) == 1 and (scales is None or
                                                                         math.prod(scales[1].shape[:-2]) == 1):
        return _stacked_product(a, b, (bound_a, bound_b), tile, acc_bits, count_saturated, scales, config, packed)

    saturate = acc_bits is not None and acc_bits < 32  # a 32-bit limit never binds: the sums fit int32
    limit = 2 ** (acc_bits - 1) - 1 if saturate else 0
    if not saturate:
        sat, steps = 0, 1
    elif tile is None or tile >= k:
        sat, steps = 1, 1
    elif tile == 32:
        sat, steps = 2, 1
    else:
        sat, steps = 3, tile // 32
    count = count_saturated and sat > 0
    if sat == 2 and packed is not False:
        steps32 = -(-k // rt.GEMM_BK) * (rt.GEMM_BK // 32)
        if 32 * bound_a * bound_b + limit <= _PACKED_LIMIT and steps32 * 2 * limit <= 2 * _PACKED_LIMIT + 1:
            sat = 4
    out_mode = 2 if scales is not None else (0 if wide >= _FLOAT32_EXACT else 1)
    if sum_batch and _tiles(m, n, SUM_BATCH_CONFIG) >= rt.sm_count():
        out_mode, config = 3, config or SUM_BATCH_CONFIG
    config = config or _gemm_config(m, n, k, sat, count, batch)
    bm, bn, threads = rt.gemm_tile(config)
    device = a.device
    with _on_device(a):
        a3, lda, batch_a = _operand(a, batch_shape, batch, m, k, transposed=False)
        b3, ldb, batch_b = _operand(b, batch_shape, batch, n, k, transposed=True)
        out_shape = (m, n) if out_mode == 3 else (*batch_shape, m, n)
        out = _empty(out_shape, torch.int32 if out_mode == 0 else torch.float32, device)
        counter = rt.ZEROS_I64.take(1, device)
        if scales is not None:
            sa, sa_batch, sa_row = _scale_operand(scales[0], batch_shape, batch, along_last=False)
            sb, sb_batch, sb_col = _scale_operand(scales[1], batch_shape, batch, along_last=True)
            block_inv = 1.0 / scales[2]  # exact: a power of two (scaled_int_matmul checked it)
        else:
            sa = sb = None
            sa_batch = sa_row = sb_batch = sb_col = 0
            block_inv = 1.0
        smem = (bm + bn) * rt.GEMM_BK * rt.gemm_stages(config)
        fn = rt.function("intmm.cu", rt.gemm_expression(config, sat, count, out_mode), template=True,
                         dynamic_smem=smem)
        grid_n, grid_m = -(-n // bn), -(-m // bm)
        pa, pb, po = a3.data_ptr(), b3.data_ptr(), out.data_ptr()
        psa, psb = (0, 0) if sa is None else (sa.data_ptr(), sb.data_ptr())
        # grid z runs the batch (65535 entries a launch); mode 3 runs it inside each CTA
        chunks = [(0, batch)] if out_mode == 3 else [(f, min(65535, batch - f)) for f in range(0, batch, 65535)]
        for first, chunk in chunks:
            rt.launch(fn, (grid_n, grid_m, 1 if out_mode == 3 else chunk), (threads,),
                      (rt.u64(pa + first * batch_a), rt.u64(pb + first * batch_b),
                       rt.u64(po + first * m * n * 4), rt.i32(m), rt.i32(n), rt.i32(k), rt.i64(lda),
                       rt.i64(ldb), rt.i64(batch_a), rt.i64(batch_b), rt.i32(limit), rt.i32(steps),
                       rt.u64(psa + first * sa_batch * 4), rt.i64(sa_batch), rt.i64(sa_row),
                       rt.u64(psb + first * sb_batch * 4), rt.i64(sb_batch), rt.i64(sb_col),
                       rt.f32(block_inv), rt.ptr(counter), rt.i32(chunk)),
                      smem)
    if out_mode == 0:
        out = out.to(torch.float64)
    if sum_batch and out_mode == 2:
        out = sum_entries(out)
    return (out, counter.view(())) if count_saturated else out


def _stacked_product(a, b, bounds, tile, acc_bits, count_saturated, scales, config, packed):
    """A batch (..., M, K) times one right factor (K, N) (and a scale_b without batch) as one (B·M, K) product:
    full CTA tiles instead of a ragged M per entry, the same values."""
    batch_shape, (m, k), n = a.shape[:-2], a.shape[-2:], b.shape[-1]
    if scales is not None:
        scale_a, scale_b, block = scales
        if scale_a.numel() > 1:
            scale_a = scale_a.expand(*batch_shape, m, 1).reshape(-1, 1)
        scales = (scale_a, scale_b.reshape(scale_b.shape[-2:]) if scale_b.dim() > 2 else scale_b, block)
    result = _int_matmul(a.reshape(-1, k), b.reshape(k, n), tile, acc_bits, bounds, count_saturated, scales,
                         config, packed)
    out, count = result if count_saturated else (result, None)
    out = out.view(*batch_shape, m, n)
    return (out, count) if count_saturated else out


# The tile of a batch-summed product (mode 3): 32 accumulators and 32 float totals a thread, no spills.
SUM_BATCH_CONFIG = "64x64"


def _tiles(m: int, n: int, config: str) -> int:
    bm, bn, _ = rt.gemm_tile(config)
    return -(-m // bm) * -(-n // bn)


def sum_entries(t: torch.Tensor) -> torch.Tensor:
    """`hdqt_cil.quant.sum_entries` of a float32 CUDA tensor (..., M, N): the batch summed in order from +0."""
    _require_cuda(t)
    flat = _flat_input(t)
    size = t.shape[-2] * t.shape[-1]
    entries = flat.numel() // size if size else 0
    out = _empty(t.shape[-2:], torch.float32, t.device)
    if size:
        with _on_device(t):
            ctas = min(-(-size // 256), rt.sm_count() * 8)
            rt.launch(rt.function("quant.cu", "sum_entries_f32"), (ctas,), (256,),
                      (rt.ptr(flat), rt.u32(entries), rt.u64(size), rt.ptr(out)))
    return out


def _reference_product(a, b, tile, acc_bits, bounds, count_saturated, scales, sum_batch=False):
    a, b = (a.float() if a.dtype == torch.int8 else a), (b.float() if b.dtype == torch.int8 else b)
    if scales is None:
        return _reference().tiled_int_matmul(a, b, tile, acc_bits, bounds, count_saturated)
    from hdqt_cil.quant.backend import TORCH_OPS  # noqa: PLC0415

    return TORCH_OPS.scaled_int_matmul(a, b, *scales, tile, acc_bits, bounds, count_saturated, sum_batch)


def tiled_int_matmul(a: torch.Tensor, b: torch.Tensor, tile: int | None = 32, acc_bits: int | None = 8,
                     bounds: tuple[float, float] | None = None, count_saturated: bool = False):
    """Σ_tiles clamp(Σ_{k in tile} a[..., m, k] b[..., k, n], ±L) as `hdqt_cil.quant.tiled_int_matmul` (same dtype:
    float32, or float64 where K·max|a|·max|b| reaches 2^24; with count_saturated the int64 count of clamped
    tile sums too). a (..., M, K) and b (..., K, N) hold integers within int8 (int8 or integer-valued floats);
    K contiguous in both (a.stride(-1) == b.stride(-2) == 1) avoids a repacking copy."""
    return _int_matmul(a, b, tile, acc_bits, bounds, count_saturated, None)


def scaled_int_matmul(a: torch.Tensor, b: torch.Tensor, scale_a, scale_b, block: int = 1, tile: int | None = 32,
                      acc_bits: int | None = 8, bounds: tuple[float, float] | None = None,
                      count_saturated: bool = False, sum_batch: bool = False):
    """float32(tiled_int_matmul(a, b, ...)) * ((scale_a * scale_b) / block), float32, with the scale applied in
    the GEMM's epilogue: scale_a broadcastable to (..., M, 1), scale_b to (..., 1, N). sum_batch: the (M, N) sum
    over the batch of `hdqt_cil.quant.sum_entries`, inside the GEMM when its M x N tiles fill the GPU (the batch
    then never written), else by a summing kernel after it."""
    from hdqt_cil.quant.intmm import epilogue_block  # noqa: PLC0415 (the reference imports its config helpers)

    block = epilogue_block(block)
    device = a.device
    scale_a = scale_a if torch.is_tensor(scale_a) else torch.tensor(float(scale_a), device=device)
    scale_b = scale_b if torch.is_tensor(scale_b) else torch.tensor(float(scale_b), device=device)
    return _int_matmul(a, b, tile, acc_bits, bounds, count_saturated, (scale_a, scale_b, block),
                       sum_batch=sum_batch)


# ---------------------------------------------------------------------------------------------------------------
# im2col and col2im

_IM2COL_TYPES = {torch.int8: "i8", torch.float32: "f32"}


def _conv_args(channels, height, width, out_h, out_w, kernel_size, padding, dilation, stride) -> tuple:
    """The geometry parameters that im2col.cu's kernels share, in their order."""
    (kh, kw), (ph, pw), (dh, dw), (sh, sw) = kernel_size, padding, dilation, stride
    return (rt.u32(channels), rt.u32(height), rt.u32(width), rt.u32(out_h), rt.u32(out_w), rt.i32(kh), rt.i32(kw),
            rt.i32(ph), rt.i32(pw), rt.i32(dh), rt.i32(dw), rt.i32(sh), rt.i32(sw))


def im2col(x: torch.Tensor, kernel_size, padding, dilation, stride, columns: bool = False) -> torch.Tensor:
    """As `hdqt_cil.quant.im2col.im2col` (a copy: the same bits by construction), in one launch: a thread writes
    16 consecutive bytes of the output, gathering its inputs (im2col.cu). int8 and float32; other dtypes and
    sizes past 32-bit indices take the reference."""
    _require_cuda(x)
    from hdqt_cil.quant.im2col import conv_output_size  # noqa: PLC0415 (the reference owns the geometry)

    batch, channels, height, width = x.shape
    out_h, out_w = conv_output_size(x.shape, kernel_size, padding, dilation, stride)
    k, positions = channels * kernel_size[0] * kernel_size[1], out_h * out_w
    total = batch * k * positions
    if x.dtype not in _IM2COL_TYPES or total == 0 or total >= _MAX_ELEMENTS or x.numel() >= _MAX_ELEMENTS:
        return _reference().im2col(x, kernel_size, padding, dilation, stride, columns)
    with _on_device(x):
        src = x.contiguous()
        out = _empty((batch, k, positions) if columns else (batch, positions, k), x.dtype, x.device)
        per_thread = 16 // x.element_size()
        name = f"im2col_{'columns' if columns else 'rows'}_{_IM2COL_TYPES[x.dtype]}"
        rt.launch(rt.function("im2col.cu", name), (-(-total // (256 * per_thread)),), (256,),
                  (rt.ptr(src), *_conv_args(channels, height, width, out_h, out_w, kernel_size, padding, dilation,
                                            stride), rt.u32(total), rt.ptr(out)))
    return out


COL2IM_LANES = 4  # consecutive channels in a col2im warp (of 32 / COL2IM_LANES consecutive positions)


def col2im(rows: torch.Tensor, x_shape, kernel_size, padding, dilation, stride) -> torch.Tensor:
    """As `hdqt_cil.quant.im2col.col2im`, bit for bit: one thread per input element adds its patches' contributions
    in the reference's order (im2col.cu), where the reference adds kh·kw strided views one after the other; a warp
    holds COL2IM_LANES channels of a few positions."""
    _require_cuda(rows)
    from hdqt_cil.quant.im2col import conv_output_size  # noqa: PLC0415 (the reference owns the geometry)

    (ph, pw), (sh, sw) = padding, stride
    batch, channels, height, width = x_shape
    out_h, out_w = conv_output_size(x_shape, kernel_size, padding, dilation, stride)
    positions = height * width
    lanes = min(COL2IM_LANES, 1 << (channels - 1).bit_length())  # channels a warp holds (a power of two)
    warps = -(-channels // lanes) * -(-positions // (32 // lanes))  # a sample's
    if (batch * channels * positions == 0 or rows.numel() >= _MAX_ELEMENTS or batch > 65535  # the grid's y
            or warps * 32 >= _MAX_ELEMENTS):
        return _reference().col2im(rows, x_shape, kernel_size, padding, dilation, stride)
    with _on_device(rows):
        src = rows.to(torch.float32).contiguous()
        out = _empty((batch, channels, height + 2 * ph, width + 2 * pw), torch.float32, rows.device)
        name = "col2im_f32_unit" if (sh, sw) == (1, 1) else "col2im_f32"
        rt.launch(rt.function("im2col.cu", name), (-(-warps // 8), batch), (256,),
                  (rt.ptr(src), *_conv_args(channels, height, width, out_h, out_w, kernel_size, padding, dilation,
                                            stride), rt.u32(lanes), rt.ptr(out)))
    return out[:, :, ph:ph + height, pw:pw + width]


OPS = SimpleNamespace(name="cupy", block_hadamard=block_hadamard, quantize=quantize,
                      tiled_int_matmul=tiled_int_matmul, hadamard_quantize=hadamard_quantize,
                      scaled_int_matmul=scaled_int_matmul, im2col=im2col, col2im=col2im)

__all__ = ["available", "unavailable_reason", "OPS", "quantize", "block_hadamard", "hadamard_quantize",
           "tiled_int_matmul", "scaled_int_matmul", "sum_entries", "im2col", "col2im", "MAX_HADAMARD_BLOCK"]
