"""scripts/gpu_check.sh in the environment the README's set-up builds: the pytest options it passes exist there,
and without a CUDA GPU it stops at once with one line instead of running into its time limits."""
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _pytest_options(script: Path) -> set[str]:
    """The long options of every `-m pytest` command in a shell script (continued lines joined)."""
    text = script.read_text().replace("\\\n", " ")
    commands = [line.split("-m pytest", 1)[1] for line in text.splitlines()
                if "-m pytest" in line and not line.lstrip().startswith("#")]
    return {option for command in commands for option in re.findall(r"(?<![\w-])--[a-z][a-z-]*", command)}


def test_the_script_passes_pytest_only_options_the_test_extras_provide():
    assert _pytest_options(SCRIPT), "the script runs pytest"
    usage = subprocess.run([sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True,
                           cwd=ROOT).stdout
    missing = {option for option in _pytest_options(SCRIPT) if not re.search(rf"(?<![\w-]){option}\b", usage)}
    assert not missing, f"pytest here has no {sorted(missing)}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the check is of a machine without a CUDA GPU")
def test_without_a_cuda_gpu_it_stops_at_once(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path))
    proc = subprocess.Popen(["bash", str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the script and the pytest it started
        proc.communicate()
        pytest.fail("gpu_check.sh ran on without a CUDA GPU")
    assert proc.returncode == 2
    expected = f"gpu_check.sh: needs a CUDA GPU, and torch ({sys.executable}) sees none here"
    assert err.strip().splitlines()[-1] == expected
