"""Tables and plots of the runs' gradient diagnostics (diagnostics.json, trainer/diagnostics.py): fidelity by layer
and by experience, old against new classes, the gradients' statistics by layer, and the quantizers' underflow and
the products' largest tile sums by layer, and the loss landscapes of diagnostics=full."""
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ..files import read_json
from ..trainer.diagnostics import COMPARED, GRADIENTS
from ..trainer.landscape import slice_summary
from .style import SCHEME_ORDER, STRATEGY_ORDER, run_style, scheme_rank

# what tells runs apart in these tables, as in table.md's rows: a tag (`tag=acc12`) names a run set of its own
RUN_KEYS = ["benchmark", "strategy", "variant", "scheme", "tag", "quant_variant"]
MEASURES = ("cosine", "rel_error", "sign")


# quant_stats.json's per-layer shares (docs/quant.md "Statistics and errors"), as quantizers.md names them
EPOCH_SHARES = {"input_clipped": "clipped input", "weight_clipped": "clipped weight",
                "forward_saturated": "saturated forward", "grad_input_saturated": "saturated grad_input",
                "grad_weight_saturated": "saturated grad_weight"}


def _records(runs: pd.DataFrame):
    """(run, its diagnostics.json records, its quant_stats.json epochs or []) of every run that recorded
    diagnostics."""
    for _, run in runs.iterrows():
        path = Path(run["path"]) / "diagnostics.json"
        if path.exists():
            stats = path.with_name("quant_stats.json")
            yield run, read_json(path), read_json(stats) if stats.exists() else []


def layer_order(record: dict) -> list[str]:
    """A record's layers in the model's order: as it gives it, or for a record written without it (its layers'
    names sorted as text), by name with the numbers in them compared as numbers and the classifier last, which is
    the order of this package's models (stem, stages and blocks, classifier)."""
    if "layer_order" in record:
        return record["layer_order"]
    return sorted(record["layers"], key=lambda name: (name.split(".")[0] == "classifier",
                                                      [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]))


