"""SLURM pre-emption through submitit's local executor: the job is signalled, requeued and resumes its run.

The local executor runs the real requeue path: submitit's SIGUSR2 handler calls the Hydra launcher's
`checkpoint` (a DelayedSubmission of the same job), exits with the local requeue code, and the local controller
starts the job again. The test signals the job's task process, as SLURM does and as the local controller itself
does near a timeout (not `LocalJob._interrupt`: it signals the controller, which SIGUSR2 would kill).
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from hdqt_cil.experiment import run

ROOT = Path(__file__).resolve().parents[1]
RUN = "digits-mlp/icarl/fp32/seed0"
CONFIG = ["strategy=icarl", "quant=fp32", "benchmark.n_experiences=null", "benchmark.classes_per_exp=4",
          "trainer.epochs=20", "trainer.device=cpu", "logging.progress=off"]  # 3 experiences


def _start(results_root, *flags):
    return subprocess.Popen([sys.executable, "run.py", *flags, f"results_root={results_root}", *CONFIG], cwd=ROOT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _submitit_task(submitit_folder: Path) -> int:
    """The pid of the process running the submitted job (not the local controller that started it)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode().split("\0")
        except OSError:  # the process ended meanwhile
            continue
        if "submitit.core._submit" in args and any(a.startswith(str(submitit_folder)) for a in args):
            return int(cmdline.parent.name)
    raise LookupError(f"no submitit task for {submitit_folder}")


def test_preempted_job_is_requeued_and_resumes_to_the_uninterrupted_result(tmp_path, make_cfg, one_thread):
    """The uninterrupted run in this process, on one thread as the job's, while the requeued job starts."""
    sweep = _start(tmp_path / "sweep", "-m", "hydra/launcher=submitit_local")
    latest = tmp_path / "sweep" / RUN / "checkpoints/latest"
    deadline = time.time() + 120
    while not (latest.exists() and latest.read_text().strip() == "exp001") and time.time() < deadline:
        time.sleep(0.05)
    assert sweep.poll() is None, "the sweep finished before it could be pre-empted"
    os.kill(_submitit_task(tmp_path / "sweep" / ".submitit"), signal.SIGUSR2)
    want = run(make_cfg(*CONFIG), tmp_path / "ref")
    _, err = sweep.communicate(timeout=300)
    assert sweep.returncode == 0, err

    (log,) = (tmp_path / "sweep" / ".submitit").glob("*/*_0_log.out")
    log = log.read_text()
    assert "this job is preempted" in log and "Requeued job" in log  # (how often submitit logs its start varies)
    resumed = re.search(r"resuming \S+ after experience (\d)", (tmp_path / "sweep" / RUN / "run.log").read_text())
    assert resumed and int(resumed.group(1)) >= 1, "the requeued job did not resume from its checkpoint"

    got = json.loads((tmp_path / "sweep" / RUN / "summary.json").read_text())
    assert got["status"] == "complete" and not latest.exists()
    np.testing.assert_array_equal(np.array(got["acc_matrix"], float), np.array(want["acc_matrix"], float))
    np.testing.assert_array_equal(np.array(got["class_acc"], float), np.array(want["class_acc"], float))
    assert "1 of 1 jobs completed" in (tmp_path / "sweep" / "sweep_summary.md").read_text()
