"""The console commands: `hdqt-cil [group=member ...] [key=value ...]` (also `python run.py ...`) runs an experiment
or a sweep from the configs shipped in the package (hdqt_cil/configs), from any folder; `hdqt-cil-tables RUNS
--out DIR` makes the tables (hdqt_cil.results)."""
import logging
import signal
import sys
import warnings

# avalanche imports qpsolvers, which imports every QP solver installed; two of them load jax (about a second of
# every run's start, and a garbage-collector callback at every collection). No strategy here solves a QP, and the
# command's process has no other use for jax: its import fails there, and qpsolvers leaves those two solvers out.
sys.modules.setdefault("jax", None)

import hydra  # noqa: E402
from hydra._internal.hydra import Hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.types import RunMode  # noqa: E402

from .config import refuse_misspelt_overrides, register_schemas  # noqa: E402
from .results.__main__ import main as tables  # noqa: E402
from .endings import end_single_run, terminate  # noqa: E402
from .sweep.preemption import Redelivered  # noqa: E402

register_schemas()
# avalanche imports an optional QP solver it never needs here and deprecates its own internals: not the user's concern.
warnings.filterwarnings("ignore", message="no QP solver found")
warnings.filterwarnings("ignore", message="No loggers specified")
warnings.filterwarnings("ignore", category=DeprecationWarning, module="avalanche")

__all__ = ["main", "tables"]

_hydra_node_alone = Hydra.get_sanitized_hydra_cfg


def _hydra_node_with_the_job_above(src_cfg):
    """Hydra's node alone, as `--cfg hydra` prints it, still under the whole config (as HydraConfig.set_config
    keeps it): hydra.run.dir and hydra.sweep.* name the run folder from the job's settings (results_root, seed,
    ...), which `--resolve` could not find once Hydra had dropped them."""
    cfg = _hydra_node_alone(src_cfg)
    cfg.hydra._set_parent(src_cfg)
    return cfg


Hydra.get_sanitized_hydra_cfg = staticmethod(_hydra_node_with_the_job_above)


def main() -> None:
    """The command: a misspelt setting or an unknown group member is refused with its nearest names before Hydra
    composes (exit 2)."""
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
        signal.signal(signal.SIGTERM, Redelivered(terminate))
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
            summary = run(cfg, run_dir, gpu=gpu)
        print(run_table(run_dir))
        diverged = summary["error"]["message"] if summary["status"] == "diverged" else None
        record_job(hydra_cfg.sweep.dir, hydra_cfg.job.num, run_dir, hydra_cfg.overrides.task, None, diverged)
    except Exception as error:  # noqa: BLE001  (recorded, logged and reported at the sweep's end)
        logging.getLogger("run").exception("job failed")
        discard_unclaimed(run_dir, cfg.results_root)
        record_job(hydra_cfg.sweep.dir, hydra_cfg.job.num, run_dir, hydra_cfg.overrides.task, error)


if __name__ == "__main__":
    main()
