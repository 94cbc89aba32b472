"""scripts/compare_runs.py: two trees of run folders are the same, bit for bit, or the differing runs are named."""
import importlib.util
import json
import math
import tarfile
from pathlib import Path

from hdqt_cil.files import write_json

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


def test_runs_written_with_a_bare_nan_equal_the_same_runs_written_with_null(tmp_path):
    """A number that was not finite is null in the project's JSON, a bare NaN in files written before: a tree of
    either compares equal to the same runs in the other."""
    bare, null = tmp_path / "bare", tmp_path / "null"
    matrix = [[90.0, math.nan], [80.0, 85.0]]
    write_run(bare, "x/seed0", acc_matrix=matrix)
    write_json(null / "x" / "seed0" / "summary.json", json.loads((bare / "x" / "seed0" / "summary.json").read_text()))
    assert "NaN" in (bare / "x" / "seed0" / "summary.json").read_text()
    assert "null" in (null / "x" / "seed0" / "summary.json").read_text()
    assert compare_runs.differences(bare, null) == [] and compare_runs.differences(null, bare) == []
    write_run(null, "x/seed1", acc_matrix=matrix)
    write_run(bare, "x/seed1", acc_matrix=[[90.0, 0.0], [80.0, 85.0]])
    assert compare_runs.differences(null, bare) == ["x/seed1: acc_matrix differ"]


def test_a_tree_without_runs_fails_and_says_so(tmp_path, capsys):
    """'0 runs identical' read as a pass; an empty tree is no evidence that two trees agree."""
    write_run(tmp_path / "b", "x/seed0")
    (tmp_path / "empty").mkdir()
    assert compare_runs.main([str(tmp_path / "empty"), str(tmp_path / "b")]) == 1
    assert capsys.readouterr().err == f"no run folders (summary.json) under {tmp_path / 'empty'}\n"


def archive(path: Path, *folders: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for folder in folders:
            tar.add(folder, arcname=folder.name)
    return path


def test_either_tree_may_be_an_archive_of_one_folder_that_stands_for_that_folder(tmp_path, capsys):
    """runs.tgz of `runs/` compares with the folder `runs` (make_tables reads the two alike): by the runs' paths
    below it; a missing run is named missing in the archive, not in its temporary copy."""
    a, b = tmp_path / "a" / "runs", tmp_path / "b" / "runs"
    for root in (a, b):
        write_run(root, "x/seed0")
    write_run(a, "x/seed1")
    write_run(b, "x/seed1", train_loss=[[0.5000001]])
    write_run(a, "x/seed2")
    a_tgz, b_tgz = archive(tmp_path / "a.tgz", a), archive(tmp_path / "b.tgz", b)
    assert compare_runs.main([str(a_tgz), str(a)]) == 0 and compare_runs.main([str(a), str(a_tgz)]) == 0
    assert capsys.readouterr().out == "3 runs identical\n3 runs identical\n"
    assert compare_runs.main([str(a_tgz), str(b_tgz)]) == 1
    assert capsys.readouterr().out == f"x/seed1: train_loss differ\nx/seed2: missing in {b_tgz}\n"


def test_an_archive_of_several_folders_stands_for_the_folder_it_unpacks_into(tmp_path, capsys):
    write_run(tmp_path / "runs" / "r_base", "x/seed0")
    write_run(tmp_path / "runs" / "r_new", "x/seed0")
    both = archive(tmp_path / "both.tgz", tmp_path / "runs" / "r_base", tmp_path / "runs" / "r_new")
    assert compare_runs.main([str(both), str(tmp_path / "runs")]) == 0
    assert capsys.readouterr().out == "2 runs identical\n"
    # one folder of it (ARCHIVE:FOLDER) stands for that folder, whatever it holds
    assert compare_runs.main([f"{both}:r_new", str(tmp_path / "runs" / "r_base")]) == 0
    assert capsys.readouterr().out == "1 run identical\n"
    assert compare_runs.main([f"{both}:r_new/x", str(tmp_path / "runs" / "r_base" / "x")]) == 0
    assert compare_runs.main([f"{both}:r_old", str(tmp_path / "runs")]) == 1
    assert capsys.readouterr().err == f"{both} holds no folder r_old\n"


def test_a_path_neither_a_folder_nor_a_readable_archive_is_named_in_one_line(tmp_path, capsys):
    write_run(tmp_path / "runs", "x/seed0")
    (tmp_path / "notes.txt").write_text("not runs")
    whole = archive(tmp_path / "whole.tgz", tmp_path / "runs").read_bytes()
    (tmp_path / "cut.tgz").write_bytes(whole[:len(whole) // 2])
    for bad, why in (("typo", "is neither a folder nor a tar archive of run folders"),
                     ("notes.txt", "is neither a folder nor a tar archive of run folders"),
                     ("cut.tgz", "is not a readable tar archive (")):
        assert compare_runs.main([str(tmp_path / "runs"), str(tmp_path / bad)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"{tmp_path / bad} {why}") and err.count("\n") == 1
