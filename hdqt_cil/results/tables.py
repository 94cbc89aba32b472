"""Tables and plots from run folders (never from logs): mean ± std over seeds.

- table.*: one row per benchmark × scenario × model × strategy × quant[tag] (and variant: runs of one such row
  whose configs differ in anything but the seed are split, the differing settings named, never averaged
  together), with the epochs a task and the paper preset the runs start from;
- main.md: the paper's layout, one row per benchmark × epochs a task × strategy with the schemes side by side
  (untagged runs);
- ablation.md / ablation.png: runs whose quant settings differ from their preset, one row per setting, and
  accuracy against each numeric setting; ablation_paired.md: each setting against its default and FP32, paired
  by seed, and the settings whose runs came out the same;
- energy.png: accuracy against the estimated training energy on integer hardware (runs that report their cost;
  table.* then adds the integer GMACs, the energy and its ratio to the FP32 row, of the row's tag where
  one ran);
- paired.md: each row against its FP32 row, paired by seed (the differences' mean ± std and each seed's);
- fidelity.md / fidelity_by_experience.md / fidelity.png / gradient_stats.md / quantizers.md: runs with
  diagnostics=light or full;
  landscape.md / landscape_<strategy>.png: runs with diagnostics=full (results/diagnostics.py);
- make_tables_outputs.txt: the files written, so that the next make_tables into the folder removes those it does
  not write again (and no other file); without plots, it keeps the figures its runs would draw.
A run counts in a mean only when its summary says `complete`. Diverged runs are shown as such; runs that
stopped early (fewer experiences than configured) are counted in a separate column, never averaged in.
Outside table.*, a benchmark's label names its scenario unless it is class-incremental ("hapt (task)").
"""
import contextlib
import functools
import hashlib
import math
import re
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from ..config import DEFAULTED_SETTINGS, RUN_INDEPENDENT_QUANT, SWITCHED_SETTINGS, comparable_config
from ..quant.schemes import SCHEMES, preset_settings
from ..files import parse_json, write_atomic
from ..wording import epochs as epochs_phrase
from .style import LINESTYLES, SCHEME_ORDER, STRATEGY_ORDER, run_style, scheme_rank
from .diagnostics import (diagnostics_frame, fidelity_by_experience, fidelity_table, landscape_table, landscapes,
                          plot_fidelity, plot_landscapes, quantizer_table, statistics_table)

KEYS = ["benchmark", "scenario", "model", "strategy", "quant"]
# the schedule beside the row's identity: epochs a task, and the paper preset ('–': none) the runs start from
SCHEDULE = ["preset", "epochs"]
ROW_KEYS = [*KEYS, *SCHEDULE, "variant", "quant_variant"]
METRICS = {"avg_acc": "avg acc", "last_acc": "last acc", "forgetting": "forgetting", "wall_time_s": "wall s",
           "peak_memory_mib": "peak GPU MiB", "int_gmacs": "int GMACs", "energy_j": "energy J"}
# the cost columns span orders of magnitude; memory in whole MiB
FORMATS = {"int_gmacs": ".4g", "energy_j": ".3g", "peak_memory_mib": ".0f"}
# Settings that make no ablation, left out when a run's settings are compared with its preset: where the products
# run, and HOT's memory against speed (its last bits differ on a GPU, its method does not).
_NEUTRAL_SETTINGS = ("name", "seed", *RUN_INDEPENDENT_QUANT, "sliced_unfold")


def _flat(d: dict, prefix="") -> dict:
    out = {}
    for key, value in d.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


EXPERIMENTS = Path(__file__).resolve().parents[1] / "configs" / "experiment"


def _run_config(run_dir: Path) -> dict:
    """The run's resolved config.yaml ({} when absent). A run from before configs recorded their `preset` takes it
    from the experiment its command named, so that its rows join the later runs of that preset."""
    path = run_dir / "config.yaml"
    if not path.exists():
        return {}
    config = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    if "preset" not in config:
        config["preset"] = _named_preset(run_dir / ".hydra" / "overrides.yaml")
    return config


def _named_preset(overrides: Path) -> str | None:
    """The `preset` of the experiment (`+experiment=NAME`) among a run's Hydra overrides, if it names one."""
    named = [o.split("=", 1)[1] for o in (OmegaConf.load(overrides) if overrides.exists() else [])
             if o.split("=", 1)[0].lstrip("+") == "experiment"]
    return _experiment_preset(named[-1]) if named else None


@functools.lru_cache(maxsize=None)
def _experiment_preset(name: str) -> str | None:
    """The `preset` an experiment config declares (read once a name: a table reads many runs of one experiment)."""
    experiment = EXPERIMENTS / f"{name}.yaml"
    return OmegaConf.load(experiment).get("preset") if experiment.exists() else None


def quant_setting(config: dict) -> str:
    """'key=value, ...' for the quant settings of a run that differ from its preset ('' when none do)."""
    quant = config.get("quant", {})
    preset = _flat(preset_settings(quant["name"]) if quant.get("name") in SCHEMES.names() else {})
    return ", ".join(f"{k}={v}" for k, v in sorted(_flat(quant).items())
                     if k not in _NEUTRAL_SETTINGS and k in preset and preset[k] != v)


def _switch(key: str) -> str | None:
    """The dotted switch of a switched setting (config.SWITCHED_SETTINGS), None for any other setting."""
    return next((f"{node}.{switch}" for node, switch, prefix in SWITCHED_SETTINGS
                 if key.startswith(f"{node}.{prefix}")), None)


