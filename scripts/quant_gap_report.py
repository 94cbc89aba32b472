"""Where a strategy's gap under a quant scheme comes from: accuracy on the newest and the old tasks, FP32 against the
scheme paired by seed, and the scheme's runs' quantization statistics (quant_stats.json) by layer group and experience.

    python scripts/quant_gap_report.py RUNS [RUNS ...] --out DIR [--scheme int4] [--compare lwf bic icarl | --compare]

Each RUNS is a folder of run folders, a tar archive of them (results/*/runs.tgz) or one folder of an archive
(results/cifar10/runs.tgz:runs/cifar10-resnet32/bic).

--scheme names the scheme set against FP32 (`hdqt` unless given; `int4`, `hot`, `fp8`, ...); the tables' columns
name it. A tagged run set at its scheme's preset (`tag=ce_seen` on FP32 and the scheme alike) counts as its scheme's
runs; one off the preset (`quant.acc_bits=12 tag=acc12`) is left out, unless --scheme names it (`hdqt[acc12]`: its
runs set against FP32, the tables naming it). The runs must share one schedule (preset and
epochs): FP32 at 60 epochs is not paired with a scheme at 8.

Writes into DIR, from the complete run folders under RUNS (a[k,j]: accuracy on task j after experience k; each
task weighted by its number of test samples n_j, as the accuracy on the seen classes weights it: summary.json's
test_sizes, equal in runs from before it recorded them, which are refused where their tasks differ in size):
- accuracy_split.md: 'new' a[k,k] and 'old' the n_j-weighted mean_{j<k} a[k,j]; old = 'learned' (the same mean of
  a[j,j]) − 'forgotten';
- gap_decomposition.md: per seed, the scheme − FP32 gap of average and last accuracy split exactly into the newest
  task's and the old tasks' parts (seen accuracy = w·new + (1 − w)·old, w = n_k / Σ_{j≤k} n_j, checked against
  the runs' own seen accuracy);
- forgetting_by_age.md: a[j,j] − a[k,j] by the task's age k − j (n_j-weighted over the tasks): whether extra
  forgetting accumulates;
- train_loss.md: each experience's first- and last-epoch mean training loss;
- quant_stats.md, saturation.png (unless `--compare` names none): each statistic per layer group (mean over its
  layers) and experience (mean over its epochs), the compared strategies' runs of the scheme and each one's
  difference from the last named (the reference), paired by seed.
Accuracies are class-incremental (predictions over all seen classes): a low a[k,j] mixes a task not learned with
its images given to other tasks' classes. Runs of one strategy in several variants (settings outside quant, e.g.
`strategy.ce_classes=seen`) are kept apart, each strategy named by its variant ('bic [strategy.ce_classes=seen]'),
and FP32 is paired with the scheme within a variant. Runs scored fewer times than they have experiences (joint
training, once on every task) have no newest task to split: they are left out.
"""
import argparse
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from hdqt_cil.files import read_json, write_atomic
from hdqt_cil.results.tables import ROOTS_HELP, collect_runs, mean_std, readable_roots, strategy_labels, to_markdown
from hdqt_cil.wording import help_description

SCHEME = "hdqt"  # set against FP32 unless --scheme names another
STATS = ("forward_saturated", "grad_input_saturated", "grad_weight_saturated", "input_clipped", "weight_clipped")


def split_accuracy(acc_matrix, sizes) -> pd.DataFrame:
    """One row per step k, task j weighted by its test samples n_j (`sizes`) as the seen accuracy weights it: new =
    a[k,k], old and learned the weighted means over j < k of a[k,j] and a[j,j], forgotten = learned − old, w_new =
    n_k / Σ_{j≤k} n_j (the newest task's share: seen = w_new·new + (1 − w_new)·old), seen = the weighted mean over
    j ≤ k of a[k,j] (old columns NaN at k = 0)."""
    a, n = np.asarray(acc_matrix, dtype=float), np.asarray(sizes, dtype=float)
    rows = []
    for k in range(len(a)):
        old = np.average(a[k, :k], weights=n[:k]) if k else np.nan
        learned = np.average(np.diag(a)[:k], weights=n[:k]) if k else np.nan
        rows.append({"exp": k, "new": a[k, k], "old": old, "learned": learned, "forgotten": learned - old,
                     "w_new": n[k] / n[: k + 1].sum(), "seen": np.average(a[k, : k + 1], weights=n[: k + 1])})
    return pd.DataFrame(rows)


