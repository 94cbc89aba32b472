import csv
import json
import math
import tarfile

import numpy as np
import pytest

from omegaconf import OmegaConf

from hdqt_cil.quant.schemes import preset_settings
from hdqt_cil.files import write_json
from hdqt_cil.results.__main__ import main
from hdqt_cil.results.style import SCHEME_ORDER, STRATEGY_ORDER, run_style
from hdqt_cil.results.tables import aggregate, collect_runs, display_table, make_tables


def _summary(strategy, quant, seed, last, status="complete", tag="", scenario=None):
    run = {"benchmark": "hapt", "model": "mlp", "strategy": strategy, "quant": quant, "tag": tag, "seed": seed}
    return {"status": status, "error": None,
            "run": run if scenario is None else {**run, "scenario": scenario},  # None: a summary from before
            "n_experiences": 2, "classes_per_exp": [2, 2], "steps_done": 2,
            "metrics": {"avg_acc": last + 10, "last_acc": last, "forgetting": 5.0, "bwt": -5.0},
            "seen_acc": [last + 20, last], "acc_matrix": [], "class_acc": [], "wall_time_s": 1.0}


def _write(root, *summaries):
    for i, s in enumerate(summaries):
        write_json(root / f"run{i}" / "summary.json", s)


def test_mean_std_over_seeds_and_flags(tmp_path):
    _write(tmp_path,
           _summary("icarl", "fp32", 0, 80.0), _summary("icarl", "fp32", 1, 84.0),
           _summary("icarl", "fp32", 2, 10.0, status="running"),          # killed: not averaged in
           _summary("bic", "hdqt", 0, 70.0), _summary("bic", "hdqt", 1, math.nan, status="diverged"),
           _summary("lwf", "hdqt", 0, math.nan, status="diverged"),
           _summary("icarl", "fp32", 0, 50.0, tag="acc4"))
    agg = aggregate(collect_runs(tmp_path)).set_index(["strategy", "quant"])
    icarl = agg.loc[("icarl", "fp32")]
    assert icarl.last_acc_mean == pytest.approx(82.0)
    assert icarl.last_acc_std == pytest.approx(2.8284271)
    assert icarl.seeds == 2 and icarl.incomplete == 1
    assert icarl.last_acc_text == "82.0 ± 2.8"
    assert agg.loc[("bic", "hdqt")].last_acc_text == "70.0 (n=1) (1 diverged)"
    assert agg.loc[("lwf", "hdqt")].last_acc_text == "diverged"
    assert agg.loc[("icarl", "fp32[acc4]")].last_acc_mean == 50.0
    assert "incomplete" in display_table(aggregate(collect_runs(tmp_path))).columns


def test_seeds_apart_by_a_float_sums_last_bits_have_no_spread_and_others_keep_theirs():
    from hdqt_cil.results.tables import mean_std

    assert mean_std([761.0, 761.0 + 2 ** -43, 761.0], ".3g") == "761 ± 0"
    assert mean_std([761.0, 762.0, 761.0], ".3g") == "761 ± 0.577"
    assert mean_std([0.0, 1e-12], ".3g") == "5e-13 ± 7.07e-13"


def test_make_tables_writes_every_format(tmp_path):
    _write(tmp_path / "runs", _summary("icarl", "fp32", 0, 80.0), _summary("icarl", "hdqt", 0, 78.0))
    table = make_tables([tmp_path / "runs"], tmp_path / "out")
    assert list(table.strategy) == ["icarl", "icarl"]
    md = (tmp_path / "out" / "table.md").read_text()
    assert "| hapt | class | mlp | icarl | hdqt | 88.0 (n=1) | 78.0 (n=1) |" in md
    assert "last_acc_mean" in (tmp_path / "out" / "table.csv").read_text()
    assert "\\begin{tabular}" in (tmp_path / "out" / "table.tex").read_text()
    assert (tmp_path / "out" / "accuracy.png").stat().st_size > 1000


def test_table_csv_leaves_the_std_of_one_seed_empty(tmp_path):
    """One seed measures no spread: table.csv's std is empty there (table.md's 'n=1'), never a spread of 0."""
    _write(tmp_path / "runs", _summary("icarl", "fp32", 0, 80.0), _summary("icarl", "fp32", 1, 84.0),
           _summary("icarl", "hdqt", 0, 78.0))
    make_tables([tmp_path / "runs"], tmp_path / "out", plot=False)
    with open(tmp_path / "out" / "table.csv", newline="") as f:
        rows = {row["quant"]: row for row in csv.DictReader(f)}
    assert (rows["hdqt"]["last_acc_mean"], rows["hdqt"]["last_acc_std"], rows["hdqt"]["seeds"]) == ("78.0", "", "1")
    assert rows["hdqt"]["wall_time_s_std"] == "" and rows["hdqt"]["wall_time_s_mean"] == "1.0"
    assert (rows["fp32"]["last_acc_mean"], rows["fp32"]["wall_time_s_std"]) == ("82.0", "0.0")
    assert float(rows["fp32"]["last_acc_std"]) == pytest.approx(2.8284271)


