"""A HAR feature file that is not there is refused in one line naming it and the command that makes it, with the
option the docs lead with, by a run and by the diagnostics benchmark alike."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from data_prep import cli, hapt
from hdqt_cil.benchmarks import har

ROOT = Path(__file__).resolve().parents[1]


def test_the_message_names_the_archive_option_and_only_options_data_prep_has(make_cfg, tmp_path):
    with pytest.raises(FileNotFoundError) as refused:
        har.load(make_cfg("benchmark=hapt").benchmark, 0)
    message = str(refused.value)
    path = tmp_path / "data" / "hapt_features.npz"
    assert f"make it from the release's archive with `python -m data_prep.hapt --archive ARCHIVE --out {path}`" \
        in message
    options = {o for action in cli.parser(hapt.HAPT, hapt.__doc__)._actions for o in action.option_strings}
    assert set(re.findall(r"--[a-z-]+", message)) <= options


def test_the_diagnostics_benchmark_ends_in_that_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "scripts.bench.diagnostics_cpu", "--data-root", str(tmp_path)],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: benchmark.path={tmp_path}/hapt_features.npz: no such file (benchmark hapt); "
                           "make it from the release's archive with `python -m data_prep.hapt --archive ARCHIVE")
    assert "Traceback" not in done.stderr
