"""The `.cu` sources of this folder, every variant a compile must produce, and their machine code: compiled with
NVRTC (no GPU needed), shipped prebuilt for the supported architectures (`prebuilt/`, made by build.py), or compiled
once per machine into its kernel cache.
"""
import hashlib
import json
import logging
import pickle
import re
import tarfile
import time
from functools import lru_cache
from pathlib import Path

import torch

from ..files import cache_root, exclusive, write_atomic

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent

# Kernels of each source, as the names (or template instantiations) that a compile must produce.
ROUNDINGS = ("nearest", "stochastic", "log2")  # quant.cu's kernel name suffixes, by rounding
TRANSFORMS = ("", "had_", "hadw_")  # quant.cu's name prefixes: no transform, any Hadamard block, a wide one
# The flat kernels with one run of 8 elements a thread (every transform), and with four ('4': Hadamard ones only).
FLAT_SHAPES = (("", TRANSFORMS), ("4", TRANSFORMS[1:]))
QUANT_KERNELS = tuple(f"absmax{n}_{had}{t}" for n, hads in FLAT_SHAPES for had in hads for t in ("f32", "i8"))
QUANT_KERNELS += tuple(f"quantize{n}_{had}{t}_{r}" for n, hads in FLAT_SHAPES for had in hads for t in ("f32", "i8")
                       for r in ROUNDINGS)
QUANT_KERNELS += tuple(f"hadamard{n}_{t}" for n, _ in FLAT_SHAPES for t in ("f32", "i8"))
QUANT_KERNELS += tuple(f"hla{n}_f32" for n, _ in FLAT_SHAPES)
QUANT_KERNELS += tuple(f"group_{had}{t}_{r}" for had in TRANSFORMS for t in ("f32", "i8") for r in ROUNDINGS)
# A forward operand's quantizers with its statistics and keep mask (float32 input, no transform).
QUANT_KERNELS += tuple(f"{kind}_stats_f32_{r}" for kind in ("quantize", "group") for r in ROUNDINGS[:2])
QUANT_KERNELS += ("sum_entries_f32", "transpose_i8", "advance_step")
# GEMM tile shapes: warps along M, warps along N, m16 blocks per warp, n8 blocks per warp, min CTAs per SM[,
# pipeline stages].
GEMM_CONFIGS = {
    "256x128": (4, 4, 4, 4, 1),
    "256x128s4": (4, 4, 4, 4, 1, 4),
    "128x128": (2, 4, 4, 4, 1),
    "128x128x2": (2, 4, 4, 4, 2),
    "128x128w": (4, 4, 2, 4, 1),
    "64x64": (2, 2, 2, 4, 1),
    "256x16": (4, 1, 4, 2, 1),
    "256x32": (4, 1, 4, 4, 1),
    "32x128": (1, 4, 2, 4, 1),
    "16x128": (1, 4, 1, 4, 1),
    "wg128x128": (8, 1, 1, 16, 1, 5),
}
# Configs whose products are Hopper's wgmma (intmm.cu WG): sm_90 only, compiled for sm_90a.
WGMMA_CONFIGS = frozenset({"wg128x128"})
GEMM_STAGES = 3  # cp.async pipeline depth unless a config names its own (6th entry)
GEMM_BK = 128


def gemm_stages(config: str) -> int:
    entry = GEMM_CONFIGS[config]
    return entry[5] if len(entry) > 5 else GEMM_STAGES


def gemm_expression(config: str, sat: int, count: bool, out: int) -> str:
    wm, wn, mi, ni, minb = GEMM_CONFIGS[config][:5]
    return (f"intmm_kernel<{wm}, {wn}, {mi}, {ni}, {gemm_stages(config)}, {minb}, {sat}, {str(count).lower()}, "
            f"{out}, {str(config in WGMMA_CONFIGS).lower()}>")


def gemm_smem(config: str) -> int:
    """Dynamic shared memory of a GEMM config's launch: its pipeline stages (and 1 KB to align a WG kernel's)."""
    bm, bn, _ = gemm_tile(config)
    return (bm + bn) * GEMM_BK * gemm_stages(config) + (1024 if config in WGMMA_CONFIGS else 0)


def gemm_tile(config: str) -> tuple[int, int, int]:
    """(BM, BN, threads) of a GEMM config."""
    wm, wn, mi, ni = GEMM_CONFIGS[config][:4]
    return wm * mi * 16, wn * ni * 8, wm * wn * 32


