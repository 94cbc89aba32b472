"""Where a raw release comes from (a folder, an archive, the official download) and how its text files are read.

Every refusal names the file (and line) at fault, so a broken copy can be fixed rather than guessed at.
"""
import contextlib
import hashlib
import io
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from .cli import progress


class RawDataError(ValueError):
    """A raw release with a missing or malformed file; the message names the first bad file (and line)."""


class DownloadError(RuntimeError):
    """The official archive could not be fetched or did not match its checksum."""


def find_root(base: Path, marker: str, shown=None) -> Path:
    """The shallowest folder under `base` (itself, or up to three levels down) that holds `marker`; `shown` names
    `base` in messages (an archive rather than its temporary unpacking)."""
    base = Path(base)
    if not base.is_dir():
        raise RawDataError(f"raw folder {base} does not exist")
    for depth in range(4):
        for folder in sorted(base.glob("/".join(["*"] * depth))) if depth else [base]:
            if (folder / marker).is_file():
                return folder
    raise RawDataError(f"missing file {marker} in {shown or base} (is this the right folder or archive?)")


def _extract(archive: Path, into: Path):
    """Unpack a .zip or .tar.* archive, then any .zip it contains (the PAMAP2 download nests one)."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(into)
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            tf.extractall(into, filter="data")
    else:
        raise RawDataError(f"{archive} is neither a zip nor a tar archive")
    for inner in sorted(into.rglob("*.zip")):
        _extract(inner, inner.with_suffix(""))
        inner.unlink()


@contextlib.contextmanager
def release_root(marker: str, raw_dir=None, archive=None):
    """Yield the release's root folder: `raw_dir` itself, or a temporary unpacking of `archive`."""
    if raw_dir is not None:
        yield find_root(Path(raw_dir), marker)
        return
    archive = Path(archive)
    if not archive.is_file():
        raise RawDataError(f"archive {archive} does not exist")
    with tempfile.TemporaryDirectory(prefix="data_prep_") as tmp:
        _extract(archive, Path(tmp))
        yield find_root(Path(tmp), marker, shown=archive)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(url: str, target: Path, sha256, size) -> Path:
    """Fetch `url` to `target` (reused when already there and intact) and verify its size and sha256.

    With no pinned digest (`sha256` None) the archive's own CRC-32s, checked while unpacking, are the only check;
    its sha256 is printed so it can be pinned.
    """
    target = Path(target)
    if target.is_file() and (sha256 is None or sha256_of(target) == sha256):
        print(f"using {target}" + (" (sha256 verified)" if sha256 else " (downloaded before)"))
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    hint = f"download it by hand from {url}, save it as {target} and run again with --archive {target}"
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
            bar = progress(total=size, desc=f"download {target.name}", unit="B", unit_scale=True)
            for block in iter(lambda: response.read(1 << 20), b""):
                out.write(block)
                bar.update(len(block))
            bar.close()
    except (urllib.error.URLError, OSError) as err:
        partial.unlink(missing_ok=True)
        raise DownloadError(f"could not download {url} ({err}); {hint}") from err
    got_size, got_sha = partial.stat().st_size, sha256_of(partial)
    if sha256 is None:
        print(f"{target.name}: {got_size:,} bytes, sha256 {got_sha} (no pinned digest to compare with)")
    elif (got_size, got_sha) != (size, sha256):
        raise DownloadError(f"{url} gave {got_size:,} bytes with sha256 {got_sha}, expected {size:,} bytes with "
                            f"sha256 {sha256}; the file is kept as {partial} for inspection; {hint}")
    partial.replace(target)
    return target


def _first_bad_line(data: bytes, name: str, n_columns: int, delimiter, allow_nan: bool) -> str:
    """The complaint about the first line of `data` that is not `n_columns` numbers (blank lines are skipped)."""
    for number, raw in enumerate(data.splitlines(), 1):
        try:
            line = raw.decode("ascii")
        except UnicodeDecodeError:
            return f"{name} line {number}: not plain text"
        if not line.strip():
            continue
        fields = line.split(delimiter) if delimiter else line.split()
        if len(fields) != n_columns:
            return f"{name} line {number}: expected {n_columns} values, found {len(fields)}: {line.strip()[:80]!r}"
        for field in fields:
            try:
                value = float(field)
            except ValueError:
                return f"{name} line {number}: {field.strip()!r} is not a number"
            if not (np.isfinite(value) or (allow_nan and field.strip() == "NaN")):
                return f"{name} line {number}: {field.strip()!r} is not a finite number"
    return f"{name}: no data rows"


def read_table(root: Path, name: str, n_columns: int, delimiter=None, allow_nan=False) -> np.ndarray:
    """Read `root/name`, a text table of `n_columns` numbers a line (whitespace- or `delimiter`-separated).

    Missing values, where allowed, must be written `NaN`. The fast path is pandas' C parser; on anything unexpected
    (including a short line, which pandas would pad with NaN) the file is scanned line by line so the error can name
    the first bad line.
    """
    path = Path(root) / name
    if not path.is_file():
        raise RawDataError(f"missing file {name} (looked for {path})")
    data = path.read_bytes()
    try:
        table = pd.read_csv(io.BytesIO(data), sep=delimiter or r"\s+", header=None, dtype=np.float64,
                            engine="c", skip_blank_lines=True, keep_default_na=False, na_values=["NaN"]).to_numpy()
        ok = table.ndim == 2 and table.shape[1] == n_columns and len(table) > 0
        nan = np.isnan(table)
        ok = ok and (np.isfinite(table) | nan).all() and nan.sum() == (data.count(b"NaN") if allow_nan else 0)
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError):
        ok = False
    if not ok:
        raise RawDataError(_first_bad_line(data, name, n_columns, delimiter, allow_nan))
    return table


def line_number(data: bytes, row: int) -> int:
    """1-based line number of data row `row` (0-based, blank lines not counted)."""
    return [i for i, line in enumerate(data.splitlines(), 1) if line.strip()][row]


def read_integers(root: Path, name: str, n_columns: int) -> np.ndarray:
    """`read_table` for tables of whole numbers (labels, ids, segment bounds)."""
    table = read_table(root, name, n_columns)
    bad = np.flatnonzero((table != np.round(table)).any(1))
    if len(bad):
        line = line_number((Path(root) / name).read_bytes(), bad[0])
        raise RawDataError(f"{name} line {line}: expected whole numbers, found {table[bad[0]].tolist()}")
    return table.astype(np.int64)