def forgetting_by_age(acc_matrix, sizes) -> pd.DataFrame:
    """Per age d ≥ 1: a[j,j] − a[k,j] over the steps k and tasks j = k − d, task j weighted by its test samples (as
    the old tasks' part is): what a task lost d experiences after its own."""
    a = np.asarray(acc_matrix, dtype=float)
    return pd.DataFrame([{"age": d, "forgetting": np.average([a[k - d, k - d] - a[k, k - d] for k in range(d, len(a))],
                                                             weights=sizes[: len(a) - d])}
                         for d in range(1, len(a))])


def load_runs(*roots, scheme: str = SCHEME) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Complete runs at their scheme's preset (collect_runs), and those of the tagged run set `scheme` names
    (`hdqt[acc12]`) whatever their settings, strategies named by their variant: one row per run × experience
    (accuracy split, last-epoch training loss) and one per run × task age (forgetting_by_age)."""
    runs = collect_runs(*roots)
    named = runs.quant == scheme  # 'hdqt[acc12]': the label the tables give a tagged run set
    at_preset = (runs.quant_variant == "") & (runs.setting == "")
    runs = runs[(runs.status == "complete") & (at_preset | named)]
    if runs.benchmark.nunique() > 1:  # FP32 on one benchmark paired with the scheme on another is no gap
        raise ValueError(f"the runs are of several benchmarks ({', '.join(sorted(set(runs.benchmark)))}): give one "
                         "benchmark's runs")
    runs = runs.assign(strategy=strategy_labels(runs), quant=runs.scheme.where(runs.quant != scheme, scheme))
    schedules = runs.groupby("strategy")[["preset", "epochs"]].apply(lambda g: sorted(set(map(tuple, g.values))))
    mixed = schedules[schedules.map(len) > 1]
    if len(mixed):  # FP32 at one schedule against the scheme at another is no gap of the scheme's
        raise ValueError(f"the runs of {mixed.index[0]} ran at more than one schedule ("
                         + ", ".join(f"{preset} at {epochs} epochs" for preset, epochs in mixed.iloc[0])
                         + "): give only one schedule's runs under the folder")
    twice = runs[runs.duplicated(["strategy", "quant", "seed"], keep=False)]
    if len(twice):
        raise ValueError("runs at the same settings and seed cannot be paired; keep one of each under the folder: "
                         + ", ".join(twice.path))
    if runs.empty:
        raise FileNotFoundError(f"no complete runs at their scheme's preset under {', '.join(map(str, roots))}")
    rows, ages, unsized = [], [], []
    for run in runs.itertuples():
        summary = read_json(Path(run.path) / "summary.json")
        if len(summary["acc_matrix"]) < summary["n_experiences"]:  # joint: trained once on every task, none newest
            continue
        sizes = summary.get("test_sizes") or [1] * summary["n_experiences"]  # runs from before it: checked below
        steps = split_accuracy(summary["acc_matrix"], sizes)
        if not np.allclose(steps.seen, summary["seen_acc"], atol=0.01):  # the parts must give the run's seen_acc
            if "test_sizes" in summary:
                raise ValueError(f"{run.path}: the tasks' accuracies weighted by test_sizes are not seen_acc")
            unsized.append(run.path)
            continue
        steps["first_loss"] = [losses[0] for losses in summary["train_loss"]]
        steps["loss"] = [losses[-1] for losses in summary["train_loss"]]
        rows.append(steps.assign(strategy=run.strategy, quant=run.quant, seed=run.seed, path=run.path,
                                 avg_acc=run.avg_acc, last_acc=run.last_acc))
        ages.append(forgetting_by_age(summary["acc_matrix"], sizes).assign(strategy=run.strategy, quant=run.quant,
                                                                           seed=run.seed))
    if unsized:
        raise ValueError("tasks' test sets differ in size in runs from before summary.json recorded them (test_sizes):"
                         f" {', '.join(unsized)}; run them again (overwrite=true) to split their accuracy")
    return pd.concat(rows, ignore_index=True), pd.concat(ages, ignore_index=True)


def paired(steps: pd.DataFrame, scheme: str, keys=("strategy", "seed", "exp"),
           cols=("new", "old", "learned", "forgotten", "w_new", "seen", "first_loss", "loss", "avg_acc", "last_acc")
           ) -> pd.DataFrame:
    """FP32 and `scheme` runs of the same strategy and seed side by side (suffixes _fp32, _q), d_* = q − fp32."""
    keys, cols = list(keys), list(cols)
    both = steps[steps.quant == "fp32"][keys + cols].merge(steps[steps.quant == scheme][keys + cols], on=keys,
                                                           suffixes=("_fp32", "_q"))
    for c in cols:
        both[f"d_{c}"] = both[f"{c}_q"] - both[f"{c}_fp32"]
    return both


def accuracy_split_table(pairs: pd.DataFrame, scheme: str) -> pd.DataFrame:
    rows = []
    for (strategy, k), g in pairs.groupby(["strategy", "exp"]):
        row = {"strategy": strategy, "after exp": k, "seeds": " ".join(map(str, sorted(g.seed)))}
        for c in ("new", "old"):
            row[f"{c} fp32"], row[f"{c} {scheme}"], row[f"Δ{c}"] = (mean_std(g[f"{c}_fp32"]), mean_std(g[f"{c}_q"]),
                                                                       mean_std(g[f"d_{c}"], "+.1f"))
        row["Δlearned"], row["Δforgotten"] = mean_std(g.d_learned, "+.1f"), mean_std(g.d_forgotten, "+.1f")
        row["Δ(new − old)"] = mean_std(g.d_new - g.d_old, "+.1f")
        if k == 0:
            for c in ("old fp32", f"old {scheme}", "Δold", "Δlearned", "Δforgotten", "Δ(new − old)"):
                row[c] = "–"
        rows.append(row)
    return pd.DataFrame(rows)


def decomposition(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per strategy and seed: Δavg = mean_k [w_new·Δnew_k + (1 − w_new)·Δold_k], Δlast the same at the last k; the
    old part split into Δlearned and −Δforgotten. Then the mean ± std over seeds. Exact where FP32 and the scheme
    weight the tasks alike (the same test sets), else refused."""
    differ = pairs[pairs.w_new_fp32 != pairs.w_new_q]
    if len(differ):
        raise ValueError(f"{differ.strategy.iloc[0]} seed {differ.seed.iloc[0]}: FP32's and the scheme's runs differ "
                         "in their tasks' test-set sizes (test_sizes): runs on other data cannot be paired")
    rows = []
    for (strategy, seed), g in pairs.groupby(["strategy", "seed"]):
        g = g.sort_values("exp")
        w_new = g.w_new_fp32.to_numpy()
        w_old = 1 - w_new
        old, learned, forgot = (np.nan_to_num(g[c].to_numpy()) for c in ("d_old", "d_learned", "d_forgotten"))
        new = g.d_new.to_numpy()
        rows.append({"strategy": strategy, "seed": seed,
                     "Δavg (summary)": g.d_avg_acc.iloc[0],
                     "Δavg: new task": np.mean(w_new * new), "Δavg: old tasks": np.mean(w_old * old),
                     "Δavg: old, learned": np.mean(w_old * learned), "Δavg: old, forgotten": -np.mean(w_old * forgot),
                     "Δlast (summary)": g.d_last_acc.iloc[0],
                     "Δlast: new task": (w_new * new)[-1], "Δlast: old tasks": (w_old * old)[-1],
                     "Δlast: old, learned": (w_old * learned)[-1], "Δlast: old, forgotten": -(w_old * forgot)[-1]})
    per_seed = pd.DataFrame(rows)
    numbers = [c for c in per_seed if c not in ("strategy", "seed")]
    table = per_seed.assign(**{c: per_seed[c].map(lambda v: f"{v:+.1f}") for c in numbers}).astype({"seed": str})
    means = [{"strategy": s, "seed": "mean ± std", **{c: mean_std(g[c], "+.1f") for c in numbers}}
             for s, g in per_seed.groupby("strategy")]
    return pd.concat([table, pd.DataFrame(means)]).sort_values(["strategy", "seed"], kind="stable")