# Every expression the CPU compile test instantiates (the runtime compiles what it needs, one variant a module).
GEMM_MODES = tuple((sat, count) for sat in range(5) for count in (False, True) if count <= (sat > 0))
GEMM_OUTS = range(4)  # int32, float32, scaled, scaled and summed over the batch (intmm.cu OUT)
# Block-scaled float tiles (intmm.cu SAT 5 and 6: MXFP4's tiles of 32, NVFP4's of 16): float32 out on the configs
# gemm_config picks for them (the others spill their float sums), summed over the batch on SUM_BATCH_CONFIG.
BLOCK_SCALED_SAT = {32: 5, 16: 6}
BLOCK_SCALED_CONFIGS = ("256x16", "256x32", "16x128", "32x128", "64x64", "128x128w")
SUM_BATCH_CONFIG = "64x64"  # the tile of a product summed over the batch (OUT 3): 32 sums and 32 totals a thread
BLOCK_SCALED_EXPRESSIONS = tuple(gemm_expression(c, sat, False, 1) for c in BLOCK_SCALED_CONFIGS
                                 for sat in BLOCK_SCALED_SAT.values())
BLOCK_SCALED_EXPRESSIONS += tuple(gemm_expression(SUM_BATCH_CONFIG, sat, False, 3) for sat in BLOCK_SCALED_SAT.values())
ALL_GEMM_EXPRESSIONS = tuple(gemm_expression(c, sat, count, out) for c in GEMM_CONFIGS for sat, count in GEMM_MODES
                             for out in GEMM_OUTS) + BLOCK_SCALED_EXPRESSIONS
WGMMA_EXPRESSIONS = frozenset(gemm_expression(c, sat, count, out) for c in WGMMA_CONFIGS for sat, count in GEMM_MODES
                              for out in GEMM_OUTS)


def runs_here(config: str) -> bool:
    """Whether this GPU runs a GEMM config (the wgmma ones need sm_90)."""
    return config not in WGMMA_CONFIGS or device_arch() == "sm_90"


def module_arch(expressions: tuple[str, ...], arch: str) -> str:
    """The architecture a module is compiled for on a GPU of `arch`: sm_90a (wgmma) for the WG GEMMs."""
    return f"{arch}a" if arch == "sm_90" and WGMMA_EXPRESSIONS.intersection(expressions) else arch

# floats.cu: the E2M1 quantizers with a scale per block along K (MXFP4: 32, E8M0 scales; NVFP4: 16, E4M3 ones),
# nearest (0) or stochastic (1).
E2M1_KERNELS = tuple(f"e2m1_blocks<{block}, {nv}, {rounding}>" for block, nv in ((32, "false"), (16, "true"))
                     for rounding in (0, 1))
COL2IM_PRODUCT_WIDTHS = (16, 32, 64)  # im2col.cu col2im_int_matmul_<O>: the contraction widths O it is built for
SOURCES = {"quant.cu": QUANT_KERNELS, "intmm.cu": ALL_GEMM_EXPRESSIONS,
           "im2col.cu": tuple(f"im2col_{layout}_{t}" for layout in ("rows", "columns") for t in ("i8", "f32"))
           + ("col2im_f32", "col2im_f32_unit")
           + tuple(f"col2im_int_matmul_{o}_c{cpt}{unit}" for o in COL2IM_PRODUCT_WIDTHS for cpt in (1, 4)
                   for unit in ("", "_unit")),
           "floats.cu": E2M1_KERNELS,
           "authors.cu": ("authors_float", "authors_tile_sum"),
           "measures.cu": ("fidelity_partials", "fidelity_final", "moment_partials", "moment_final",
                           "zero_level_partials_i8", "zero_level_partials_f32", "zero_level_final")}
# IEEE single precision throughout: no contraction into FMA, no flush of subnormals, correctly rounded division.
# (CuPy's own RawModule appends -ftz=true to every compile, which flushes subnormal inputs and maxima: these
# sources are therefore compiled here with NVRTC directly and only loaded through CuPy.)
NVRTC_OPTIONS = ("--std=c++17", "--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true")


def source(name: str) -> str:
    """The text of source `name`: a file of this folder, or a path (a benchmark's or a test's own source)."""
    return (HERE / name).read_text()


@lru_cache(maxsize=None)
def headers(name: str) -> tuple[str, ...]:
    """The headers of this folder that source `name` includes (`#include "x.cuh"`), in order."""
    return tuple(re.findall(r'^#include "([^"]+)"', source(name), flags=re.MULTILINE))


def kernel_cache_dir() -> Path:
    return cache_root() / "kernels"


def nvrtc_compile(name: str, expressions: tuple[str, ...], arch: str, *extra: str) -> tuple[bytes, dict, str]:
    """(cubin, {expression: lowered name}, NVRTC's log) of source `name`, uncached; `extra` options are added
    after NVRTC_OPTIONS (e.g. --ptxas-options=-v for registers and spills). A virtual `arch` (compute_90) gives
    PTX instead of a cubin: the front end alone, a third of the time."""
    from cupy_backends.cuda.libs import nvrtc  # noqa: PLC0415

    included = headers(name)
    program = nvrtc.createProgram(source(name), name, [source(h).encode() for h in included],
                                  [h.encode() for h in included])
    try:
        for expression in expressions:
            if "<" in expression:
                nvrtc.addNameExpression(program, expression)
        try:
            nvrtc.compileProgram(program, [f"--gpu-architecture={arch}", *NVRTC_OPTIONS, *extra])
        except Exception as err:
            raise RuntimeError(f"{name} does not compile: {err}\n{nvrtc.getProgramLog(program)}") from err
        lowered = {e: (nvrtc.getLoweredName(program, e) if "<" in e else e) for e in expressions}
        log = nvrtc.getProgramLog(program)
        code = nvrtc.getCUBIN(program) if arch.startswith("sm_") else nvrtc.getPTX(program)
        return code, lowered, log.decode() if isinstance(log, bytes) else log
    finally:
        nvrtc.destroyProgram(program)


