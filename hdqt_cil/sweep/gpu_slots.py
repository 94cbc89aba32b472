"""Which GPU a sweep job runs on when several jobs share each GPU.

The launcher makes a folder of GPUs × jobs_per_gpu slot files and names it in `HDQT_GPU_SLOTS` for its jobs. A job
holds one slot's lock for its whole run: first the slot of its own number (so job k runs on GPU k mod #GPUs when
that slot is free, as with one job a GPU), else the next free one. A GPU so never holds more than jobs_per_gpu
runs, even when jobs of unequal length finish out of order, and a job that dies releases its slot with its
process. Without the variable (a single run, another launcher), job k takes GPU k mod #GPUs.
"""
import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

ENV = "HDQT_GPU_SLOTS"


def announce(folder: Path, gpus: int, per_gpu: int) -> dict[str, str]:
    """The environment entry that tells a sweep's jobs its slots."""
    folder.mkdir(parents=True, exist_ok=True)
    return {ENV: f"{gpus}:{per_gpu}:{folder}"}


def _try_lock(path: Path):
    handle = open(path, "a+b")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return handle
    except BlockingIOError:
        handle.close()
        return None


def claim(folder: Path, gpus: int, per_gpu: int, job: int):
    """(GPU index, open slot handle or None): the first free slot from `job`'s own; None when every slot is held
    (then GPU job mod gpus, like a sweep without slots)."""
    slots = gpus * per_gpu
    for step in range(slots):
        slot = (job + step) % slots
        handle = _try_lock(folder / f"slot{slot}")
        if handle is not None:
            return slot % gpus, handle
    return job % gpus, None


@contextmanager
def job_gpu(job: int, device_count: int):
    """The GPU index for sweep job `job` while the block runs (see the module's docstring)."""
    announced = os.environ.get(ENV)
    if not announced or device_count == 0:
        yield job % max(device_count, 1)
        return
    gpus, per_gpu, folder = announced.split(":", 2)
    gpu, handle = claim(Path(folder), min(int(gpus), device_count), int(per_gpu), job)
    try:
        yield gpu
    finally:
        if handle is not None:
            handle.close()
