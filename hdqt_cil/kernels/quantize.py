"""The quantizers on the GPU: `hdqt_cil.quant.quantize` (and its composition with the block Hadamard transform,
fused) bit for bit, levels as int8 (quant.cu's absmax / quantize / group kernels).

What a `QuantSpec` means (its scale shape, level range, rounding) is defined in `hdqt_cil.quant`; the launchers here
read it from the spec they are given and never import the reference.
"""
import math
from typing import NamedTuple

import torch

from . import flat
from . import runtime as rt
from .hadamard import MAX_HADAMARD_BLOCK, block_hadamard

# Single-pass quantization (one CTA per scale group, the group in registers, 32 elements a thread): groups of
# GROUP_MIN..GROUP_MAX elements, or a whole tensor up to GROUP_MAX.
GROUP_MIN, GROUP_MAX = 1024, 32768
_GROUP_PER_THREAD = 32  # elements a thread holds (quant.cu GROUP_ROUNDINGS: 4 runs of 8)
_INT8_BOUND = 127
_MASK32 = 0xFFFFFFFF
_SIGN_MODES = {"signed": 0, "unsigned": 1, "auto": 2}
STES = {"none": 0, "clip": 1, "authors": 2}  # quant.cu Stats::ste


def _group_threads(group: int) -> int:
    """Whole warps covering the group."""
    return 32 * -(-group // (32 * _GROUP_PER_THREAD))


def _check_covered(t: torch.Tensor, spec) -> None:
    """What the quantize kernels cover: levels that fit int8, 1 <= numel < 2^31, at least one dimension."""
    if not (spec.level_bound <= _INT8_BOUND and t.dim() >= 1 and 0 < t.numel() <= rt.MAX_ELEMENTS):
        raise rt.NotCovered(f"levels up to {spec.level_bound} over a tensor of shape {tuple(t.shape)}")


def counter_args(counter, device: torch.device) -> tuple:
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


def _scalar(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """A one-element factor as the kernels read it: float32 on `device`."""
    if t is None:
        return None
    if t.numel() != 1:
        raise rt.NotCovered(f"a scale factor of {t.numel()} elements")
    return t.to(device=device, dtype=torch.float32).reshape(())


def advance_step(counter: torch.Tensor) -> torch.Tensor:
    """A copy of the int64 0-dim `counter` (a layer's step, as this call's quantizers read it), the counter then
    advanced by one: one launch (torch: a clone and an add)."""
    rt.require_cuda(counter)
    out = rt.empty((), torch.int64, counter.device)
    with rt.on_device(counter):
        rt.launch(rt.function("quant.cu", "advance_step"), (1,), (1,), (rt.ptr(counter), rt.ptr(out)))
    return out


class Stats(NamedTuple):
    """What a forward operand's quantizer counts and masks beside its levels (quant.cu `Stats`): `tally` an int64
    (2,) view, (values outside the level range, values seen) added to; `ste` a key of STES, its keep mask
    written where not 'none' ('authors': |t| <= threshold)."""
    tally: torch.Tensor
    ste: str
    threshold: float


def _report_args(worst: torch.Tensor | None, stats: Stats | None, keep: torch.Tensor | None,
                 times: torch.Tensor | None) -> tuple:
    """quant.cu's REPORT_ARGS."""
    if stats is None:
        return rt.ptr(worst), rt.u64(0), rt.u64(0), rt.ptr(None), rt.i32(0), rt.f32(0.0), rt.ptr(times)
    clipped = stats.tally.data_ptr()
    return (rt.ptr(worst), rt.u64(clipped), rt.u64(clipped + stats.tally.stride(0) * 8), rt.ptr(keep),
            rt.i32(STES[stats.ste]), rt.f32(stats.threshold), rt.ptr(times))


def _quantize_flat(x: torch.Tensor, shape, spec, counter, logn: int, moments: torch.Tensor | None,
                   worst: torch.Tensor | None = None, stats: Stats | None = None, times: torch.Tensor | None = None):
    """levels (int8, `shape`), scale and the keep mask (bool, or None) of the flat tensor x (already contiguous),
    transformed first when logn. `moments`: for a SAWB scale, the caller's (2, groups) float32 sums (mean t²,
    mean |t|) from which the kernels finish the rule. `worst`: a float32 slot raised to the largest scale;
    `stats` (float32 input, no transform): the forward operand's statistics and mask; `times`: a float32 0-dim
    tensor the returned scale is multiplied by (the levels still follow the quantizer's own scale)."""
    n_el = x.numel()
    scale_shape = spec.scale_shape(shape)
    groups = math.prod(scale_shape)
    group = n_el // groups
    stochastic = spec.rounding != "nearest"
    rounding = "log2" if stochastic and spec.grid == "log2" else spec.rounding  # quant.cu's name suffix
    key = counter_args(counter if stochastic else None, x.device)
    sign_mode = _SIGN_MODES[spec.signedness]
    device = x.device
    levels = rt.empty(shape, torch.int8, device)
    keep = rt.empty(shape, torch.bool, device) if stats is not None and stats.ste != "none" else None
    report = _report_args(worst, stats, keep, _scalar(times, device))
    counted = "stats_" if stats is not None else ""  # quant.cu's forward-operand kernels (no transform)
    single_pass = (spec.scale == "max" and group <= GROUP_MAX and (group >= GROUP_MIN or groups == 1)
                   and (sign_mode != 2 or groups == 1))
    if single_pass:
        scale = rt.empty(groups, torch.float32, device)
        threads = _group_threads(group)
        transform = flat.transform(logn, _GROUP_PER_THREAD)
        fn = rt.function("quant.cu", f"group_{counted}{transform}{rt.dtype_suffix(x)}_{rounding}")
        rt.launch(fn, (groups,), (threads,),
                  (rt.ptr(x), rt.u32(group), rt.i32(logn), rt.i32(sign_mode), rt.f32(spec.signed_max),
                   rt.f32(spec.unsigned_max), rt.f32(spec.clip), *key, rt.ptr(levels), rt.ptr(scale), *report),
                  flat.exchange_smem(threads, logn, _GROUP_PER_THREAD))
        return levels, scale.view(scale_shape), keep

    work = rt.ZEROS_I32.take(groups + 1, device)  # per-group max bits, then 'negative'
    peaks, negative = work[:groups], work[groups:]
    elements = flat.per_thread(n_el, logn)
    suffix = flat.transform(logn, elements) + rt.dtype_suffix(x)
    absmax = rt.function("quant.cu", f"{flat.kernel_name('absmax', elements)}_{suffix}")
    quantize_levels = rt.function("quant.cu", f"{flat.kernel_name('quantize', elements)}_{counted}{suffix}_{rounding}")
    ctas, threads, span, smem = flat.grid(n_el, logn, elements, absmax, quantize_levels)
    rt.launch(absmax, (ctas,), (threads,),
              (rt.ptr(x), rt.u32(n_el), rt.u32(group), rt.u32(span), rt.i32(logn), rt.ptr(peaks), rt.ptr(negative)),
              smem)
    scale = rt.empty(groups, torch.float32, device)
    moments = None if spec.scale == "max" else moments.to(torch.float32).reshape(2, groups).contiguous()
    rt.launch(quantize_levels, (ctas,), (threads,),
              (rt.ptr(x), rt.u32(n_el), rt.u32(group), rt.u32(span), rt.i32(logn), rt.ptr(peaks),
               rt.ptr(moments), rt.ptr(negative), rt.i32(sign_mode), rt.f32(spec.signed_max),
               rt.f32(spec.unsigned_max), rt.f32(spec.clip), *key, rt.ptr(levels), rt.ptr(scale), *report),
              smem)
    return levels, scale.view(scale_shape), keep


def _storage_order(t: torch.Tensor, spec) -> tuple[int, ...]:
    """The order of t's dims to quantize it in: the one that lists its memory as it lies where that gives the levels
    of t's own order (one scale for the whole tensor, nearest rounding: stochastic rounding draws its bits by
    logical index) and t is dense (a BatchNorm's channels-last output); else t's own order, from a contiguous
    copy."""
    own = tuple(range(t.dim()))
    if t.is_contiguous() or spec.granularity != "tensor" or spec.rounding != "nearest":
        return own
    lying = tuple(sorted(own, key=lambda d: -t.stride(d)))
    return lying if t.permute(lying).is_contiguous() else own


def _quantize_in_place_order(t: torch.Tensor, spec, counter, moments, worst, stats):
    """_quantize_flat of t read in its _storage_order (no copy of a dense t), the levels and keep mask returned in
    t's shape with t's layout. For the forward's operands only: a backward operand's consumers (the GEMM's
    packing, col2im_int_matmul) want its levels contiguous."""
    order = _storage_order(t, spec)
    lying = t.permute(order)
    levels, scale, keep = _quantize_flat(rt.flat_input(lying), lying.shape, spec, counter, 0, moments, worst, stats)
    back = tuple(order.index(d) for d in range(t.dim()))
    return levels.permute(back), scale, None if keep is None else keep.permute(back)  # one scale: shape (1,) * dim


def _needs_moments(spec, moments) -> None:
    if spec.scale != "max" and moments is None:
        raise ValueError(f"the kernels take a {spec.scale} scale's float sums from the caller "
                         "(hdqt_cil.quant.quantizers.sawb_moments)")


def quantize(t: torch.Tensor, spec, counter=None, moments: torch.Tensor | None = None,
             worst: torch.Tensor | None = None, times: torch.Tensor | None = None):
    """(int8 levels, float32 scale) as `hdqt_cil.quant.quantize`. `counter`: the random bits' key of stochastic
    rounding; `moments`: for a SAWB scale, the (2, groups) float32 (mean t², mean |t|) of the reference's
    `sawb_moments` on `t`; `worst`: a float32 slot raised to the largest scale (a NaN or Inf in t reaches it);
    `times`: a one-element tensor the returned scale is multiplied by, where it is written (no launch of its
    own)."""
    rt.require_cuda(t)
    _check_covered(t, spec)
    _needs_moments(spec, moments)
    with rt.on_device(t):
        return _quantize_flat(rt.flat_input(t), t.shape, spec, counter, 0, moments, worst, times=times)[:2]


def forward_quantize(t: torch.Tensor, spec, counter, moments: torch.Tensor | None, stats: Stats,
                     worst: torch.Tensor | None = None):
    """quantize(t, ...) and, in the same pass, a forward operand's statistics and keep mask (`Stats`): (levels,
    scale, keep or None). float32 input only (the forward's operands); other dtypes are NotCovered."""
    rt.require_cuda(t)
    _check_covered(t, spec)
    _needs_moments(spec, moments)
    if t.dtype != torch.float32 or spec.grid != "uniform":
        raise rt.NotCovered(f"forward statistics of a {t.dtype} tensor on a {spec.grid} grid")
    with rt.on_device(t):
        return _quantize_in_place_order(t, spec, counter, moments, worst, stats)


def hadamard_quantize(x: torch.Tensor, spec, counter, block: int, dim: int = -1, worst: torch.Tensor | None = None,
                      times: torch.Tensor | None = None):
    """quantize(block_hadamard(x, dim, block), spec, counter), the transformed tensor never written where `dim` is
    the last; `block` a power of two dividing x.shape[dim] (the caller checks it). Max scales only: a SAWB scale
    needs the transformed tensor written anyway (for the reference's float sums). `worst`, `times` as in
    quantize."""
    rt.require_cuda(x)
    _check_covered(x, spec)
    if spec.scale != "max" or block > MAX_HADAMARD_BLOCK:
        raise rt.NotCovered(f"a {spec.scale} scale after a Hadamard block of {block}, fused")
    if block == 1 or dim not in (-1, x.dim() - 1):
        return quantize(block_hadamard(x, dim, block), spec, counter, worst=worst, times=times)
    with rt.on_device(x):
        return _quantize_flat(rt.flat_input(x), x.shape, spec, counter, block.bit_length() - 1, None, worst,
                              times=times)[:2]
