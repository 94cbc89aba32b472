"""Files written so that nothing is lost or half-read: atomic writes, locks between processes, the machine cache.

A reader (or a crash) never sees a half-written file: `write_atomic` writes a temporary file beside the target,
syncs it and renames it into place. Several jobs of a sweep start together and ask for the same cache entry:
`exclusive` makes one of them build it while the others wait on an advisory file lock (released by the kernel
when a holder dies, so a killed job blocks nobody).
"""
import fcntl
import hashlib
import json
import math
import os
import uuid
from contextlib import contextmanager
from pathlib import Path


def write_atomic(path, data: str | bytes) -> None:
    """Write a temporary file in the same folder (the umask's permissions), fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _null_if_not_finite(obj):
    """`obj` with null for each NaN and ±inf in it: JSON has no such numbers, and strict readers (jq, JavaScript)
    refuse the bare `NaN` Python writes."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: _null_if_not_finite(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_null_if_not_finite(value) for value in obj]
    return obj


def write_json(path, obj) -> None:
    """`obj` as JSON any parser reads: a number that is not finite (a metric with nothing to measure yet, the
    accuracy matrix's experiences not yet seen) is written as null, which the tables read back as NaN."""
    write_atomic(path, json.dumps(_null_if_not_finite(obj), indent=2, sort_keys=True, allow_nan=False) + "\n")


def parse_json(text: str | bytes):
    """JSON the project wrote: a bare NaN or Infinity (in files written before write_json wrote null) is read as
    null too, so that a number that was not finite reads the same from any file."""
    return json.loads(text, parse_constant=lambda _: None)


def read_json(path):
    return parse_json(Path(path).read_bytes())


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


def file_digest(path: Path, chunk: int = 1 << 22) -> str:
    """sha256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def cache_root() -> Path:
    """The machine's cache of what is expensive to make and the same on every later use (decoded datasets, kernels
    compiled here): `$HDQT_CACHE`, default `~/.cache/hdqt_cil`."""
    return Path(os.environ.get("HDQT_CACHE", Path.home() / ".cache" / "hdqt_cil")).expanduser()
