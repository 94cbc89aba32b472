"""A sweep goes on past a failed job and ends by telling which jobs failed and why.

Hydra's launchers re-raise the first failed job's exception when they collect results, which skips the
remaining bookkeeping. So in a sweep, run.py records each job's outcome in `job.json` in its folder and returns
normally; this callback collects them at the sweep's end into `<sweep dir>/sweep_summary.md`, logs the
failures and exits non-zero if there were any.
"""
import logging
import sys
import time
from pathlib import Path

from hydra.experimental.callback import Callback

from ..files import read_json, write_atomic, write_json

log = logging.getLogger(__name__)


def record_job(folder, overrides, error: BaseException | None) -> None:
    write_json(Path(folder) / "job.json", {"overrides": list(overrides), "status": "failed" if error else "completed",
                                          "error": f"{type(error).__name__}: {error}" if error else None})


class SweepReport(Callback):
    """Reports the jobs of this sweep: those whose job.json was written after it started (the results root is
    shared with earlier sweeps)."""

    def on_multirun_start(self, config, **kwargs) -> None:
        self.started = time.time()

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = [read_json(p) | {"folder": str(p.parent.relative_to(sweep_dir))}
                for p in sorted(sweep_dir.rglob("job.json")) if p.stat().st_mtime >= self.started]
        failed = [j for j in jobs if j["status"] == "failed"]
        lines = [f"# Sweep: {len(jobs) - len(failed)} of {len(jobs)} jobs completed", "",
                 "| folder | overrides | status | error |", "|---|---|---|---|"]
        lines += [f"| {j['folder']} | {' '.join(j['overrides'])} | {j['status']} | {j['error'] or ''} |" for j in jobs]
        write_atomic(sweep_dir / "sweep_summary.md", "\n".join(lines) + "\n")
        for j in failed:
            log.error("failed: %s → %s", " ".join(j["overrides"]), j["error"])
        if failed:
            sys.exit(f"{len(failed)} of {len(jobs)} jobs failed; see {sweep_dir / 'sweep_summary.md'}")
