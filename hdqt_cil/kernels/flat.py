"""Launch geometry of quant.cu's flat kernels (absmax, quantize, hadamard: a grid-stride walk over a tensor in runs of
8 elements a thread), shared by the quantize and Hadamard launchers."""
from . import runtime as rt

# Flat kernels with a Hadamard transform on tensors of at least this many elements hold 4 runs of 8 a thread
# (quant.cu's absmax4 / quantize4 / hadamard4: 15-20 % faster on 64 MiB); the others one run (a quarter of the warps
# was 1.7-2x slower on the MLP's 70K-element tensors). docs/kernels.md, "Flat kernels".
FLAT_RUNS_FROM = 1 << 22


def per_thread(n_el: int, logn: int) -> int:
    """Elements a thread of the flat kernels holds: 4 runs of 8 or one."""
    return 32 if logn and n_el >= FLAT_RUNS_FROM else 8


def kernel_name(kind: str, elements: int) -> str:
    """quant.cu's name of a flat kernel ("absmax", "quantize", "hadamard") holding `elements` a thread."""
    return kind if elements == 8 else f"{kind}4"


def transform(logn: int, elements: int) -> str:
    """quant.cu's name prefix for a Hadamard block of 2^logn: none, any block, or one filling a warp's elements
    (32 threads' `elements`: every in-warp butterfly stage runs, no branch between them)."""
    return "" if not logn else "hadw_" if (1 << logn) >= 32 * elements else "had_"


def exchange_smem(threads: int, logn: int, elements: int) -> int:
    """Shared bytes of the butterfly's exchange buffer (8 floats a thread), for blocks beyond a warp's elements."""
    return threads * 8 * 4 if (1 << logn) > 32 * elements else 0


def grid(n_el: int, logn: int, elements: int, *fns) -> tuple[int, int, int, int]:
    """(ctas, threads, range, shared bytes) for passes of the kernels `fns` over n_el elements with Hadamard blocks
    of 2^logn: at most one wave of the kernel with the lowest occupancy, so that two passes share their CTAs'
    ranges and the quantize pass, walking its range backwards, starts in what the absmax pass read last (in L2)."""
    threads = max(256, (1 << logn) // elements)
    step = threads * elements
    steps = -(-n_el // step)
    smem = exchange_smem(threads, logn, elements)
    ctas = min(steps, rt.sm_count() * min(rt.ctas_per_sm(fn, threads, smem) for fn in fns))
    per_cta = -(-steps // ctas)
    ctas = -(-steps // per_cta)
    return ctas, threads, per_cta * step, smem