def age_table(pairs: pd.DataFrame, scheme: str) -> pd.DataFrame:
    return pd.DataFrame([{"strategy": s, "age (experiences since the task's own)": d,
                          "seeds": " ".join(map(str, sorted(g.seed))), "fp32": mean_std(g.forgetting_fp32),
                          scheme: mean_std(g.forgetting_q), "Δ (paired)": mean_std(g.d_forgetting, "+.1f"),
                          "Δ per seed": " / ".join(f"{v:+.1f}" for v in g.sort_values("seed").d_forgetting),
                          f"seeds {scheme} > fp32": f"{int((g.d_forgetting > 0).sum())}/{len(g)}"}
                         for (s, d), g in pairs.groupby(["strategy", "age"])])


def loss_table(pairs: pd.DataFrame, scheme: str) -> pd.DataFrame:
    return pd.DataFrame([{"strategy": s, "exp": k, "seeds": len(g),
                          "first epoch fp32": mean_std(g.first_loss_fp32, ".3f"),
                          f"first epoch {scheme}": mean_std(g.first_loss_q, ".3f"),
                          "fp32": mean_std(g.loss_fp32, ".3f"), scheme: mean_std(g.loss_q, ".3f"),
                          "Δ (paired)": mean_std(g.d_loss, "+.3f"),
                          f"{scheme} / fp32": mean_std(g.loss_q / g.loss_fp32, ".2f")}
                         for (s, k), g in pairs.groupby(["strategy", "exp"])])


