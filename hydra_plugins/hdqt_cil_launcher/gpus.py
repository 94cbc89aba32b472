"""`hydra/launcher=gpus`: a local sweep that packs several runs onto each GPU.

hydra-joblib-launcher's processes run the jobs; this launcher decides how many at once (GPUs × jobs_per_gpu),
hands each job a GPU slot (hdqt_cil/sweep/gpu_slots.py) and keeps CUDA MPS up for the sweep's length
(hdqt_cil/sweep/mps.py). loky's workers live for the whole sweep, so a worker imports torch and loads the kernels
once for all the jobs it runs. Without a GPU, jobs run on the CPU, `n_jobs` at a time (default 1).

Each job's CPU thread pools (OpenMP, MKL, OpenBLAS) get its GPU's share of the host's cores, split among that
GPU's jobs (`threads_per_job`). joblib's own limit, cores // n_jobs, counts only this sweep's jobs: sweeps started
side by side on one host, each on its own GPUs, would otherwise together ask for several threads a core.

A job process that dies (a segfault, the OOM killer, a GPU fault: under MPS one ends every process on that GPU)
breaks loky's pool and with it every running job. The launcher then starts the sweep again, `restarts` times at
most, with fresh workers (and a fresh MPS daemon where it started one): finished runs are skipped, unfinished ones
resume from their checkpoints (experiment.run).
"""
import logging
import os
import signal
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence
from unittest.mock import patch

from hydra.core.config_store import ConfigStore
from joblib import cpu_count
from hydra_plugins.hydra_joblib_launcher.config import JobLibLauncherConf
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher

log = logging.getLogger(__name__)

MPS_MODES = ("auto", "on", "off")


@dataclass
class GpusLauncherConf(JobLibLauncherConf):
    _target_: str = "hydra_plugins.hdqt_cil_launcher.gpus.GpusLauncher"
    n_jobs: Optional[int] = None  # jobs at once; null: GPUs x jobs_per_gpu (1 without a GPU)
    jobs_per_gpu: Any = "auto"  # a positive integer, or auto: jobs_per_gpu_by_model's figure for the sweep's model
    jobs_per_gpu_by_model: dict = field(default_factory=dict)
    default_jobs_per_gpu: int = 1  # auto, for a model the table does not name
    mps: str = "auto"  # auto: CUDA MPS when more than one job shares a GPU and it can start | on | off
    restarts: int = 1  # times the sweep starts again after a job process died
    threads_per_job: Optional[int] = None  # CPU threads of a job; null: threads_per_job()'s share of the cores


ConfigStore.instance().store(group="hydra/launcher", name="gpus_base", node=GpusLauncherConf,
                             provider="hdqt_cil_launcher")


def device_count() -> int:
    import torch  # noqa: PLC0415 (not needed to compose configs)

    return torch.cuda.device_count()


def sweep_models(job_overrides: Sequence[Sequence[str]], default: str) -> set[str]:
    """The model names the jobs run: their `model=` overrides, else the composed default."""
    models = {o.split("=", 1)[1] for overrides in job_overrides for o in overrides if o.startswith("model=")}
    return models or {default}


def jobs_per_gpu(setting, by_model: dict, fallback: int, models: set[str]) -> int:
    """The `jobs_per_gpu` setting as a number: auto takes the smallest table entry of the sweep's models."""
    if setting == "auto":
        return min(int(by_model.get(m, fallback)) for m in models)
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        raise ValueError(f"hydra.launcher.jobs_per_gpu={setting!r} must be a positive integer or auto")
    return setting


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def host_gpu_count(visible: int) -> int:
    """The host's NVIDIA GPUs, whatever CUDA_VISIBLE_DEVICES hides (the driver's /proc entries); else `visible`."""
    folder = Path("/proc/driver/nvidia/gpus")
    return max(len(list(folder.iterdir())), visible) if folder.is_dir() else visible


