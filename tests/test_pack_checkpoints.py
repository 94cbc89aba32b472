"""scripts/pack_checkpoints.py: the unfinished runs' checkpoints leave a GPU machine in archives small enough for a
device call, each run's folder whole in one archive, every run once, under the path the next machine unpacks."""
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def _run_with_checkpoint(root: Path, name: str, mib: float) -> None:
    folder = root / "runs" / name / "checkpoints" / "exp001"
    folder.mkdir(parents=True)
    (folder / "state.pt").write_bytes(b"\0" * int(mib * MIB))


def _pack(root: Path, out: Path, *counts: int) -> str:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "pack_checkpoints.py"), str(out),
                             *map(str, counts), "--root", str(root / "runs")], capture_output=True, text=True,
                            check=True)
    return result.stdout


def test_checkpoints_are_grouped_within_the_limit_and_fetched_in_parts(tmp_path):
    sizes = {"a/seed0": 6, "a/seed1": 6, "b/seed0": 9, "c/seed0": 20, "d/seed0": 1}  # MiB; c alone exceeds 15
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
        assert len(runs) == 1 or sum(m.size for m in files) <= 15 * MIB
        packed += sorted(runs)
    assert sorted(packed) == [f"runs/{name}" for name in sorted(sizes)]  # each run once, as the next machine unpacks
