"""scripts/quant_gap_report.py: the accuracy split, the gap decomposition, forgetting by task age and the
per-layer-group quantization statistics, on tiny run folders whose numbers are known."""
import importlib.util
import tarfile
import json
import math
from pathlib import Path

import pytest

from hdqt_cil.files import write_json

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("quant_gap_report", ROOT / "scripts" / "quant_gap_report.py")
gap = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gap)

NAN = math.nan
FP32 = [[90, NAN, NAN], [60, 80, NAN], [40, 50, 70]]
# HDQT: every task learned as well (same diagonal), the old ones forgotten 10 points more after one experience and
# 20 more after two
HDQT = [[90, NAN, NAN], [50, 80, NAN], [20, 40, 70]]
LAYERS = ("features.1.conv1", "features.1.stages.1.0.conv1", "features.1.stages.1.0.conv2", "classifier")


def write_run(root: Path, strategy: str, quant: str, acc_matrix, stats=None, seed=0, tag="", config=None,
              sizes=None):
    """A run folder; `sizes`: its tasks' test samples (test_sizes), none recorded (a run from before) for None."""
    folder = root / "cifar10-resnet32" / strategy / (f"{quant}-{tag}" if tag else quant) / f"seed{seed}"
    folder.mkdir(parents=True)
    if config is not None:  # the settings a table compares; the run's tag and seed as the real config records them
        (folder / "config.yaml").write_text(json.dumps({**config, "tag": tag, "seed": seed}))
    n = sizes or [1, 1, 1]
    seen = [sum(a * w for a, w in zip(row[: k + 1], n)) / sum(n[: k + 1]) for k, row in enumerate(acc_matrix)]
    summary = {"status": "complete", "error": None, "n_experiences": 3, "classes_per_exp": [2, 2, 2], "steps_done": 3,
               "run": {"benchmark": "cifar10", "model": "resnet32", "strategy": strategy, "quant": quant, "tag": tag,
                       "seed": seed, "scenario": "class"},
               "metrics": {"avg_acc": sum(seen) / 3, "last_acc": seen[-1], "forgetting": 0.0, "bwt": 0.0},
               "seen_acc": seen, "acc_matrix": acc_matrix, "class_acc": [], "wall_time_s": 1.0,
               "train_loss": [[2.0, 1.0], [3.0, 2.0],
                              [4.0 if quant == "fp32" else 5.0, 3.0 if quant == "fp32" else 3.6]]}
    if sizes is not None:
        summary["test_sizes"] = sizes
    write_json(folder / "summary.json", summary)  # NaN written as the runs write it (null)
    if stats is not None:
        records = [{"epoch": epoch, "experience": exp,
                    "layers": {layer: {s: stats(exp, epoch, layer) if s == "forward_saturated" else 0.0
                                       for s in gap.STATS} for layer in LAYERS}}
                   for exp in range(3) for epoch in (1, 2)]
        (folder / "quant_stats.json").write_text(json.dumps(records))


def lwf_saturation(exp, epoch, layer):
    """Stage 1 in experience 1: conv1 0.01 and 0.03 over the two epochs, conv2 0.03 and 0.05: mean 3 %."""
    if exp == 1 and ".stages.1." in layer:
        return {1: 0.01, 2: 0.03}[epoch] + (0.02 if layer.endswith("conv2") else 0.0)
    return 0.0


def rows(md: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines()[2:] if line.startswith("|")]