def _value(key: str, flat: dict):
    """A run's value of a dotted setting as the variant column shows it. A defaulted setting
    (config.DEFAULTED_SETTINGS) is left out of a run's identity at its default, which it then shows where it means
    something (its switch, if it has one, on); any other setting a run lacks is 'unset'."""
    if key in flat:
        return flat[key]
    default = next((d for node, name, d, _ in DEFAULTED_SETTINGS if key == f"{node}.{name}"), "unset")
    switch = _switch(key)
    return default if switch is None or switch in flat else "unset"


def _alike_where_known(key: str, flat: list[dict]) -> bool:
    """Whether `key` has one value among the runs where it says something: a switched setting among the runs with
    its switch on (it then differs only with its switch, which the rows show already); the data's fingerprint among
    the runs that record it (a run from before summaries recorded it is told apart by its config alone)."""
    switch = _switch(key)
    if switch is None and key != "data":
        return False
    known = [f for f in flat if (switch or key) in f]
    return len({repr(_value(key, f)) for f in known}) == 1


def _differences(df: pd.DataFrame, flat: list[dict], by: list[str]) -> list[str]:
    """Per run, 'key=value, ...' for the settings in which it differs from other runs of its `by` group."""
    out = [""] * len(df)
    for _, group in df.groupby(by):
        rows = group.index.tolist()
        keys = sorted(set().union(*(flat[i] for i in rows)))
        differing = [k for k in keys if len({repr(_value(k, flat[i])) for i in rows}) > 1
                     and not _alike_where_known(k, [flat[i] for i in rows])]
        for i in rows:
            out[i] = ", ".join(f"{k}={_value(k, flat[i])}" for k in differing)
    return out


def _variants(df: pd.DataFrame, configs: list[dict]) -> tuple[list[str], list[str]]:
    """Settings that split runs which would otherwise share a row: outside quant (compared across the schemes of
    one benchmark × model × strategy, so the schemes still line up) and inside quant (within one row)."""
    flat = [{k: v for k, v in _flat(comparable_config(c)).items()
             if k not in ("seed", "tag", "quant.seed", "trainer.epochs")}  # seeds averaged; epochs: SCHEDULE
            for c in configs]
    outside = [{k: v for k, v in f.items() if not k.startswith("quant.")} for f in flat]
    inside = [{k: v for k, v in f.items() if k.startswith("quant.")} for f in flat]
    # runs of other epochs are rows apart already, with milestones of their own: compared within one epochs
    return (_differences(df, outside, ["benchmark", "model", "strategy", "epochs"]), _differences(df, inside, KEYS))


def _schedule(config: dict) -> dict:
    """The run's SCHEDULE columns, as text ('–' where its config does not say), so that rows group by them."""
    epochs = config.get("trainer", {}).get("epochs")
    return {"preset": config.get("preset") or "–", "epochs": "–" if epochs is None else str(epochs)}


def collect_runs(*roots) -> pd.DataFrame:
    """One row per run folder (a folder holding summary.json) found under `roots`, for the tables: two runs of one
    row and seed are refused (a row's mean counts a seed once; its spread would shrink)."""
    df = _collect(roots)[0]
    clash = df[df.duplicated([*ROW_KEYS, "seed"], keep=False)]
    if len(clash):
        paths = next(iter(clash.groupby([*ROW_KEYS, "seed"]).path))[1]
        raise ValueError(f"{len(clash)} run folders repeat a table row's seed (different summary.json files), e.g. "
                         f"{' and '.join(paths)}: a row averages one run a seed, so pass only one of them (tag= "
                         f"gives a run a row of its own)")
    return df


def _collect(roots) -> tuple[pd.DataFrame, list[dict]]:
    """collect_runs' frame, and each run's config as its config.yaml resolves ({} where it has none)."""
    rows, configs, sources = [], [], []
    for root in roots:
        for path in sorted(Path(root).rglob("summary.json")):
            raw = path.read_bytes()  # read once: parsed, and its digest tells a run found twice (_each_run_once)
            summary, config = parse_json(raw), _run_config(path.parent)
            configs.append(config)
            sources.append(summary.get("data_source"))
            cost = summary.get("cost") or {}  # training's cost on integer hardware (trainer/cost.py)
            metrics = {name: math.nan if value is None else value  # null: not finite (files.write_json)
                       for name, value in summary["metrics"].items()}
            rows.append({**summary["run"], **metrics, "status": summary["status"],
                         "seen_acc": summary["seen_acc"], "classes_per_exp": summary["classes_per_exp"],
                         "n_experiences": summary["n_experiences"], "acc_matrix": summary.get("acc_matrix"),
                         "wall_time_s": summary.get("wall_time_s", math.nan), "path": str(path.parent),
                         "peak_memory_mib": summary.get("peak_memory_mib") or math.nan,
                         "setting": quant_setting(config), "int_gmacs": cost.get("training int GMACs", math.nan),
                         **_schedule(config),
                         "energy_j": cost.get("training energy J", {}).get("total", math.nan),
                         "digest": hashlib.sha256(raw).hexdigest()})
    if not rows:
        raise FileNotFoundError(f"no run folders (summary.json) under {', '.join(map(str, roots))}")
    df = pd.DataFrame(rows)
    # The scenario in every row: a column of table.*, and in the other views' benchmark label unless class.
    df["scenario"] = df["scenario"].fillna("class") if "scenario" in df else "class"
    df["benchmark"] = [b if s == "class" else f"{b} ({s})" for b, s in zip(df.benchmark, df.scenario)]
    df["scheme"] = df["quant"]
    df["tag"] = df["tag"].fillna("")  # untagged: "" (a summary may hold null)
    df["quant"] = df["quant"] + df["tag"].map(lambda t: f"[{t}]" if t else "")
    # runs on other data: rows apart (the data before the seed's split; runs that do not record it are told apart
    # by their configs alone)
    df["variant"], df["quant_variant"] = _variants(df, [{**c, "data": d} for c, d in zip(configs, sources)])
    # a run folder found twice (roots that overlap, an archive beside its unpacked copy: the same summary.json) is
    # one run
    df = df[~df.duplicated([*ROW_KEYS, "seed", "digest"])]
    return df.reset_index(drop=True), [configs[i] for i in df.index]  # the configs of the runs kept


