"""scripts/cuda_graph_speedup.sh compares the two runs of its own call, whatever earlier calls left under the same
$HDQT_RESULTS: run.py is stood in for by a `python3` that writes the summary.json a run would, with given wall times."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE_RUN = """
import json, os, sys
from pathlib import Path

settings = dict(arg.split("=", 1) for arg in sys.argv[2:])
tag = settings["tag"]
wall = float(os.environ["WALL_" + tag.rsplit("-", 1)[1]])
folder = Path(os.environ["HDQT_RESULTS"]) / "digits-mlp" / settings["strategy"] / f"hdqt-{tag}" / "seed0"
folder.mkdir(parents=True)
summary = {"device": "cpu", "run": str(folder), "acc_matrix": [[50.0]], "train_loss": [1.0],
           "metrics": {"avg_acc": 50.0, "last_acc": 50.0}, "wall_time_s": wall}
(folder / "summary.json").write_text(json.dumps(summary))
"""


@pytest.fixture
def fake_python(tmp_path):
    """A folder whose python3 runs FAKE_RUN for `python3 run.py ...` and the real interpreter otherwise."""
    (tmp_path / "fake_run.py").write_text(FAKE_RUN)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/usr/bin/env bash\nif [ "$1" = run.py ]; then shift; '
                                     f'exec {sys.executable} {tmp_path}/fake_run.py run.py "$@"; fi\n'
                                     f'exec {sys.executable} "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    return bin_dir


def speedup(fake_python, results, strategy, eager, graphed):
    env = dict(os.environ, PATH=f"{fake_python}:{os.environ['PATH']}", HDQT_RESULTS=str(results),
               WALL_off=str(eager), WALL_on=str(graphed))
    done = subprocess.run(["bash", str(ROOT / "scripts" / "cuda_graph_speedup.sh"), f"strategy={strategy}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("first, second", [("lwf", "icarl"), ("icarl", "lwf")])
def test_a_call_compares_its_own_runs(fake_python, tmp_path, first, second):
    """Both orders: an earlier call's folders come before this call's in one of them, whatever order the file
    system lists folders in."""
    results = tmp_path / "results"
    assert "eager 10.0 s, CUDA graphs 5.0 s: 2.00x faster" in speedup(fake_python, results, first, 10, 5)
    assert "eager 9.0 s, CUDA graphs 3.0 s: 3.00x faster" in speedup(fake_python, results, second, 9, 3)