@pytest.mark.parametrize("sizes", [None, [360, 360, 360]])
def test_numbers_from_known_runs(tmp_path, sizes):
    """Equal test sets, recorded or not (runs from before test_sizes): each task weighs the same."""
    runs = tmp_path / "runs"
    write_run(runs, "lwf", "fp32", FP32, sizes=sizes)
    write_run(runs, "lwf", "hdqt", HDQT, stats=lwf_saturation, sizes=sizes)
    write_run(runs, "icarl", "hdqt", FP32, stats=lambda exp, epoch, layer: 0.01 if layer == "classifier" else 0.0)
    for quant in ("fp32", "hdqt"):  # joint training, scored once after every task: no split, left out
        write_run(runs, "joint", quant, [[0.0, 84.4, 40.4]], sizes=sizes)
    gap.main([str(runs), "--out", str(tmp_path / "out"), "--no-plot"])
    out = tmp_path / "out"
    assert "joint" not in (out / "accuracy_split.md").read_text()
    with tarfile.open(tmp_path / "runs.tgz", "w:gz") as archive:  # the same runs as a published runs.tgz
        archive.add(runs, arcname="runs")
    gap.main([str(tmp_path / "runs.tgz"), "--out", str(tmp_path / "from_archive"), "--no-plot"])
    for table in out.glob("*.md"):
        assert (tmp_path / "from_archive" / table.name).read_text() == table.read_text()

    split = {r[1]: r for r in rows((out / "accuracy_split.md").read_text())}
    # after experience 2: new 70 in both; old (40+50)/2 = 45 → (20+40)/2 = 30; learned (90+80)/2 in both
    assert split["2"][3:11] == ["70.0 (n=1)", "70.0 (n=1)", "+0.0 (n=1)", "45.0 (n=1)", "30.0 (n=1)",
                                "-15.0 (n=1)", "+0.0 (n=1)", "+15.0 (n=1)"]
    assert split["1"][8] == "-10.0 (n=1)"

    # seen accuracy 90/70/53.3 → 90/65/43.3: Δavg −5 and Δlast −10, all from the old tasks and all forgotten
    decomposition = rows((out / "gap_decomposition.md").read_text())[0]
    assert decomposition[:12] == ["lwf", "0", "-5.0", "+0.0", "-5.0", "+0.0", "-5.0", "-10.0", "+0.0", "-10.0",
                                  "+0.0", "-10.0"]

    ages = {r[1]: r for r in rows((out / "forgetting_by_age.md").read_text())}
    assert ages["1"][3:8] == ["30.0 (n=1)", "40.0 (n=1)", "+10.0 (n=1)", "+10.0", "1/1"]
    assert ages["2"][3:8] == ["50.0 (n=1)", "70.0 (n=1)", "+20.0 (n=1)", "+20.0", "1/1"]

    loss = {r[1]: r for r in rows((out / "train_loss.md").read_text())}
    # first epoch fp32, hdqt; last epoch fp32, hdqt, paired Δ
    assert loss["2"][3:8] == ["4.000 (n=1)", "5.000 (n=1)", "3.000 (n=1)", "3.600 (n=1)", "+0.600 (n=1)"]

    quant = (out / "quant_stats.md").read_text()
    forward = {(r[0], r[1]): r for r in rows(quant.split("## grad_input_saturated")[0].split("\n", 2)[2])}
    assert forward[("stage 1", "1")][2:] == ["3 (n=1)", "0 (n=1)", "+3 (n=1)", "1/1"]
    assert forward[("stage 1", "0")][2:] == ["0 (n=1)", "0 (n=1)", "+0 (n=1)", "0/1"]
    assert forward[("classifier", "2")][2:] == ["0 (n=1)", "1 (n=1)", "-1 (n=1)", "0/1"]
    assert [g for g, k in forward if k == "0"] == ["stem", "stage 1", "classifier"]


def number(cell: str) -> float:
    return float(cell.split()[0])


# tasks of 100, 300 and 200 test samples (seed 0): FP32's seen accuracy 90, 75, 60; HDQT's 80, 65, 48.3
UNEQUAL_FP32 = [[90, NAN, NAN], [60, 80, NAN], [40, 60, 70]]
UNEQUAL_HDQT = [[80, NAN, NAN], [50, 70, NAN], [20, 40, 75]]