# what a root of the tables' commands may be (make_tables, quant_gap_report)
ROOTS_HELP = ("folders searched recursively for run folders (summary.json), tar archives of them (results/*/runs.tgz), "
              "or one folder of an archive (ARCHIVE:FOLDER, e.g. results/cifar10/runs.tgz:runs/cifar10-resnet32/icarl)")


def archive_member(root: str) -> tuple[str, str]:
    """(archive, folder inside it) for a root that names a folder of a tar archive as `runs.tgz:runs/x`, the form in
    which the tables name an archive's runs; (root, '') for any other root."""
    for at, char in enumerate(root):
        if char == ":" and Path(root[:at]).is_file():
            return root[:at], root[at + 1:].strip("/").removeprefix("./")
    return root, ""


def unpacked(root: str, into: str) -> str:
    """`root` itself, or where the tar archive `root` is unpacked under `into` (with `archive:folder`, that folder of
    it alone); a damaged or cut-short archive, or one whose paths leave its folder, is a ValueError naming it, a
    folder the archive does not hold a FileNotFoundError."""
    archive, inner = archive_member(root)
    if not Path(archive).is_file():
        return root
    try:
        if not tarfile.is_tarfile(archive):  # reads the first member: a short archive can end there
            if inner:
                raise tarfile.ReadError("not a tar archive")
            return root
        folder = tempfile.mkdtemp(dir=into)
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if _within(m.name.removeprefix("./"), inner)]
            tar.extractall(folder, members=members, filter="data")
    except (tarfile.TarError, EOFError, OSError) as error:
        raise ValueError(f"{archive} is not a readable tar archive ({error})") from error
    if inner and not members:
        raise FileNotFoundError(f"{archive} holds no folder {inner}")
    return str(Path(folder) / inner) if inner else folder


def _within(name: str, folder: str) -> bool:
    return not folder or name == folder or name.startswith(f"{folder}/")


def _refuse_missing(roots) -> None:
    """Every root that does not exist (an archive's folder: its archive), named in one FileNotFoundError."""
    missing = [str(root) for root in roots if not Path(archive_member(str(root))[0]).exists()]
    if missing:
        raise FileNotFoundError(f"no such file or folder: {', '.join(missing)}")


@contextlib.contextmanager
def readable_roots(roots):
    """`roots` to read as folders for the block's length: missing ones refused together (FileNotFoundError), tar
    archives (or one folder of an archive, `runs.tgz:runs/x`) unpacked into a temporary folder; a ValueError or
    FileNotFoundError of the block names an archive's runs by the archive (`runs.tgz:runs/x`), not by its copy."""
    roots = [str(root) for root in roots]
    _refuse_missing(roots)
    folders = []
    with tempfile.TemporaryDirectory() as scratch:
        try:
            folders += [unpacked(root, scratch) for root in roots]  # a damaged archive: ValueError
            yield folders
        except (FileNotFoundError, ValueError) as error:
            message = str(error)
            for folder, root in zip(folders, roots):
                if folder != root:
                    archive, inner = archive_member(root)
                    copy = folder.removesuffix(f"/{inner}") if inner else folder
                    message = message.replace(f"{copy}/", f"{archive}:").replace(copy, archive)
            raise type(error)(message) from error


def load_runs(*roots) -> pd.DataFrame:
    """Every run folder under `roots` (folders, tar archives of run folders: results/*/runs.tgz, or one folder of
    one: runs.tgz:runs/x), for a notebook: collect_runs' row (run identity, status, metrics, cost, wall time, peak
    memory, path: an archive's runs in a temporary copy) with each setting of the run's config as a column of its
    dotted name (`trainer.epochs`, `quant.acc_bits`, ...) and its accuracy matrix in `acc_matrix` (a float array,
    row k: after experience k, NaN for experiences not yet seen)."""
    _refuse_missing(roots)
    copies = tempfile.mkdtemp(prefix="hdqt-runs-")
    df, configs = _collect([unpacked(str(root), copies) for root in roots])
    settings = pd.DataFrame([_flat(c) for c in configs], index=df.index)
    df = pd.concat([df, settings[[c for c in settings.columns if c not in df.columns]]], axis=1)
    df["acc_matrix"] = [np.array(m, dtype=float) for m in df.acc_matrix]
    return df


def mean_std(values, form: str = ".1f") -> str:
    """'mean ± std' over seeds (std with ddof 1), 'value (n=1)' for one seed (no spread measured, not a spread of
    0); a '+' in `form` signs the mean only. Seeds that differ only in a float sum's last bits (one cost summed in
    another order) have no spread: 0, not 1e-13."""
    values = np.asarray(values, dtype=float)
    if len(values) == 1:
        return f"{number(values[0], form)} (n=1)"
    mean, spread = values.mean(), values.std(ddof=1)
    spread = 0.0 if spread <= 1e-9 * abs(mean) else spread
    return f"{number(mean, form)} ± {spread:{form.lstrip('+')}}"


