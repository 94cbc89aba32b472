"""Atomic writers: a reader (or a crash) never sees a half-written result file."""
import json
import os
import tempfile
from pathlib import Path


def write_atomic(path, data: str | bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=True) + "\n")


def read_json(path):
    with open(path) as f:
        return json.load(f)
