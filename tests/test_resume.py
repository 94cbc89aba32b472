"""Runs that survive: a real process killed with SIGKILL mid-experience resumes to the identical result."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _cmd(results_root, *overrides):
    return [sys.executable, "run.py", f"results_root={results_root}", "logging.progress=off", "trainer.device=cpu",
            *overrides]


def _summary(results_root, strategy, quant="fp32"):
    return json.loads((results_root / f"digits-mlp/{strategy}/{quant}/seed0/summary.json").read_text())


@pytest.mark.parametrize("strategy,quant", [("icarl", "fp32"), ("bic", "hdqt"), ("lwf", "hot")])
def test_sigkill_mid_experience_then_resume_matches_uninterrupted(tmp_path, strategy, quant):
    """Stochastic rounding draws from per-layer step counters and HOT keeps its LQS choices in buffers: both must
    resume exactly too."""
    overrides = [f"strategy={strategy}", f"quant={quant}", "trainer.epochs=30", "trainer.milestones=[20]",
                 *(["strategy.stage_2_epochs=5"] if strategy == "bic" else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    reference = subprocess.run(_cmd(tmp_path / "ref", *overrides), cwd=ROOT, env=env, capture_output=True,
                               text=True, timeout=600)
    assert reference.returncode == 0, reference.stderr

    killed = tmp_path / "killed"
    latest = killed / f"digits-mlp/{strategy}/{quant}/seed0/checkpoints/latest"
    proc = subprocess.Popen(_cmd(killed, *overrides), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (latest.exists() and latest.read_text().strip() == "exp002") and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    time.sleep(0.3)  # well inside experience 2 (0-based): each experience trains 30 epochs
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _summary(killed, strategy, quant)["status"] == "running"

    resumed = subprocess.run(_cmd(killed, *overrides), cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr + resumed.stdout
    got, want = _summary(killed, strategy, quant), _summary(tmp_path / "ref", strategy, quant)
    assert got["status"] == "complete"
    np.testing.assert_array_equal(np.array(got["acc_matrix"], float), np.array(want["acc_matrix"], float))
    np.testing.assert_array_equal(np.array(got["class_acc"], float), np.array(want["class_acc"], float))


def test_divergence_is_recorded_and_optionally_lets_a_sweep_go_on(tmp_path):
    bad = ["strategy=naive", "quant=fp32", "trainer.epochs=2", "trainer.lr=1e30"]
    stopped = subprocess.run(_cmd(tmp_path / "a", *bad), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert stopped.returncode != 0
    summary = _summary(tmp_path / "a", "naive")
    assert summary["status"] == "diverged"
    assert summary["error"]["experience"] == 0 and summary["error"]["epoch"] == 1
    assert "non-finite" in summary["error"]["message"]

    going_on = subprocess.run(_cmd(tmp_path / "b", *bad, "on_divergence=continue"), cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
    assert going_on.returncode == 0, going_on.stderr
    assert "| digits | mlp | naive | fp32 | diverged | diverged |" in going_on.stdout
