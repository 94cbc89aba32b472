"""Packing several runs onto each GPU, on the CPU: which GPU a job gets (a faked GPU count), CUDA MPS started and
stopped around a sweep (a stand-in nvidia-cuda-mps-control that keeps its state in files), and the launcher that
puts them together."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hdqt_cil.sweep import gpu_slots, mps
from hydra_plugins.hdqt_cil_launcher import gpus as launcher

ROOT = Path(__file__).resolve().parents[1]

HOLD_SLOT = """
import sys, time
from pathlib import Path
from hdqt_cil.sweep import gpu_slots
gpu, handle = gpu_slots.claim(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
print(gpu, handle is not None, flush=True)
time.sleep(3600)  # held until the test kills it: a timed hold ends early under load, freeing its slot
"""


def hold_slot(folder, gpus, per_gpu, job):
    """A process that claims a slot and holds it; returns (process, gpu, whether it got a slot)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_SLOT, str(folder), str(gpus), str(per_gpu), str(job)],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    gpu, got = proc.stdout.readline().split()
    return proc, int(gpu), got == "True"


def test_job_k_takes_gpu_k_mod_count_when_its_slot_is_free(tmp_path):
    for job in range(7):
        gpu, handle = gpu_slots.claim(tmp_path, 3, 2, job)
        assert gpu == job % 3
        handle.close()


def test_a_gpu_never_holds_more_than_jobs_per_gpu_and_a_dead_job_frees_its_slot(tmp_path):
    held = [hold_slot(tmp_path, 2, 2, job) for job in (0, 2, 4, 6)]  # all prefer GPU 0
    try:
        assert sorted(gpu for _, gpu, _ in held) == [0, 0, 1, 1] and all(got for _, _, got in held)
        extra, gpu, got = hold_slot(tmp_path, 2, 2, 8)  # every slot taken: GPU 8 mod 2, no slot
        extra.kill()
        assert (gpu, got) == (0, False)
        victim = next(p for p, gpu, _ in held if gpu == 1)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        again, gpu, got = hold_slot(tmp_path, 2, 2, 0)  # preferred GPU 0 is full; the dead job's slot is free
        again.kill()
        assert (gpu, got) == (1, True)
    finally:
        for proc, _, _ in held:
            proc.kill()


def test_job_gpu_without_slots_is_job_mod_device_count(monkeypatch):
    monkeypatch.delenv(gpu_slots.ENV, raising=False)
    with gpu_slots.job_gpu(5, 2) as gpu:
        assert gpu == 1
    with gpu_slots.job_gpu(5, 0) as gpu:  # no GPU: the index is unused
        assert gpu == 0


def test_jobs_per_gpu_auto_takes_the_table_entry_of_the_sweeps_models():
    table = {"resnet32": 8, "mlp": 12}
    assert launcher.jobs_per_gpu("auto", table, 4, {"resnet32"}) == 8  # the table given, not the config's
    assert launcher.jobs_per_gpu("auto", table, 4, {"resnet32", "mlp"}) == 8
    assert launcher.jobs_per_gpu("auto", table, 4, {"vit"}) == 4
    assert launcher.jobs_per_gpu(3, table, 4, {"mlp"}) == 3
    for bad in (0, -2, "many", True, 2.5):
        with pytest.raises(ValueError, match=f"jobs_per_gpu={bad!r} must be a positive integer or auto"):
            launcher.jobs_per_gpu(bad, table, 4, {"mlp"})
    assert launcher.sweep_models([["seed=0", "model=mlp"], ["model=resnet32"]], "mlp") == {"mlp", "resnet32"}
    assert launcher.sweep_models([["seed=0"]], "resnet32") == {"resnet32"}


FAKE_CONTROL = """#!/usr/bin/env bash
# Stand-in for nvidia-cuda-mps-control: the daemon's state is the control file in its pipe folder.
dir=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}
if [ "${1:-}" = -d ]; then mkdir -p "$dir" && touch "$dir/control" && echo "start $dir" >> "$CALLS"; exit; fi
read -r command
case $command in
  get_server_list) [ -e "$dir/control" ] ;;
  quit) rm -f "$dir/control"; echo "quit $dir" >> "$CALLS" ;;
esac
"""


