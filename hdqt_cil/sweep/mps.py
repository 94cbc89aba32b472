"""CUDA MPS for the length of a sweep, so that the runs sharing a GPU run their kernels side by side instead of
taking turns (time-slicing).

`sharing()` uses a control daemon that already runs (at `$CUDA_MPS_PIPE_DIRECTORY`, default /tmp/nvidia-mps) and
leaves it running. Otherwise it starts one with pipe and log folders of the sweep's own, checks that a CUDA
context comes up through it, and quits it when the sweep ends. A guardian process in a session of its own quits
it too when the launcher dies without running its cleanup (SIGKILL, a lost terminal): a cut sweep leaves no
daemon behind. Where no daemon can start, the jobs share the GPU time-sliced, and one log line says so.

    python -m hdqt_cil.sweep.mps --guard PIPE_DIR LAUNCHER_PID    (what the guardian runs)
"""
import argparse
import logging
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
PIPE, LOG = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"


def _control(pipe_dir: str, command: str) -> subprocess.CompletedProcess:
    return subprocess.run([CONTROL], input=f"{command}\n", env={**os.environ, PIPE: pipe_dir}, capture_output=True,
                          text=True, timeout=30, check=False)


def running(pipe_dir: str) -> bool:
    """Whether a control daemon answers at `pipe_dir`."""
    return (Path(pipe_dir) / "control").exists() and _control(pipe_dir, "get_server_list").returncode == 0


def quit_daemon(pipe_dir: str, wait_s: float = 30) -> None:
    """Ask the daemon at `pipe_dir` to shut its servers down and exit; wait until its control pipe is gone."""
    if not (Path(pipe_dir) / "control").exists():
        return
    _control(pipe_dir, "quit")
    deadline = time.monotonic() + wait_s
    while (Path(pipe_dir) / "control").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def cuda_probe(env: dict) -> str:
    """'' when a process with `env` gets a CUDA context and runs a kernel, else the reason it does not."""
    code = "import torch; torch.ones(1, device='cuda').add_(1); torch.cuda.synchronize()"
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
                            text=True, timeout=300, check=False)
    return "" if result.returncode == 0 else (result.stderr.strip().splitlines() or ["the probe failed"])[-1]


def _start(folder: Path, probe=None) -> tuple[dict, str]:
    """(environment for the jobs, '') with a daemon of this sweep running, or ({}, why not)."""
    if shutil.which(CONTROL) is None:
        return {}, f"{CONTROL} is not on PATH"
    env = {PIPE: str(folder / "pipe"), LOG: str(folder / "log")}
    for path in env.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    started = subprocess.run([CONTROL, "-d"], env={**os.environ, **env}, capture_output=True, text=True,
                             timeout=30, check=False)
    deadline = time.monotonic() + 10
    while started.returncode == 0 and not running(env[PIPE]) and time.monotonic() < deadline:
        time.sleep(0.1)
    if started.returncode != 0 or not running(env[PIPE]):
        return {}, (started.stderr.strip() or f"{CONTROL} -d started no daemon")
    why = (probe or cuda_probe)(env)
    if why:
        quit_daemon(env[PIPE])
        return {}, f"no CUDA context through it ({why})"
    return env, ""


@contextmanager
def sharing(folder: Path, required: bool = False, probe=None):
    """MPS for the block: yields the environment entries the jobs need ({} for a daemon that already runs, or
    for none). `required`: fail instead of falling back to time-slicing. `probe(env)`: the check that a CUDA
    context comes up through a started daemon (cuda_probe unless given)."""
    existing = os.environ.get(PIPE, DEFAULT_PIPE_DIR)
    if shutil.which(CONTROL) is not None and running(existing):
        log.info("CUDA MPS: using the control daemon already running at %s", existing)
        yield {}
        return
    env, why = _start(folder, probe)
    if not env:
        if required:
            raise RuntimeError(f"hydra.launcher.mps=on, but CUDA MPS cannot start here: {why}")
        log.info("CUDA MPS cannot start here (%s): the jobs sharing a GPU run time-sliced", why)
        yield {}
        return
    guardian = subprocess.Popen([sys.executable, "-m", "hdqt_cil.sweep.mps", "--guard", env[PIPE], str(os.getpid())],
                                start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    log.info("CUDA MPS: started a control daemon for this sweep (pipes in %s); it stops when the sweep does",
             env[PIPE])
    try:
        yield env
    finally:
        quit_daemon(env[PIPE])
        guardian.terminate()
        guardian.wait()


def guard(pipe_dir: str, launcher: int, poll_s: float = 0.5) -> None:
    """Quit the daemon at `pipe_dir` once this process's parent is no longer `launcher` (it died, and this one
    was handed to another) or the daemon is gone."""
    while os.getppid() == launcher and (Path(pipe_dir) / "control").exists():
        time.sleep(poll_s)
    quit_daemon(pipe_dir)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Quit a sweep's MPS daemon when its launcher is gone.")
    parser.add_argument("--guard", required=True, nargs=2, metavar=("PIPE_DIR", "LAUNCHER_PID"))
    pipe_dir, launcher = parser.parse_args().guard
    guard(pipe_dir, int(launcher))
