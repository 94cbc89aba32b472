"""Loading and launching the kernels on torch tensors, and what every primitive's launcher shares: whether the
kernels run here, buffers, the launch geometry's device facts.

CuPy is used only to load and launch: every buffer is a torch tensor (its allocator, its stream) and reaches a
kernel as a raw device address, so no CuPy array or memory pool is involved.
"""
import logging
import threading
from functools import lru_cache

import numpy as np
import torch

from .compile import SOURCES, compile_cubin, device_arch, module_arch, module_key, prebuilt

log = logging.getLogger(__name__)


class NotCovered(Exception):
    """The kernels do not cover this call (a size, dtype or setting outside what they implement); raised before
    anything is launched, so that the caller (quant/backend.py) runs the reference instead. `warn`: the user
    asked for something the kernels could run with another setting (worth a warning), not merely a rare size."""

    def __init__(self, reason: str, warn: bool = False):
        super().__init__(reason)
        self.warn = warn


# ---------------------------------------------------------------------------------------------------------------
# whether the kernels run here


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
        function("quant.cu", "quantize_f32_nearest")
    except Exception as err:  # noqa: BLE001
        return f"the kernels do not compile or load ({type(err).__name__}: {err})"
    return ""


def available() -> bool:
    """Whether CUDA, CuPy and the kernels work in this process (checked once)."""
    return _probe() == ""


def unavailable_reason() -> str:
    return _probe()


def require_cuda(*tensors) -> None:
    for t in tensors:
        if not t.is_cuda:
            raise ValueError(f"hdqt_cil.kernels runs on CUDA tensors; got a tensor on {t.device}")
    reason = _probe()
    if reason:
        raise RuntimeError(f"hdqt_cil.kernels cannot run: {reason}")


# ---------------------------------------------------------------------------------------------------------------
# loading

_lock = threading.Lock()
_modules: dict = {}
_functions: dict = {}
_sm_counts: dict = {}


def _module(name: str, expressions: tuple[str, ...]):
    """(CuPy Module, lowered names) for the current device: the shipped cubin when there is one and the driver
    loads it, else one compiled here."""
    device = torch.cuda.current_device()
    key = (device, name, expressions)
    with _lock:
        entry = _modules.get(key)
        if entry is None:
            from cupy.cuda import function as cupy_function  # noqa: PLC0415

            device_kind = device_arch()
            arch = module_arch(expressions, device_kind)
            shipped = prebuilt(device_kind).get(module_key(name, expressions, arch))
            module = cupy_function.Module()
            try:
                if shipped is None:
                    raise LookupError
                module.load(shipped[0])
                lowered = shipped[1]
            except Exception as err:  # noqa: BLE001 (not shipped, or a driver older than the shipping NVRTC)
                if not isinstance(err, LookupError):
                    log.warning("the prebuilt %s for %s does not load here (%s); compiling it", name, arch, err)
                cubin, lowered = compile_cubin(name, expressions, arch)
                module.load(cubin)
            entry = _modules[key] = (module, lowered)
        return entry


def function(name: str, kernel: str, template: bool = False, dynamic_smem: int = 0):
    """CuPy's launchable function for `kernel` of source `name` on the current device (compiled once, cached).
    Templates get a module of their own, and so do the kernels of a source outside this folder (a path); the
    extern "C" kernels of a source of this folder share one."""
    device = torch.cuda.current_device()
    key = (device, name, kernel)
    entry = _functions.get(key)
    if entry is None or entry[1] < dynamic_smem:
        module, lowered = _module(name, (kernel,) if template or name not in SOURCES else SOURCES[name])
        fn = entry[0] if entry is not None else module.get_function(lowered[kernel])
        if dynamic_smem > 48 * 1024:
            from cupy_backends.cuda.api import driver  # noqa: PLC0415

            driver.funcSetAttribute(fn.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_smem)
        entry = _functions[key] = (fn, max(dynamic_smem, entry[1] if entry else 0))
    return entry[0]


# ---------------------------------------------------------------------------------------------------------------
# launching

class _StreamRef:
    """What CuPy's launcher needs of a stream: its handle (torch's current stream)."""
    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr


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
    """Launch on torch's current stream; `args` are NumPy scalars typed as the kernel's parameters (pointers as
    uint64)."""
    fn(grid, block, args, shared_mem, current_stream())


_occupancy: dict = {}


def ctas_per_sm(fn, threads: int, shared_mem: int = 0) -> int:
    """Resident CTAs per multiprocessor for a launch shape (CUDA's occupancy calculator), at least 1."""
    key = (fn.ptr, threads, shared_mem)
    count = _occupancy.get(key)
    if count is None:
        from cupy_backends.cuda.api import driver  # noqa: PLC0415

        count = _occupancy[key] = max(1, driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, threads,
                                                                                          shared_mem))
    return count


class _ZeroPool:
    """Zero-filled device memory handed out in slices that are never handed out twice: a kernel's atomic
    accumulators (per-group maxima, saturation counts) start from zero without a memset launch per call. A slice
    keeps its pool alive while referenced; a used-up pool is replaced by a fresh zero-filled one. While a CUDA graph
    is captured each slice is a fresh `torch.zeros` (a memset node): a pool slice would be reused, unzeroed, by
    every replay."""

    def __init__(self, dtype: torch.dtype, size: int):
        self.dtype, self.size = dtype, size
        self.pools: dict = {}

    def take(self, n: int, device: torch.device) -> torch.Tensor:
        if n > self.size // 4 or torch.cuda.is_current_stream_capturing():
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


# ---------------------------------------------------------------------------------------------------------------
# buffers

# The largest element count (and index) the kernels' 32-bit indexing covers.
MAX_ELEMENTS = 2**31 - 1


class on_device:
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


def empty(shape, dtype, device) -> torch.Tensor:
    """An output buffer: every one the launchers allocate comes from here (the GPU tests poison it)."""
    return torch.empty(shape, dtype=dtype, device=device)


def flat_input(t: torch.Tensor) -> torch.Tensor:
    """float32 or int8, contiguous, 16-byte aligned (the kernels' inputs)."""
    if t.dtype not in (torch.float32, torch.int8):
        t = t.to(torch.float32)
    t = t.contiguous()
    if t.data_ptr() % 16:
        t = t.clone()
    return t


def dtype_suffix(t: torch.Tensor) -> str:
    """The kernel name suffix of an input dtype (flat_input's two)."""
    return "f32" if t.dtype == torch.float32 else "i8"