@pytest.fixture
def fake_mps(tmp_path, monkeypatch):
    """A stand-in control binary on PATH; returns the file where it records starts and quits."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / mps.CONTROL
    control.write_text(FAKE_CONTROL)
    control.chmod(0o755)
    calls = tmp_path / "calls"
    calls.touch()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(calls))
    monkeypatch.setenv(mps.PIPE, str(tmp_path / "no-daemon-here"))
    return calls


def test_mps_starts_for_the_block_and_stops_after_it(tmp_path, fake_mps):
    with mps.sharing(tmp_path / "sweep", probe=lambda env: "") as env:
        assert mps.running(env[mps.PIPE]) and env[mps.LOG]
        pipe = env[mps.PIPE]
    assert not mps.running(pipe)
    assert fake_mps.read_text().split() == ["start", pipe, "quit", pipe]


def test_mps_already_running_is_used_and_left_running(tmp_path, fake_mps, monkeypatch):
    existing = tmp_path / "theirs"
    existing.mkdir()
    (existing / "control").touch()
    monkeypatch.setenv(mps.PIPE, str(existing))
    with mps.sharing(tmp_path / "sweep", probe=lambda env: "") as env:
        assert env == {}
    assert mps.running(str(existing)) and fake_mps.read_text() == ""


def test_mps_that_cannot_start_falls_back_to_time_slicing_and_says_so(tmp_path, fake_mps, caplog):
    caplog.set_level("INFO")
    with mps.sharing(tmp_path / "sweep", probe=lambda env: "no device") as env:
        assert env == {}
    assert "time-sliced" in caplog.text and "no device" in caplog.text
    assert fake_mps.read_text().split()[::2] == ["start", "quit"]  # the daemon that could not serve is gone
    with pytest.raises(RuntimeError, match="mps=on, but CUDA MPS cannot start here: .*no device"):
        with mps.sharing(tmp_path / "sweep2", required=True, probe=lambda env: "no device"):
            pass


def test_without_the_control_binary_jobs_run_time_sliced(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))
    caplog.set_level("INFO")
    with mps.sharing(tmp_path / "sweep") as env:
        assert env == {}
    assert f"{mps.CONTROL} is not on PATH" in caplog.text and "time-sliced" in caplog.text


LAUNCHER_THAT_DIES = """
import sys, time
from pathlib import Path
from hdqt_cil.sweep import mps
with mps.sharing(Path(sys.argv[1]), probe=lambda env: "") as env:
    print(env[mps.PIPE], flush=True)
    time.sleep(60)
