"""A sweep is checked before its jobs start, goes on past a failed job and ends by telling which jobs failed or
diverged and why.

Two jobs whose runs would share one run folder are refused before any starts, whichever launcher runs them. Hydra's
launchers re-raise the first failed job's exception when they collect results, which skips the remaining
bookkeeping. So in a sweep, run.py records each job's outcome under the sweep folder (`.jobs/<digest of the job's
overrides>.json`, outside the run folders: a job refused before it claimed its folder leaves no run folder) and
returns normally; this callback collects them at the sweep's end into `<sweep dir>/sweep_summary.md`, one section
a sweep, added below those of earlier sweeps into the same folder; it logs the failures and exits non-zero if there
were any.
"""
import hashlib
import json
import logging
import sys
import time
import traceback
from pathlib import Path

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from ..endings import end_single_run
from ..files import read_json, write_atomic, write_json

log = logging.getLogger(__name__)

JOBS = ".jobs"


def record_job(sweep_dir, job: int, folder, overrides, error: BaseException | None,
               diverged: str | None = None) -> None:
    """Record the outcome of job number `job`, whose run folder is `folder` (inside `sweep_dir`), under its
    overrides: the same job run again (requeued, restarted, its sweep started again) replaces its record, and no
    other job's: not one that shares its folder, nor one of its number in a sweep beside it into one results root.
    `diverged`: the divergence of a run that ended without an error (on_divergence=continue), which the report
    lists as such rather than among the completed ones."""
    sweep_dir, overrides = Path(sweep_dir), list(overrides)
    key = hashlib.sha256(json.dumps(overrides).encode()).hexdigest()[:16]
    write_json(sweep_dir / JOBS / f"{key}.json",
               {"job": job, "folder": Path(folder).resolve().relative_to(sweep_dir.resolve()).as_posix(),
                "overrides": overrides, "status": "failed" if error else "diverged" if diverged else "completed",
                "error": f"{type(error).__name__}: {error}" if error else diverged})


def sweep_jobs(config) -> list[list[str]]:
    """Each job's overrides, as Hydra's basic sweeper expands the command's (its params first), read unresolved: an
    override's value may interpolate the job's settings (`tag=b${quant.bits}`)."""
    params = OmegaConf.to_container(config.hydra.sweeper, resolve=False).get("params") or {}
    task = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    overrides = parser.parse_overrides([f"{key}={value}" for key, value in params.items()] + task)
    return BasicSweeper.split_arguments(overrides, None)[0]


def refuse_shared_folders(config) -> None:
    """Two jobs whose runs would share one folder (they differ only in settings that are not part of its path)
    are refused before any starts: in turn the second would find a different config in it, in parallel the folder
    held. A job that does not compose is left to the sweeper, which refuses the sweep with Hydra's message."""
    loader, seen = GlobalHydra.instance().config_loader(), {}
    for num, overrides in enumerate(sweep_jobs(config)):
        try:
            folder = loader.load_sweep_config(config, overrides).hydra.sweep.subdir
        except HydraException:
            return
        if folder in seen:
            first, other = seen[folder]
            if set(other) == set(overrides):
                raise ValueError(f"jobs #{first} and #{num} of this sweep are the same run ({folder}): a value is "
                                 "repeated in a sweep list; give each value once")
            differ = (" ".join(sorted(set(a) - set(b))) for a, b in ((other, overrides), (overrides, other)))
            raise ValueError(f"jobs #{first} and #{num} of this sweep would write one run folder, {folder}: they "
                             f"differ only in {' and '.join(differ)}, which a run folder's path does not include (it "
                             "has the benchmark, model, strategy, quant, tag and seed); sweep them as separate "
                             "commands, each with its own tag=NAME")
        seen[folder] = num, overrides


class SweepReport(Callback):
    """Checks the sweep before its jobs start and reports the jobs of this sweep at its end: those recorded after it
    started (the results root is shared with earlier sweeps, whose sections of the summary stay)."""

    def on_multirun_start(self, config, **kwargs) -> None:
        self.started = time.time()
        try:
            refuse_shared_folders(config)
        except ValueError as error:  # Hydra would make a callback's exception a warning and start the jobs
            end_single_run(error)  # one line, exit 2; under HYDRA_FULL_ERROR=1 it returns: the traceback here
            traceback.print_exc()
            sys.exit(2)

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        records = (sweep_dir / JOBS).glob("*.json") if (sweep_dir / JOBS).is_dir() else []
        jobs = sorted((read_json(p) for p in records if p.stat().st_mtime >= self.started), key=lambda j: j["job"])
        failed = [j for j in jobs if j["status"] == "failed"]
        diverged = sum(j["status"] == "diverged" for j in jobs)
        lines = [f"# Sweep of {time.strftime('%Y-%m-%d %H:%M', time.localtime(self.started))}: "
                 f"{len(jobs) - len(failed) - diverged} of {len(jobs)} jobs completed"
                 + (f", {diverged} diverged" if diverged else ""), "",
                 "| job | folder | overrides | status | error |", "|---|---|---|---|---|"]
        lines += [f"| #{j['job']} | {j['folder']} | {' '.join(j['overrides'])} | {j['status']} | {j['error'] or ''} |"
                  for j in jobs]
        summary = sweep_dir / "sweep_summary.md"
        earlier = summary.read_text() + "\n" if summary.exists() else ""
        write_atomic(summary, earlier + "\n".join(lines) + "\n")
        for j in failed:
            log.error("job #%d failed: %s → %s", j["job"], " ".join(j["overrides"]), j["error"])
        if failed:
            sys.exit(f"{len(failed)} of {len(jobs)} jobs failed; see {summary}")
