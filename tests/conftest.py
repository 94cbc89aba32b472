import logging
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hdqt_cil.config import compose_run, register_schemas

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

register_schemas()


def _share_the_cores() -> None:
    """Each pytest-xdist worker, and every command its tests start, trains on its share of the machine's cores:
    torch's OpenMP threads spin while they wait, so workers that each take every core slow each other down (the
    training-loss tests of test_strategies.py: 128 s on two workers of two threads on two cores, 49 s with one)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


_share_the_cores()


@pytest.fixture
def make_cfg(tmp_path):
    """Compose the project config with overrides, results and data under tmp_path."""
    def _make(*overrides):
        quant = [] if any(o.startswith("quant=") for o in overrides) else ["quant=fp32"]  # fast unless asked
        return compose_run([f"results_root={tmp_path}/runs", f"data_root={tmp_path}/data", "logging.progress=off",
                            *quant, *overrides])
    return _make


@pytest.fixture(scope="session", autouse=True)
def _machine_cache(tmp_path_factory):
    """The per-machine cache (decoded datasets, kernels compiled here) of this test session alone."""
    os.environ["HDQT_CACHE"] = str(tmp_path_factory.mktemp("hdqt_cache"))
    yield


@pytest.fixture(autouse=True)
def _quiet_threads():
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    yield


@pytest.fixture
def one_thread():
    """Tiny layers: one thread avoids OpenMP hand-offs that dominate on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _run_on_one_thread(cfg, run_dir) -> None:
    from hdqt_cil.experiment import run

    torch.set_num_threads(1)
    run(cfg, run_dir)


def start_run(cfg, run_dir) -> multiprocessing.Process:
    """A process of its own training run(cfg, run_dir) on one thread, for a test to kill: forked from a server that
    imported the package once for this test worker, it starts at once where `python run.py` spends ~15 s importing
    (the forked server has trained nothing, so no OpenMP threads are forked)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["hdqt_cil.experiment"])
    proc = context.Process(target=_run_on_one_thread, args=(cfg, run_dir), daemon=True)
    proc.start()
    return proc


@pytest.fixture
def run_in_process(capsys, monkeypatch):
    """`python run.py ARGS` as a call of its entry point in this process: what it prints and its exit status, as
    subprocess.run gives them, without the ~15 s start of a command (tests/test_cli.py keeps a real process of each
    command-line path). Hydra's logging set-up and the sweep's signal handlers are undone afterwards."""
    from hdqt_cil.cli import main

    def _run(*args) -> subprocess.CompletedProcess:
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        signals = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGUSR2)}
        monkeypatch.setattr(sys, "argv", ["run.py", *map(str, args)])
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as end:
            code = end.code if isinstance(end.code, int) else int(end.code is not None)
        finally:
            for handler in set(root.handlers) - set(handlers):
                handler.close()
            root.handlers[:] = handlers
            root.setLevel(level)
            for signum, handler in signals.items():
                signal.signal(signum, handler)
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["run.py", *args], code, out.out, out.err)
    return _run
