"""scripts/pack_checkpoints.py: the unfinished runs' checkpoints leave a GPU machine in archives small enough for a
device call, each run's folder whole in one archive, every run once, under the path the next machine unpacks."""
import subprocess
import sys
import tarfile
from pathlib import Path

from scripts.pack_checkpoints import LIMIT

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
LIMIT_MIB = LIMIT / MIB


def _run_with_checkpoint(root: Path, name: str, mib: float) -> None:
    folder = root / "runs" / name / "checkpoints" / "exp001"
    folder.mkdir(parents=True)
    (folder / "state.pt").write_bytes(b"\0" * int(mib * MIB))


def _pack(root: Path, out: Path, *counts: int) -> str:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "pack_checkpoints.py"), str(out),
                             *map(str, counts), "--root", str(root / "runs"), "--stage", str(root / "stage")],
                            capture_output=True, text=True,
                            check=True)
    return result.stdout


def test_checkpoints_are_grouped_within_the_limit_and_fetched_in_parts(tmp_path):
    # MiB: a's two runs fill one file, b one alone, c exceeds the limit alone, d follows c in a file of its own
    sizes = {name: share * LIMIT_MIB for name, share in
             {"a/seed0": 0.4, "a/seed1": 0.4, "b/seed0": 0.6, "c/seed0": 1.3, "d/seed0": 0.1}.items()}
    for name, mib in sizes.items():
        _run_with_checkpoint(tmp_path, name, mib)
    (tmp_path / "runs" / "e" / "seed0").mkdir(parents=True)  # a finished run: no checkpoints, nothing to pack
    first = _pack(tmp_path, tmp_path / "out", 2, 0)
    assert "5 unfinished runs in 4 checkpoint files; returned 0..1" in first
    _pack(tmp_path, tmp_path / "out", 5, 2)
    archives = sorted((tmp_path / "out").glob("ckpt_*.tgz"))
    assert [a.name for a in archives] == ["ckpt_0.tgz", "ckpt_1.tgz", "ckpt_2.tgz", "ckpt_3.tgz"]
    packed = []
    for archive in archives:
        with tarfile.open(archive) as tar:
            files = [m for m in tar.getmembers() if m.isfile()]
        runs = {m.name.split("/checkpoints")[0] for m in files}
        assert len(runs) == 1 or sum(m.size for m in files) <= LIMIT_MIB * MIB
        packed += sorted(runs)
    assert sorted(packed) == [f"runs/{name}" for name in sorted(sizes)]  # each run once, as the next machine unpacks


def _packed_runs(out: Path) -> list[str]:
    runs = []
    for archive in sorted(out.glob("ckpt_*.tgz")):
        with tarfile.open(archive) as tar:
            runs += sorted({m.name.split("/checkpoints")[0] for m in tar.getmembers() if m.isfile()})
    return runs


def test_a_later_part_comes_from_the_first_call_s_snapshot(tmp_path):
    """A run that finishes between the calls (its checkpoints removed) must not shift the numbering: the second
    call returns the runs the first call's numbering promised, none twice, none left out."""
    for name in ("a/seed0", "b/seed0", "c/seed0", "d/seed0"):
        _run_with_checkpoint(tmp_path, name, LIMIT_MIB)  # one run a file
    _pack(tmp_path, tmp_path / "out", 2, 0)
    for path in sorted((tmp_path / "runs" / "a").rglob("*"), reverse=True):  # a finishes, e starts
        path.unlink() if path.is_file() else path.rmdir()
    _run_with_checkpoint(tmp_path, "e/seed0", LIMIT_MIB)
    second = _pack(tmp_path, tmp_path / "out", 5, 2)
    assert "ckpt_2.tgz: c/seed0" in second and "ckpt_3.tgz: d/seed0" in second
    assert _packed_runs(tmp_path / "out") == [f"runs/{n}/seed0" for n in "abcd"]


def test_a_run_that_ended_is_not_packed_even_with_checkpoints_unpacked_into_it(tmp_path):
    for name in ("a/seed0", "b/seed0", "c/seed0"):
        _run_with_checkpoint(tmp_path, name, 1)
    (tmp_path / "runs" / "a" / "seed0" / "summary.json").write_text('{"status": "complete"}')
    (tmp_path / "runs" / "b" / "seed0" / "summary.json").write_text('{"status": "running"}')
    assert "2 unfinished runs in 1 checkpoint files" in _pack(tmp_path, tmp_path / "out", 5, 0)
    assert _packed_runs(tmp_path / "out") == ["runs/b/seed0", "runs/c/seed0"]


def test_nothing_to_pack_returns_none_and_says_so(tmp_path):
    (tmp_path / "runs").mkdir()
    assert _pack(tmp_path, tmp_path / "out", 2, 0).startswith("0 unfinished runs in 0 checkpoint files; returned none")
    assert not list((tmp_path / "out").glob("ckpt_*.tgz"))