def nvrtc_version() -> str:
    from cupy_backends.cuda.libs import nvrtc  # noqa: PLC0415

    return ".".join(map(str, nvrtc.getVersion()))


def module_key(name: str, expressions: tuple[str, ...], arch: str) -> str:
    """What decides a module's machine code: its source and headers, the options, the architecture and the
    template instantiations (the NVRTC release that compiles them is recorded beside the cubin, not keyed)."""
    text = "\0".join((source(name), *map(source, headers(name)), name, arch, *NVRTC_OPTIONS, *expressions))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# The modules shipped compiled (prebuilt/<arch>.tar.xz, made by `python -m hdqt_cil.kernels.build`): every GEMM
# variant as a module of its own, quant.cu, im2col.cu and measures.cu whole.
SUPPORTED_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90")
PREBUILT_DIR = HERE / "prebuilt"


def shipped_modules(arch: str) -> list[tuple[str, tuple[str, ...]]]:
    """(source, expressions) of every module shipped for `arch` (the WG GEMMs for sm_90 alone): a template
    instantiation is a module of its own (runtime.function), the extern "C" kernels of a source one together."""
    gemms = [e for e in ALL_GEMM_EXPRESSIONS if arch == "sm_90" or e not in WGMMA_EXPRESSIONS]
    return ([("intmm.cu", (e,)) for e in gemms] + [("floats.cu", (e,)) for e in E2M1_KERNELS]
            + [(n, SOURCES[n]) for n in ("quant.cu", "im2col.cu", "measures.cu", "authors.cu")])


def prebuilt_path(arch: str) -> Path:
    return PREBUILT_DIR / f"{arch}.tar.xz"


@lru_cache(maxsize=None)
def prebuilt(arch: str) -> dict:
    """{module key: (cubin, lowered names)} shipped for `arch` (empty where none is)."""
    path = prebuilt_path(arch)
    if not path.exists():
        return {}
    with tarfile.open(path, "r:xz") as bundle:
        index = json.load(bundle.extractfile("index.json"))
        return {key: (bundle.extractfile(f"{key}.cubin").read(), entry["lowered"])
                for key, entry in index["modules"].items()}


_compiled = {"modules": 0, "seconds": 0.0}


def compile_seconds() -> float:
    """Seconds this process spent compiling kernels (modules neither shipped nor in the disk cache)."""
    return _compiled["seconds"]


def compile_cubin(name: str, expressions: tuple[str, ...], arch: str) -> tuple[bytes, dict]:
    """(cubin, {expression: lowered name}) of source `name` for `arch` (e.g. 'sm_90'), compiled here through
    NVRTC with NVRTC_OPTIONS and kept in the machine's kernel cache. Jobs that start together compile each
    module once: the first holds the module's lock, the others find its cubin when they get the lock. Needs no
    GPU."""
    path = kernel_cache_dir() / f"{module_key(name, expressions, arch)}-nvrtc{nvrtc_version()}.pkl"
    with exclusive(path.with_suffix(".lock")):
        if path.exists():
            try:
                return pickle.loads(path.read_bytes())
            except Exception:  # noqa: BLE001 (a foreign or damaged file: compile again)
                pass
        start = time.perf_counter()
        result = nvrtc_compile(name, expressions, arch)[:2]
        seconds = time.perf_counter() - start
        _compiled["modules"] += 1
        _compiled["seconds"] += seconds
        log.info("compiled %s%s for %s in %.1f s (not among the prebuilt kernels)", name,
                 f" {expressions[0]}" if len(expressions) == 1 else "", arch, seconds)
        try:
            write_atomic(path, pickle.dumps(result))
        except OSError:
            pass
    return result


def device_arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def _compile_job(job) -> str:
    name, expressions, arch = job
    compile_cubin(name, expressions, arch)
    return name


def precompile(workers: int = 8, arch: str | None = None) -> int:
    """Compile what is not shipped for `arch` (default: this GPU's) into the disk cache with `workers`
    processes, no GPU needed: for architectures outside SUPPORTED_ARCHS. Returns the count compiled."""
    import concurrent.futures  # noqa: PLC0415

    arch = arch or device_arch()
    shipped = prebuilt(arch)
    modules = [(name, expressions, module_arch(expressions, arch)) for name, expressions in shipped_modules(arch)]
    jobs = [module for module in modules if module_key(*module) not in shipped]
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        return len(list(pool.map(_compile_job, jobs)))


