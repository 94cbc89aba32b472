"""A run records which code trained it: the source's fingerprint, a commit's from git, each process of a resumed
run."""
import shutil
import subprocess
from pathlib import Path

import pytest

import hdqt_cil.experiment as experiment
from hdqt_cil.code_version import fingerprint, processes_code
from hdqt_cil.results.metrics import AccuracyHistory
from scripts.code_fingerprint import commit_fingerprint


def _tree(root: Path) -> Path:
    (root / "hdqt_cil" / "quant").mkdir(parents=True)
    (root / "hydra_plugins").mkdir()
    (root / "hdqt_cil" / "quant" / "layers.py").write_text("x = 1\n")
    (root / "hdqt_cil" / "kernels.cu").write_text("// kernel\n")
    (root / "hdqt_cil" / "settings.yaml").write_text("bits: 4\n")
    (root / "hydra_plugins" / "launcher.py").write_text("y = 2\n")
    (root / "run.py").write_text("print()\n")
    return root


def test_the_fingerprint_follows_the_source_and_nothing_built_from_it(tmp_path):
    root = _tree(tmp_path)
    before = fingerprint(root)
    (root / "hdqt_cil" / "__pycache__").mkdir()
    (root / "hdqt_cil" / "__pycache__" / "layers.cpython-312.pyc").write_bytes(b"\0bytecode")
    (root / "hdqt_cil" / "prebuilt.tar.xz").write_bytes(b"\0built kernels")
    (root / "README.md").write_text("docs\n")
    assert fingerprint(root) == before
    for path, text in [("hdqt_cil/quant/layers.py", "x = 2\n"), ("hdqt_cil/kernels.cu", "// other\n"),
                       ("hdqt_cil/settings.yaml", "bits: 8\n"), ("hydra_plugins/launcher.py", "y = 3\n"),
                       ("run.py", "print(1)\n")]:
        original = (root / path).read_text()
        (root / path).write_text(text)
        assert fingerprint(root) != before, path
        (root / path).write_text(original)
    assert fingerprint(root) == before
    (root / "hdqt_cil" / "quant" / "layers.py").rename(root / "hdqt_cil" / "quant" / "layer.py")
    assert fingerprint(root) != before  # the path counts, not the contents alone


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_commits_fingerprint_is_its_checked_out_trees(tmp_path):
    root = _tree(tmp_path)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    first = fingerprint(root)
    (root / "hdqt_cil" / "quant" / "layers.py").write_text("x = 3\n")
    (root / "hdqt_cil" / "untracked.py").write_text("z = 0\n")
    assert commit_fingerprint("HEAD", root) == first != fingerprint(root)
    with pytest.raises(ValueError, match="nosuch: not a commit"):
        commit_fingerprint("nosuch", root)


def test_each_process_of_a_run_is_listed_once_in_order():
    assert processes_code(None, "a") == ["a"]
    assert processes_code(["a"], "a") == ["a"]
    assert processes_code(["a"], "b") == ["a", "b"]
    assert processes_code(["a", "b"], "a") == ["a", "b", "a"]


def test_a_resumed_run_lists_the_code_of_both_processes(make_cfg, tmp_path, monkeypatch):
    """The first process (another code) is interrupted after its second experience; the resuming one finishes."""
    cfg, run_dir = make_cfg("strategy=naive", "trainer.epochs=1"), tmp_path / "run"
    add_step = AccuracyHistory.add_step

    def interrupted_third(history, results):
        if len(history.seen_acc) == 2:
            raise KeyboardInterrupt
        add_step(history, results)

    with monkeypatch.context() as patch:
        patch.setattr(experiment, "fingerprint", lambda: "0" * 16)
        patch.setattr(AccuracyHistory, "add_step", interrupted_third)
        with pytest.raises(KeyboardInterrupt):
            experiment.run(cfg, run_dir)
    summary = experiment.run(cfg, run_dir)
    assert summary["status"] == "complete"
    assert summary["code"] == ["0" * 16, fingerprint()]