def test_unequal_test_sets_weight_each_task_by_its_test_samples(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    for seed, sizes in enumerate(([100, 300, 200], [300, 100, 200])):  # the class order, hence the sizes, by seed
        write_run(runs, "lwf", "fp32", UNEQUAL_FP32, seed=seed, sizes=sizes)
        write_run(runs, "lwf", "hdqt", UNEQUAL_HDQT, seed=seed, sizes=sizes)
    gap.main([str(runs), "--out", str(out), "--no-plot", "--compare"])

    split = {r[1]: r for r in rows((out / "accuracy_split.md").read_text())}
    # after experience 2, FP32's old tasks (100·40 + 300·60)/400 = 55 in seed 0 and (300·40 + 100·60)/400 = 45 in
    # seed 1, HDQT's 35 and 25; learned −10 in both (90 → 80 and 80 → 70)
    assert split["2"][6:11] == ["50.0 ± 7.1", "30.0 ± 7.1", "-20.0 ± 0.0", "-10.0 ± 0.0", "+10.0 ± 0.0"]

    seeds = [r for r in rows((out / "gap_decomposition.md").read_text()) if r[1] in ("0", "1")]
    for r in seeds:  # Δ = new task's part + old tasks' part, and old = learned + forgotten, to the tables' rounding
        for total, new, old, learned, forgotten in (r[2:7], r[7:12]):
            assert number(new) + number(old) == pytest.approx(number(total), abs=0.11)
            assert number(learned) + number(forgotten) == pytest.approx(number(old), abs=0.11)
    # seed 0: Δseen −10, −10, −11.7; the newest task's part −10, −10·300/400, +5·200/600, the old tasks' part
    # 0, −10·100/400, −20·400/600
    assert seeds[0][2:12] == ["-10.6", "-5.3", "-5.3", "-3.1", "-2.2", "-11.7", "+1.7", "-13.3", "-6.7", "-6.7"]

    ages = {r[1]: r for r in rows((out / "forgetting_by_age.md").read_text())}
    # age 1, FP32: tasks 0 (100 samples) and 1 (300) lost 30 and 20: 22.5 in seed 0, 27.5 in seed 1
    assert ages["1"][3] == "25.0 ± 3.5"


def test_runs_whose_tasks_cannot_be_weighted_are_refused(tmp_path):
    """A run from before test_sizes whose seen accuracy is not its tasks' mean, a recorded run whose seen accuracy
    is not its tasks' weighted one, and FP32 against the scheme on tasks of other sizes."""
    write_run(tmp_path / "old", "lwf", "fp32", FP32)
    write_run(tmp_path / "new", "lwf", "fp32", FP32, sizes=[1, 2, 3])
    for path in tmp_path.rglob("summary.json"):
        summary = json.loads(path.read_text())
        summary["seen_acc"][1] += 1.0
        path.write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"^tasks' test sets differ in size in runs from before summary.json recorded "
                                         r"them \(test_sizes\): .*old.*fp32/seed0; run them again"):
        gap.load_runs(tmp_path / "old")
    with pytest.raises(ValueError, match=r"new.*fp32.*: the tasks' accuracies weighted by test_sizes are not seen_acc"):
        gap.load_runs(tmp_path / "new")
    write_run(tmp_path / "other", "lwf", "fp32", FP32, sizes=[1, 2, 3])
    write_run(tmp_path / "other", "lwf", "hdqt", HDQT, sizes=[3, 2, 1])
    with pytest.raises(ValueError, match="lwf seed 0: FP32's and the scheme's runs differ in their tasks' test-set"):
        gap.report([tmp_path / "other"], tmp_path / "out", compare=())


