"""Compiling the `.cu` sources of this folder with NVRTC (through CuPy) and launching them on torch tensors.

CuPy is used only to compile, load and launch: every buffer is a torch tensor (its allocator, its stream) and
reaches a kernel as a raw device address, so no CuPy array or memory pool is involved.
"""
import threading
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent

# Kernels of each source, as the names (or template instantiations) that a compile must produce.
QUANT_KERNELS = tuple(f"{kind}_{t}" for kind in ("absmax", "absmax_had", "quantize", "quantize_had")
                      for t in ("f32", "i8")) + ("hadamard_f32", "hadamard_i8")
QUANT_KERNELS += tuple(f"group_{had}{t}_r{r}" for had in ("", "had_") for t in ("f32", "i8") for r in (1, 2, 4))
PEAK_KERNELS = ("mma_peak_plain", "mma_peak_clamped")
# GEMM tile shapes: warps along M, warps along N, m16 blocks per warp, n8 blocks per warp, min CTAs per SM.
GEMM_CONFIGS = {
    "256x128": (4, 4, 4, 4, 1),
    "128x128": (2, 4, 4, 4, 1),
    "128x128x2": (2, 4, 4, 4, 2),
    "128x128w": (4, 4, 2, 4, 1),
    "64x64": (2, 2, 2, 4, 1),
    "256x16": (4, 1, 4, 2, 1),
    "256x32": (4, 1, 4, 4, 1),
    "32x128": (1, 4, 2, 4, 1),
    "16x128": (1, 4, 1, 4, 1),
}
GEMM_STAGES = 3
GEMM_BK = 128


def gemm_expression(config: str, sat: int, count: bool, out: int) -> str:
    wm, wn, mi, ni, minb = GEMM_CONFIGS[config]
    return (f"intmm_kernel<{wm}, {wn}, {mi}, {ni}, {GEMM_STAGES}, {minb}, {sat}, {'true' if count else 'false'}, "
            f"{out}>")


def gemm_tile(config: str) -> tuple[int, int, int]:
    """(BM, BN, threads) of a GEMM config."""
    wm, wn, mi, ni, _ = GEMM_CONFIGS[config]
    return wm * mi * 16, wn * ni * 8, wm * wn * 32


# Every expression the CPU compile test instantiates (the runtime compiles what it needs, one variant a module).
ALL_GEMM_EXPRESSIONS = tuple(gemm_expression(c, sat, count, out) for c in GEMM_CONFIGS for sat in range(4)
                             for count in (False, True) for out in range(3))

SOURCES = {"quant.cu": QUANT_KERNELS, "intmm.cu": ALL_GEMM_EXPRESSIONS, "peak.cu": PEAK_KERNELS}
# No float contraction: every float operation of the contract is a single rounding (the sources also use the
# _rn intrinsics where it matters).
NVRTC_OPTIONS = ("--std=c++17", "--fmad=false")


def source(name: str) -> str:
    return (HERE / name).read_text()


class _StreamRef:
    """What CuPy's launcher needs of a stream: its handle (torch's current stream)."""
    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr


# Tests set this: output buffers are then filled with poison before every launch (see kernels._empty).
POISON = False

_lock = threading.Lock()
_modules: dict = {}
_functions: dict = {}
_sm_counts: dict = {}


def _cupy():
    import cupy  # noqa: PLC0415 (optional dependency)

    return cupy


def _module(name: str, expressions: tuple[str, ...] | None):
    key = (name, expressions)
    with _lock:
        module = _modules.get(key)
        if module is None:
            cupy = _cupy()
            module = cupy.RawModule(code=source(name), options=NVRTC_OPTIONS,
                                    name_expressions=list(expressions) if expressions else None)
            _modules[key] = module
        return module


def function(name: str, kernel: str, template: bool = False, dynamic_smem: int = 0):
    """CuPy's launchable function for `kernel` of source `name` on the current device (compiled once, cached)."""
    device = torch.cuda.current_device()
    key = (device, name, kernel)
    fn = _functions.get(key)
    if fn is None or fn[1] < dynamic_smem:
        module = _module(name, (kernel,) if template else None)
        raw = module.get_function(kernel)
        if dynamic_smem > 48 * 1024:
            raw.max_dynamic_shared_size_bytes = dynamic_smem
        fn = (raw.kernel, max(dynamic_smem, fn[1] if fn else 0), raw)
        _functions[key] = fn
    return fn[0]


def _compile_job(job) -> str:
    name, expressions = job
    module = _cupy().RawModule(code=source(name), options=NVRTC_OPTIONS,
                               name_expressions=list(expressions) if expressions else None)
    module.get_function(expressions[0] if expressions else SOURCES[name][0])
    return name


def precompile(workers: int = 8) -> int:
    """Compile every kernel variant into CuPy's on-disk cache with `workers` processes (a fresh machine compiles
    each GEMM variant on first use otherwise, about a second each). Returns the number compiled."""
    import concurrent.futures
    import multiprocessing

    jobs = [("intmm.cu", (e,)) for e in ALL_GEMM_EXPRESSIONS] + [("quant.cu", None), ("peak.cu", None)]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        return len(list(pool.map(_compile_job, jobs)))


def raw_kernel(name: str, kernel: str, template: bool = False):
    """The RawKernel object (attributes: num_regs, local_size_bytes, ...), for reports."""
    function(name, kernel, template)
    return _functions[(torch.cuda.current_device(), name, kernel)][2]


try:  # the raw handle of torch's current stream without building a Stream object (what torch's inductor uses)
    from torch._C import _cuda_getCurrentRawStream as _raw_stream
except ImportError:  # pragma: no cover
    _raw_stream = None
_stream_refs: dict = {}


def current_stream() -> _StreamRef:
    handle = (_raw_stream(torch.cuda.current_device()) if _raw_stream is not None
              else torch.cuda.current_stream().cuda_stream)
    ref = _stream_refs.get(handle)
    if ref is None:
        ref = _stream_refs[handle] = _StreamRef(handle)
    return ref


def launch(fn, grid, block, args, shared_mem: int = 0) -> None:
    fn(grid, block, args, shared_mem, current_stream())


class _ZeroPool:
    """Zero-filled device memory handed out in slices that are never handed out twice: a kernel's atomic
    accumulators (per-group maxima, saturation counts) start from zero without a memset launch per call. A slice
    keeps its pool alive while referenced; a used-up pool is replaced by a fresh zero-filled one."""

    def __init__(self, dtype: torch.dtype, size: int):
        self.dtype, self.size = dtype, size
        self.pools: dict = {}

    def take(self, n: int, device: torch.device) -> torch.Tensor:
        if n > self.size // 4:
            return torch.zeros(n, dtype=self.dtype, device=device)
        key = (device.index, current_stream().ptr)  # a pool zeroed on another stream could race
        pool, used = self.pools.get(key, (None, self.size))
        if used + n > self.size:
            pool, used = torch.zeros(self.size, dtype=self.dtype, device=device), 0
        self.pools[key] = (pool, used + n)
        return pool[used:used + n]


ZEROS_I32 = _ZeroPool(torch.int32, 1 << 20)
ZEROS_I64 = _ZeroPool(torch.int64, 1 << 16)


def sm_count() -> int:
    device = torch.cuda.current_device()
    count = _sm_counts.get(device)
    if count is None:
        count = _sm_counts[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return count


def ptr(t: torch.Tensor | None):
    return np.uint64(0 if t is None else t.data_ptr())


u32, u64, i32, i64, f32 = np.uint32, np.uint64, np.int32, np.int64, np.float32
