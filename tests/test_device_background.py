"""scripts/device_background.sh's process handling, with a sweep that only sleeps: `start` records the sweep's
session so that `stop` ends every process in it and `wait` tells a running sweep from an ended one."""
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device_background.sh"

pytestmark = pytest.mark.skipif(shutil.which("setsid") is None or shutil.which("pkill") is None,
                                reason="needs setsid and pkill (util-linux, procps)")


@pytest.fixture
def checkout(tmp_path):
    """A checkout whose sweep starts a child and sleeps (the child stands for a sweep's job processes)."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    (root / "scripts" / "offline_site.sh").write_text("")
    (root / "scripts" / "device_sweep.sh").write_text("sleep 300 &\necho training >sweep.log\nwait\n")
    return root


def background(checkout, tmp_path, *args, job_control=False):
    """Runs device_background.sh from `checkout` (under a shell with job control where asked, as a remote
    command runs it), its sweeps under tmp_path/sweeps."""
    command = f"bash {SCRIPT} {' '.join(args)}"
    if job_control:
        command = f"set -m; {command}"
    env = dict(os.environ, SWEEPS=str(tmp_path / "sweeps"), RUNS=str(tmp_path / "runs"), OUT=str(tmp_path / "out"))
    done = subprocess.run(["bash", "-c", command], cwd=checkout, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def session_members(session: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == session:
                    members.append(int(entry.name))
            except ProcessLookupError:
                pass
    return members


@pytest.mark.parametrize("job_control", [False, True])
def test_stop_ends_every_process_of_the_sweep(checkout, tmp_path, job_control):
    background(checkout, tmp_path, "start", "probe", "seed=0", job_control=job_control)
    pid = int((tmp_path / "sweeps" / "probe" / "pid").read_text())
    try:
        assert os.getsid(pid) == pid, "the recorded pid must lead the sweep's session"
        deadline = time.time() + 10
        while len(session_members(pid)) < 2 and time.time() < deadline:
            time.sleep(0.1)
        assert len(session_members(pid)) >= 2  # the sweep and its sleeping child
        assert "== probe: running" in background(checkout, tmp_path, "wait", "0")
        background(checkout, tmp_path, "stop", "probe")
        assert session_members(pid) == []
        assert "== probe: ended" in background(checkout, tmp_path, "wait", "0")
        assert (tmp_path / "out" / "logs.tgz").is_file()
    finally:
        subprocess.run(["pkill", "-KILL", "-s", str(pid)])


def test_a_sweep_runs_its_own_copy_of_the_code(checkout, tmp_path):
    background(checkout, tmp_path, "start", "probe")
    pid = int((tmp_path / "sweeps" / "probe" / "pid").read_text())
    try:
        sweep = Path("scripts", "device_sweep.sh")
        copy = tmp_path / "sweeps" / "probe" / "checkout"
        assert (copy / sweep).read_text() == (checkout / sweep).read_text()
        (checkout / sweep).write_text("exit 1\n")  # a later call re-sends the tree
        assert "exit" not in (copy / sweep).read_text()
        assert Path(os.readlink(f"/proc/{pid}/cwd")) == copy
    finally:
        subprocess.run(["pkill", "-KILL", "-s", str(pid)])


def test_wait_names_each_unfinished_runs_last_epoch(checkout, tmp_path):
    def run(name, status, *epochs):
        folder = tmp_path / "runs" / name
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(f'{{"status": "{status}"}}')
        lines = [f"[2026-11-29 11:49:04,642][hdqt_cil.trainer.monitor][INFO] - {name}: experience 3, epoch {e}/60: "
                 "mean training loss 0.70 (4.85 s an epoch)\n" for e in epochs]
        (folder / "run.log").write_text("".join(lines) + "[2026-11-29][x][INFO] - after experience 3/5\n")

    run("fp8/seed0", "running", 48, 54)
    run("fp8/seed1", "complete", 60)
    run("fp8/seed2", "running")  # nothing trained yet
    background(checkout, tmp_path, "start", "probe")
    try:
        printed = background(checkout, tmp_path, "wait", "0")
    finally:
        subprocess.run(["pkill", "-KILL", "-s", (tmp_path / "sweeps" / "probe" / "pid").read_text().strip()])
    assert "fp8/seed0: experience 3, epoch 54/60: mean training loss 0.70 (4.85 s an epoch)\n" in printed
    assert "epoch 48/60" not in printed and "seed1" not in printed and "seed2" not in printed
    assert "finished runs: 1" in printed