def test_the_quick_start_benchmark_is_split(make_cfg, tmp_path, one_thread):
    """Digits (the default benchmark): its classes' test sets differ in size; iCaRL at FP32 and HDQT, one epoch."""
    from hdqt_cil.experiment import run

    summaries = [run(make_cfg(f"quant={quant}", "trainer.epochs=1", "seed=0"), tmp_path / "runs" / quant)
                 for quant in ("fp32", "hdqt")]
    assert len(set(summaries[0]["test_sizes"])) > 1
    gap.main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--no-plot", "--compare"])
    seed = rows((tmp_path / "out" / "gap_decomposition.md").read_text())[0]
    gaps = [b["metrics"][m] - a["metrics"][m] for m in ("avg_acc", "last_acc") for a, b in [summaries]]
    assert [number(seed[2]), number(seed[7])] == pytest.approx(gaps, abs=0.051)
    assert number(seed[3]) + number(seed[4]) == pytest.approx(gaps[0], abs=0.11)
    assert number(seed[8]) + number(seed[9]) == pytest.approx(gaps[1], abs=0.11)


def test_layer_groups():
    assert [gap.layer_group(n) for n in LAYERS] == ["stem", "stage 1", "stage 1", "classifier"]


def test_several_strategies_each_against_the_last(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs, "lwf", "hdqt", HDQT, stats=lwf_saturation)
    write_run(runs, "bic", "hdqt", HDQT, stats=lambda exp, epoch, layer: 0.02 if layer == "classifier" else 0.0)
    write_run(runs, "icarl", "hdqt", FP32, stats=lambda exp, epoch, layer: 0.01 if layer == "classifier" else 0.0)
    write_run(runs, "lwf", "fp32", FP32)
    gap.main([str(runs), "--out", str(tmp_path / "out"), "--no-plot", "--compare", "lwf", "bic", "icarl"])
    quant = (tmp_path / "out" / "quant_stats.md").read_text()
    table = quant.split("## grad_input_saturated")[0].split("\n", 2)[2]
    assert table.splitlines()[0].split("|")[3:-1] == [
        " lwf % ", " bic % ", " icarl % ", " lwf − icarl (paired) ", " seeds lwf > icarl ",
        " bic − icarl (paired) ", " seeds bic > icarl "]
    forward = {(r[0], r[1]): r for r in rows(table)}
    assert forward[("classifier", "2")][2:] == ["0 (n=1)", "2 (n=1)", "1 (n=1)", "-1 (n=1)", "0/1", "+1 (n=1)", "1/1"]
    assert forward[("stage 1", "1")][2:] == ["3 (n=1)", "0 (n=1)", "0 (n=1)", "+3 (n=1)", "1/1", "+0 (n=1)", "0/1"]


def test_one_strategy_to_compare_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gap.main([str(tmp_path), "--out", str(tmp_path / "out"), "--compare", "lwf"])
    assert "two strategies or none" in capsys.readouterr().err


def test_no_strategy_to_compare_writes_the_accuracy_tables_alone(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs, "lwf", "fp32", FP32)
    write_run(runs, "lwf", "hdqt", HDQT, stats=lwf_saturation)
    gap.main([str(runs), "--out", str(tmp_path / "out"), "--no-plot", "--compare"])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "accuracy_split.md", "forgetting_by_age.md", "gap_decomposition.md", "train_loss.md"]


def test_strategy_variants_are_paired_apart(tmp_path):
    """A strategy run in two variants (one of them tagged): FP32 against HDQT within each variant, never across."""
    runs = tmp_path / "runs"
    seen = {"strategy": {"name": "bic", "ce_classes": "seen"}}
    write_run(runs, "bic", "fp32", FP32, config={"strategy": {"name": "bic"}})
    write_run(runs, "bic", "hdqt", HDQT, stats=lwf_saturation, config={"strategy": {"name": "bic"}})
    write_run(runs, "bic", "fp32", FP32, tag="ce_seen", config=seen)
    write_run(runs, "bic", "hdqt", FP32, stats=lwf_saturation, tag="ce_seen", config=seen)
    both = ["bic [strategy.ce_classes=seen]", "bic [strategy.ce_classes=unset]"]
    gap.main([str(runs), "--out", str(tmp_path / "out"), "--no-plot", "--compare", *both])
    means = {r[0]: r for r in rows((tmp_path / "out" / "gap_decomposition.md").read_text()) if r[1] == "mean ± std"}
    assert sorted(means) == both
    assert means[both[0]][2] == "+0.0 (n=1)" and means[both[1]][2] == "-5.0 (n=1)"