"""


def test_a_killed_sweep_leaves_no_daemon_behind(tmp_path, fake_mps):
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER_THAT_DIES, str(tmp_path / "sweep")],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    pipe = proc.stdout.readline().strip()
    assert mps.running(pipe)
    proc.send_signal(signal.SIGKILL)  # no finally runs: the guardian must quit the daemon
    proc.wait()
    deadline = time.monotonic() + 20
    while mps.running(pipe) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not mps.running(pipe)
    assert fake_mps.read_text().split() == ["start", pipe, "quit", pipe]


class _Config:
    class model:
        name = "resnet32"


class _HydraContext:
    """Hydra's context as far as the launcher reads it: each job's run folder, named by its overrides."""
    class config_loader:
        @staticmethod
        def load_sweep_config(config, overrides):
            return OmegaConf.create({"hydra": {"sweep": {"subdir": "/".join(overrides)}}})


def _launcher(**settings):
    """The launcher as Hydra sets it up for a sweep of a ResNet-32 config."""
    made = launcher.GpusLauncher(default_jobs_per_gpu=1, n_jobs=None, **settings)
    made.config, made.hydra_context = _Config, _HydraContext
    return made


def test_launcher_packs_jobs_per_gpu_and_runs_the_sweep_under_mps(tmp_path, fake_mps, monkeypatch):
    """With 2 (faked) GPUs and 3 jobs a GPU: 6 jobs at once, the slots announced to the jobs, MPS up while the
    jobs run and down after."""
    seen = {}

    def fake_joblib_launch(self, job_overrides, initial_job_idx):
        seen["n_jobs"] = self.joblib["n_jobs"]
        seen["slots"] = os.environ[gpu_slots.ENV]
        seen["mps"] = mps.running(os.environ[mps.PIPE])
        return []

    monkeypatch.setattr(launcher, "device_count", lambda: 2)
    monkeypatch.setattr(launcher.JoblibLauncher, "launch", fake_joblib_launch)
    monkeypatch.setattr(mps, "cuda_probe", lambda env: "")
    monkeypatch.setattr(launcher, "_stop_workers", lambda: None)
    sweep = _launcher(jobs_per_gpu="auto", jobs_per_gpu_by_model={"resnet32": 3}, mps="auto")
    sweep.launch([["seed=0"], ["seed=1"]], 0)
    assert seen["n_jobs"] == 6 and seen["slots"].startswith("2:3:") and seen["mps"]
    assert gpu_slots.ENV not in os.environ and fake_mps.read_text().split()[::2] == ["start", "quit"]


def test_each_job_gets_its_gpus_share_of_the_host_cores(monkeypatch, fake_mps):
    """Two GPUs of a 4-GPU, 64-core host, 3 jobs a GPU: 64 / (4 × 3) = 5 threads a job, whatever this sweep's own
    job count; the environment's counts are kept unless threads_per_job is set; a bad setting is refused."""
    seen = {}
    monkeypatch.setattr(launcher, "device_count", lambda: 2)
    monkeypatch.setattr(launcher, "host_gpu_count", lambda visible: 4)
    monkeypatch.setattr(launcher, "cpu_count", lambda: 64)
    monkeypatch.setattr(launcher.JoblibLauncher, "launch", lambda self, overrides, idx: seen.update(
        {name: os.environ.get(name) for name in launcher.THREAD_VARIABLES}) or [])
    monkeypatch.setattr(mps, "cuda_probe", lambda env: "")
    monkeypatch.setattr(launcher, "_stop_workers", lambda: None)
    for name in launcher.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def sweep(threads=None):
        _launcher(jobs_per_gpu=3, jobs_per_gpu_by_model={}, mps="auto", threads_per_job=threads).launch([["seed=0"]], 0)
        return dict(seen)

    assert sweep() == dict.fromkeys(launcher.THREAD_VARIABLES, "5")
    assert "OMP_NUM_THREADS" not in os.environ  # the jobs' environment only
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert sweep()["OMP_NUM_THREADS"] == "7" and sweep()["MKL_NUM_THREADS"] == "5"
    assert sweep(threads=2) == dict.fromkeys(launcher.THREAD_VARIABLES, "2")
    with pytest.raises(ValueError, match="hydra.launcher.threads_per_job=0 must be a positive integer or null"):
        sweep(threads=0)
    assert launcher.threads_per_job(None, 16, 1, 12) == 1 and launcher.threads_per_job(None, 8, 0, 1) == 8


def test_a_sweep_whose_job_process_died_starts_again_with_a_fresh_mps_daemon(tmp_path, fake_mps, monkeypatch, caplog):
    """A dead worker breaks loky's pool (every running job with it): the launcher starts the sweep again, after
    quitting the daemon it started (a GPU fault leaves MPS unusable) and starting a fresh one, `restarts` times."""
    from joblib.externals.loky.process_executor import TerminatedWorkerError

    attempts = []

    def launch_that_dies_first(self, job_overrides, initial_job_idx):
        attempts.append(mps.running(os.environ[mps.PIPE]))
        if len(attempts) == 1:
            raise TerminatedWorkerError("A worker process managed by the executor was unexpectedly terminated.")
        return ["done"]

    monkeypatch.setattr(launcher, "device_count", lambda: 1)
    monkeypatch.setattr(launcher.JoblibLauncher, "launch", launch_that_dies_first)
    monkeypatch.setattr(mps, "cuda_probe", lambda env: "")
    monkeypatch.setattr(launcher, "_stop_workers", lambda: None)
    caplog.set_level("WARNING")

    def sweep(restarts):
        made = _launcher(jobs_per_gpu=2, jobs_per_gpu_by_model={}, mps="auto", restarts=restarts)
        return made.launch([["seed=0"], ["seed=1"]], 0)

    assert sweep(restarts=1) == ["done"] and attempts == [True, True]
    assert fake_mps.read_text().split()[::2] == ["start", "quit", "start", "quit"]
    assert "a job process died (A worker process managed" in caplog.text and "restart 1 of 1" in caplog.text
    attempts.clear()
    with pytest.raises(TerminatedWorkerError):
        sweep(restarts=0)
    with pytest.raises(ValueError, match="hydra.launcher.restarts=-1 must be an integer ≥ 0"):
        sweep(restarts=-1)