def test_a_second_make_tables_removes_the_earlier_ones_outputs_it_does_not_write_and_nothing_else(tmp_path):
    """Tables of other runs left beside new ones would look current: an output of the earlier make_tables into the
    folder that this one does not write goes (here paired.md); a file it never wrote stays."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    _write(tmp_path / "pairs", _summary("icarl", "fp32", 0, 80.0), _summary("icarl", "hdqt", 0, 78.0))
    make_tables([tmp_path / "pairs"], out)
    assert (out / "paired.md").exists() and (out / "accuracy.png").exists()
    _write(tmp_path / "alone", _summary("icarl", "fp32", 0, 80.0))
    make_tables([tmp_path / "alone"], out, plot=False)
    assert sorted(p.name for p in out.iterdir()) == ["accuracy.png", "main.md", "make_tables_outputs.txt", "notes.md",
                                                      "table.csv", "table.md", "table.tex"]
    assert (out / "make_tables_outputs.txt").read_text() == "table.md\ntable.csv\ntable.tex\nmain.md\naccuracy.png\n"
    assert (out / "notes.md").read_text() == "mine"
    (tmp_path / "beside.md").write_text("mine")  # a name of another folder in the list is none make_tables wrote
    (out / "make_tables_outputs.txt").write_text("../beside.md\n")
    make_tables([tmp_path / "alone"], out, plot=False)
    assert (tmp_path / "beside.md").exists()


def test_no_plot_draws_no_figure_and_removes_only_those_its_runs_would_not_draw(tmp_path):
    """--no-plot is no drawing, not removal: the figures of an earlier make_tables that these runs would draw again
    stay, named still, so that a later make_tables whose runs no longer call for one removes it; a table these runs
    do not give, or a figure they would not draw, goes."""
    def costed(quant, last):
        return {**_summary("icarl", quant, 0, last),
                "cost": {"training int GMACs": 1.0, "training energy J": {"total": 2.0}}}

    out = tmp_path / "out"
    _write(tmp_path / "pairs", costed("fp32", 80.0), costed("hdqt", 78.0))
    main([str(tmp_path / "pairs"), "--out", str(out)])
    drawn = {name: (out / name).read_bytes() for name in ("accuracy.png", "energy.png")}
    _write(tmp_path / "alone", costed("fp32", 82.0))  # no pair; costed: energy.png would be drawn
    main([str(tmp_path / "alone"), "--out", str(out), "--no-plot"])
    assert {name: (out / name).read_bytes() for name in drawn} == drawn and not (out / "paired.md").exists()
    assert "82.0 (n=1)" in (out / "table.md").read_text()
    _write(tmp_path / "plain", _summary("icarl", "fp32", 0, 84.0))  # no cost: no energy.png
    main([str(tmp_path / "plain"), "--out", str(out), "--no-plot"])
    assert not (out / "energy.png").exists() and (out / "accuracy.png").read_bytes() == drawn["accuracy.png"]
    assert (out / "make_tables_outputs.txt").read_text() == "table.md\ntable.csv\ntable.tex\nmain.md\naccuracy.png\n"


def test_no_runs_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no run folders"):
        collect_runs(tmp_path)


def test_the_command_names_a_root_without_runs_in_one_line(tmp_path, capsys):
    (tmp_path / "outputs").mkdir()
    with pytest.raises(SystemExit) as end:
        main([str(tmp_path / "outputs"), "--out", str(tmp_path / "tables")])
    err = capsys.readouterr().err
    assert end.value.code == 2 and err == f"error: no run folders (summary.json) under {tmp_path / 'outputs'}\n"
    with pytest.raises(SystemExit) as end:
        main([str(tmp_path / "outputs"), str(tmp_path / "typo"), "--out", str(tmp_path / "tables")])
    err = capsys.readouterr().err
    assert end.value.code == 2 and err == f"error: no such file or folder: {tmp_path / 'typo'}\n"


def _run_with_config(root, name, summary, strategy=None, trainer=None, **quant):
    write_json(root / name / "summary.json", summary)
    config = {"quant": {**preset_settings(summary["run"]["quant"]), **quant},
              "strategy": strategy or {"name": summary["run"]["strategy"]}, "trainer": trainer or {}}
    (root / name / "config.yaml").write_text(OmegaConf.to_yaml(config))


def test_main_table_puts_schemes_side_by_side_and_ablation_rows_by_setting(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        _run_with_config(runs, f"fp{seed}", _summary("bic", "fp32", seed, 90.0 + seed))
        _run_with_config(runs, f"hdqt{seed}", _summary("bic", "hdqt", seed, 88.0 + seed))
        _run_with_config(runs, f"acc8_{seed}", _summary("bic", "hdqt", seed, 88.0 + seed, tag="acc8"), acc_bits=8)
        _run_with_config(runs, f"acc4_{seed}", _summary("bic", "hdqt", seed, 2.0 + seed, tag="acc4"), acc_bits=4)
        _run_with_config(runs, f"acc12_{seed}", _summary("bic", "hdqt", seed, 89.0, tag="acc12"), acc_bits=12)
        # memory against speed is no ablation (though a GPU run's last bits differ): HOT's runs stay in main.md
        _run_with_config(runs, f"hot{seed}", _summary("bic", "hot", seed, 85.0 + seed), sliced_unfold=False)
    make_tables([runs], tmp_path / "out")
    main = (tmp_path / "out" / "main.md").read_text().splitlines()
    assert main[0].startswith("| benchmark | strategy | fp32 avg acc | fp32 last acc | fp32 forgetting | hdqt avg acc")
    assert "| 95.5 ± 0.7 | 85.5 ± 0.7 | 5.0 ± 0.0 |" in main[2]  # hot, after hdqt
    assert main[2].startswith("| hapt | bic | 100.5 ± 0.7 | 90.5 ± 0.7 | 5.0 ± 0.0 | 98.5 ± 0.7 | 88.5 ± 0.7 |")
    ablation = (tmp_path / "out" / "ablation.md").read_text()
    assert "| hapt | bic | hdqt | acc_bits=4 | 12.5 ± 0.7 | 2.5 ± 0.7 |" in ablation
    assert "| hapt | bic | hdqt | default | 98.5 ± 0.7 | 88.5 ± 0.7 |" in ablation   # the tagged acc8 copy counts once
    assert "| 2 |" in ablation.splitlines()[-1] and "fp32" not in ablation and "hot" not in ablation
    assert (tmp_path / "out" / "ablation.png").stat().st_size > 1000


def test_tables_carry_the_schedule_of_their_runs(tmp_path):
    """Epochs a task and the preset beside every row; a shortened schedule is a row of its own in main.md."""
    runs = tmp_path / "runs"
    for epochs, last in ((100, 90.0), (5, 33.8)):
        tag = "" if epochs == 100 else "short"
        _run_with_config(runs, f"fp{epochs}", _summary("icarl", "fp32", 0, last, tag=tag),
                         trainer={"epochs": epochs})
        config = OmegaConf.load(runs / f"fp{epochs}" / "config.yaml")
        config.preset = "har_paper"
        (runs / f"fp{epochs}" / "config.yaml").write_text(OmegaConf.to_yaml(config))
    table = make_tables([runs], tmp_path / "out", plot=False)
    assert list(table.preset) == ["har_paper", "har_paper"] and sorted(table.epochs) == ["100", "5"]
    md = (tmp_path / "out" / "table.md").read_text()
    assert "| hapt | class | mlp | icarl | fp32 | har_paper | 100 | 100.0 (n=1) | 90.0 (n=1) |" in md
    assert "| fp32[short] | har_paper | 5 | 43.8 (n=1) | 33.8 (n=1) |" in md
    _run_with_config(runs, "hdqt", _summary("icarl", "hdqt", 0, 88.0), trainer={"epochs": 100})
    main = (tmp_path / "out2" / "main.md")
    make_tables([runs], tmp_path / "out2", plot=False)
    assert main.read_text().splitlines()[2] == ("| hapt | 100 | icarl | 100.0 (n=1) | 90.0 (n=1) | 5.0 (n=1) | "
                                                "98.0 (n=1) | 88.0 (n=1) | 5.0 (n=1) |")


def test_ablation_settings_are_paired_by_seed_against_default_and_fp32_and_same_runs_named(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1, 2):
        _run_with_config(runs, f"fp{seed}", _summary("bic", "fp32", seed, 90.0 + seed))
        if seed < 2:  # the default lacks seed 2: its differences are over two seeds, and say so
            _run_with_config(runs, f"hdqt{seed}", _summary("bic", "hdqt", seed, 80.0 + 2 * seed))
        _run_with_config(runs, f"acc4_{seed}", _summary("bic", "hdqt", seed, 10.0 + seed, tag="acc4"), acc_bits=4)
        for bits in (12, 16):  # the same numbers at 12 and 16 bits: nothing saturated at either
            _run_with_config(runs, f"acc{bits}_{seed}", _summary("bic", "hdqt", seed, 88.0 + 3 * seed,
                                                                   tag=f"acc{bits}"), acc_bits=bits)
    make_tables([runs], tmp_path / "out", plot=False)
    paired = (tmp_path / "out" / "ablation_paired.md").read_text().splitlines()
    assert paired[0] == ("| benchmark | strategy | scheme | setting | avg acc − default | last acc − default | "
                         "avg acc − fp32 | last acc − fp32 | seeds | same runs as |")
    # acc12 − default: 88 − 80, 91 − 82; − fp32: −2, 0, +2
    assert paired[2] == ("| hapt | bic | hdqt | acc_bits=12 | +8.5 ± 0.7 (2) | +8.5 ± 0.7 (2) | +0.0 ± 2.0 | "
                         "+0.0 ± 2.0 | 3 | acc_bits=16 |")
    # acc4 − default: 10 − 80, 11 − 82; − fp32: 10 − 90, 11 − 91, 12 − 92
    assert paired[4] == ("| hapt | bic | hdqt | acc_bits=4 | -70.5 ± 0.7 (2) | -70.5 ± 0.7 (2) | -80.0 ± 0.0 | "
                         "-80.0 ± 0.0 | 3 | – |")
    assert paired[3].endswith("| 3 | acc_bits=12 |") and len(paired) == 5


def test_a_run_from_before_configs_named_their_preset_takes_it_from_its_experiment(tmp_path):
    """Its command's `+experiment=har_paper` (.hydra/overrides.yaml): its row joins the later runs' of that preset,
    FP32's cost beside them; a run that names no experiment stays without one."""
    runs = tmp_path / "runs"
    _run_with_config(runs, "fp", _summary("icarl", "fp32", 0, 90.0), trainer={"epochs": 100})
    (runs / "fp" / ".hydra").mkdir()
    (runs / "fp" / ".hydra" / "overrides.yaml").write_text("- +experiment=har_paper\n- trainer.epochs=100\n")
    _run_with_config(runs, "hdqt", _summary("icarl", "hdqt", 0, 88.0), trainer={"epochs": 100})
    config = OmegaConf.load(runs / "hdqt" / "config.yaml")
    config.preset = "har_paper"
    (runs / "hdqt" / "config.yaml").write_text(OmegaConf.to_yaml(config))
    _run_with_config(runs, "plain", _summary("lwf", "fp32", 0, 70.0), trainer={"epochs": 100})
    table = make_tables([runs], tmp_path / "out", plot=False).set_index(["strategy", "quant"])
    assert table.loc[("icarl", "fp32"), "preset"] == table.loc[("icarl", "hdqt"), "preset"] == "har_paper"
    assert table.loc[("lwf", "fp32"), "preset"] == "–"
    main = (tmp_path / "out" / "main.md").read_text().splitlines()
    assert sum("| icarl |" in row for row in main) == 1  # one row: FP32 and HDQT side by side