def test_runs_that_cannot_be_paired_are_refused(tmp_path, capsys):
    write_run(tmp_path, "lwf", "fp32", FP32)
    write_run(tmp_path, "lwf", "hdqt", HDQT, stats=lwf_saturation)
    with pytest.raises(SystemExit) as end:  # one line, no traceback
        gap.main([str(tmp_path), "--out", str(tmp_path / "out"), "--no-plot", "--compare", "bic", "lwf"])
    err = capsys.readouterr().err
    assert end.value.code == 2 and err.startswith("error: ") and "no hdqt runs of bic; there are lwf" in err
    assert err.count("\n") == 1
    with pytest.raises(SystemExit) as end:
        gap.main([str(tmp_path / "typo"), "--out", str(tmp_path / "out"), "--no-plot"])
    assert end.value.code == 2 and capsys.readouterr().err == f"error: no such file or folder: {tmp_path / 'typo'}\n"
    write_run(tmp_path, "lwf", "fp32", FP32, tag="again")  # the same settings and seed twice
    with pytest.raises(ValueError, match="same settings and seed.*fp32-again"):
        gap.load_runs(tmp_path)


def test_runs_of_two_benchmarks_are_not_paired(tmp_path, capsys):
    """FP32 on one benchmark and the scheme on another would make a gap of two datasets: refused in one line."""
    write_run(tmp_path, "lwf", "fp32", FP32)
    write_run(tmp_path, "lwf", "hdqt", HDQT)
    summary = tmp_path / "cifar10-resnet32" / "lwf" / "hdqt" / "seed0" / "summary.json"
    summary.write_text(summary.read_text().replace('"benchmark": "cifar10"', '"benchmark": "cifar100"'))
    with pytest.raises(SystemExit) as end:
        gap.main([str(tmp_path), "--out", str(tmp_path / "out"), "--no-plot", "--compare"])
    assert end.value.code == 2
    assert capsys.readouterr().err == "error: the runs are of several benchmarks (cifar10, cifar100): give one " \
        "benchmark's runs\n"


def test_a_tagged_ablation_is_left_out_and_schedules_are_not_mixed(tmp_path):
    """A tagged run set off its scheme's preset (acc_bits 12) is no run of the scheme: HDQT's gap is its preset
    runs', unless --scheme names the set (hdqt[acc12]). FP32 at one schedule against the scheme at another is
    refused, naming both."""
    from hdqt_cil.quant.schemes import preset_settings

    def config(quant, epochs=60, **settings):
        return {"quant": {**preset_settings(quant), **settings}, "strategy": {"name": "lwf"},
                "trainer": {"epochs": epochs}}

    write_run(tmp_path, "lwf", "fp32", FP32, config=config("fp32"))
    write_run(tmp_path, "lwf", "hdqt", HDQT, config=config("hdqt"))
    write_run(tmp_path, "lwf", "hdqt", FP32, tag="acc12", config=config("hdqt", acc_bits=12))
    steps, _ = gap.load_runs(tmp_path)
    assert sorted(set(steps.path.map(lambda p: Path(p).parent.name))) == ["fp32", "hdqt"]
    steps, _ = gap.load_runs(tmp_path, scheme="hdqt[acc12]")
    assert sorted(set(steps.quant)) == ["fp32", "hdqt", "hdqt[acc12]"]
    assert set(steps[steps.quant == "hdqt[acc12]"].path.map(lambda p: Path(p).parent.name)) == {"hdqt-acc12"}
    out = tmp_path / "out"
    gap.main([str(tmp_path), "--out", str(out), "--no-plot", "--compare", "--scheme", "hdqt[acc12]"])
    assert header((out / "gap_decomposition.md").read_text())[2] == "Δavg (summary)"
    assert rows((out / "gap_decomposition.md").read_text())[0][2] == "+0.0"  # the acc12 run is FP32's twin here
    write_run(tmp_path / "short", "lwf", "hdqt", HDQT, config=config("hdqt", epochs=8))
    write_run(tmp_path / "short", "lwf", "fp32", FP32, seed=1, config=config("fp32"))
    with pytest.raises(ValueError, match=r"the runs of lwf ran at more than one schedule \(– at 60 epochs, – at 8 "
                                         r"epochs\)"):
        gap.load_runs(tmp_path / "short")


