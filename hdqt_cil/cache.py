"""The per-machine cache: what is expensive to make once (decoded datasets, kernels compiled here) and identical on
every later use, kept under `$HDQT_CACHE` (default `~/.cache/hdqt_cil`).

Several jobs of a sweep start together and ask for the same entry: `exclusive` makes one of them build it while
the others wait on an advisory file lock (released by the kernel when a holder dies, so a killed job blocks
nobody), and entries appear by an atomic rename, so a reader never sees half a file.
"""
import fcntl
import hashlib
import os
from contextlib import contextmanager
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("HDQT_CACHE", Path.home() / ".cache" / "hdqt_cil")).expanduser()


@contextmanager
def exclusive(path: Path):
    """Hold the lock file `path` (created if absent) for the block, across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    partial.write_bytes(data)
    partial.replace(path)


def file_digest(path: Path, chunk: int = 1 << 22) -> str:
    """sha256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()