def test_an_ablation_without_preset_runs_is_tabled_and_plotted_without_a_reference(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        _run_with_config(runs, f"acc4_{seed}", _summary("bic", "hdqt", seed, 2.0 + seed, tag="acc4"), acc_bits=4)
        _run_with_config(runs, f"acc12_{seed}", _summary("bic", "hdqt", seed, 89.0, tag="acc12"), acc_bits=12)
    make_tables([runs], tmp_path / "out")
    ablation = (tmp_path / "out" / "ablation.md").read_text()
    assert "| hapt | bic | hdqt | acc_bits=12 | 99.0 ± 0.0 | 89.0 ± 0.0 |" in ablation
    assert (tmp_path / "out" / "ablation.png").stat().st_size > 1000


def test_the_peak_gpu_memory_column_appears_where_runs_recorded_it(tmp_path):
    runs = tmp_path / "runs"
    for seed, peak in ((0, 300.0), (1, 340.0)):
        _run_with_config(runs, f"gpu{seed}", {**_summary("bic", "hot", seed, 80.0), "peak_memory_mib": peak})
        _run_with_config(runs, f"cpu{seed}", {**_summary("bic", "fp32", seed, 85.0), "peak_memory_mib": None})
    table = make_tables([runs], tmp_path / "out")
    assert table.set_index("quant")["peak GPU MiB"].to_dict() == {"fp32": "–", "hot": "320 ± 28"}
    _run_with_config(tmp_path / "cpu_only", "cpu", _summary("bic", "fp32", 0, 85.0))
    assert "peak GPU MiB" not in make_tables([tmp_path / "cpu_only"], tmp_path / "out_cpu")


def test_runs_differing_in_settings_are_split_and_named_never_averaged(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        for loss, last in (("bce", 70.0), ("ce_kd", 85.0)):
            _run_with_config(runs, f"{loss}{seed}", _summary("icarl", "fp32", seed, last + seed),
                             strategy={"name": "icarl", "loss": loss},
                             trainer={"epochs": 100, "device": f"cuda:{seed}"})
        _run_with_config(runs, f"hdqt{seed}", _summary("icarl", "hdqt", seed, 60.0),
                         strategy={"name": "icarl", "loss": "bce"}, trainer={"epochs": 100, "device": "cpu"})
    table = make_tables([runs], tmp_path / "out")
    assert sorted(table.variant) == ["strategy.loss=bce", "strategy.loss=bce", "strategy.loss=ce_kd"]
    assert sorted(table["last acc"]) == ["60.0 ± 0.0", "70.5 ± 0.7", "85.5 ± 0.7"]   # the device does not split
    main = (tmp_path / "out" / "main.md").read_text()
    assert ("| hapt | 100 | icarl [strategy.loss=bce] | 80.5 ± 0.7 | 70.5 ± 0.7 | 5.0 ± 0.0 | 70.0 ± 0.0 | "
            "60.0 ± 0.0 |" in main)
    assert "| hapt | 100 | icarl [strategy.loss=ce_kd] | 95.5 ± 0.7 | 85.5 ± 0.7 | 5.0 ± 0.0 | – | – | – |" in main


def test_the_settings_of_a_feature_split_rows_only_where_they_differ_among_runs_that_use_it(tmp_path):
    runs, replay = tmp_path / "runs", {"hp_replay_epochs": 2, "hp_replay_bits": 8}
    for name, hp, epochs in (("plain", None, 2), ("hp200", 200, 2), ("hp100", 100, 2), ("hp200e4", 200, 4)):
        _run_with_config(runs, name, _summary("icarl", "hdqt", 0, 80.0),
                         strategy={"name": "icarl", "hp_replay": hp, **replay, "hp_replay_epochs": epochs})
    table = make_tables([runs], tmp_path / "out")
    assert sorted(table.variant) == [
        "strategy.hp_replay=100, strategy.hp_replay_epochs=2", "strategy.hp_replay=200, strategy.hp_replay_epochs=2",
        "strategy.hp_replay=200, strategy.hp_replay_epochs=4",
        "strategy.hp_replay=unset, strategy.hp_replay_epochs=unset"]


def test_a_defaulted_setting_splits_rows_from_the_runs_at_its_default_and_shows_that_default(tmp_path):
    """hp_replay_bn=train is the value before the setting existed, so it is left out of a run's identity: the runs
    at train must still not share a row with those at eval, and say train, not unset."""
    runs = tmp_path / "runs"
    for seed, (name, hp, bn) in enumerate((("plain", None, None), ("train", 200, "train"), ("old", 200, None),
                                           ("eval", 200, "eval"))):
        _run_with_config(runs, name, _summary("icarl", "hdqt", seed, 80.0 if bn == "eval" else 70.0),
                         strategy={"name": "icarl", "hp_replay": hp, "hp_replay_bn": bn})
    table = make_tables([runs], tmp_path / "out")
    assert sorted(zip(table.variant, table["last acc"])) == [
        ("strategy.hp_replay=200, strategy.hp_replay_bn=eval", "80.0 (n=1)"),
        ("strategy.hp_replay=200, strategy.hp_replay_bn=train", "70.0 ± 0.0"),
        ("strategy.hp_replay=unset, strategy.hp_replay_bn=unset", "70.0 (n=1)")]


def test_a_run_from_before_a_setting_or_record_existed_shares_the_row_of_runs_at_its_behaviour(tmp_path):
    """A run written before quant.grad_clip, benchmark.scenario and the data's fingerprint were recorded computed
    what grad_clip=1.0 on class-incremental data computes: its seed joins theirs. A clip that cuts, or other data
    among the runs that record it, still splits rows."""
    runs = tmp_path / "runs"

    def written(name, seed, last, data=None, **quant):
        summary = {**_summary("icarl", "hdqt", seed, last), **({"data_source": data} if data else {})}
        write_json(runs / name / "summary.json", summary)
        benchmark = {"name": "hapt"} if data is None else {"name": "hapt", "scenario": "class"}
        config = {"quant": {k: v for k, v in preset_settings("hdqt").items() if k != "grad_clip"} | quant,
                  "strategy": {"name": "icarl"}, "trainer": {}, "benchmark": benchmark}
        (runs / name / "config.yaml").write_text(OmegaConf.to_yaml(config))

    written("before", 0, 60.0)
    written("later", 1, 62.0, data="d1", grad_clip=1.0)
    table = make_tables([runs], tmp_path / "one")
    assert list(table["last acc"]) == ["61.0 ± 1.4"] and not {"variant", "quant_variant"} & set(table.columns)
    written("cut", 2, 50.0, data="d1", grad_clip=0.975)
    written("other", 3, 40.0, data="d2", grad_clip=1.0)
    table = make_tables([runs], tmp_path / "four")
    assert sorted(zip(table.variant, table.quant_variant, table["last acc"])) == [
        ("data=d1", "quant.grad_clip=0.975", "50.0 (n=1)"), ("data=d1", "quant.grad_clip=1.0", "62.0 (n=1)"),
        ("data=d2", "quant.grad_clip=1.0", "40.0 (n=1)"), ("data=unset", "quant.grad_clip=1.0", "60.0 (n=1)")]


def test_tagged_runs_only_leave_the_main_table_empty_and_table_md_whole(tmp_path):
    runs = tmp_path / "runs"
    _run_with_config(runs, "fp", _summary("bic", "fp32", 0, 40.0, tag="short3"))
    _run_with_config(runs, "hd", _summary("bic", "hdqt", 0, 35.0, tag="short3"))
    make_tables([runs], tmp_path / "out")
    assert (tmp_path / "out" / "main.md").read_text().splitlines()[0] == "| benchmark | strategy |"
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| hapt | class | mlp | bic | hdqt[short3] | 45.0 (n=1) | 35.0 (n=1) |" in table


def test_published_numbers_beside_the_runs_with_differences_and_costs(tmp_path):
    _write(tmp_path / "runs", _summary("icarl", "fp32", 0, 80.0), _summary("icarl", "fp32", 1, 84.0),
           _summary("icarl", "hdqt", 0, 78.0), _summary("icarl", "hdqt", 1, 80.0),
           _summary("icarl", "hdqt", 0, 10.0, tag="acc4"))  # an ablation: not the preset, not compared
    published = tmp_path / "published.csv"
    published.write_text("benchmark,strategy,quant,avg_acc,last_acc,source\n"
                         "hapt,icarl,fp32,90.0,83.0,paper\nhapt,icarl,hdqt,89.0,82.0,paper\n"
                         "hapt,bic,fp32,89.8,81.4,paper\n")
    make_tables([tmp_path / "runs"], tmp_path / "out", plot=False, published=published)
    lines = (tmp_path / "out" / "published.md").read_text().splitlines()
    assert lines[2] == ("| hapt | icarl | fp32 | 90.0 / 83.0 | 92.0 ± 2.8 / 82.0 ± 2.8 | 2 | +2.0 / -1.0 | – | – "
                        "| paper |")
    assert lines[3] == ("| hapt | icarl | hdqt | 89.0 / 82.0 | 89.0 ± 1.4 / 79.0 ± 1.4 | 2 | +0.0 / -3.0 "
                        "| -1.0 / -1.0 | -3.0 / -3.0 | paper |")
    assert lines[4].startswith("| hapt | bic | fp32 | 89.8 / 81.4 | – | 0 | – |")
    bad = tmp_path / "bad.csv"
    bad.write_text("benchmark,strategy,quant,avg\nhapt,icarl,fp32,1\n")
    with pytest.raises(ValueError, match="bad.csv: .* missing avg_acc, last_acc, source"):
        make_tables([tmp_path / "runs"], tmp_path / "out2", plot=False, published=bad)


def test_published_numbers_are_set_beside_one_schedule_only(tmp_path):
    """Runs of one scheme at two schedules would be averaged into one 'here' cell: refused, naming both; FP32 at
    another schedule than the scheme's gives no cost here."""
    runs = tmp_path / "runs"
    _run_with_config(runs, "fp_short", _summary("icarl", "fp32", 0, 60.0), trainer={"epochs": 1})
    _run_with_config(runs, "hd", _summary("icarl", "hdqt", 0, 78.0), trainer={"epochs": 50})
    published = tmp_path / "published.csv"
    published.write_text("benchmark,strategy,quant,avg_acc,last_acc,source\n"
                         "hapt,icarl,fp32,90.0,83.0,paper\nhapt,icarl,hdqt,89.0,82.0,paper\n")
    make_tables([runs], tmp_path / "out", plot=False, published=published)
    hdqt_row = (tmp_path / "out" / "published.md").read_text().splitlines()[3]
    assert hdqt_row.startswith("| hapt | icarl | hdqt | 89.0 / 82.0 | 88.0 (n=1) / 78.0 (n=1) | 1 |")
    assert "| -1.0 / -1.0 | – | paper |" in hdqt_row
    _run_with_config(runs, "fp_long", _summary("icarl", "fp32", 0, 80.0), trainer={"epochs": 50})
    with pytest.raises(ValueError, match=r"the runs of hapt icarl fp32 ran at more than one schedule \(– at 1 epochs, "
                                         r"– at 50 epochs\): give only the runs of the schedule"):
        make_tables([runs], tmp_path / "out", plot=False, published=published)


def test_cost_columns_and_the_energy_plot_where_runs_report_their_cost(tmp_path):
    def costed(quant, seed, last, gmacs, joules):
        return {**_summary("icarl", quant, seed, last),
                "cost": {"training int GMACs": gmacs, "training energy J": {"total": joules}}}

    _write(tmp_path / "runs", costed("fp32", 0, 80.0, 0.0, 2.0), costed("fp32", 1, 82.0, 0.0, 2.2),
           costed("hdqt", 0, 78.0, 3.5, 0.5), costed("hdqt", 1, 78.0, 3.7, 0.6))
    table = make_tables([tmp_path / "runs"], tmp_path / "out").set_index("quant")
    assert table.loc["hdqt", "int GMACs"] == "3.6 ± 0.1414" and table.loc["hdqt", "energy J"] == "0.55 ± 0.0707"
    assert table.loc["hdqt", "energy vs fp32"] == "0.262" and table.loc["fp32", "energy vs fp32"] == "1.000"
    assert (tmp_path / "out" / "energy.png").stat().st_size > 1000
    _write(tmp_path / "old", _summary("icarl", "fp32", 0, 80.0))  # runs from before the cost: no such columns
    assert "energy J" not in make_tables([tmp_path / "old"], tmp_path / "out2", plot=False).columns


def test_energy_is_set_against_fp32_of_the_same_tag_where_it_ran_so(tmp_path):
    def costed(quant, seed, joules, tag=""):
        return {**_summary("bic", quant, seed, 80.0, tag=tag),
                "cost": {"training int GMACs": 1.0, "training energy J": {"total": joules}}}

    _write(tmp_path / "runs", costed("fp32", 0, 4.0), costed("hdqt", 0, 1.0),
           costed("fp32", 0, 8.0, tag="ce_seen"), costed("mxfp4", 0, 6.0, tag="ce_seen"),
           costed("hdqt", 0, 2.0, tag="w8"))  # no FP32 under w8: untagged FP32's
    table = make_tables([tmp_path / "runs"], tmp_path / "out", plot=False).set_index("quant")
    assert table["energy vs fp32"].to_dict() == {"fp32": "1.000", "fp32[ce_seen]": "1.000", "hdqt": "0.250",
                                                 "hdqt[w8]": "0.500", "mxfp4[ce_seen]": "0.750"}


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_energy_against_an_fp32_energy_of_0_is_left_empty(tmp_path):
    """Every cost.*_pj=0 gives FP32 no energy: no ratio (not nan, nor inf), as the other empty cells."""
    def costed(quant, joules):
        return {**_summary("icarl", quant, 0, 80.0),
                "cost": {"training int GMACs": 1.0, "training energy J": {"total": joules}}}

    _write(tmp_path / "runs", costed("fp32", 0.0), costed("hdqt", 0.0), costed("mxfp4", 1.0))
    table = make_tables([tmp_path / "runs"], tmp_path / "out", plot=False).set_index("quant")
    assert table["energy vs fp32"].to_dict() == {"fp32": "–", "hdqt": "–", "mxfp4": "–"}


def test_each_row_is_paired_by_seed_with_its_fp32_row(tmp_path):
    _write(tmp_path / "runs", *(_summary("icarl", "fp32", seed, last) for seed, last in enumerate((80.0, 84.0, 70.0))),
           _summary("icarl", "hdqt", 0, 79.0), _summary("icarl", "hdqt", 1, 83.96),  # -0.04: "+0.0", not "-0.0"
           _summary("icarl", "hdqt", 2, 1.0, status="diverged"),  # not paired
           _summary("icarl", "hdqt", 3, 90.0),  # no FP32 seed 3: not paired
           _summary("icarl", "fp32", 0, 60.0, tag="ce"), _summary("icarl", "mxfp4", 0, 62.0, tag="ce"),
           _summary("icarl", "luq", 0, 81.0, tag="acc4"),  # no FP32 under acc4: untagged FP32's
           _summary("bic", "hdqt", 0, 50.0))  # no FP32 of its strategy: no row
    make_tables([tmp_path / "runs"], tmp_path / "out", plot=False)
    lines = (tmp_path / "out" / "paired.md").read_text().splitlines()
    assert lines[0] == ("| benchmark | scenario | model | strategy | quant | against | seeds | avg acc − fp32 "
                        "| avg acc − fp32 by seed | last acc − fp32 | last acc − fp32 by seed |")
    assert lines[2:] == [
        "| hapt | class | mlp | icarl | hdqt | fp32 | 0, 1 | -0.5 ± 0.7 | -1.0, +0.0 | -0.5 ± 0.7 | -1.0, +0.0 |",
        "| hapt | class | mlp | icarl | luq[acc4] | fp32 | 0 | +1.0 (n=1) | +1.0 | +1.0 (n=1) | +1.0 |",
        "| hapt | class | mlp | icarl | mxfp4[ce] | fp32[ce] | 0 | +2.0 (n=1) | +2.0 | +2.0 (n=1) | +2.0 |"]
    _write(tmp_path / "alone", _summary("icarl", "hdqt", 0, 79.0))
    make_tables([tmp_path / "alone"], tmp_path / "out2", plot=False)
    assert not (tmp_path / "out2" / "paired.md").exists()


def test_the_figures_keep_a_long_legend_beside_their_panels_whole(tmp_path):
    """The legends stand outside the axes; the saved figure grows to hold them, so no label is cut at its edge."""
    import matplotlib.image

    tag = "a-long-tag-" * 24
    _write(tmp_path / "runs", *({**_summary("icarl", quant, 0, 80.0, tag=tag),
                                 "cost": {"training int GMACs": 1.0, "training energy J": {"total": 1.0}}}
                                for quant in ("fp32", "hdqt")))
    make_tables([tmp_path / "runs"], tmp_path / "out")
    for figure in ("accuracy.png", "energy.png"):
        pixels = matplotlib.image.imread(tmp_path / "out" / figure)[..., :3]
        assert (pixels[:, -3:] == 1.0).all(), f"{figure}: something drawn at its right edge"
        assert (pixels[:, -len(pixels[0]) // 4:] < 1.0).any(), f"{figure}: no legend beside the panel"


def test_task_incremental_runs_are_rows_of_their_own_named_by_their_scenario(tmp_path):
    _write(tmp_path / "runs", _summary("icarl", "fp32", 0, 80.0), _summary("icarl", "fp32", 0, 95.0, scenario="task"),
           _summary("icarl", "hdqt", 0, 93.0, scenario="task"))
    make_tables([tmp_path / "runs"], tmp_path / "out", plot=False)
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| hapt | class | mlp | icarl | fp32 | 90.0 (n=1) | 80.0 (n=1) |" in table
    assert "| hapt (task) | task | mlp | icarl | fp32 | 105.0 (n=1) | 95.0 (n=1) |" in table
    main = (tmp_path / "out" / "main.md").read_text()
    assert "| hapt | icarl | 90.0 (n=1) | 80.0 (n=1) |" in main
    assert "| hapt (task) | icarl | 105.0 (n=1) | 95.0 (n=1) | 5.0 (n=1) | 103.0 (n=1) | 93.0 (n=1) |" in main


def test_domain_incremental_runs_are_plotted_against_the_experiences_seen(tmp_path, monkeypatch):
    """A domain run has every class in every experience (classes_per_exp null): its curve's x values are the
    experiences seen, on an axis of its own benchmark label."""
    domain = {**_summary("replay", "fp32", 0, 80.0, scenario="domain"), "classes_per_exp": None}
    _write(tmp_path / "runs", _summary("replay", "fp32", 0, 70.0), domain)
    import matplotlib.axes
    drawn = []
    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar",
                        lambda self, x, y, **kw: drawn.append((self, list(x), list(y))))
    make_tables([tmp_path / "runs"], tmp_path / "out")
    assert sorted((ax.get_title(), ax.get_xlabel(), x, y) for ax, x, y in drawn) == [
        ("hapt (domain): 1 seed a line", "experiences (domains) seen", [1, 2], [100.0, 80.0]),
        ("hapt: 1 seed a line", "classes seen", [2, 4], [90.0, 70.0])]


def test_load_runs_gives_a_row_a_run_with_its_settings_and_accuracy_matrix(make_cfg, tmp_path):
    from hdqt_cil.experiment import run
    from hdqt_cil.results import load_runs

    for seed in (0, 1):
        run(make_cfg("strategy=naive", "trainer.epochs=1", f"seed={seed}"), tmp_path / f"seed{seed}")
    runs = load_runs(tmp_path)
    assert list(runs.seed) == [0, 1] and set(runs.status) == {"complete"}
    assert (runs["trainer.epochs"] == 1).all() and (runs["quant.name"] == runs["quant"]).all()
    for matrix, path in zip(runs.acc_matrix, runs.path):
        written = np.loadtxt(f"{path}/accuracy_matrix.csv", delimiter=",", skiprows=1)[:, 1:]
        assert matrix.shape == (5, 5) and np.isnan(matrix[0, 1]) and np.isfinite(matrix[-1]).all()
        np.testing.assert_array_equal(np.round(matrix, 2), written)


def test_a_number_that_is_not_finite_is_null_in_summary_json_and_missing_in_the_tables(make_cfg, tmp_path):
    """JSON has no NaN (jq and JavaScript refuse the bare NaN Python writes): summary.json holds null where a number
    is not finite, and load_runs and the tables read it as NaN. A joint run, scored once, has no forgetting and no
    backward transfer to measure."""
    from hdqt_cil.experiment import run
    from hdqt_cil.results import load_runs

    run(make_cfg("strategy=joint", "trainer.epochs=1"), tmp_path / "runs" / "joint")
    text = (tmp_path / "runs" / "joint" / "summary.json").read_text()
    summary = json.loads(text, parse_constant=lambda constant: pytest.fail(f"summary.json holds a bare {constant}"))
    assert summary["status"] == "complete" and (summary["metrics"]["forgetting"], summary["metrics"]["bwt"]) == (
        None, None)
    runs = load_runs(tmp_path / "runs")
    assert math.isnan(runs.forgetting[0]) and runs.forgetting.dtype == float
    main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--no-plot"])
    header, _, row = (tmp_path / "out" / "table.md").read_text().splitlines()
    cells = dict(zip(header.split("|"), row.split("|")))
    assert cells[" forgetting "] == " – " and cells[" last acc "].endswith(" (n=1) ")


def test_plot_styles_follow_strategy_and_scheme_and_show_one_seed_as_such(tmp_path, monkeypatch):
    """A colour per strategy and a marker per scheme, the same in every figure, and in a figure of one strategy a
    colour per scheme; one seed: no error bar, n=1."""
    import matplotlib.axes
    drawn = {}
    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar",
                        lambda self, x, y, **kw: drawn.__setitem__(kw["label"], kw))
    _write(tmp_path / "a", _summary("icarl", "fp32", 0, 80.0), _summary("icarl", "hdqt", 0, 70.0),
           _summary("bic", "fp32", 0, 75.0), _summary("bic", "fp32", 1, 77.0))
    make_tables([tmp_path / "a"], tmp_path / "out_a")
    first = dict(drawn)
    drawn.clear()
    _write(tmp_path / "b", _summary("icarl", "hdqt", 0, 60.0))
    make_tables([tmp_path / "b"], tmp_path / "out_b")
    assert first["icarl / fp32 (n=1)"]["color"] == first["icarl / hdqt (n=1)"]["color"] != first["bic / fp32"]["color"]
    marker = {label: kw["marker"] for label, kw in first.items()}
    assert marker["icarl / fp32 (n=1)"] == marker["bic / fp32"] != marker["icarl / hdqt (n=1)"]
    alone = run_style("icarl", "hdqt", list(STRATEGY_ORDER), list(SCHEME_ORDER), True)
    assert drawn["icarl / hdqt (n=1)"]["color"] == alone["color"] != first["icarl / hdqt (n=1)"]["color"]
    assert drawn["icarl / hdqt (n=1)"]["marker"] == first["icarl / hdqt (n=1)"]["marker"]
    assert first["icarl / fp32 (n=1)"]["yerr"] is None and first["bic / fp32"]["yerr"] is not None
    drawn.clear()  # a tagged run set: its scheme's marker and colour, a line style of its own
    _write(tmp_path / "c", _summary("icarl", "fp32", 0, 80.0), _summary("icarl", "hdqt", 0, 70.0),
           _summary("icarl", "hdqt", 0, 65.0, tag="acc12"))
    make_tables([tmp_path / "c"], tmp_path / "out_c")
    plain, tagged, fp32 = (drawn[f"icarl / {q} (n=1)"] for q in ("hdqt", "hdqt[acc12]", "fp32"))
    assert tagged["marker"] == plain["marker"] and tagged["color"] == plain["color"]
    assert tagged["linestyle"] != plain["linestyle"] == fp32["linestyle"]
    drawn.clear()  # six tagged run sets of one strategy and scheme: six line styles
    tags = ["acc12", "acc16", "w8", "hp200", "hp200bn", "ce_seen"]
    _write(tmp_path / "d", *(_summary("icarl", "hdqt", 0, 60.0, tag=t) for t in ["", *tags]))
    make_tables([tmp_path / "d"], tmp_path / "out_d")
    styles = [str(drawn[f"icarl / hdqt{f'[{t}]' if t else ''} (n=1)"]["linestyle"]) for t in ["", *tags]]
    assert len(set(styles)) == 7


def test_a_panel_of_one_strategy_colours_its_schemes():
    """Across strategies a line takes its strategy's colour; in a panel of one strategy, its scheme's, the same in
    every such panel; the marker is the scheme's either way."""
    strategies, schemes = list(STRATEGY_ORDER), list(SCHEME_ORDER)
    mixed = [run_style(s, q, strategies, schemes, False) for s in ("icarl", "bic") for q in ("fp32", "mxfp4")]
    assert mixed[0]["color"] == mixed[1]["color"] != mixed[2]["color"] == mixed[3]["color"]
    alone = [run_style("icarl", q, strategies, schemes, True) for q in ("fp32", "hdqt", "mxfp4", "a new scheme")]
    assert len({style["color"] for style in alone}) == 4
    assert run_style("bic", "hdqt", strategies, schemes, True) == alone[1]
    assert [s["marker"] for s in alone] == [m["marker"] for m in (run_style("bic", q, strategies, schemes, False)
                                                               for q in ("fp32", "hdqt", "mxfp4", "a new scheme"))]


def test_tables_from_an_archive_of_run_folders_equal_the_folders(tmp_path, capsys):
    """A root may be a tar archive of run folders (results/*/runs.tgz): the same tables as from the folders;
    an archive cut short, or with a member that would land outside the unpacked folder, is refused in one line."""
    _write(tmp_path / "runs", _summary("icarl", "fp32", 0, 80.0), _summary("icarl", "hdqt", 1, 78.0))
    with tarfile.open(tmp_path / "runs.tgz", "w:gz") as archive:
        archive.add(tmp_path / "runs", arcname="runs")
    main([str(tmp_path / "runs"), "--out", str(tmp_path / "from_folders"), "--no-plot"])
    main([str(tmp_path / "runs.tgz"), "--out", str(tmp_path / "from_archive"), "--no-plot"])
    for name in ("table.md", "table.csv", "main.md"):
        assert (tmp_path / "from_archive" / name).read_text() == (tmp_path / "from_folders" / name).read_text()
    with tarfile.open(tmp_path / "evil.tar", "w") as archive:
        archive.add(tmp_path / "runs" / "run0" / "summary.json", arcname="../outside/summary.json")
    (tmp_path / "cut.tgz").write_bytes((tmp_path / "runs.tgz").read_bytes()[:200])
    capsys.readouterr()
    for bad in ("evil.tar", "cut.tgz"):
        with pytest.raises(SystemExit) as end:
            main([str(tmp_path / bad), "--out", str(tmp_path / "bad"), "--no-plot"])
        err = capsys.readouterr().err
        assert end.value.code == 2 and err.startswith(f"error: {tmp_path / bad} is not a readable tar archive (")
        assert err.count("\n") == 1


def test_one_folder_of_an_archive_is_a_root_of_its_own(tmp_path, capsys):
    """`runs.tgz:runs/icarl` reads that folder of the archive alone: the tables of the folder unpacked by hand; its
    runs are named by the archive in errors; a folder the archive lacks, or an archive that is no tar, is refused in
    one line naming both."""
    _write(tmp_path / "runs" / "icarl", _summary("icarl", "fp32", 0, 80.0), _summary("icarl", "hdqt", 0, 78.0))
    _write(tmp_path / "runs" / "bic", _summary("bic", "fp32", 0, 84.0))
    with tarfile.open(tmp_path / "runs.tgz", "w:gz") as archive:
        archive.add(tmp_path / "runs", arcname="./runs")  # members named ./runs/..., as `tar -C DIR .` writes them
    main([str(tmp_path / "runs" / "icarl"), "--out", str(tmp_path / "by_hand"), "--no-plot"])
    for member in ("runs/icarl", "./runs/icarl/"):
        main([f"{tmp_path / 'runs.tgz'}:{member}", "--out", str(tmp_path / "member"), "--no-plot"])
        for name in ("table.md", "table.csv", "main.md"):
            assert (tmp_path / "member" / name).read_text() == (tmp_path / "by_hand" / name).read_text()
    assert "| bic |" not in (tmp_path / "member" / "table.md").read_text()
    capsys.readouterr()
    _write(tmp_path / "again", _summary("icarl", "fp32", 0, 70.0))  # seed 0 again, another result
    with pytest.raises(SystemExit) as end:
        main([f"{tmp_path / 'runs.tgz'}:runs/icarl", str(tmp_path / "again"), "--out", str(tmp_path / "x"),
              "--no-plot"])
    err = capsys.readouterr().err
    assert end.value.code == 2 and f"{tmp_path / 'runs.tgz'}:runs/icarl/run0 and {tmp_path / 'again' / 'run0'}" in err
    (tmp_path / "notes.txt").write_text("not an archive")
    archive, notes = tmp_path / "runs.tgz", tmp_path / "notes.txt"
    for root, message in ((f"{archive}:runs/lwf", f"{archive} holds no folder runs/lwf"),
                          (f"{archive}:runs/ic", f"{archive} holds no folder runs/ic"),  # a prefix of a folder's name
                          (f"{notes}:runs", f"{notes} is not a readable tar archive")):
        with pytest.raises(SystemExit) as end:
            main([root, "--out", str(tmp_path / "x"), "--no-plot"])
        err = capsys.readouterr().err
        assert end.value.code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1


def test_a_run_found_twice_counts_once_and_two_runs_of_one_seed_are_refused(tmp_path, capsys):
    """Overlapping roots or an archive beside its unpacked copy hold the same runs: each counts once. Two different
    runs of one row and seed would be averaged as two seeds: refused, naming both (an archive's by its name)."""
    _write(tmp_path / "runs", _summary("icarl", "fp32", 0, 80.0), _summary("icarl", "fp32", 1, 84.0))
    with tarfile.open(tmp_path / "runs.tgz", "w:gz") as archive:
        archive.add(tmp_path / "runs", arcname="runs")
    main([str(tmp_path / "runs"), "--out", str(tmp_path / "once"), "--no-plot"])
    main([str(tmp_path / "runs.tgz"), str(tmp_path / "runs"), str(tmp_path / "runs" / "run0"),
          "--out", str(tmp_path / "twice"), "--no-plot"])
    assert (tmp_path / "twice" / "table.md").read_text() == (tmp_path / "once" / "table.md").read_text()
    assert "| 82.0 ± 2.8 | 5.0 ± 0.0 | 1.0 ± 0.0 | 2 |" in (tmp_path / "once" / "table.md").read_text()
    capsys.readouterr()
    _write(tmp_path / "rerun", _summary("icarl", "fp32", 1, 70.0))  # seed 1 again, another result
    with pytest.raises(SystemExit) as end:
        main([str(tmp_path / "runs.tgz"), str(tmp_path / "rerun"), "--out", str(tmp_path / "clash"), "--no-plot"])
    err = capsys.readouterr().err
    assert end.value.code == 2 and err.count("\n") == 1
    assert f"{tmp_path / 'runs.tgz'}:runs/run1 and {tmp_path / 'rerun' / 'run0'}" in err
    (tmp_path / "a_file").write_text("")
    with pytest.raises(SystemExit) as end:
        main([str(tmp_path / "runs"), "--out", str(tmp_path / "a_file"), "--no-plot"])
    assert end.value.code == 2 and capsys.readouterr().err == f"error: --out {tmp_path / 'a_file'} is a file; name a " \
        "folder for the tables\n"
    from hdqt_cil.results import load_runs  # a notebook's view lists every run folder, each once

    assert sorted(load_runs(tmp_path / "runs", tmp_path / "runs" / "run0", tmp_path / "rerun").seed) == [0, 1, 1]
    assert sorted(load_runs(tmp_path / "runs.tgz").seed) == [0, 1]  # an archive of run folders, as make_tables
    with pytest.raises(FileNotFoundError, match="no such file or folder: .*typo"):
        load_runs(tmp_path / "typo")