def header(md: str) -> list[str]:
    return [c.strip() for c in md.splitlines()[0].strip("|").split("|")]


def test_another_scheme_against_fp32(tmp_path, capsys):
    """--scheme int4: FP32 against INT4 (a tagged run set), the tables naming int4; the HDQT runs beside them (no
    gap if they were paired in) are left out."""
    runs = tmp_path / "runs"
    write_run(runs, "lwf", "fp32", FP32)
    write_run(runs, "lwf", "int4", HDQT, stats=lwf_saturation, tag="diag")
    write_run(runs, "lwf", "hdqt", FP32, stats=lwf_saturation)
    write_run(runs, "icarl", "int4", FP32, stats=lambda exp, epoch, layer: 0.01 if layer == "classifier" else 0.0)
    out = tmp_path / "out"
    gap.main([str(runs), "--out", str(out), "--no-plot", "--scheme", "int4"])
    assert not [p.name for p in out.iterdir() if "hdqt" in p.read_text()]

    split = (out / "accuracy_split.md").read_text()
    assert header(split)[3:7] == ["new fp32", "new int4", "Δnew", "old fp32"] and header(split)[7] == "old int4"
    assert {r[1]: r for r in rows(split)}["2"][6:9] == ["45.0 (n=1)", "30.0 (n=1)", "-15.0 (n=1)"]
    assert rows((out / "gap_decomposition.md").read_text())[0][:8] == [
        "lwf", "0", "-5.0", "+0.0", "-5.0", "+0.0", "-5.0", "-10.0"]
    ages = (out / "forgetting_by_age.md").read_text()
    assert header(ages)[3:] == ["fp32", "int4", "Δ (paired)", "Δ per seed", "seeds int4 > fp32"]
    assert {r[1]: r for r in rows(ages)}["2"][3:8] == ["50.0 (n=1)", "70.0 (n=1)", "+20.0 (n=1)", "+20.0", "1/1"]
    loss = (out / "train_loss.md").read_text()
    assert header(loss)[3:] == ["first epoch fp32", "first epoch int4", "fp32", "int4", "Δ (paired)", "int4 / fp32"]
    assert {r[1]: r for r in rows(loss)}["2"][3:9] == ["4.000 (n=1)", "5.000 (n=1)", "3.000 (n=1)", "3.600 (n=1)",
                                                      "+0.600 (n=1)", "1.20 (n=1)"]
    forward = rows((out / "quant_stats.md").read_text().split("## grad_input_saturated")[0].split("\n", 2)[2])
    assert {(r[0], r[1]): r for r in forward}[("stage 1", "1")][2:] == ["3 (n=1)", "0 (n=1)", "+3 (n=1)", "1/1"]

    capsys.readouterr()
    with pytest.raises(SystemExit) as end:
        gap.main([str(runs), "--out", str(out), "--no-plot", "--scheme", "fp8"])
    assert end.value.code == 2 and capsys.readouterr().err == (
        f"error: --scheme: no fp8 runs to set against fp32 under {runs}; there are hdqt, int4\n")
