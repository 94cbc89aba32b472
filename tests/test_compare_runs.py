"""scripts/compare_runs.py: two trees of run folders are the same, bit for bit, or the differing runs are named."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("compare_runs", ROOT / "scripts" / "compare_runs.py")
compare_runs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_runs)


def write_run(root: Path, run: str, **changes):
    summary = {"status": "complete", "acc_matrix": [[90.0]], "class_acc": [[90.0, 90.0]], "train_loss": [[0.5]],
               "class_order": [1, 0], **changes}
    (root / run).mkdir(parents=True)
    (root / run / "summary.json").write_text(json.dumps(summary))


def test_equal_trees_pass_and_a_changed_loss_or_a_missing_run_is_named(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        write_run(root, "x/seed0")
    write_run(a, "x/seed1")
    write_run(b, "x/seed1", train_loss=[[0.5000001]])
    write_run(a, "x/seed2")
    assert compare_runs.differences(a, a) == []
    assert compare_runs.differences(a, b) == ["x/seed1: train_loss differ", f"x/seed2: missing in {b}"]
    assert compare_runs.main([str(a), str(b)]) == 1 and compare_runs.main([str(a), str(a)]) == 0


def test_a_tree_without_runs_fails_and_says_so(tmp_path, capsys):
    """'0 runs identical' read as a pass; a misspelt tree is no evidence that two trees agree."""
    write_run(tmp_path / "b", "x/seed0")
    assert compare_runs.main([str(tmp_path / "typo"), str(tmp_path / "b")]) == 1
    assert capsys.readouterr().err == f"no run folders (summary.json) under {tmp_path / 'typo'}\n"