def number(value: float, form: str = ".1f") -> str:
    """`value` in `form`; one that rounds to zero without its sign ('+0.0', never '-0.0')."""
    text = f"{value:{form}}"
    return text if float(text) != 0 else f"{0.0:{form}}"


def _cell(values, status, form: str = ".1f") -> str:
    done = [v for v, s in zip(values, status) if s == "complete" and not math.isnan(v)]
    diverged = sum(s == "diverged" for s in status)
    if not done:
        return "diverged" if diverged else "–"
    return mean_std(done, form) + (f" ({diverged} diverged)" if diverged else "")


def aggregate(df: pd.DataFrame, keys=ROW_KEYS) -> pd.DataFrame:
    """Numeric table: per keys, mean and std of each metric over complete runs, and run counts. A std needs two
    values: NaN (an empty field in table.csv) where fewer were measured, as mean_std's 'n=1', not a spread of 0."""
    rows = []
    for key, group in df.groupby(list(keys), sort=True):
        complete = group[group.status == "complete"]
        row = dict(zip(keys, key))
        for m in METRICS:
            row[f"{m}_mean"] = complete[m].mean()
            row[f"{m}_std"] = complete[m].std(ddof=1)
            row[f"{m}_text"] = _cell(group[m].tolist(), group.status.tolist(), FORMATS.get(m, ".1f"))
        row["seeds"] = len(complete)
        row["diverged"] = int((group.status == "diverged").sum())
        row["incomplete"] = int(group.status.isin(["running", "interrupted"]).sum())
        rows.append(row)
    return pd.DataFrame(rows)


# the accuracies compared seed by seed (paired.md, ablation_paired.md)
PAIRED = {"avg_acc": "avg acc", "last_acc": "last acc"}
# what a row shares with the FP32 row it is set against (energy vs fp32, paired.md); the tag too where FP32 ran so
REFERENCE_KEYS = ["benchmark", "model", "strategy", *SCHEDULE, "variant"]


def label_parts(quant: str) -> tuple[str, str]:
    """A row's quant label split into its scheme and its tag's part ('hdqt[acc12]': 'hdqt', '[acc12]'; untagged:
    '')."""
    scheme, bracket, tag = quant.partition("[")
    return scheme, bracket + tag


def fp32_labels(quant: str) -> tuple[str, str]:
    """The quant labels of the FP32 rows a row is set against, in order of preference: FP32 under the row's own
    tag (a tag's runs share a setting: 'mxfp4[ce_seen]' against 'fp32[ce_seen]'), then untagged FP32."""
    return f"fp32{label_parts(quant)[1]}", "fp32"


def energy_vs_fp32(agg: pd.DataFrame) -> list[str]:
    """Each row's mean estimated energy over that of its FP32 row (fp32_labels); '–' where there is none, or it is
    0 (every cost.*_pj=0), which no ratio is taken against."""
    fp32 = agg.set_index([*REFERENCE_KEYS, "quant"]).energy_j_mean  # looked up by FP32's labels alone
    out = []
    for row in agg.itertuples():
        key = tuple(getattr(row, k) for k in REFERENCE_KEYS)
        base = next((fp32[(*key, label)] for label in fp32_labels(row.quant) if (*key, label) in fp32), math.nan)
        unknown = math.isnan(base) or base == 0 or math.isnan(row.energy_j_mean)
        out.append("–" if unknown else f"{row.energy_j_mean / base:.3f}")
    return out


def paired_vs_fp32(df: pd.DataFrame) -> pd.DataFrame:
    """Each table row other than FP32 against its FP32 row (fp32_labels), paired by seed over the seeds both
    completed: mean ± std of the per-seed differences (row − FP32) and the differences seed by seed. A seed fixes
    the class order, so a paired difference leaves out what the order does to both runs."""
    done = df[df.status == "complete"]
    fp32 = done[done.scheme == "fp32"]
    rows = []
    for key, group in done[done.scheme != "fp32"].groupby(ROW_KEYS, sort=True):
        row = dict(zip(ROW_KEYS, key))
        candidates = fp32[(fp32[REFERENCE_KEYS] == pd.Series(row)[REFERENCE_KEYS]).all(axis=1)]
        reference = next((candidates[candidates.quant == label] for label in fp32_labels(row["quant"])
                          if (candidates.quant == label).any()), None)
        if reference is None:
            continue
        pairs = group.merge(reference, on="seed", suffixes=("", "_ref")).sort_values("seed")
        if pairs.empty:
            continue
        row["against"] = reference.quant.iloc[0]
        row["seeds"] = ", ".join(str(seed) for seed in pairs.seed)
        for m, title in PAIRED.items():
            differences = pairs[m] - pairs[f"{m}_ref"]
            row[f"{title} − fp32"] = mean_std(differences, "+.1f")
            row[f"{title} − fp32 by seed"] = ", ".join(number(d, "+.1f") for d in differences)
        rows.append(row)
    if not rows:
        return pd.DataFrame()
    table = pd.DataFrame(rows)
    return table[[*_known(table, ROW_KEYS), *table.columns[len(ROW_KEYS):]]]


