"""The JSON record every benchmark script leaves in results/bench/: device, header, command, duration, rows."""
import subprocess
import sys
import time
from pathlib import Path

from hdqt_cil.files import write_json


def save_rows(out_dir, prefix: str, device: str, header: str, started: float, rows: list) -> Path:
    """Write `<out_dir>/<prefix>_<device slug>.json` and return its path."""
    slug = "".join(c if c.isalnum() else "_" for c in device).strip("_").lower()
    path = Path(out_dir) / f"{prefix}_{slug}.json"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent, check=False).stdout.strip()
    write_json(path, {"device": device, "commit": commit, "header": header, "command": " ".join(sys.argv),
                      "seconds": time.time() - started, "rows": rows})
    return path


def _kernel_events(fn):
    """(profiler, the device operations fn() caused) under torch.profiler: kernels (those launched through CuPy on
    torch's stream too) and the copies and fills the CUDA driver runs (memory_operation tells them apart)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return prof, [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def memory_operation(event) -> bool:
    """Whether a device event is a driver copy or fill (cudaMemcpyAsync, cudaMemsetAsync) rather than a kernel."""
    return event.name.startswith(("Memcpy ", "Memset "))  # the profiler's names: "Memcpy DtoH (...)", "Memset (...)"


def device_work(fn, calls: int = 2, profile_title: str | None = None) -> tuple[float, float, float]:
    """(kernels launched, copies and fills, seconds of device time) per call of fn(), from `calls` calls under the
    profiler; with `profile_title` those calls' device operations are also printed by device time."""
    prof, events = _kernel_events(lambda: [fn() for _ in range(calls)])
    if profile_title is not None:
        _print_profile(profile_title, prof, events)
    copies = sum(map(memory_operation, events))
    return (len(events) - copies) / calls, copies / calls, sum(e.device_time for e in events) / 1e6 / calls


def print_device_profile(title: str, fn, rows: int = 30, path: Path | None = None) -> None:
    """Device time of fn() by kernel, largest first, and how many kernels it launched; also written to `path`
    (a remote command's output keeps only its tail, where a profile's largest rows come first)."""
    _print_profile(title, *_kernel_events(fn), rows, path)


def _print_profile(title: str, prof, kernels, rows: int = 30, path: Path | None = None) -> None:
    busy = sum(e.device_time for e in kernels)
    text = (f"profile: {title}: {len(kernels)} device ops, {busy / 1e3:.2f} ms of device time\n"
            + prof.key_averages().table(sort_by="self_device_time_total", row_limit=rows))
    print("\n" + text, flush=True)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
