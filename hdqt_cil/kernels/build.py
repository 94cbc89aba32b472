"""Compile the shipped kernels for every supported architecture into `prebuilt/<arch>.tar.xz`, or check that the
bundles match the sources. NVRTC compiles on a CPU; no GPU is needed.

    python -m hdqt_cil.kernels.build            # rebuild the bundles that are stale (make kernels)
    python -m hdqt_cil.kernels.build --check    # exit 1 naming the stale bundles (CI's test does the same)

A bundle is a tar.xz of `index.json` (the NVRTC release, and per module key its source, template instantiations
and lowered names) and one `<key>.cubin` per module; members are sorted and their metadata fixed, so the same
sources and NVRTC release give the same bytes.
"""
import argparse
import concurrent.futures
import io
import json
import os
import sys
import tarfile
import time

from ..files import write_atomic
from ..wording import help_description
from . import compile as rt


def expected_keys(arch: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """{module key: (source, expressions)} that the bundle for `arch` must hold."""
    return {rt.module_key(name, expressions, rt.module_arch(expressions, arch)): (name, expressions)
            for name, expressions in rt.shipped_modules(arch)}


def _bundle_index(arch: str) -> dict:
    """The index of the bundle for `arch` (empty where there is none)."""
    path = rt.prebuilt_path(arch)
    if not path.exists():
        return {"modules": {}}
    with tarfile.open(path, "r:xz") as bundle:
        return json.load(bundle.extractfile("index.json"))


def bundle_keys(arch: str) -> set[str]:
    return set(_bundle_index(arch)["modules"])


def stale_archs(archs=rt.SUPPORTED_ARCHS) -> list[str]:
    """The architectures whose bundle is missing or differs from what the sources make."""
    return [arch for arch in archs if bundle_keys(arch) != set(expected_keys(arch))]


def _compile(job):
    key, name, expressions, arch = job
    cubin, lowered, _ = rt.nvrtc_compile(name, expressions, arch)
    return key, name, expressions, cubin, lowered


def _member(name: str, data: bytes) -> tuple[tarfile.TarInfo, io.BytesIO]:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    return info, io.BytesIO(data)


def _reusable(arch: str, keys) -> dict:
    """{key: (cubin, lowered)} of the modules among `keys` that the current bundle already holds, compiled by this
    NVRTC release (a key covers the source, headers, options and architecture, so the cubin is what a compile
    would give)."""
    if _bundle_index(arch).get("nvrtc") != rt.nvrtc_version():
        return {}
    shipped = rt.prebuilt(arch)
    return {key: shipped[key] for key in keys if key in shipped}


def build(arch: str, workers: int, reuse: bool = True) -> tuple[int, int]:
    """Write the bundle of every shipped module for `arch`, compiling with `workers` processes those that the
    current bundle does not hold (every one with reuse=False); returns (modules compiled, bytes)."""
    expected = expected_keys(arch)
    kept = _reusable(arch, expected) if reuse else {}
    jobs = [(key, name, expressions, rt.module_arch(expressions, arch)) for key, (name, expressions) in expected.items()
            if key not in kept]
    jobs.sort(key=lambda job: job[1] != "quant.cu")  # the longest compile first
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        compiled = list(pool.map(_compile, jobs, chunksize=4))
    results = sorted(compiled + [(key, *expected[key], *kept[key]) for key in kept])
    index = {"arch": arch, "nvrtc": rt.nvrtc_version(), "options": list(rt.NVRTC_OPTIONS),
             "modules": {key: {"source": name, "expressions": list(expressions), "lowered": lowered}
                         for key, name, expressions, _, lowered in results}}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz", preset=9) as bundle:
        bundle.addfile(*_member("index.json", json.dumps(index, indent=1, sort_keys=True).encode()))
        for key, _, _, cubin, _ in results:
            bundle.addfile(*_member(f"{key}.cubin", cubin))
    write_atomic(rt.prebuilt_path(arch), buffer.getvalue())
    rt.prebuilt.cache_clear()
    return len(jobs), len(buffer.getvalue())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("--arch", nargs="+", default=list(rt.SUPPORTED_ARCHS), choices=rt.SUPPORTED_ARCHS)
    parser.add_argument("--check", action="store_true", help="only report stale bundles (exit 1 if any)")
    parser.add_argument("--all", action="store_true", help="rebuild every bundle, compiling every module anew")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiler processes")
    args = parser.parse_args(argv)
    stale = stale_archs(args.arch)
    if args.check:
        for arch in stale:
            print(f"{rt.prebuilt_path(arch)} does not match the kernel sources: run `make kernels`", file=sys.stderr)
        return 1 if stale else 0
    for arch in args.arch if args.all else stale:
        start = time.perf_counter()
        compiled, size = build(arch, args.jobs, reuse=not args.all)
        print(f"{rt.prebuilt_path(arch)}: {len(expected_keys(arch))} modules ({compiled} compiled), "
              f"{size / 2**20:.1f} MiB, {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
