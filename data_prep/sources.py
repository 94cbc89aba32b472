"""Where a raw release comes from (a folder, an archive, the official download) and how its text files are read.

Every refusal names the file (and line) at fault, so a broken copy can be fixed rather than guessed at.
"""
import contextlib
import gzip
import hashlib
import io
import lzma
import re
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from .progress import progress


class RawDataError(ValueError):
    """A raw release with a missing or malformed file; the message names the first bad file (and line)."""


class DownloadError(RuntimeError):
    """The official archive could not be fetched or did not match its checksum."""


ARCHIVE_SUFFIXES = {".zip", ".tar", ".xz", ".gz", ".bz2", ".tgz"}
# the per-file list beside an archive, NAME.tar.xz → NAME.contents.sha256: `sha256sum` lines, paths as in the archive
CHECKSUM_SUFFIX = ".contents.sha256"
UNCHECKED = "not checked (no per-file sha256 list; give one with --checksums)"
# what reading a damaged archive raises: a bad CRC, corrupt or truncated compressed data, a broken header
DAMAGED_ARCHIVE = (tarfile.TarError, zipfile.BadZipFile, lzma.LZMAError, zlib.error, gzip.BadGzipFile, EOFError)


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
    """Unpack a .zip or .tar.* archive, then any .zip it contains (the PAMAP2 download nests one).

    Members are unpacked one at a time so that a damaged archive is refused naming where reading stopped.
    """
    member = None
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                for info in zf.infolist():
                    member = info.filename
                    zf.extract(info, into)  # checks the member's CRC-32
        elif tarfile.is_tarfile(archive):
            with tarfile.open(archive) as tf:
                for info in tf:
                    member = info.name
                    tf.extract(info, into, filter="data")
        else:
            raise RawDataError(f"{archive} is neither a zip nor a tar archive (or too damaged to tell)")
    except DAMAGED_ARCHIVE as err:
        where = f"near member {member}" if member else "at its start"
        raise RawDataError(f"{archive} is damaged or incomplete: reading stopped {where} ({err}); expected an intact "
                           ".zip or .tar.* of the release") from err
    for inner in sorted(into.rglob("*.zip")):
        _extract(inner, inner.with_suffix(""))
        inner.unlink()


def checksum_list_beside(archive: Path):
    """The per-file list shipped beside an archive (NAME.contents.sha256 for NAME.tar.xz or NAME.zip), or None."""
    stem = archive.name
    while Path(stem).suffix in ARCHIVE_SUFFIXES:
        stem = Path(stem).stem
    listing = archive.with_name(stem + CHECKSUM_SUFFIX)
    return listing if listing.is_file() else None


def read_checksum_list(listing: Path) -> dict:
    """{path as listed: sha256} of a `sha256sum` output file; a line in another form is refused by number."""
    if not listing.is_file():
        raise RawDataError(f"checksum list {listing} does not exist")
    entries = {}
    for number, line in enumerate(listing.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        match = re.fullmatch(r"([0-9a-f]{64}) [ *](.+)", line)
        if not match:
            raise RawDataError(f"{listing} line {number}: expected '<64 hex digits>  <path>', found {line[:100]!r}")
        entries[match[2]] = match[1]
    return entries


def verify_checksums(root: Path, marker: str, listing: Path) -> str:
    """Check every file of `listing` under `root` and say so; the first missing or different file is refused.

    The list names files as inside the archive (data/a01/p1/s01.txt); its entry for `marker` tells which leading
    folders the release root stands for, so an unpacked copy may sit in a folder of any name.
    """
    entries = read_checksum_list(listing)
    anchors = [name for name in entries if name == marker or name.endswith("/" + marker)]
    if not anchors:
        raise RawDataError(f"checksum list {listing} does not list {marker}, so it is not a list of this release")
    prefix = min(anchors, key=len)[: -len(marker)]
    for name, expected in progress(entries.items(), desc="sha256", total=len(entries)):
        if not name.startswith(prefix):
            raise RawDataError(f"checksum list {listing} lists {name}, outside the release folder {prefix}")
        path = root / name[len(prefix):]
        if not path.is_file():
            raise RawDataError(f"missing file {name} (listed in {listing} with sha256 {expected})")
        found = sha256_of(path)
        if found != expected:
            raise RawDataError(f"{name}: sha256 {found}, expected {expected} (listed in {listing})")
    unlisted = sum(p.is_file() for p in root.rglob("*")) - len(entries)
    return (f"per-file sha256 against {listing}: {len(entries):,} files verified"
            + (f"; files not in the list (unchecked): {unlisted:,}" if unlisted else ""))


@contextlib.contextmanager
def release_root(marker: str, raw_dir=None, archive=None, checksums=None):
    """Yield the release's root folder (`raw_dir` itself, or a temporary unpacking of `archive`) and a sentence on
    how its contents were checked: against the per-file sha256 list `checksums` (by default the one beside the
    archive), else by the zip's CRC-32s, else not at all."""
    if raw_dir is not None:
        root = find_root(Path(raw_dir), marker)
        yield root, verify_checksums(root, marker, Path(checksums)) if checksums else UNCHECKED
        return
    archive = Path(archive)
    if not archive.is_file():
        raise RawDataError(f"archive {archive} does not exist")
    checksums = Path(checksums) if checksums else checksum_list_beside(archive)
    with tempfile.TemporaryDirectory(prefix="data_prep_") as tmp:
        _extract(archive, Path(tmp))
        root = find_root(Path(tmp), marker, shown=archive)
        if checksums:
            yield root, verify_checksums(root, marker, checksums)
        elif zipfile.is_zipfile(archive):
            files = sum(p.is_file() for p in Path(tmp).rglob("*"))
            yield root, f"zip CRC-32 of every member verified on unpacking ({files:,} files; no per-file sha256 list)"
        else:
            yield root, UNCHECKED


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