def _known(frame: pd.DataFrame, keys) -> list[str]:
    """The key columns some row knows: variants ('' unknown) and the schedule ('–') only where a row has one."""
    unknown = {k: "" for k in keys if k.endswith("variant")} | {k: "–" for k in SCHEDULE}
    return [k for k in keys if k not in unknown or (frame[k] != unknown[k]).any()]


def display_table(agg: pd.DataFrame, keys=ROW_KEYS) -> pd.DataFrame:
    """The human table: text cells 'mean ± std'; variant and schedule columns, the peak GPU memory and the cost
    columns only where some row has one."""
    table = agg[_known(agg, keys)].copy()
    costed = agg["energy_j_mean"].notna().any()
    shown = {"int_gmacs": costed, "energy_j": costed, "peak_memory_mib": agg["peak_memory_mib_mean"].notna().any()}
    for m, title in METRICS.items():
        if shown.get(m, True):
            table[title] = agg[f"{m}_text"]
    if costed and "quant" in agg and "variant" in agg:
        table["energy vs fp32"] = energy_vs_fp32(agg)
    table["seeds"] = agg["seeds"]
    if agg["incomplete"].any():
        table["incomplete"] = agg["incomplete"]
    return table


def main_table(df: pd.DataFrame) -> pd.DataFrame:
    """The paper's layout: benchmark × epochs a task × strategy rows; avg / last accuracy and forgetting of each
    scheme side by side, FP32 first. Only runs at their preset's settings (no tag, no quant variant) enter; a
    strategy run in several variants gets a row for each, named by its differing settings."""
    runs = _preset_runs(df)
    if runs.empty:  # every run tagged (an ablation, a shortened schedule): table.md holds them
        return pd.DataFrame(columns=["benchmark", "strategy"])
    rows = ["benchmark", "epochs", "strategy"]
    agg = aggregate(runs, keys=[*rows, "scheme"])
    schemes = sorted(agg.scheme.unique(), key=scheme_rank)
    table = agg[rows].drop_duplicates().reset_index(drop=True)
    for scheme in schemes:
        cells = agg[agg.scheme == scheme].set_index(rows)
        for m in ("avg_acc", "last_acc", "forgetting"):
            table[f"{scheme} {METRICS[m]}"] = [cells[f"{m}_text"].get(k, "–")
                                               for k in zip(*(table[r] for r in rows))]
    return table.drop(columns="epochs") if (table.epochs == "–").all() else table


def strategy_labels(runs: pd.DataFrame) -> list[str]:
    """Each run's strategy, named by its variant (the settings outside quant in which it differs from the
    strategy's other runs) when it has one: 'bic [strategy.ce_classes=seen]'."""
    return [s + (f" [{v}]" if v else "") for s, v in zip(runs.strategy, runs.variant)]


def _preset_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Runs at their scheme's preset settings (no tag, no quant variant), strategies named by their variant."""
    runs = df[(df.tag == "") & (df.quant_variant == "")]
    return runs.assign(strategy=strategy_labels(runs))


PUBLISHED_COLUMNS = ("benchmark", "strategy", "quant", "avg_acc", "last_acc", "source")


