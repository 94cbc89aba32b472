"""The console commands: `hdqt-cil [group=member ...] [key=value ...]` (also `python run.py ...`) runs an experiment
or a sweep from the configs shipped in the package (hdqt_cil/configs), from any folder; `hdqt-cil-tables RUNS
--out DIR` makes the tables (hdqt_cil.results)."""
import logging
import os
import signal
import sys
import warnings

# avalanche imports qpsolvers, which imports every QP solver installed; two of them load jax (about a second of
# every run's start, and a garbage-collector callback at every collection). No strategy here solves a QP, and the
# command's process has no other use for jax: its import fails there, and qpsolvers leaves those two solvers out.
sys.modules.setdefault("jax", None)

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.types import RunMode  # noqa: E402

from .config import refuse_misspelt_overrides, register_schemas  # noqa: E402
from .results.__main__ import main as tables  # noqa: E402
from .run_folder import RunInUse  # noqa: E402
from .sweep.preemption import Redelivered  # noqa: E402
from .trainer.monitor import Diverged  # noqa: E402

register_schemas()
# avalanche imports an optional QP solver it never needs here and deprecates its own internals: not the user's concern.
warnings.filterwarnings("ignore", message="no QP solver found")
warnings.filterwarnings("ignore", message="No loggers specified")
warnings.filterwarnings("ignore", category=DeprecationWarning, module="avalanche")

__all__ = ["main", "tables"]

# What a user's input can be refused with: the message names the bad value or file and what is allowed (a run
# folder that holds another config's or other data's run: FileExistsError, saying what to set; one that another
# process is writing: RunInUse).
REFUSALS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, PermissionError, RunInUse)


class Terminated(BaseException):
    """SIGTERM (`timeout`, `docker stop`, a scheduler that does not requeue) ends a run as Ctrl-C does: recorded in
    its folder, resumable. A BaseException, as KeyboardInterrupt, so that no `except Exception` swallows it."""


def _terminate(signum, frame):
    raise Terminated()


def end_single_run(error: BaseException) -> None:
    """A refused value or file, a diverged run (`on_divergence=stop`), Ctrl-C or SIGTERM ends the process with one
    message and no traceback (exit 2, 1, 130, 143): each is an outcome the user acts on, not a fault in the code;
    anything else, and everything under HYDRA_FULL_ERROR=1, returns so that the caller re-raises it."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return
    for ending, name, code in ((KeyboardInterrupt, "interrupted", 130), (Terminated, "terminated (SIGTERM)", 143)):
        if isinstance(error, ending):
            print(f"{name}: the run folder records it; the same command resumes from its last checkpoint",
                  file=sys.stderr)
            sys.exit(code)
    if isinstance(error, Diverged):
        print(f"stopped: {error}; the run folder records it (status 'diverged')", file=sys.stderr)
        sys.exit(1)
    if isinstance(error, REFUSALS):
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    """The command: a misspelt setting is refused with its nearest names before Hydra composes (exit 2)."""
    try:
        refuse_misspelt_overrides(sys.argv[1:])
    except ValueError as error:
        end_single_run(error)
        raise
    run_or_sweep()


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def run_or_sweep(cfg):
    import torch

    from .experiment import run, run_table
    from .run_folder import discard_unclaimed
    from .sweep import record_job
    from .sweep.gpu_slots import job_gpu
    from .sweep.preemption import keep_ending_signals

    hydra_cfg = HydraConfig.get()
    run_dir = hydra_cfg.runtime.output_dir
    if hydra_cfg.mode != RunMode.MULTIRUN:
        signal.signal(signal.SIGTERM, Redelivered(_terminate))
        try:
            run(cfg, run_dir)
        except BaseException as error:
            discard_unclaimed(run_dir, cfg.results_root)  # a refused config leaves nothing behind
            end_single_run(error)
            raise
        print(run_table(run_dir))
        return
    keep_ending_signals()  # a SLURM job's pre-emption handler (submitit's) must not be lost
    try:  # in a sweep, one failed job must not stop the others (hdqt_cil/sweep/report.py)
        with job_gpu(hydra_cfg.job.num, torch.cuda.device_count()) as gpu:
            run(cfg, run_dir, gpu=gpu)
        print(run_table(run_dir))
        record_job(hydra_cfg.sweep.dir, hydra_cfg.job.num, run_dir, hydra_cfg.overrides.task, None)
    except Exception as error:  # noqa: BLE001  (recorded, logged and reported at the sweep's end)
        logging.getLogger("run").exception("job failed")
        discard_unclaimed(run_dir, cfg.results_root)
        record_job(hydra_cfg.sweep.dir, hydra_cfg.job.num, run_dir, hydra_cfg.overrides.task, error)


if __name__ == "__main__":
    main()
