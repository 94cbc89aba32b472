"""The command line every dataset module shares: pick the raw source, reuse or write the feature file."""
import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hdqt_cil.wording import help_description

from . import sources
from .progress import progress


def parallel_map(function, calls, desc: str, max_jobs: int = 8) -> list:
    """[function(*args) for args in calls], spread over the CPU cores (at most `max_jobs` processes, each holding
    one recording in memory). Results keep the order of `calls`; the first failing call, in that order, raises.
    Fewer than 8 calls run in this process: starting the workers costs about a second. Workers are spawned, so a
    script that calls this must keep its top level under `if __name__ == "__main__":`."""
    calls = list(calls)
    jobs = min(len(calls), os.cpu_count() or 1, max_jobs)
    if jobs <= 1 or len(calls) < 8:
        return [function(*args) for args in progress(calls, desc=desc)]
    # spawn, not fork: the parent may hold threads (torch, BLAS) that a forked child would inherit half-locked
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(progress(pool.map(function, *zip(*calls)), total=len(calls), desc=desc))


@dataclass(frozen=True)
class Dataset:
    """What the shared command needs to know about one dataset release."""

    name: str
    url: str  # the official archive
    archive_name: str  # file name to store the download under
    archive_sha256: str | None  # None where no published digest could be checked
    archive_bytes: int | None
    marker: str  # a file that identifies the release root inside a folder or archive
    extractor: str  # recorded in the feature file; bump it when the features change
    n_features: int


def npz_path(text: str) -> Path:
    """`--out`: the feature file is an NPZ archive whatever its name, and the benchmarks read a file by its suffix."""
    if Path(text).suffix != ".npz":
        raise argparse.ArgumentTypeError(f"{text}: a feature file is a NumPy .npz archive; name it .npz")
    return Path(text)


def parser(dataset: Dataset, doc: str) -> argparse.ArgumentParser:
    """The command line every release's module shares, described by the module's docstring `doc`."""
    p = argparse.ArgumentParser(prog=f"python -m data_prep.{dataset.name}", description=help_description(doc))
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--raw-dir", type=Path, help="an unpacked copy of the official release")
    source.add_argument("--archive", type=Path, help="the official .zip (or a .tar.* of the same files)")
    source.add_argument("--download", action="store_true", help=f"fetch {dataset.url}"
                        + (" (size and sha256 checked)" if dataset.archive_sha256 else ""))
    p.add_argument("--checksums", type=Path, help="a per-file sha256 list (`sha256sum` lines, paths as in the "
                   "archive) to check the raw files against [NAME.contents.sha256 beside --archive NAME.tar.xz]")
    p.add_argument("--out", type=npz_path, required=True, help="the feature file to write (.npz)")
    p.add_argument("--download-dir", type=Path, help="where --download stores the archive [beside --out]")
    p.add_argument("--force", action="store_true", help="recompute even if --out is present and valid")
    return p


def run(dataset: Dataset, args, build) -> int:
    """Reuse `args.out` if valid, else build it from the chosen source; `build(root)` returns `save`'s arguments."""
    from . import feature_file  # it imports torch (through the benchmarks): not needed for --help

    if not args.force and feature_file.reusable(args.out, dataset.extractor, dataset.n_features):
        print(f"{args.out} is present and valid; reusing it (--force recomputes)")
        return 0
    started = time.perf_counter()
    try:
        archive = args.archive
        if args.download:
            target = (args.download_dir or args.out.parent / "downloads") / dataset.archive_name
            archive = sources.download(dataset.url, target, dataset.archive_sha256, dataset.archive_bytes)
        with sources.release_root(dataset.marker, raw_dir=args.raw_dir, archive=archive,
                                  checksums=args.checksums) as (root, contents_check):
            print(f"contents: {contents_check}")
            arrays = build(root)
    except (sources.RawDataError, sources.DownloadError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    feature_file.save(args.out, extractor=dataset.extractor, contents_check=contents_check, **arrays)
    n, d = arrays["X"].shape
    print(f"wrote {args.out}: {n:,} windows × {d} features in {time.perf_counter() - started:.1f} s")
    return 0
