"""Image sources decoded once per machine.

Decoding CIFAR-10's 60,000 JPEGs takes about half a minute; every run of a sweep used to pay it. The decoded
arrays are kept in the machine's cache (files.py: cache_root) under the sha256 of the source's bytes (an archive's,
or every image file's of a folder, with its relative path), so an edited or replaced source is decoded again and
an unchanged one never is. Jobs that start together decode it once: the first holds the entry's lock, the others
read what it wrote. What else is made once of a source is kept beside the arrays under the same digest (cache_entry).
"""
import hashlib
import io
import logging
import time
from pathlib import Path
from typing import Callable

import numpy as np

from ..files import cache_root, exclusive, file_digest, write_atomic

log = logging.getLogger(__name__)

Splits = tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], list]


def source_digest(source: Path, suffixes: tuple[str, ...]) -> str:
    """sha256 of a file, or of a folder's files ending in `suffixes` (relative path and bytes, sorted)."""
    if source.is_file():
        return file_digest(source)
    digest = hashlib.sha256()
    for path in sorted(p for p in source.rglob("*") if p.suffix.lower() in suffixes and p.is_file()):
        digest.update(str(path.relative_to(source)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_entry(maker: str, digest: str, suffix: str) -> Path:
    """Where what `maker` made of the source whose source_digest is `digest` is kept (`maker`: a name that changes
    whenever it would make something else of the same source)."""
    return cache_root() / "datasets" / f"{maker}-{digest[:40]}{suffix}"


def _read(entry: Path) -> Splits:
    with np.load(entry, allow_pickle=False) as arrays:
        return ((arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"]),
                arrays["names"].tolist())


def _write(entry: Path, splits: Splits) -> None:
    (x_train, y_train), (x_test, y_test), names = splits
    buffer = io.BytesIO()
    np.savez(buffer, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, names=np.asarray(names))
    write_atomic(entry, buffer.getvalue())


def decoded_once(source: Path, decode: Callable[[Path], Splits], decoder: str, digest: str) -> Splits:
    """decode(source), from the cache when the source with this digest (source_digest) was decoded before by the
    decoder named `decoder` (a name that changes whenever decoding would give other arrays)."""
    entry = cache_entry(decoder, digest, ".npz")
    if not entry.exists():
        with exclusive(entry.with_suffix(".lock")):
            if not entry.exists():
                start = time.perf_counter()
                _write(entry, decode(source))
                log.info("decoded %s in %.0f s; kept as %s", source, time.perf_counter() - start, entry)
    return _read(entry)