def published_table(df: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    """Each published row (benchmark, strategy, quant: avg and last accuracy, its source) beside the runs here at
    the scheme's preset: mean ± std over complete seeds and the differences; for a scheme other than fp32, its cost
    (scheme − fp32) published and here."""
    missing = set(PUBLISHED_COLUMNS) - set(published.columns)
    if missing:
        raise ValueError(f"a published table needs the columns {', '.join(PUBLISHED_COLUMNS)}; "
                         f"missing {', '.join(sorted(missing))}")
    keys = ["benchmark", "strategy", "scheme"]
    agg = aggregate(_preset_runs(df), keys=[*keys, *SCHEDULE])
    mixed = agg[agg.duplicated(keys, keep=False)]
    if len(mixed):  # one published number beside runs of two schedules: their mean would be of neither
        first = mixed.iloc[0]
        schedules = ", ".join(f"{r.preset} at {r.epochs} epochs" for r in
                              mixed[(mixed[keys] == first[keys]).all(axis=1)].itertuples())
        raise ValueError(f"the runs of {first.benchmark} {first.strategy} {first.scheme} ran at more than one "
                         f"schedule ({schedules}): give only the runs of the schedule the published numbers were "
                         "made with")
    agg = agg.set_index(keys)
    theirs = published.set_index(["benchmark", "strategy", "quant"])
    rows = []
    for (bench, strategy, quant), ref in theirs.iterrows():
        here = agg.loc[(bench, strategy, quant)] if (bench, strategy, quant) in agg.index else None
        row = {"benchmark": bench, "strategy": strategy, "quant": quant,
               "published avg / last": f"{ref.avg_acc:.1f} / {ref.last_acc:.1f}",
               "here avg / last": "–" if here is None else f"{here.avg_acc_text} / {here.last_acc_text}",
               "seeds": 0 if here is None else int(here.seeds)}
        row["here − published"] = "–" if here is None else (f"{here.avg_acc_mean - ref.avg_acc:+.1f} / "
                                                             f"{here.last_acc_mean - ref.last_acc:+.1f}")
        fp32_ref = theirs.loc[(bench, strategy, "fp32")] if (bench, strategy, "fp32") in theirs.index else None
        fp32_here = agg.loc[(bench, strategy, "fp32")] if (bench, strategy, "fp32") in agg.index else None
        if fp32_here is not None and here is not None and (fp32_here.preset, fp32_here.epochs) != (here.preset,
                                                                                           here.epochs):
            fp32_here = None  # FP32 at another schedule: no cost here
        costs = ("–", "–")
        if quant != "fp32" and fp32_ref is not None:
            costs = (f"{ref.avg_acc - fp32_ref.avg_acc:+.1f} / {ref.last_acc - fp32_ref.last_acc:+.1f}",
                     "–" if here is None or fp32_here is None else
                     f"{here.avg_acc_mean - fp32_here.avg_acc_mean:+.1f} / "
                     f"{here.last_acc_mean - fp32_here.last_acc_mean:+.1f}")
        row["cost vs fp32, published"], row["cost vs fp32, here"] = costs
        row["source"] = ref.source
        rows.append(row)
    return pd.DataFrame(rows)


ABLATION_KEYS = ["benchmark", "strategy", "scheme", "setting"]


def ablation_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Runs of every (benchmark, strategy, scheme) that has runs off its preset, with that preset's own runs as
    the 'default' row; a seed run twice at the same settings (a tagged copy of the default) counts once."""
    ablated = df[df.setting != ""][["benchmark", "strategy", "scheme"]].drop_duplicates()
    runs = df.merge(ablated, on=["benchmark", "strategy", "scheme"])
    runs = runs.assign(setting=runs.setting.replace("", "default"))
    return runs.sort_values("tag").drop_duplicates([*ABLATION_KEYS, "seed"])


def paired_ablation(ablation: pd.DataFrame, presets: pd.DataFrame) -> pd.DataFrame:
    """Each ablation setting against its scheme's default and against FP32, paired by seed: mean ± std of the
    per-seed differences (setting − reference) over the seeds both completed, the count of those seeds after each
    cell when it is fewer than the setting's; and the other settings whose runs are the same seed for seed (the
    same accuracy after every experience: the setting changed no number)."""
    done = ablation[ablation.status == "complete"]
    fp32 = presets[(presets.scheme == "fp32") & (presets.status == "complete")]
    rows = []
    for key, group in done.groupby(ABLATION_KEYS):
        bench, strategy, scheme, setting = key
        if setting == "default":
            continue
        siblings = done[(done.benchmark == bench) & (done.strategy == strategy) & (done.scheme == scheme)]
        references = {"default": siblings[siblings.setting == "default"],
                      "fp32": fp32[(fp32.benchmark == bench) & (fp32.strategy == strategy)]}
        row = dict(zip(ABLATION_KEYS, key))
        for name, reference in references.items():
            pairs = group.merge(reference, on="seed", suffixes=("", "_ref"))
            for m, title in PAIRED.items():
                cell = mean_std(pairs[m] - pairs[f"{m}_ref"], "+.1f") if len(pairs) else "–"
                row[f"{title} − {name}"] = cell + (f" ({len(pairs)})" if 0 < len(pairs) < len(group) else "")
        row["seeds"] = len(group)
        row["same runs as"] = ", ".join(other for other, runs in siblings.groupby("setting")
                                        if other != setting and _same_runs(group, runs)) or "–"
        rows.append(row)
    return pd.DataFrame(rows)


def _same_runs(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Whether two settings' runs have the same seeds and, seed for seed, the same accuracy after every
    experience."""
    if sorted(a.seed) != sorted(b.seed):
        return False
    curves = dict(zip(b.seed, b.seen_acc))
    return all(list(curve) == list(curves[seed]) for seed, curve in zip(a.seed, a.seen_acc))


def _setting_value(setting: str, key: str, scheme: str):
    """The numeric value of `key` in a run's setting, or the preset's value for the 'default' row."""
    if setting == "default":
        return _flat(preset_settings(scheme)).get(key)
    name, _, value = setting.partition("=")
    return float(value) if name == key and "," not in value and value.lstrip("-").isdigit() else None


