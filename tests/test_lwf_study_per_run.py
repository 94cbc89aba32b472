"""scripts/lwf_study_per_run.py: the LwF class-order study's per-run table, and a root without its runs refused."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("lwf_study_per_run", ROOT / "scripts" / "lwf_study_per_run.py")
study = importlib.util.module_from_spec(spec)
spec.loader.exec_module(study)


def write_run(root: Path, order: str, seed: int, avg: float, last: float, status: str = "complete"):
    folder = root / "hapt-mlp" / "lwf" / order / f"seed{seed}"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({
        "status": status, "run": {"seed": seed}, "metrics": {"avg_acc": avg, "last_acc": last},
        "seen_acc": [90.0, last], "class_order": [1, 0], "wall_time_s": 12.0}))


def test_each_order_counts_the_runs_that_reach_the_authors_numbers(tmp_path, capsys):
    write_run(tmp_path, "fp32", 0, 60.0, 35.0)
    write_run(tmp_path, "fp32", 1, 50.0, 35.0)
    write_run(tmp_path, "fp32", 2, 10.0, 5.0, status="diverged")  # not a complete run: left out
    study.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "| fp32 | 2 | 55.0 ± 7.1 | 35.0 ± 0.0 | 1/2 | 2/2 | 1/2 | 50.0 / 55.0 / 60.0 | 35.0 / 35.0 / 35.0 |" in out
    assert "| 1 | 50.0 | 35.0 | 90.0 35.0 | [1, 0] | 12 |" in out


def test_a_root_without_the_study_runs_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no complete LwF HAPT run folders under"):
        study.main([str(tmp_path)])
