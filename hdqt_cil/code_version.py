"""Which code a run trained with, where no git history travels (a GPU node gets a copy of the working tree).

The fingerprint hashes the source a run executes: every .py, .cu, .cuh and .yaml file of the package and of the
sweep launcher, and run.py, by their paths and contents. Built kernels, caches and bytecode are left out: they
follow from the source. `scripts/code_fingerprint.py COMMIT` gives a commit's fingerprint, so the commit a README
names beside a run can be checked against the run's own record (summary.json `code`).
"""
import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_FOLDERS = ("hdqt_cil", "hydra_plugins")
SOURCE_FILES = ("run.py",)
SOURCE_SUFFIXES = {".py", ".cu", ".cuh", ".yaml"}


def source_files(root: Path = ROOT) -> list[Path]:
    """The source files under `root` that the fingerprint covers, in a fixed order."""
    found = [p for folder in SOURCE_FOLDERS for p in (root / folder).rglob("*")
             if p.is_file() and p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts]
    found += [root / name for name in SOURCE_FILES if (root / name).is_file()]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def fingerprint(root: Path = ROOT) -> str:
    """16 hex digits of SHA-256 over each source file's relative path and contents."""
    digest = hashlib.sha256()
    for path in source_files(root):
        for part in (path.relative_to(root).as_posix().encode(), path.read_bytes()):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
    return digest.hexdigest()[:16]


def processes_code(before: list[str] | None, now: str) -> list[str]:
    """The fingerprints of the processes a run trained in, oldest first: `before` (a resumed run's record) with
    `now` appended unless it is the last already."""
    before = list(before or [])
    return before if before and before[-1] == now else [*before, now]