def ablation_panels(agg: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Each numeric setting (bits, acc_bits, tile) that takes two values or more among the aggregated ablation
    rows, with those rows and the setting's value in `x`, sorted by it: the panels of plot_ablation."""
    keys = sorted({s.partition("=")[0] for s in agg.setting if s != "default" and "," not in s})
    panels = []
    for key in keys:
        x = [_setting_value(setting, key, scheme) for setting, scheme in zip(agg.setting, agg.scheme)]
        points = agg.assign(x=x).dropna(subset=["x"])
        if points.x.nunique() > 1:
            panels.append((key, points.sort_values("x")))
    return panels


def plot_ablation(panels: list[tuple[str, pd.DataFrame]], path, fp32: pd.DataFrame | None = None) -> None:
    """Average accuracy against each numeric setting (ablation_panels, at least one), one line per benchmark ×
    strategy; `fp32` (aggregated preset runs by benchmark, strategy, scheme) adds each line's FP32 accuracy as the
    level to reach, dashed in the line's colour."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (key, points) in zip(axes[0], panels):
        for (bench, strategy, scheme), line in points.groupby(["benchmark", "strategy", "scheme"]):
            drawn = ax.errorbar(line.x, line.avg_acc_mean, yerr=line.avg_acc_std, marker="o", capsize=2,
                                label=f"{bench} / {strategy} / {scheme}")
            reference = None if fp32 is None else fp32[(fp32.benchmark == bench) & (fp32.strategy == strategy)]
            if reference is not None and len(reference):
                ax.axhline(reference.avg_acc_mean.iloc[0], linestyle="--", color=drawn.lines[0].get_color(),
                           label=f"{bench} / {strategy} / fp32 ({int(reference.seeds.iloc[0])} seeds)")
        ax.set(xlabel=key, ylabel="avg accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_energy(agg: pd.DataFrame, path) -> None:
    """Average accuracy against the estimated training energy, one point per table row (scheme, ablation), one
    panel per benchmark, coloured and marked as style.run_style gives them: what each scheme buys and costs."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = agg[agg.energy_j_mean.notna()]
    benchmarks = sorted(rows.benchmark.unique())
    strategies, schemes = list(STRATEGY_ORDER), list(SCHEME_ORDER)
    fig, axes = plt.subplots(1, len(benchmarks), figsize=(6.5 * len(benchmarks), 4.5), squeeze=False)
    for ax, bench in zip(axes[0], benchmarks):
        panel = rows[rows.benchmark == bench]
        one_strategy = panel.strategy.nunique() == 1
        for row in panel.itertuples():
            detail = ", ".join(filter(None, (_short(row.variant), _short(row.quant_variant),
                                             epochs_phrase(row.epochs) if panel.epochs.nunique() > 1 else "")))
            scheme = label_parts(row.quant)[0]  # a tagged row's marker is its scheme's
            ax.errorbar(row.energy_j_mean, row.avg_acc_mean, xerr=row.energy_j_std, yerr=row.avg_acc_std,
                        capsize=2, **run_style(row.strategy, scheme, strategies, schemes, one_strategy),
                        label=f"{row.strategy} / {row.quant}" + (f" ({detail})" if detail else ""))
        ax.set(title=bench, xscale="log", xlabel="estimated training energy (J)", ylabel="avg accuracy (%)")
        _label_energy_axis(ax, panel.energy_j_mean)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # the legends beside the panels, which tight_layout leaves out
    plt.close(fig)


def _label_energy_axis(ax, energies) -> None:
    """Plain numbers on the log energy axis, at 1-2-5 steps where the panel spans under two decades: matplotlib's
    own minor labels there ('3×10³ 4×10³') run into each other."""
    from matplotlib import ticker

    plain = ticker.FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}")
    ax.xaxis.set_major_formatter(plain)
    if np.log10(energies.max() / energies.min()) < 2:
        ax.xaxis.set_minor_locator(ticker.LogLocator(subs=(2, 5)))
        ax.xaxis.set_minor_formatter(plain)
    else:
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())


def _markdown_cell(value) -> str:
    """A markdown cell: '–' where the measure does not apply to the row (NaN, None), as in every table here."""
    return "–" if pd.api.types.is_scalar(value) and pd.isna(value) else str(value)