def test_launcher_without_a_gpu_runs_one_job_at_a_time_without_mps(monkeypatch, fake_mps):
    seen = {}
    monkeypatch.setattr(launcher, "device_count", lambda: 0)
    monkeypatch.setattr(launcher.JoblibLauncher, "launch",
                        lambda self, overrides, idx: seen.update(n_jobs=self.joblib["n_jobs"]) or [])
    _launcher(jobs_per_gpu=4, jobs_per_gpu_by_model={}, mps="auto").launch([["seed=0"]], 0)
    assert seen["n_jobs"] == 1 and fake_mps.read_text() == ""
    with pytest.raises(ValueError, match="hydra.launcher.mps='sometimes' must be one of auto, on, off"):
        launcher.GpusLauncher(jobs_per_gpu=1, jobs_per_gpu_by_model={}, default_jobs_per_gpu=1, mps="sometimes")


def _training_sweep(results_root):
    """Two CPU runs side by side through the real launcher, returned once one has an epoch checkpoint (renamed into
    place: a `.partial` folder being written is not one yet, and is not searched, as it may vanish meanwhile): the
    sweep's process and its job processes."""
    import psutil

    sweep = subprocess.Popen([sys.executable, "run.py", "-m", "hydra/launcher=gpus", "hydra.launcher.n_jobs=2",
                              f"results_root={results_root}", "strategy=naive", "quant=fp32", "seed=0,1",
                              "benchmark.n_experiences=null", "benchmark.classes_per_exp=4", "trainer.epochs=30",
                              "trainer.checkpoint_every=5", "logging.progress=off"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while (not any(results_root.glob("*/*/*/*/checkpoints/exp*_epoch*")) and time.monotonic() < deadline
           and sweep.poll() is None):  # digits-mlp/naive/fp32/seedN
        time.sleep(0.05)
    workers = [p for p in psutil.Process(sweep.pid).children(recursive=True) if "popen_loky" in " ".join(p.cmdline())]
    assert workers, "no job process found while the runs trained"
    return sweep, workers


def test_a_sweep_finishes_every_run_after_one_of_its_job_processes_is_killed(tmp_path):
    """The real launcher through run.py on the CPU: SIGKILL to a job process mid-run (as a segfault or the OOM
    killer would end it) costs a restart, not the sweep: both runs finish, resumed from their epoch checkpoints.
    (A sweep of it with a failed job, one that prints its table: tests/test_cli.py.)"""
    sweep, workers = _training_sweep(tmp_path)
    workers[0].kill()
    out, err = sweep.communicate(timeout=600)
    assert sweep.returncode == 0, err
    assert "a job process died" in out and "restart 1 of 1" in out
    assert "2 of 2 jobs completed" in (tmp_path / "sweep_summary.md").read_text()
    assert "resuming" in out + err


def test_a_sweep_ended_by_sigterm_ends_its_job_processes(tmp_path):
    """`kill` (SIGTERM) to the sweep's process, as a scheduler or a user would send it: its job processes end with
    it, instead of training on with their run folders held."""
    import psutil

    sweep, workers = _training_sweep(tmp_path)
    sweep.terminate()
    sweep.communicate(timeout=120)
    assert sweep.returncode != 0
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, f"job processes outlived the sweep: {[p.pid for p in alive]}"

