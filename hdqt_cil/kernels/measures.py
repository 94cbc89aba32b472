"""The diagnostics' measures of float32 CUDA tensors (measures.cu), two launches each where torch's ops take about
twenty: trainer/diagnostics.py's fidelity of a gradient against its float reference, its moments and a quantizer's
zero levels, with float64 sums in an order fixed by the size (the same bits on every run; torch's reference agrees
to rounding)."""
import torch

from . import runtime as rt

_THREADS = 256
_PER_THREAD = 16  # elements a thread sums at least, before the grid stops growing
_MAX_BLOCKS = 512  # the partials one block combines; a function of n alone, never of the GPU


def _blocks(n: int) -> int:
    return max(1, min(_MAX_BLOCKS, -(-n // (_THREADS * _PER_THREAD))))


def _operand(t: torch.Tensor) -> torch.Tensor:
    rt.require_cuda(t)
    if t.dtype != torch.float32:
        raise rt.NotCovered(f"a {t.dtype} tensor (the measures read float32)")
    if t.numel() == 0:
        raise rt.NotCovered("an empty tensor")
    return t.contiguous()


def _two_passes(kernels: tuple[str, str], inputs: tuple, sums: int, out: torch.Tensor, *final_args) -> torch.Tensor:
    """The partials kernel over `inputs` (n elements each: the first's count), then the final one into `out`."""
    n = inputs[0].numel()
    blocks = _blocks(n)
    partials = rt.empty((blocks, sums), torch.float64, out.device)
    with rt.on_device(out):
        rt.launch(rt.function("measures.cu", kernels[0]), (blocks,), (_THREADS,),
                  (*map(rt.ptr, inputs), rt.u64(n), rt.ptr(partials)))
        rt.launch(rt.function("measures.cu", kernels[1]), (1,), (_THREADS,),
                  (rt.ptr(partials), rt.u32(blocks), *final_args, rt.ptr(out)))
    return out


def fidelity(q: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """float64 (3,): cosine similarity, relative L2 error |q - f| / |f| and sign agreement (where f is not zero) of
    q against the reference f (same number of elements); cosine 0 where q is all zero, all NaN where f is."""
    q, f = _operand(q), _operand(f)
    if q.numel() != f.numel():
        raise ValueError(f"fidelity of {q.numel()} values against {f.numel()}")
    return _two_passes(("fidelity_partials", "fidelity_final"), (q, f), 6, rt.empty((3,), torch.float64, q.device))


def moments(t: torch.Tensor) -> torch.Tensor:
    """float64 (4,): max, min (a NaN propagates), mean and L2 norm of t's values."""
    t = _operand(t)
    return _two_passes(("moment_partials", "moment_final"), (t,), 4, rt.empty((4,), torch.float64, t.device),
                       rt.u64(t.numel()))


def count_zero_levels(t: torch.Tensor, levels: torch.Tensor, counts: torch.Tensor) -> None:
    """counts (float64 (2,), on t's device) += (t's nonzero values whose level is 0, t's nonzero values); levels:
    int8, or float32 values, with t's number of elements."""
    t = _operand(t)
    if levels.dtype not in (torch.int8, torch.float32) or levels.numel() != t.numel():
        raise rt.NotCovered(f"{levels.dtype} levels of {levels.numel()} values for {t.numel()}")
    if counts.dtype != torch.float64 or counts.shape != (2,) or not counts.is_contiguous():
        raise ValueError(f"counts must be a contiguous float64 pair; got {counts.dtype} {tuple(counts.shape)}")
    levels = levels.contiguous()
    _two_passes((f"zero_level_partials_{rt.dtype_suffix(levels)}", "zero_level_final"), (t, levels), 2, counts)
