"""run.py as a user calls it: real Hydra, in a real process for each path through the command (a run, a sweep of
each launcher, a refusal, Ctrl-C, the installed commands with --help); further checks of what it prints and exits
with call its entry point in this process (conftest.run_in_process)."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]


def cli_args(*args, tmp_path) -> list[str]:
    """run.py's arguments: flags first, results under tmp_path, quant=fp32 unless one is given."""
    flags = [a for a in args if a.startswith("-")]
    overrides = [a for a in args if not a.startswith("-")]
    overrides += [] if any(a.startswith("quant=") for a in overrides) else ["quant=fp32"]
    return [*flags, f"results_root={tmp_path}", *overrides]


def run_cli(*args, tmp_path):
    return subprocess.run([sys.executable, "run.py", *cli_args(*args, tmp_path=tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture
def cli(run_in_process, tmp_path):
    """run_cli's command, results under tmp_path, run in this process."""
    return lambda *args: run_in_process(*cli_args(*args, tmp_path=tmp_path))


def test_run_prints_its_table(tmp_path):
    out = run_cli("strategy=naive", "trainer.epochs=1", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "| digits | class | mlp | naive | fp32 |" in out.stdout
    assert (tmp_path / "digits-mlp" / "naive" / "fp32" / "seed0" / "summary.json").exists()


def test_multirun_sweeps_into_one_results_tree(tmp_path):
    out = run_cli("-m", "strategy=naive,lwf", "seed=0,1", "trainer.epochs=1", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    runs = sorted(str(p.parent.relative_to(tmp_path)) for p in tmp_path.rglob("summary.json"))
    assert runs == [f"digits-mlp/{s}/fp32/seed{k}" for s in ("lwf", "naive") for k in (0, 1)]


@pytest.mark.parametrize("overrides, message", [
    (("strategy=ewcc",), "strategy=ewcc is not a member of strategy; did you mean strategy=ewc? its members are agem, "
                         "bic,"),
    (("-m", "quant=fp32,hdq"), "quant=hdq is not a member of quant; did you mean quant=hdqt?"),
])
def test_an_unknown_member_is_refused_in_one_line_with_the_nearest(cli, overrides, message):
    out = cli(*overrides)
    assert out.returncode == 2 and out.stderr.strip() == out.stderr.strip().splitlines()[0], out.stderr
    assert out.stderr.startswith(f"error: {message}")


def test_bad_value_fails_before_writing_anything(tmp_path, cli, monkeypatch):
    out = run_cli("trainer.epochs=0", tmp_path=tmp_path)
    assert out.returncode == 2 and "error: trainer.epochs=0 must be a positive integer" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not list(tmp_path.iterdir())
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # the error itself escapes: Python's traceback and exit status 1
    with pytest.raises(ValueError, match="trainer.epochs=0 must be a positive integer"):
        cli("trainer.epochs=0")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a CPU run")
def test_the_kernels_backend_on_a_cpu_run_is_refused_before_a_folder_is_claimed(tmp_path, cli):
    out = cli("strategy=naive", "quant=hdqt", "quant.backend=cupy", "trainer.epochs=1")
    assert out.returncode == 2 and out.stderr.startswith("error: quant.backend=cupy runs the products as CUDA kernels")
    assert not list(tmp_path.iterdir())


def test_a_diverged_run_stops_with_its_message_and_no_traceback(tmp_path):
    out = run_cli("strategy=naive", "trainer.epochs=3", "trainer.lr=1e6", tmp_path=tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr and "Error executing job" not in out.stderr
    assert out.stderr.startswith("stopped: training diverged in experience 1, epoch 1: non-finite weights in ")
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    summary = json.loads(next(tmp_path.rglob("summary.json")).read_text())
    assert summary["status"] == "diverged" and summary["error"]["experience"] == 0



@pytest.mark.parametrize("quant", sorted(p.stem for p in (ROOT / "hdqt_cil/configs/quant").glob("*.yaml")))
def test_a_diverged_run_of_every_scheme_stops_in_one_line_and_is_recorded_as_diverged(tmp_path, cli, quant):
    """The quantized schemes meet the NaN at a quantizer, mid-epoch, before the monitor's check at its end: the same
    ending as FP32's."""
    out = cli("strategy=naive", f"quant={quant}", "trainer.epochs=2", "trainer.lr=1e6")
    assert out.returncode == 1 and "Traceback" not in out.stdout + out.stderr, out.stderr
    assert re.fullmatch(r"stopped: training diverged in experience 1, epoch [12]: .*non-finite.*; the run folder "
                        r"records it \(status 'diverged'\)\n", out.stderr), out.stderr
    summary = json.loads(next(tmp_path.rglob("summary.json")).read_text())
    assert summary["status"] == "diverged" and summary["error"]["experience"] == 0


def test_a_sweep_goes_on_past_a_quantized_run_that_diverges(tmp_path, cli):
    out = cli("-m", "strategy=naive", "quant=hdqt,fp32", "seed=0,1", "trainer.epochs=1", "trainer.lr=1e6",
              "on_divergence=continue")
    assert out.returncode == 0 and "Traceback" not in out.stdout + out.stderr, out.stderr
    status = {str(p.parent.relative_to(tmp_path)): json.loads(p.read_text())["status"]
              for p in tmp_path.rglob("summary.json")}
    assert status == {f"digits-mlp/naive/{q}/seed{k}": "diverged" for q in ("fp32", "hdqt") for k in (0, 1)}
    report = (tmp_path / "sweep_summary.md").read_text()
    assert "0 of 4 jobs completed, 4 diverged" in report
    row = next(line for line in report.splitlines() if line.startswith("| #1 | digits-mlp/naive/hdqt/seed1 | "))
    assert row.endswith(" | diverged | training diverged in experience 1, epoch 1: layer 'classifier': non-finite "
                        "value nan in the grad_input.grad_output reaching its quantizer (scheme hdqt) |"), row


def test_asking_again_for_a_finished_run_says_what_its_folder_does_not_hold(tmp_path, cli):
    """A diverged run asked for again ends as it did (exit 1, not a success a script would count); diagnostics
    that are not part of a run's identity are said not to be measured rather than silently missing."""
    diverging = ("strategy=naive", "trainer.epochs=3", "trainer.lr=1e6")
    assert cli(*diverging).returncode == 1
    again = cli(*diverging)
    assert again.returncode == 1 and again.stderr.startswith("stopped: training diverged in experience 1, epoch 1: ")
    going_on = cli(*diverging, "on_divergence=continue")
    assert going_on.returncode == 0 and "holds this run, which diverged (training diverged in experience 1" in \
        going_on.stdout + going_on.stderr
    assert cli("strategy=naive", "trainer.epochs=1", "tag=plain").returncode == 0
    light = cli("strategy=naive", "trainer.epochs=1", "tag=plain", "diagnostics=light")
    assert light.returncode == 0 and "finished with diagnostics=off: diagnostics=light was not measured; " \
        "overwrite=true reruns it" in light.stdout + light.stderr
    assert not list(tmp_path.rglob("diagnostics.json"))


def test_an_added_key_no_schema_declares_is_refused_with_the_nearest_names(tmp_path, cli):
    out = cli("+trainer.epoch=5")
    assert out.returncode == 2 and "trainer.epoch is not a setting; did you mean trainer.epochs?" in out.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("overrides, message", [
    (["trainer.epoch=5"], "trainer.epoch is not a setting; did you mean trainer.epochs?"),
    (["sed=3"], "sed is not a setting; did you mean seed?"),
    (["logging.progres=off"], "logging.progres is not a setting; did you mean logging.progress?"),
    (["diagnostics.levl=light"], "diagnostics.levl is not a setting; did you mean diagnostics.level?"),
    (["quant=hdqt", "quant.acc_bit=12"], "quant.acc_bit is not a setting; did you mean quant.acc_bits"),
    (["strategy=bic", "strategy.ce_clases=seen"], "strategy.ce_clases is not a setting; did you mean "
                                                  "strategy.ce_classes?"),
    (["+experiment=cifar10_paper", "benchmark.rot=x"], "benchmark.rot is not a setting; did you mean benchmark.root?"),
    (["quant=hdqt", "quant.rounding.grad_outpt=nearest"], "quant.rounding.grad_outpt is not a setting; did you mean "
                                                          "quant.rounding.grad_output? the settings of quant.rounding"),
])
def test_a_misspelt_setting_is_refused_with_the_nearest_names(tmp_path, cli, overrides, message):
    out = cli("-m", *overrides, "seed=0,1")  # a sweep's too: refused before Hydra composes or launches anything
    assert out.returncode == 2 and out.stderr.strip().startswith(f"error: {message}"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())



@pytest.mark.parametrize("args, message", [
    (["tag=${nope}"], "tag=${nope} interpolates ${nope}, which is not a setting; an interpolation names a setting"),
    (["--cfg", "job", "--resolve", "tag=${nope}"], "tag=${nope} interpolates ${nope}, which is not a setting; "),
    (["-m", "seed=0,1", "quant.bits=${trainer.epoch}"], "quant.bits=${trainer.epoch} interpolates ${trainer.epoch}, "
                                                         "which is not a setting; did you mean ${trainer.epochs}"),
], ids=["run", "cfg-job-resolve", "sweep"])
def test_an_interpolation_of_a_missing_key_is_refused_in_one_line(tmp_path, run_in_process, args, message):
    out = run_in_process(*args, f"results_root={tmp_path}")
    assert out.returncode == 2 and out.stderr.startswith(f"error: {message}"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())

@pytest.mark.parametrize("overrides, message", [
    (["benchmark=features", "benchmark.path=absent.csv"], "benchmark.path=absent.csv: no such file"),
    (["benchmark=images", "benchmark.root=absent.zip", "benchmark.name=pets"], "benchmark.root=absent.zip does not "
                                                                               "exist"),
])
def test_a_members_required_setting_passes_the_check_to_the_data_check(tmp_path, cli, overrides, message):
    """A member's setting without a default (own data's path: ???) given on the command line is no misspelling:
    the run goes on to the data's own check, which names the missing file in one line."""
    out = cli(*overrides, "trainer.epochs=1")
    assert out.returncode == 2 and out.stderr.strip().startswith(f"error: {message}"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_the_misspelling_check_leaves_hydra_and_group_members_keys_to_hydra(tmp_path, cli, recwarn):
    """Hydra's own keys and a chosen member's pass the check (the value check after composition then speaks); a
    member's keys where the member is swept are Hydra's to check."""
    out = cli("hydra.job.chdir=false", "+experiment=cifar10_paper", "benchmark.root=x", "trainer.epochs=0")
    assert out.returncode == 2 and "error: trainer.epochs=0 must be a positive integer" in out.stderr, out.stderr
    out = cli("experiment=cifar10_paper")  # a group that is not in the defaults: Hydra says to add it with +
    assert "is not a setting" not in out.stderr and "+experiment=cifar10_paper" in out.stderr, out.stderr
    out = cli("-m", "strategy=naive", "quant=fp,hdqt", "quant.acc_bits=12", "trainer.epochs=1")
    assert "is not a setting" not in out.stderr and "Key 'acc_bits' not in 'FpConfig'" in out.stderr
    assert not [w for w in recwarn if "Callback" in str(w.message)]  # the sweep's checks leave it to Hydra alone


@pytest.mark.parametrize("signum, code, said", [(signal.SIGINT, 130, "interrupted"),
                                                (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_ctrl_c_or_sigterm_ends_a_run_with_one_line_and_records_it(tmp_path, signum, code, said):
    args = cli_args("strategy=naive", "trainer.epochs=500", tmp_path=tmp_path)
    proc = subprocess.Popen([sys.executable, "run.py", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as in a terminal
    summary = tmp_path / "digits-mlp" / "naive" / "fp32" / "seed0" / "run.log"
    deadline = time.time() + 120
    while not summary.exists() and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # into training
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(f"{said}: the run folder records it")
    status = json.loads((summary.parent / "summary.json").read_text())["status"]
    assert status == "interrupted"


def test_a_config_refused_while_building_leaves_nothing_but_a_claimed_folder_stays(tmp_path, cli):
    out = cli("benchmark.n_experiences=7")  # 10 classes do not split into 7 experiences
    assert out.returncode != 0 and "benchmark.n_experiences=7 does not divide the 10 classes" in out.stderr
    assert not list(tmp_path.iterdir())
    (tmp_path / "keep.txt").write_text("the user's")
    assert cli("strategy=naive", "trainer.epochs=1").returncode == 0
    out = cli("strategy=naive", "trainer.epochs=2")  # refused: the folder holds another run
    assert out.returncode == 2 and "error: " in out.stderr and "holds a run with a different config" in out.stderr
    assert "Traceback" not in out.stderr
    assert (tmp_path / "digits-mlp/naive/fp32/seed0/summary.json").exists() and (tmp_path / "keep.txt").exists()


def test_failed_job_does_not_stop_the_sweep_and_is_reported(tmp_path, cli):
    """The real launcher of GPUs through run.py on the CPU (one job at a time, no MPS): the job that completes prints
    its table; the sweep of tests/test_sweep_packing.py whose job process is killed ends with every job complete."""
    out = run_cli("-m", "hydra/launcher=gpus", "strategy=icarl,naive", "trainer.memory_size=5", "trainer.epochs=1",
                  tmp_path=tmp_path)
    assert out.returncode != 0
    assert (tmp_path / "digits-mlp/naive/fp32/seed0/summary.json").exists()
    assert "| digits | class | mlp | naive | fp32 |" in out.stdout
    if not torch.cuda.is_available():  # said, not left to a reader of joblib's n_jobs=1
        assert "no CUDA GPU here: the jobs train on the CPU, 1 at once" in out.stdout + out.stderr
    report = (tmp_path / "sweep_summary.md").read_text()
    assert "1 of 2 jobs completed" in report
    assert "| digits-mlp/icarl/fp32/seed0 |" in report and "iCaRL needs at least one exemplar per class" in report
    assert not (tmp_path / "digits-mlp/icarl").exists()  # refused before it claimed a folder: none is left
    again = cli("-m", "strategy=naive", "trainer.epochs=1", "seed=1")
    assert again.returncode == 0, again.stderr
    sections = (tmp_path / "sweep_summary.md").read_text().split("# Sweep of ")
    assert len(sections) == 3 and "1 of 2 jobs completed" in sections[1] and "1 of 1 jobs completed" in sections[2]


@pytest.mark.parametrize("launcher", ["basic", "gpus", "submitit_local"])
def test_a_sweep_whose_jobs_would_share_a_run_folder_is_refused_before_any_starts(tmp_path, cli, launcher, monkeypatch):
    """Whichever launcher: trainer.weight_bits is not part of a run folder's path, so both jobs would write one."""
    out = cli("-m", f"hydra/launcher={launcher}", "strategy=naive", "trainer.weight_bits=null,8", "trainer.epochs=1")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith("error: jobs #0 and #1 of this sweep would write one run folder, "
                                 "digits-mlp/naive/fp32/seed0: they differ only in trainer.weight_bits=null and "
                                 "trainer.weight_bits=8, which a run folder's path does not include")
    assert "each with its own tag=NAME" in out.stderr and not list(tmp_path.iterdir())
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # the traceback too, and still no job
    out = cli("-m", f"hydra/launcher={launcher}", "strategy=naive", "trainer.weight_bits=null,8", "trainer.epochs=1")
    assert out.returncode == 2 and "Traceback" in out.stderr and "ValueError: jobs #0 and #1" in out.stderr
    assert not list(tmp_path.iterdir())


def test_a_sweep_whose_tag_names_the_swept_value_runs_each_job_in_its_folder(tmp_path, cli):
    """The check before a sweep reads the command's overrides unresolved: each job's tag is its own value's."""
    out = cli("-m", "strategy=naive", "quant=hdqt", "quant.bits=3,4", "tag=b${quant.bits}", "trainer.epochs=1")
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (tmp_path / "digits-mlp/naive").iterdir()) == ["hdqt-b3", "hdqt-b4"]


def test_a_sweep_that_repeats_a_job_is_refused_as_such(tmp_path, cli):
    out = cli("-m", "strategy=naive", "seed=0,0", "trainer.epochs=1")
    assert out.returncode == 2 and out.stderr.startswith("error: jobs #0 and #1 of this sweep are the same run "
                                                         "(digits-mlp/naive/fp32/seed0): a value is repeated")


def test_submitit_local_launcher_runs_the_sweep(tmp_path):
    out = run_cli("-m", "hydra/launcher=submitit_local", "strategy=naive,lwf", "trainer.epochs=1", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "2 of 2 jobs completed" in (tmp_path / "sweep_summary.md").read_text()


def test_ablation_preset_sweeps_into_tagged_folders(tmp_path, cli):
    out = cli("-m", "+experiment=ablation_acc_bits", "quant=hdqt", "quant.acc_bits=8,16", "strategy=naive",
              "trainer.epochs=1")
    assert out.returncode == 0, out.stderr
    runs = sorted(str(p.parent.relative_to(tmp_path)) for p in tmp_path.rglob("summary.json"))
    assert runs == ["digits-mlp/naive/hdqt-acc16/seed0", "digits-mlp/naive/hdqt-acc8/seed0"]


def test_help_is_the_products_and_names_every_member_and_default(run_in_process):
    out = run_in_process("--help")  # a real process prints it in test_the_installed_commands_run_from_any_folder
    assert out.returncode == 0 and "schema/" not in out.stdout
    for group in ("strategy", "quant", "benchmark", "model", "cost", "diagnostics", "experiment", "hydra/launcher"):
        for member in (ROOT / "hdqt_cil" / "configs" / group).glob("*.yaml"):
            assert member.stem in out.stdout, f"{group}={member.stem} missing from --help"
    from hdqt_cil.config import TrainerConfig

    defaults = TrainerConfig()
    for key in ("epochs", "batch_size", "lr", "memory_size", "gamma", "device", "cuda_graph", "compile"):
        value = getattr(defaults, key)
        assert f"trainer.{key} [{str(value).lower() if isinstance(value, bool) else value}]" in out.stdout, key


def test_cfg_hydra_resolves_the_run_folder_from_the_jobs_settings(run_in_process, tmp_path):
    """hydra.run.dir and hydra.sweep.* name the run folder from the job's settings, which `--cfg hydra` leaves out
    of what it prints: --resolve and -p hydra.run.dir still resolve them."""
    overrides = (f"results_root={tmp_path}", "seed=3", "strategy=naive")
    out = run_in_process("--cfg", "hydra", "--resolve", *overrides)
    assert out.returncode == 0, out.stderr
    assert "${" not in out.stdout
    cfg = yaml.safe_load(out.stdout)["hydra"]
    assert cfg["run"]["dir"] == f"{tmp_path}/digits-mlp/naive/hdqt/seed3"
    assert cfg["sweep"] == {"dir": str(tmp_path), "subdir": "digits-mlp/naive/hdqt/seed3"}
    out = run_in_process("--cfg", "hydra", "-p", "hydra.run.dir", *overrides)
    assert (out.returncode, out.stdout) == (0, f"{tmp_path}/digits-mlp/naive/hdqt/seed3\n"), out.stderr


def test_the_installed_commands_run_from_any_folder(tmp_path):
    """`pip install .` ships the configs inside the package: `hdqt-cil` and `hdqt-cil-tables` work far from the
    checkout (the wheel's files alone on the path, the environment's libraries beside them)."""
    source, site = tmp_path / "source", tmp_path / "site"  # built from a copy: a build writes into its tree
    for folder in ("hdqt_cil", "hydra_plugins"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "prebuilt"))
    for file in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / file, source / file)
    build = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                            "--target", str(site), str(source)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}

    def command(name, *args):
        return subprocess.run([sys.executable, str(site / "bin" / name), *args], cwd=elsewhere, env=env,
                              capture_output=True, text=True, timeout=600)

    out = command("hdqt-cil", "strategy=naive", "quant=fp32", "trainer.epochs=1", "results_root=runs")
    assert out.returncode == 0, out.stderr[-2000:]
    assert (elsewhere / "runs" / "digits-mlp" / "naive" / "fp32" / "seed0" / "run.log").exists()
    tables = command("hdqt-cil-tables", "runs", "--out", "tables", "--no-plot")
    assert tables.returncode == 0, tables.stderr[-2000:]
    assert "| digits | class | mlp | naive | fp32 |" in (elsewhere / "tables" / "table.md").read_text()
    assert "hdqt-cil-tables RUNS" in command("hdqt-cil", "--help").stdout