def layer_group(name: str) -> str:
    """stem, stage s (ResNet's `stages.s`), classifier; other layers by their own name."""
    stage = re.search(r"stages\.(\d+)\.", name)
    if stage:
        return f"stage {stage.group(1)}"
    return "stem" if name.endswith("conv1") else name


def group_order(group: str) -> tuple:
    """stem first, then the stages in order, the classifier last."""
    return (group != "stem", group == "classifier", group)


def load_quant_stats(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run × epoch × layer group: each statistic's mean share over the group's layers."""
    rows = []
    for run in runs.drop_duplicates("path").itertuples():
        path = Path(run.path) / "quant_stats.json"
        if not path.exists():
            continue
        for record in read_json(path):
            for layer, stats in record["layers"].items():
                rows.append({"strategy": run.strategy, "quant": run.quant, "seed": run.seed, "epoch": record["epoch"],
                             "exp": record["experience"], "group": layer_group(layer), **stats})
    long = pd.DataFrame(rows)
    return long.groupby(["strategy", "quant", "seed", "exp", "epoch", "group"], as_index=False)[list(STATS)].mean()


def quant_table(stats: pd.DataFrame, stat: str, strategies) -> pd.DataFrame:
    """Rows group × experience: `stat` in percent for each strategy (mean over epochs, then ± over seeds) and each
    one's difference from the last, the reference, paired by seed."""
    *others, ref = strategies
    per_exp = stats.groupby(["strategy", "seed", "group", "exp"], as_index=False)[stat].mean()
    per_exp[stat] *= 100
    wide = per_exp.pivot_table(index=["group", "exp", "seed"], columns="strategy", values=stat).reset_index()
    rows = []
    for (group, k), g in sorted(wide.groupby(["group", "exp"]), key=lambda kg: (group_order(kg[0][0]), kg[0][1])):
        row = {"group": group, "exp": k, **{f"{s} %": mean_std(g[s].dropna(), ".3g") for s in strategies}}
        for s in others:
            both = g.dropna(subset=[s, ref])
            row[f"{s} − {ref} (paired)"] = mean_std(both[s] - both[ref], "+.3g")
            row[f"seeds {s} > {ref}"] = f"{int((both[s] > both[ref]).sum())}/{len(both)}"
        rows.append(row)
    return pd.DataFrame(rows)


def plot_saturation(stats: pd.DataFrame, strategies, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted(stats.group.unique(), key=group_order)
    fig, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 3.2), squeeze=False)
    epochs = stats.epoch.max()
    for ax, group in zip(axes[0], groups):
        for strategy in strategies:
            g = stats[(stats.group == group) & (stats.strategy == strategy)]
            curve = g.assign(x=g.exp * epochs + g.epoch).groupby("x").forward_saturated
            mean, std = 100 * curve.mean(), 100 * curve.std()
            ax.plot(mean.index, mean, label=f"{strategy} ({g.seed.nunique()} seeds)", lw=1)
            ax.fill_between(mean.index, mean - std, mean + std, alpha=0.2)
        for b in range(1, stats.exp.max() + 1):
            ax.axvline(b * epochs + 0.5, color="grey", lw=0.5)
        ax.set(title=group, xlabel="epoch (all experiences)", ylabel="forward tile sums saturated (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(roots, out, compare=("lwf", "icarl"), plot=True, scheme=SCHEME) -> dict:
    out = Path(out)
    steps, ages = load_runs(*roots, scheme=scheme)
    if scheme not in (schemes := sorted(set(steps.quant) - {"fp32"})):
        raise ValueError(f"--scheme: no {scheme} runs to set against fp32 under {', '.join(map(str, roots))}; "
                         f"there are {', '.join(schemes) or 'none'}")
    pairs = paired(steps, scheme)
    tables = {"accuracy_split.md": accuracy_split_table(pairs, scheme), "gap_decomposition.md": decomposition(pairs),
              "forgetting_by_age.md": age_table(paired(ages, scheme, ("strategy", "seed", "age"), ("forgetting",)),
                                                scheme),
              "train_loss.md": loss_table(pairs, scheme)}
    quantized = set(steps[steps.quant == scheme].strategy)
    if missing := sorted(set(compare) - quantized):
        raise ValueError(f"--compare: no {scheme} runs of {', '.join(missing)}; "
                         f"there are {', '.join(sorted(quantized))}")
    for name, table in tables.items():
        write_atomic(out / name, to_markdown(table))
    if not compare:  # the accuracy tables alone (runs of one strategy)
        return tables
    stats = load_quant_stats(steps[(steps.quant == scheme) & steps.strategy.isin(compare)])
    sections = [f"## {stat}\n\n" + to_markdown(quant_table(stats, stat, compare)) for stat in STATS]
    write_atomic(out / "quant_stats.md", "\n".join(sections))
    if plot:
        plot_saturation(stats, compare, out / "saturation.png")
    return {**tables, "quant_stats": stats}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("runs", nargs="+", help=ROOTS_HELP)
    parser.add_argument("--out", required=True)
    parser.add_argument("--compare", nargs="*", default=["lwf", "icarl"], metavar="STRATEGY",
                        help="strategies whose quantization statistics are set side by side, each against the "
                             "last named; none named (`--compare` alone): the accuracy tables only")
    parser.add_argument("--scheme", default=SCHEME, metavar="NAME",
                        help=f"the quant scheme set against FP32 and named in the tables (default {SCHEME}), e.g. "
                             "int4, hot, fp8; its tagged run sets at its preset count as its runs; a tagged run set "
                             "off it (hdqt[acc12]) is named whole")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    if len(args.compare) == 1:
        parser.error(f"--compare needs two strategies or none, got {args.compare}")
    try:
        with readable_roots(args.runs) as roots:
            report(roots, args.out, args.compare, plot=not args.no_plot, scheme=args.scheme)
    except (FileNotFoundError, ValueError) as error:  # no run folders, runs that cannot be paired
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