def to_markdown(table: pd.DataFrame) -> str:
    header = "| " + " | ".join(table.columns) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    body = ["| " + " | ".join(_markdown_cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"


def _short(variant: str) -> str:
    """'strategy.loss=ce_kd, trainer.milestones=[60, 100]' -> 'loss=ce_kd, milestones=[60, 100]' for legends."""
    parts = re.split(r", (?=[\w.]+=)", variant) if variant else []
    return ", ".join(key.rsplit(".", 1)[-1] + "=" + value for key, value in (part.split("=", 1) for part in parts))


def _seeds(counts) -> str:
    """'3 seeds a line', '1-3 seeds a line'."""
    low, high = min(counts), max(counts)
    return f"{low if low == high else f'{low}-{high}'} seed{'s' if high > 1 else ''} a line"


def plot_accuracy_curves(df: pd.DataFrame, path) -> None:
    """Seen-class accuracy after each experience vs number of classes seen, mean ± std over complete seeds (no
    error bar for one seed: the legend says n=1); one line per table row (variants apart): colour and marker as
    style.run_style gives them, line style by variant; each panel titled with its benchmark, epochs a task and
    seeds."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = df[df.status == "complete"]
    benchmarks = sorted(done.benchmark.unique())
    strategies, schemes = list(STRATEGY_ORDER), list(SCHEME_ORDER)
    panels = max(len(benchmarks), 1)
    fig, axes = plt.subplots(1, panels, figsize=(10 * panels, 4.5), squeeze=False)  # each legend beside its panel
    for ax, bench in zip(axes[0], benchmarks):
        runs = done[done.benchmark == bench]
        lines = runs.groupby(["strategy", "epochs", "variant", "scheme", "quant", "quant_variant"])
        one_strategy = runs.strategy.nunique() == 1
        # a line style a schedule, variant or tagged run set of one strategy and scheme
        variants = sorted({(epochs, variant, label_parts(quant)[1], quant_variant)
                           for (_, epochs, variant, _, quant, quant_variant), _ in lines})
        counts = []
        for (strategy, epochs, variant, scheme, quant, quant_variant), group in lines:
            curves = np.array([c for c in group.seen_acc if len(c) == len(group.seen_acc.iloc[0])])
            counts.append(len(curves))
            # the last points: a joint run's single evaluation comes after every class (domain-incremental runs:
            # after every experience, each holding every class)
            per_exp = group.classes_per_exp.iloc[0]
            seen = np.cumsum(per_exp) if per_exp else np.arange(1, group.n_experiences.iloc[0] + 1)
            classes = seen[-curves.shape[1]:]
            detail = ", ".join(filter(None, (_short(variant), _short(quant_variant),
                                             epochs_phrase(epochs) if runs.epochs.nunique() > 1 else "",
                                             "n=1" if len(curves) == 1 else "")))
            ax.errorbar(classes, curves.mean(0), yerr=curves.std(0, ddof=1) if len(curves) > 1 else None,
                        capsize=2, **run_style(strategy, scheme, strategies, schemes, one_strategy),
                        linestyle=LINESTYLES[variants.index((epochs, variant, label_parts(quant)[1], quant_variant))
                                             % len(LINESTYLES)],
                        label=f"{strategy} / {quant}" + (f" ({detail})" if detail else ""))
        domain = bench.endswith("(domain)")
        epochs = [e for e in runs.epochs.unique() if e != "–"]  # '–': a run that does not record them
        schedule = [f"{epochs[0]} epochs a task"] if len(epochs) == 1 else ["epochs as labelled"] if epochs else []
        ax.set(title=f"{bench}: {', '.join([*schedule, _seeds(counts)])}",
               xlabel="experiences (domains) seen" if domain else "classes seen",
               ylabel="accuracy on seen classes (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150, bbox_inches="tight")  # the legends beside the panels, which tight_layout leaves out
    plt.close(fig)


# In make_tables' folder: the files it wrote there, a name a line.
OUTPUTS = "make_tables_outputs.txt"


def make_tables(roots, out_dir, plot: bool = True, published=None) -> pd.DataFrame:
    """Write table.md/.csv/.tex, main.md, ablation.md (when there are ablation runs), published.md (with
    `published`, a CSV of published numbers: published_table) and the plots into `out_dir`, named in its OUTPUTS
    file; remove those an earlier make_tables named there and this one does not write (a fidelity.md of other runs
    would look current), but with plot=False not the figures these runs would draw: no plots means none drawn, not
    the earlier ones removed; return the display table."""
    df = collect_runs(*roots)
    beside = None
    if published is not None:
        try:
            beside = published_table(df, pd.read_csv(published))
        except ValueError as err:
            raise ValueError(f"{published}: {err}") from err
    out, written, undrawn = Path(out_dir), [], []

    def path(name: str) -> Path:
        """Where the output `name` goes, named in OUTPUTS."""
        written.append(name)
        return out / name

    def figure(name: str, draw) -> None:
        """draw(where the figure `name` goes); with plot=False, `name` is kept as a figure these runs call for."""
        if plot:
            draw(path(name))
        else:
            undrawn.append(name)

    if beside is not None:
        write_atomic(path("published.md"), to_markdown(beside))
    agg = aggregate(df)
    table = display_table(agg)
    write_atomic(path("table.md"), to_markdown(table))
    write_atomic(path("table.csv"), agg.drop(columns=[c for c in agg if c.endswith("_text")]).to_csv(index=False))
    write_atomic(path("table.tex"), table.to_latex(index=False, escape=True))
    write_atomic(path("main.md"), to_markdown(main_table(df)))
    paired = paired_vs_fp32(df)
    if len(paired):
        write_atomic(path("paired.md"), to_markdown(paired))
    ablation = ablation_runs(df)
    if len(ablation):
        ablation_agg = aggregate(ablation, keys=ABLATION_KEYS)
        write_atomic(path("ablation.md"), to_markdown(display_table(ablation_agg, keys=ABLATION_KEYS)))
        presets = _preset_runs(df)  # none: the ablation is drawn without FP32's level
        write_atomic(path("ablation_paired.md"), to_markdown(paired_ablation(ablation, presets)))
        panels = ablation_panels(ablation_agg)
        if panels:
            preset = aggregate(presets, keys=["benchmark", "strategy", "scheme"]) if len(presets) else None
            fp32 = None if preset is None else preset[preset.scheme == "fp32"]
            figure("ablation.png", lambda where: plot_ablation(panels, where, fp32))
    figure("accuracy.png", lambda where: plot_accuracy_curves(df, where))
    if agg.energy_j_mean.notna().any():
        figure("energy.png", lambda where: plot_energy(agg, where))
    fidelity, statistics, quantizers = diagnostics_frame(df)
    if len(fidelity):
        write_atomic(path("fidelity.md"), to_markdown(fidelity_table(fidelity)))
        write_atomic(path("fidelity_by_experience.md"), to_markdown(fidelity_by_experience(fidelity, quantizers)))
        write_atomic(path("gradient_stats.md"), to_markdown(statistics_table(statistics)))
        figure("fidelity.png", lambda where: plot_fidelity(fidelity, where))
    if len(quantizers):
        write_atomic(path("quantizers.md"), to_markdown(quantizer_table(quantizers)))
    found = landscapes(df)
    if found:
        write_atomic(path("landscape.md"), to_markdown(landscape_table(found)))
        for strategy in dict.fromkeys(entry["strategy"] for entry in found):  # a figure a strategy: a row a run
            runs = [e for e in found if e["strategy"] == strategy]
            figure(f"landscape_{strategy}.png", lambda where: plot_landscapes(runs, where))
    _replace_outputs(out, written, undrawn)
    return table


def _replace_outputs(out: Path, written: list[str], undrawn: list[str]) -> None:
    """Remove the files the OUTPUTS of `out` names that were neither `written` nor left `undrawn` (figures these
    runs call for, which plot=False did not draw), then name there those written and the undrawn ones it names:
    only files an earlier make_tables wrote go, never one of the folder's own (nor a name with a folder in it)."""
    manifest = out / OUTPUTS
    earlier = manifest.read_text().splitlines() if manifest.exists() else []
    kept = [name for name in earlier if name in undrawn]
    for name in set(earlier) - set(written) - set(kept):
        if name == Path(name).name and (out / name).is_file():
            (out / name).unlink()
    write_atomic(manifest, "".join(f"{name}\n" for name in written + kept))
