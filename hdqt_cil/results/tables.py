"""Tables and plots from run folders (never from logs): rows strategy × quant, mean ± std over seeds.

A run counts in a mean only when its summary says `complete`. Diverged runs are shown as such; runs that
stopped early (fewer experiences than configured) are counted in a separate column, never averaged in.
"""
import math
from pathlib import Path

import numpy as np
import pandas as pd

from .io import read_json, write_atomic

KEYS = ["benchmark", "model", "strategy", "quant"]
METRICS = {"avg_acc": "avg acc", "last_acc": "last acc", "forgetting": "forgetting", "wall_time_s": "wall s"}


def collect_runs(*roots) -> pd.DataFrame:
    """One row per run folder (a folder holding summary.json) found under `roots`."""
    rows = []
    for root in roots:
        for path in sorted(Path(root).rglob("summary.json")):
            summary = read_json(path)
            rows.append({**summary["run"], **summary["metrics"], "status": summary["status"],
                         "seen_acc": summary["seen_acc"], "classes_per_exp": summary["classes_per_exp"],
                         "wall_time_s": summary.get("wall_time_s", math.nan), "path": str(path.parent)})
    if not rows:
        raise FileNotFoundError(f"no run folders (summary.json) under {', '.join(map(str, roots))}")
    df = pd.DataFrame(rows)
    df["quant"] = df["quant"] + df["tag"].fillna("").map(lambda t: f"[{t}]" if t else "")
    return df


def _cell(values, status) -> str:
    done = [v for v, s in zip(values, status) if s == "complete" and not math.isnan(v)]
    diverged = sum(s == "diverged" for s in status)
    if not done:
        return "diverged" if diverged else "–"
    text = f"{np.mean(done):.1f} ± {np.std(done, ddof=1) if len(done) > 1 else 0.0:.1f}"
    return text + (f" ({diverged} diverged)" if diverged else "")


def aggregate(df: pd.DataFrame) -> pd.DataFrame:
    """Numeric table: per KEYS, mean and std of each metric over complete runs, and run counts."""
    rows = []
    for key, group in df.groupby(KEYS, sort=True):
        complete = group[group.status == "complete"]
        row = dict(zip(KEYS, key))
        for m in METRICS:
            row[f"{m}_mean"] = complete[m].mean()
            row[f"{m}_std"] = complete[m].std(ddof=1) if len(complete) > 1 else 0.0
            row[f"{m}_text"] = _cell(group[m].tolist(), group.status.tolist())
        row["seeds"] = len(complete)
        row["diverged"] = int((group.status == "diverged").sum())
        row["incomplete"] = int(group.status.isin(["running", "interrupted"]).sum())
        rows.append(row)
    return pd.DataFrame(rows)


def display_table(agg: pd.DataFrame) -> pd.DataFrame:
    """The human table: text cells 'mean ± std'."""
    table = agg[KEYS].copy()
    for m, title in METRICS.items():
        table[title] = agg[f"{m}_text"]
    table["seeds"] = agg["seeds"]
    if agg["incomplete"].any():
        table["incomplete"] = agg["incomplete"]
    return table


def to_markdown(table: pd.DataFrame) -> str:
    header = "| " + " | ".join(table.columns) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"


def plot_accuracy_curves(df: pd.DataFrame, path) -> None:
    """Seen-class accuracy after each experience vs number of classes seen, mean over complete seeds."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = df[df.status == "complete"]
    benchmarks = sorted(done.benchmark.unique())
    fig, axes = plt.subplots(1, max(len(benchmarks), 1), figsize=(5 * max(len(benchmarks), 1), 4), squeeze=False)
    for ax, bench in zip(axes[0], benchmarks):
        for (strategy, quant), group in done[done.benchmark == bench].groupby(["strategy", "quant"]):
            curves = np.array([c for c in group.seen_acc if len(c) == len(group.seen_acc.iloc[0])])
            classes = np.cumsum(group.classes_per_exp.iloc[0])[: curves.shape[1]]
            ax.errorbar(classes, curves.mean(0), yerr=curves.std(0), marker="o", capsize=2,
                        label=f"{strategy} / {quant}")
        ax.set(title=bench, xlabel="classes seen", ylabel="accuracy on seen classes (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def make_tables(roots, out_dir, plot: bool = True) -> pd.DataFrame:
    """Write table.md, table.csv, table.tex (and accuracy.png) into `out_dir`; return the display table."""
    df = collect_runs(*roots)
    agg = aggregate(df)
    table = display_table(agg)
    out = Path(out_dir)
    write_atomic(out / "table.md", to_markdown(table))
    write_atomic(out / "table.csv", agg.drop(columns=[c for c in agg if c.endswith("_text")]).to_csv(index=False))
    write_atomic(out / "table.tex", table.to_latex(index=False, escape=True))
    if plot:
        plot_accuracy_curves(df, out / "accuracy.png")
    return table