def diagnostics_frame(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(fidelity, statistics, quantizers) in long form, one row per run, experience, layer and measured thing;
    empty where no run recorded diagnostics. quantizers: `measure` an underflow share by role, a product's largest
    tile sum as a fraction of its accumulator's limit, or (one row an epoch, from quant_stats.json) the share of a
    forward operand's values its clip cut or of a product's tile sums its accumulator saturated."""
    fidelity, statistics, quantizers = [], [], []
    for run, records, epochs in _records(runs):
        keys = {k: run[k] for k in RUN_KEYS + ["seed"] if k in run}
        places = _latest_places(records)
        diagnosed = set()  # (experience, layer)
        for record in records:
            for layer in layer_order(record):
                found = record["layers"][layer]
                diagnosed.add((record["experience"], layer))
                where = {**keys, "experience": record["experience"], "position": places[layer], "layer": layer}
                for kind in COMPARED:
                    for part, measures in found.get(kind, {}).items():
                        fidelity.append({**where, "gradient": kind, "part": part, **measures})
                for role, values in found.get("stats", {}).items():
                    statistics.append({**where, "role": role, **values})
                for role, share in found.get("underflow", {}).items():
                    quantizers.append({**where, "measure": f"underflow {role}", "value": share})
                for product, kept in found.get("tile_sums", {}).items():
                    quantizers.append({**where, "measure": f"{product} tile sum / limit",
                                       "value": kept["largest"] / kept["limit"]})
            # the model's output, after its last layer: the quantized forward's logits against the float one's
            where = {**keys, "experience": record["experience"], "position": len(places), "layer": "logits"}
            fidelity += [{**where, "gradient": "logits", "part": part, **measures}
                         for part, measures in record.get("logits", {}).items()]
        for epoch in epochs:
            for layer, shares in epoch["layers"].items():
                if (epoch["experience"], layer) in diagnosed:
                    where = {**keys, "experience": epoch["experience"], "position": places[layer], "layer": layer}
                    quantizers += [{**where, "measure": EPOCH_SHARES[stat], "value": share}
                                   for stat, share in shares.items() if stat in EPOCH_SHARES]
    return pd.DataFrame(fidelity), pd.DataFrame(statistics), pd.DataFrame(quantizers)


def _latest_places(records: list[dict]) -> dict[str, int]:
    """Each layer's place in the last model that has it: a model that grows (MEMO adds an extractor each
    experience) moves its later layers, which the tables would otherwise list once for every place they held."""
    places = {}
    for record in sorted(records, key=lambda r: r["experience"]):
        places.update({layer: place for place, layer in enumerate(layer_order(record))})
    return places


def _keys(frame: pd.DataFrame) -> list[str]:
    return [k for k in RUN_KEYS if k in frame and (frame[k] != "").any()]


def fidelity_table(fidelity: pd.DataFrame) -> pd.DataFrame:
    """Per run kind and layer: each gradient's fidelity to the float shadow's, the mean over experiences and seeds
    (n: the diagnosed experiences × seeds)."""
    keys = _keys(fidelity) + ["position", "layer"]
    whole = fidelity[fidelity.part == "all"].pivot_table(index=keys + ["experience", "seed"], columns="gradient",
                                                         values=list(MEASURES)).groupby(level=keys).mean()
    whole.columns = [f"{kind} {measure}" for measure, kind in whole.columns]
    parts = fidelity[(fidelity.gradient == "g_W") & fidelity.part.isin(["old", "new"])]
    if len(parts):
        split = parts.pivot_table(index=keys, columns="part", values="cosine")
        whole = whole.join(split.rename(columns=lambda p: f"g_W cosine {p} classes"))
    whole["n"] = fidelity[fidelity.part == "all"].groupby(keys)[["experience", "seed"]].apply(
        lambda g: len(g.drop_duplicates()))
    return whole.reset_index().drop(columns="position").round(3)


def fidelity_by_experience(fidelity: pd.DataFrame, quantizers: pd.DataFrame) -> pd.DataFrame:
    """Per run kind and experience: each gradient's cosine to the float one (the mean over layers), for G whole and
    for the old and the new classes' logits, the layers' inputs' and the logits' (whole, old and new classes'), the
    means over seeds; in how many seeds g_W's old-class cosine is the higher; and each product's largest tile sum
    over the layers as a fraction of its limit, the mean over seeds (whether the experience's sums reached past the
    accumulator's range)."""
    keys = _keys(fidelity) + ["experience"]
    per_seed = fidelity.pivot_table(index=keys + ["seed"], columns=["gradient", "part"], values="cosine")
    per_seed.columns = [f"{kind} cosine {part}" for kind, part in per_seed.columns]
    table = per_seed.groupby(level=keys).mean()
    if "g_W cosine old" in per_seed:
        old, new = per_seed["g_W cosine old"], per_seed["g_W cosine new"]
        counts = (old > new).astype(float).where(old.notna()).groupby(level=keys).sum(min_count=1)
        # a count of seeds (one seed's too, not its comparison), none where no experience had old classes
        table["g_W old > new, seeds"] = counts.astype("Int64").astype(object)
    reach = quantizers[quantizers.measure.str.endswith("tile sum / limit")]
    if len(reach):
        table = table.join(reach.pivot_table(index=keys + ["seed"], columns="measure", values="value", aggfunc="max")
                           .groupby(level=keys).mean())
    table["seeds"] = per_seed.groupby(level=keys).size()
    table = table.reset_index()
    table["experience"] += 1  # counted from 1, as the run's log counts them
    return table.round(3)


def statistics_table(statistics: pd.DataFrame) -> pd.DataFrame:
    keys = _keys(statistics) + ["position", "layer", "role"]
    table = statistics.groupby(keys)[["max", "min", "mean", "norm"]].mean().reset_index().drop(columns="position")
    for column in ("max", "min", "mean", "norm"):
        table[column] = table[column].map(lambda v: f"{v:.4g}")
    return table


def quantizer_table(quantizers: pd.DataFrame) -> pd.DataFrame:
    """Per run kind and layer: each quantizer role's underflow share, the forward operands' clipped shares and each
    product's saturated share (the means over experiences, their epochs and seeds), and each product's largest tile
    sum as a fraction of its accumulator's limit (the largest over them; above 1: sums the accumulator
    saturated)."""
    keys = _keys(quantizers) + ["position", "layer"]
    reach = quantizers.measure.str.endswith("tile sum / limit")
    parts = [quantizers[~reach].pivot_table(index=keys, columns="measure", values="value", aggfunc="mean"),
             quantizers[reach].pivot_table(index=keys, columns="measure", values="value", aggfunc="max")]
    table = pd.concat([p for p in parts if len(p.columns)], axis=1)
    return table.reset_index().drop(columns="position").round(3)


def layer_names(fidelity: pd.DataFrame) -> dict[int, str] | None:
    """The layer at each place of the plotted runs' models, or None where two runs' models put other layers at one
    place (a panel of ResNet-32 beside MEMO's growing model): one run's names would mislabel the others' curves."""
    names = fidelity.groupby("position").layer.unique()
    return None if any(len(n) > 1 for n in names) else {int(p): n[0] for p, n in names.items()}


def plot_fidelity(fidelity: pd.DataFrame, path) -> None:
    """Cosine to the float gradient by layer (g_W, g_x), and g_W's over the experiences for the old (solid) and the
    new (dashed) classes' logits: one line per strategy (colour) and scheme (marker), means over seeds; the
    quantized schemes only in the last panel (FP32's is 1 by construction)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = _keys(fidelity)
    benchmarks = sorted(fidelity.benchmark.unique())
    strategies, schemes = list(STRATEGY_ORDER), list(SCHEME_ORDER)
    fig, axes = plt.subplots(len(benchmarks), 3, figsize=(17, 4.5 * len(benchmarks)), squeeze=False)

    def style(label, one_strategy: bool) -> dict:
        """run_style's, a tagged or varied run set of a scheme counting as a scheme of its own."""
        run = dict(zip(keys[1:], label))
        kind = " / ".join(str(run[k]) for k in keys[1:] if k not in ("strategy", "variant") and run[k])
        return run_style(run["strategy"], kind, strategies, schemes, one_strategy)

    for row, bench in zip(axes, benchmarks):
        runs = fidelity[(fidelity.benchmark == bench) & fidelity.gradient.isin(GRADIENTS)]
        one_strategy = runs.strategy.nunique() == 1
        names = layer_names(runs)
        for ax, kind in zip(row[:2], GRADIENTS):
            chosen = runs[(runs.gradient == kind) & (runs.part == "all")]
            for label, group in chosen.groupby(keys[1:]):
                curve = group.groupby("position").cosine.mean()
                ax.plot(curve.index, curve.values, label=" / ".join(filter(None, label)), **style(label, one_strategy))
            if names is None:
                ax.set_xlabel("layer, by its place in its model (the models differ)")
            else:
                ax.set_xticks(list(names), list(names.values()), rotation=90, fontsize=6)
            ax.set(title=f"{bench}: {kind} against FP32, by layer", ylabel="cosine similarity")
        ax = row[2]
        split = runs[(runs.gradient == "g_W") & runs.part.isin(["old", "new"]) & (runs.scheme != "fp32")]
        for label, group in split.groupby(keys[1:]):
            for part, line in (("old", "-"), ("new", "--")):
                curve = group[group.part == part].groupby("experience").cosine.mean()
                ax.plot(curve.index + 1, curve.values, line, **style(label, one_strategy))
        experiences = sorted(split.experience.unique() + 1)
        ax.set_xticks(experiences)
        ax.set(title=f"{bench}: g_W against FP32, old (solid) and new (dashed) classes' logits", xlabel="experience",
               ylabel="cosine similarity (mean over layers)")
        for ax in row:
            ax.grid(alpha=0.3)
    fig.tight_layout()
    handles, labels = axes[0][0].get_legend_handles_labels()  # one legend for every panel, beside them
    fig.legend(handles, labels, fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def landscapes(runs: pd.DataFrame) -> list[dict]:
    """The loss landscapes the runs recorded (diagnostics=full): one entry per run and experience, with the run's
    strategy, label (strategy / scheme, variants) and seed, in the schemes' order."""
    out = []
    for run, records, _ in _records(runs):
        label = " / ".join(str(run[k]) for k in RUN_KEYS[1:] if k in run and run[k])
        for record in records:
            if "landscape" in record:
                out.append({"benchmark": run["benchmark"], "strategy": run["strategy"], "scheme": run["scheme"],
                            "label": label, "seed": run.get("seed"), "experience": record["experience"],
                            **_losses(record["landscape"]), "old_test": _losses(record.get("old_test_landscape"))})
    return sorted(out, key=lambda e: (e["benchmark"], e["strategy"], scheme_rank(e["scheme"]), e["label"]))


def _losses(landscape: dict | None) -> dict | None:
    """A recorded landscape (each model's alphas, 1d and 2d slices) as float arrays: NaN where it holds null (a
    loss that was not finite)."""
    if landscape is None:
        return None
    return {model: {key: np.asarray(values, dtype=float) for key, values in slices.items()}
            for model, slices in landscape.items()}


def landscape_table(found: list[dict]) -> pd.DataFrame:
    """Per run and experience: the training loss at the weights and its rise at ±span along the first direction
    (trainer/landscape.py `slice_summary`), then the same of the old experiences' test loss, for the quantized
    model and its float shadow."""
    rows = []
    for entry in found:
        row = {"benchmark": entry["benchmark"], "run": entry["label"], "seed": entry["seed"],
               "experience": entry["experience"] + 1}
        for what, slices in (("train", entry), ("old test", entry["old_test"])):
            for model, suffix in (("quantized", ""), ("float", " (float)")):
                summary = slice_summary(slices[model]["1d"]) if slices else {"centre": None, "rise": None}
                row[f"{what} loss{suffix}"], row[f"{what} rise{suffix}"] = summary["centre"], summary["rise"]
        rows.append(row)
    return pd.DataFrame(rows).round(3)  # the first experience has no old ones: "–" in the table


def _spans_decades(values) -> bool:
    """Whether positive losses spread over more than two decades (a float shadow far from its quantized model, as
    at a LUQ run's weights): drawn on a log scale, else the small curves flatten to a line."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values) & (values > 0)]
    return len(values) > 1 and values.max() > 100 * np.median(values)


def _contour_levels(grid, count: int = 15) -> np.ndarray:
    """Contour levels at the grid's quantiles: evenly spaced levels would all fall among a few outlying points."""
    values = np.asarray(grid, dtype=float)
    return np.unique(np.quantile(values[np.isfinite(values)], np.linspace(0.02, 0.98, count)))


def plot_landscapes(found: list[dict], path) -> None:
    """Per run (its lowest seed): the 1-D slice of every experience's training loss (quantized solid, float shadow
    dashed), the same of the old experiences' test loss where recorded, and the 2-D slice of the last experience's
    training loss, quantized, as contours."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {}
    for entry in sorted(found, key=lambda e: (e["seed"] is None, e["seed"])):
        runs.setdefault((entry["benchmark"], entry["label"]), {}).setdefault(entry["seed"], []).append(entry)
    old_tests = any(entry.get("old_test") for entry in found)
    fig, axes = plt.subplots(len(runs), 2 + old_tests, figsize=(5.5 * (2 + old_tests), 4 * len(runs)), squeeze=False)
    for row, ((bench, label), seeds) in zip(axes, runs.items()):
        ax_1d, ax_2d = row[0], row[-1]
        entries = next(iter(seeds.values()))
        colors = plt.get_cmap("viridis")([i / max(1, len(entries) - 1) for i in range(len(entries))])
        panels = [(ax_1d, lambda entry: entry, "training loss")]
        if old_tests:
            panels.append((row[1], lambda entry: entry.get("old_test"), "old experiences' test loss"))
        for ax, slices, what in panels:
            for entry, color in zip(entries, colors):
                for model, style in (("quantized", "-"), ("float", "--")):
                    if slices(entry):
                        ax.plot(slices(entry)[model]["alphas"], slices(entry)[model]["1d"], style, color=color,
                                label=f"experience {entry['experience'] + 1}, {model}")
            ax.set(title=f"{bench}: {label}, 1-D slice, {what}", xlabel="α (filter-normalised direction)",
                   ylabel=what)
            drawn = [y for line in ax.get_lines() for y in line.get_ydata()]
            if _spans_decades(drawn):
                ax.set_yscale("log")
            ax.legend(fontsize=6)
        last = entries[-1]["quantized"]
        contour = ax_2d.contour(last["alphas"], last["alphas"], last["2d"], levels=_contour_levels(last["2d"]))
        ax_2d.clabel(contour, fontsize=6)
        ax_2d.set(title=f"{bench}: {label}, 2-D slice after experience {entries[-1]['experience'] + 1}, quantized",
                  xlabel="β", ylabel="α")
        for ax in (ax_1d, ax_2d):
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
