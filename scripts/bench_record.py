"""The JSON record every benchmark script leaves in results/bench/: device, header, command, duration, rows."""
import json
import sys
import time
from pathlib import Path


def save_rows(out_dir, prefix: str, device: str, header: str, started: float, rows: list) -> Path:
    """Write `<out_dir>/<prefix>_<device slug>.json` and return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    slug = "".join(c if c.isalnum() else "_" for c in device).strip("_").lower()
    path = out / f"{prefix}_{slug}.json"
    path.write_text(json.dumps({"device": device, "header": header, "command": " ".join(sys.argv),
                                "seconds": time.time() - started, "rows": rows}, indent=1))
    return path