def threads_per_job(setting, cores: int, host_gpus: int, per_gpu: int) -> int:
    """The `threads_per_job` setting as a number: null takes each GPU's share of the cores split among its jobs."""
    return max(1, cores // (max(host_gpus, 1) * per_gpu)) if setting is None else setting


class GpusLauncher(JoblibLauncher):
    def __init__(self, jobs_per_gpu, jobs_per_gpu_by_model, default_jobs_per_gpu, mps, restarts=1,
                 threads_per_job=None, **joblib) -> None:
        if mps not in MPS_MODES:
            raise ValueError(f"hydra.launcher.mps={mps!r} must be one of {', '.join(MPS_MODES)}")
        if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
            raise ValueError(f"hydra.launcher.restarts={restarts!r} must be an integer ≥ 0")
        if threads_per_job is not None and (isinstance(threads_per_job, bool) or not isinstance(threads_per_job, int)
                                            or threads_per_job < 1):
            raise ValueError(f"hydra.launcher.threads_per_job={threads_per_job!r} must be a positive integer or null")
        super().__init__(**joblib)
        self.jobs_per_gpu, self.mps, self.restarts = jobs_per_gpu, mps, restarts
        self.by_model, self.fallback = dict(jobs_per_gpu_by_model), default_jobs_per_gpu
        self.threads = threads_per_job

    def launch(self, job_overrides, initial_job_idx):
        """The sweep's jobs; a SIGTERM to the sweep (`kill`, a scheduler) ends their processes with it, as Ctrl-C
        does: loky's workers outlive a parent killed outright and would train on, holding their run folders."""
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            return self._launch_restarting(job_overrides, initial_job_idx)
        except BaseException:
            _stop_workers()
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _launch_restarting(self, job_overrides, initial_job_idx):
        from joblib.externals.loky.process_executor import TerminatedWorkerError  # noqa: PLC0415

        for attempt in range(self.restarts + 1):
            try:
                return self._launch_once(job_overrides, initial_job_idx)
            except TerminatedWorkerError as died:
                if attempt == self.restarts:
                    raise
                log.warning("a job process died (%s); starting the sweep again (restart %d of %d): finished runs "
                            "are skipped, the others resume from their checkpoints",
                            str(died).splitlines()[0], attempt + 1, self.restarts)
                _stop_workers()

    def _launch_once(self, job_overrides, initial_job_idx):
        gpus = device_count()
        per_gpu = jobs_per_gpu(self.jobs_per_gpu, self.by_model, self.fallback,
                               sweep_models(job_overrides, self.config.model.name))
        if self.joblib.get("n_jobs") is None:
            self.joblib["n_jobs"] = gpus * per_gpu if gpus else 1
        with ExitStack() as stack:
            if gpus:
                from hdqt_cil.sweep import gpu_slots, mps  # noqa: PLC0415

                folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hdqt-sweep-")))
                env = gpu_slots.announce(folder / "slots", gpus, per_gpu)
                threads = threads_per_job(self.threads, cpu_count(), host_gpu_count(gpus), per_gpu)
                # a setting overrides the environment's thread counts; the share only fills them in
                env |= {name: str(threads) for name in THREAD_VARIABLES if self.threads or name not in os.environ}
                if per_gpu > 1 and self.mps != "off":
                    env |= stack.enter_context(mps.sharing(folder / "mps", required=self.mps == "on"))
                    stack.callback(_stop_workers)  # before the daemon quits: it waits for its clients
                stack.enter_context(patch.dict(os.environ, env))  # the job processes inherit it
                log.info("%d GPU(s) x %d job(s) each, %d at once, %s CPU thread(s) a job", gpus, per_gpu,
                         self.joblib["n_jobs"], os.environ["OMP_NUM_THREADS"])
            else:
                log.warning("no CUDA GPU here: the jobs train on the CPU, %d at once (hydra.launcher.n_jobs)",
                            self.joblib["n_jobs"])
            return super().launch(job_overrides, initial_job_idx)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def _stop_workers() -> None:
    """End the sweep's job processes (loky keeps them for reuse, and with them their CUDA contexts)."""
    from joblib.externals.loky import get_reusable_executor  # noqa: PLC0415

    get_reusable_executor(reuse=True).shutdown(wait=True, kill_workers=True)
