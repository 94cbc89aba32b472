"""The two-pass quantizers under quant.cu's L2 eviction hints (L2_HINTS, L2_KEEP_BYTES), on the GPU, one table:
the per-tensor rows of bench_kernels.py at 64 and 128 MiB, replayed from CUDA graphs, for each variant
MODE:KEEP_MIB[:persist] ('persist': the device's persisting-L2 limit raised to its maximum first). Every variant's
levels are checked against the first variant's.

    python scripts/sweep_l2_hints.py [0:0 2:32 2:32:persist ...] [--mib 64 128] [--rows nearest]
"""
import argparse
import concurrent.futures
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_kernels import copy_bandwidth, cuda_time, graphed, quantizer_cases  # noqa: E402
from hdqt_cil.kernels import _runtime as rt  # noqa: E402

BASE_OPTIONS = rt.NVRTC_OPTIONS
PERSISTING_L2_LIMIT = 0x06  # cudaLimitPersistingL2CacheSize


def options(mode: int, keep_mib: int) -> tuple[str, ...]:
    return (*BASE_OPTIONS, f"-DL2_HINTS={mode}", f"-DL2_KEEP_BYTES={keep_mib << 20}u")


def compile_variant(job) -> None:
    opts, arch = job
    rt.NVRTC_OPTIONS = opts
    rt.compile_cubin("quant.cu", rt.SOURCES["quant.cu"], arch)


def parse(variant: str) -> tuple[int, int, bool]:
    mode, keep, *rest = variant.split(":")
    return int(mode), int(keep), rest == ["persist"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*", default=["0:0", "1:32", "2:16", "2:24", "2:32", "2:40", "3:32",
                                                         "2:32:persist"])
    parser.add_argument("--mib", type=int, nargs="*", default=[64, 128], help="tensor sizes")
    parser.add_argument("--rows", nargs="*", default=["per tensor"], help="rows whose names contain any of these")
    args = parser.parse_args()
    variants = [parse(v) for v in args.variants]
    arch = rt.device_arch()
    with concurrent.futures.ProcessPoolExecutor(len(variants)) as pool:
        list(pool.map(compile_variant, {(options(m, k), arch) for m, k, _ in variants}))
    copy_bw = copy_bandwidth(False)
    import cupy  # noqa: PLC0415

    props = cupy.cuda.runtime.getDeviceProperties(torch.cuda.current_device())
    print(f"device {props['name'].decode()}, L2 {props['l2CacheSize'] >> 20} MiB, "
          f"persisting L2 up to {props['persistingL2CacheMaxSize'] >> 20} MiB")
    cases = {n_el: [(name, fn) for name, fn, _ in quantizer_cases(n_el)
                    if "per tensor" in name and any(r in name for r in args.rows)]
             for n_el in (mib << 18 for mib in args.mib)}
    reference = {}
    print("| variant | row | MiB | us | of copy | levels equal |\n|---|---|---|---|---|---|")
    for mode, keep, persist in variants:
        rt.NVRTC_OPTIONS = options(mode, keep)
        rt._modules.clear()
        rt._functions.clear()
        cupy.cuda.runtime.deviceSetLimit(PERSISTING_L2_LIMIT, props["persistingL2CacheMaxSize"] if persist else 0)
        for n_el, rows in cases.items():
            for name, fn in rows:
                levels = fn()[0].clone()
                same = torch.equal(levels, reference.setdefault((n_el, name), levels))
                t = cuda_time(graphed(fn), reps=20)
                print(f"| {mode}:{keep}{':persist' if persist else ''} | {name} | {n_el * 4 >> 20} | {t * 1e6:.1f} | "
                      f"{n_el * 5 / t / copy_bw:.3f} | {same} |", flush=True)
    rt.NVRTC_OPTIONS = BASE_OPTIONS


if __name__ == "__main__":
    main()
