"""The HDQT authors' float quantizer (authors.cu): `hdqt_cil.quant.floats.authors_float` bit for bit, alone and fused
with the sums of the K tiles it rounds (`hdqt_cil.quant.float_product.format_matmul` under an accumulator format)."""
import math

import torch

from . import runtime as rt

_THREADS = 256
_CTAS_PER_SM = 8  # a grid-stride walk: enough warps in flight to hide the loads, one count per warp at the end


def _grid(n: int) -> tuple[int]:
    return (max(1, min(-(-n // _THREADS), rt.sm_count() * _CTAS_PER_SM)),)


def authors_float(t: torch.Tensor, exp_bits: int, man_bits: int) -> torch.Tensor:
    """floats.authors_float(t, exp_bits, man_bits) of a CUDA tensor: float32, t's shape, contiguous."""
    rt.require_cuda(t)
    x = t.to(torch.float32).contiguous()
    out = rt.empty(x.shape, torch.float32, x.device)
    if x.numel():
        with rt.on_device(x):
            rt.launch(rt.function("authors.cu", "authors_float"), _grid(x.numel()), (_THREADS,),
                      (rt.ptr(x), rt.u64(x.numel()), rt.i32(exp_bits), rt.i32(man_bits), rt.ptr(out)))
    return out


def authors_tile_sum(partials: torch.Tensor, out: torch.Tensor | None, exp_bits: int, man_bits: int, limit: float,
                     saturated: torch.Tensor | None = None) -> torch.Tensor:
    """`out` (..., M, N; None: zeros) plus authors_float of each K tile's sums in `partials` (..., tiles, M, N),
    added tile by tile in order, into `out` itself where given; the count of partials with |partial| > `limit` is
    added to `saturated` (an int64 element, e.g. a layer's tally; None: not kept)."""
    rt.require_cuda(partials)
    *batch_shape, tiles, m, n = partials.shape
    if partials.dtype != torch.float32:
        raise rt.NotCovered(f"tile sums of {partials.dtype}")
    if out is not None and (out.shape != (*batch_shape, m, n) or out.dtype != torch.float32
                            or not out.is_contiguous()):
        raise rt.NotCovered(f"a running sum of {tuple(out.shape)} {out.dtype} beside tile sums {tuple(partials.shape)}")
    if saturated is not None and (saturated.dtype != torch.int64 or saturated.numel() != 1):
        raise ValueError(f"saturated must be one int64 element; got {saturated.dtype} {tuple(saturated.shape)}")
    partials = partials.contiguous()
    result = rt.empty((*batch_shape, m, n), torch.float32, partials.device) if out is None else out
    if result.numel():
        with rt.on_device(partials):
            counter = saturated if saturated is not None else rt.ZEROS_I64.take(1, partials.device)
            rt.launch(rt.function("authors.cu", "authors_tile_sum"), _grid(result.numel()), (_THREADS,),
                      (rt.ptr(partials), rt.u64(math.prod(batch_shape)), rt.u32(tiles), rt.u64(m * n), rt.i32(exp_bits),
                       rt.i32(man_bits), rt.f32(limit), rt.i32(out is not None), rt.ptr(result), rt.ptr(counter)))
    return result
