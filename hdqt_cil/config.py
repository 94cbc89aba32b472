"""The run's settings: the top-level and trainer schemas, the resolvers the config files use, validation (once a
run) and what makes two runs the same experiment.

Every group member (strategy, benchmark, model, quant) brings its own schema through hdqt_cil/registry.py; this
module holds the settings that belong to the run itself. `register_schemas()` must run before Hydra composes.
"""
import re
from dataclasses import dataclass, fields, is_dataclass
from difflib import get_close_matches
from pathlib import Path
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.errors import HydraException
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from .cost.energy import EnergyTable
from .trainer.diagnostics import DiagnosticsConfig
from .benchmarks import BENCHMARKS
from .registry import load_members
from .settings import (BOOL, NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE, POSITIVE_INT, Rule, check_settings, one_of,
                       setting)

MILESTONES = Rule(lambda v: isinstance(v, list) and all(isinstance(m, int) and m > 0 for m in v)
                  and v == sorted(set(v)), "a list of increasing positive epoch numbers, e.g. [60,100,140] (or [])")


@dataclass
class TrainerConfig:
    epochs: int = setting(10, POSITIVE_INT)
    batch_size: int = setting(32, POSITIVE_INT)
    eval_batch_size: int = setting(256, POSITIVE_INT)
    lr: float = setting(0.05, POSITIVE)
    momentum: float = setting(0.9, Rule(lambda v: 0 <= v < 1, "a number in [0, 1)"))
    weight_decay: float = setting(2.0e-4, NON_NEGATIVE)
    milestones: List[int] = setting([], MILESTONES)  # epochs (within each experience) where lr is multiplied by gamma
    gamma: float = setting(0.1, Rule(lambda v: 0 < v <= 1, "a number in (0, 1]"))
    device: str = setting("auto", Rule(lambda v: re.fullmatch(r"auto|cpu|cuda(:\d+)?", v) is not None,
                                       "auto, cpu, cuda or cuda:N"))  # auto: CUDA when present
    num_workers: int = setting(0, NON_NEGATIVE_INT)
    checkpoint_every: int = setting(0, NON_NEGATIVE_INT)  # also checkpoint every N epochs inside an experience
    # Replay each training step's forward + backward from CUDA graphs (the same results): auto = on CUDA devices.
    cuda_graph: Any = setting("auto", Rule(lambda v: v == "auto" or isinstance(v, bool), "auto, true or false"))
    # The captured training step compiled by torch.compile (inductor fuses BatchNorm, ReLU and the additions): FP32
    # runs on CUDA with trainer.cuda_graph; their numbers move within FP32's own run-to-run differences.
    compile: bool = setting(False, BOOL)
    # torch's deterministic kernels (cuDNN, cuBLAS): FP32 GPU runs otherwise differ between machines; slower. The
    # quantized kernels are deterministic either way.
    deterministic: bool = setting(False, BOOL)
    memory_size: int = setting(200, NON_NEGATIVE_INT)  # exemplars kept across experiences
    # Every Conv2d / Linear weight rounded to this many bits (its own per-tensor scale) after each optimizer step,
    # as an integer device stores the model (trainer/weight_storage.py); null: float32 weights.
    weight_bits: Optional[int] = setting(None, Rule(lambda v: v is None or (isinstance(v, int) and 2 <= v <= 16),
                                                    "null (float32 weights) or an integer from 2 to 16"))
    # How stored weights are updated: sgd (this product's SGD, momentum, weight decay and schedule) or authors (the
    # HDQT authors' QuantMomentumOptimizer: w - lr·g at the base lr, every trained parameter stored; docs/quant.md).
    weight_update: str = setting("sgd", one_of("sgd", "authors"))

    def check(self, path: str) -> None:
        if self.weight_update == "authors" and self.weight_bits is None:
            raise ValueError(f"{path}weight_update=authors is the update of the HDQT authors' weight storage; set "
                             f"{path}weight_bits (8 as theirs) or leave {path}weight_update=sgd")


@dataclass
class LoggingConfig:
    progress: str = setting("auto", one_of("auto", "on", "off"))  # bars: auto = on a terminal only
    # A log line (mean loss, time an epoch) every N epochs: auto = about ten an experience when no bars are drawn.
    epochs: Any = setting("auto", Rule(lambda v: v == "auto" or (isinstance(v, int) and not isinstance(v, bool)
                                                                 and v >= 0), "auto or a non-negative integer"))
    csv: bool = setting(False, BOOL)  # avalanche CSVLogger into <run>/csv
    tensorboard: bool = setting(False, BOOL)  # avalanche TensorboardLogger into <run>/tb
    # Weights & Biases through avalanche's WandBLogger, into <run>/wandb: the run's metrics and config, named by its
    # folder; offline (no network; `wandb sync <run>/wandb/offline-run-*` uploads it later) unless wandb_mode=online.
    # A resumed run continues its W&B run (the logger's id is kept in the checkpoint).
    wandb: bool = setting(False, BOOL)
    wandb_project: str = "hdqt-cil"
    wandb_mode: str = setting("offline", one_of("offline", "online"))


@dataclass
class RunConfig:
    benchmark: Any = MISSING
    model: Any = MISSING
    strategy: Any = MISSING
    quant: Any = MISSING
    trainer: Any = MISSING
    cost: Any = MISSING  # the energy table of the cost estimate (hdqt_cil/configs/cost/)
    diagnostics: Any = MISSING  # what the run measures of its gradients (hdqt_cil/configs/diagnostics/)
    seed: int = setting(0, NON_NEGATIVE_INT)
    # The paper protocol (hdqt_cil/configs/experiment/*_paper.yaml) the run's settings start from, and its epochs
    # a task: tables name it, and a run that trains fewer epochs says so at its start.
    preset: Optional[str] = None
    preset_epochs: Optional[int] = setting(None, Rule(lambda v: v is None or (isinstance(v, int) and v >= 1),
                                                      "a positive integer or null"))
    # Appended to the quant folder name, to keep ablations (e.g. quant.acc_bits=12) apart from the defaults.
    tag: str = setting("", Rule(lambda v: "/" not in v, "a string without '/'"))
    results_root: str = "${oc.env:HDQT_RESULTS,outputs}"
    data_root: str = "${oc.env:HDQT_DATA,data}"
    overwrite: bool = setting(False, BOOL)  # re-running a finished run folder reuses its results unless true
    resume: bool = setting(True, BOOL)  # an unfinished run folder continues from its last checkpoint; false: anew
    # A run whose loss or weights run away is recorded as diverged; stop = exit with an error, continue = exit
    # normally so that a sweep goes on with its next job.
    on_divergence: str = setting("stop", one_of("stop", "continue"))
    logging: LoggingConfig = setting(LoggingConfig())


def run_path(benchmark, scenario, model, strategy, quant, tag, seed) -> str:
    """Run folder relative to results_root: <benchmark>[-<scenario>]-<model>/<strategy>/<quant>[-<tag>]/seed<seed>
    (the scenario named unless class-incremental)."""
    quant_dir = f"{quant}-{tag}" if tag else str(quant)
    data = benchmark if scenario == "class" else f"{benchmark}-{scenario}"
    return f"{data}-{model}/{strategy}/{quant_dir}/seed{seed}"


# Keys that may differ between two runs of the same experiment: they change how, not what, is computed.
RUN_INDEPENDENT = ("overwrite", "resume", "on_divergence", "logging", "results_root", "data_root", "cost", "preset",
                   "preset_epochs", "diagnostics")
RUN_INDEPENDENT_TRAINER = ("device", "num_workers", "checkpoint_every", "cuda_graph", "compile", "deterministic")
# backend: where the same products run, as the device (the integer schemes' kernels bit for bit; fp8's tensor cores
# round alike and sum with their own accumulator). HOT's sliced_unfold is part of a run: on a GPU, x̃'s per-sample
# SAWB sums are torch reductions over slices of other sizes, whose float sums end in other bits.
RUN_INDEPENDENT_QUANT = ("backend",)


# Settings that mean something only while another is set: (node, the switch, the prefix of its settings).
SWITCHED_SETTINGS = (("strategy", "hp_replay", "hp_replay_"),)
# A setting at the value that was the behaviour before it existed, with the settings that mean nothing then: left
# out of a run's identity, so that a folder written before it matches.
DEFAULTED_SETTINGS = (("quant", "acc", "int", ("acc_exp_bits", "acc_man_bits")),
                      ("quant", "grad_clip", 1.0, ()),
                      ("trainer", "weight_update", "sgd", ()),
                      ("strategy", "hp_replay_bn", "train", ()),
                      ("benchmark", "scenario", "class", ()))


def _without_nulls(value):
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


# Where a benchmark's files lie: not part of a run's identity; the data's contents are (their fingerprint,
# recorded beside the config: run_folder.py).
DATA_LOCATION = ("path", "root", "test_path")


def comparable_config(cfg_dict: dict) -> dict:
    """The part of a resolved config that decides a run's results, but for the data: where they lie is left out
    (the fingerprint of their contents decides). A null setting counts as absent, so that a folder written before
    a setting existed matches a run that leaves it at null; so do the settings of a feature that is off."""
    out = {k: v for k, v in _without_nulls(cfg_dict).items() if k not in RUN_INDEPENDENT}
    for node, switch, prefix in SWITCHED_SETTINGS:
        if switch not in out.get(node, {}):
            out[node] = {k: v for k, v in out.get(node, {}).items() if not k.startswith(prefix)}
    for node, setting_name, default, meaningless in DEFAULTED_SETTINGS:
        if out.get(node, {}).get(setting_name) == default:
            out[node] = {k: v for k, v in out[node].items() if k != setting_name and k not in meaningless}
    out["trainer"] = {k: v for k, v in out.get("trainer", {}).items() if k not in RUN_INDEPENDENT_TRAINER}
    out["quant"] = {k: v for k, v in out.get("quant", {}).items() if k not in RUN_INDEPENDENT_QUANT}
    benchmark = {k: v for k, v in out.get("benchmark", {}).items() if k not in DATA_LOCATION}
    if benchmark.get("loader") == benchmark.get("name"):  # a loader named as its data says nothing more
        benchmark.pop("loader", None)
    out["benchmark"] = benchmark
    return out


def config_differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """`key: old -> new` for each dotted setting whose value differs between two (comparable) configs."""
    out = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


def scaled_milestones(milestones, full_epochs, epochs) -> list:
    """A schedule's milestones (for `full_epochs` a task) moved to the same fractions of `epochs`, so that
    shortening a paper schedule with `trainer.epochs=N` alone keeps where its learning rate drops."""
    return sorted({max(1, round(m * epochs / full_epochs)) for m in milestones})


def model_for(loader: str) -> str:
    """The model a benchmark's inputs call for: resnet32 for images (a loader registered with images=True),
    mlp for feature vectors."""
    return "resnet32" if BENCHMARKS.facts(loader).get("images") else "mlp"


@dataclass
class AutoModelConfig:
    """model=auto (the default): the benchmark's model (model_for), with that model's default settings."""
    name: str = "${model_for:${benchmark.loader}}"


def register_schemas() -> None:
    """The resolvers and every schema (the run's, the trainer's, each member's) where Hydra finds them."""
    for name, fn in (("run_path", run_path), ("scaled_milestones", scaled_milestones), ("lower", str.lower),
                     ("model_for", model_for)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    store = ConfigStore.instance()
    store.store(group="schema/model", name="auto", node=AutoModelConfig)
    store.store(name="run_schema", node=RunConfig)
    store.store(group="schema/trainer", name="default", node=TrainerConfig)
    store.store(group="schema/cost", name="table", node=EnergyTable)
    store.store(group="schema/diagnostics", name="default", node=DiagnosticsConfig)
    load_members()


def _did_you_mean(name: str, known: list[str], spelled) -> str:
    """'did you mean A or B? ' for the known names nearest `name` (each as `spelled` writes it), or ''."""
    near = get_close_matches(name, known, n=3, cutoff=0.5)
    return f"did you mean {' or '.join(spelled(k) for k in near)}? " if near else ""


def _refuse_unknown(key: str, path: str, schema) -> None:
    """Refuse `path + key` unless `schema` (a dataclass) declares `key`, naming its nearest settings."""
    known = [f.name for f in fields(schema)]
    if key not in known:
        hint = _did_you_mean(str(key), known, lambda k: path + k)
        raise ValueError(f"{path}{key} is not a setting; {hint}the settings of {path.rstrip('.') or 'a run'} "
                         f"are {', '.join(known)}")


def _refuse_unknown_members(group: str, override) -> None:
    """Refuse `strategy=icrl` (or one such choice of a sweep) naming the nearest members, where Hydra prints its
    config search path (`group=null`, which leaves a group out, stays Hydra's)."""
    members = sorted(path.stem for path in (CONFIGS / group).glob("*.yaml"))
    chosen = (list(override.sweep_string_iterator()) if override.is_sweep_override()
              else [override.get_value_element_as_str()])
    for member in chosen:
        if member not in (*members, "null"):
            hint = _did_you_mean(member, members, lambda m: f"{group}={m}")
            raise ValueError(f"{group}={member} is not a member of {group}; {hint}its members are {', '.join(members)}")


def refuse_unknown_keys(node, path: str = "") -> None:
    """Refuse a key that no schema declares (an added `+trainer.epoch=5` would be stored and ignored), naming the
    nearest settings of its node."""
    for where, section in _sections(node, path):
        declared = OmegaConf.get_type(section)
        if is_dataclass(declared):
            for key in section.keys():
                _refuse_unknown(key, where, declared)


def _sections(node: DictConfig, path: str = ""):
    """`node` and every section below it, each with its dotted path (`trainer.`), read without resolving a value."""
    yield path, node
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            yield from _sections(child, f"{path}{key}.")


# The sections whose schema no group choice changes, and the groups whose chosen member brings its own.
FIXED_SECTIONS = {"trainer": TrainerConfig, "diagnostics": DiagnosticsConfig, "cost": EnergyTable,
                  "logging": LoggingConfig}
MEMBER_GROUPS = ("benchmark", "model", "strategy", "quant")
CONFIGS = Path(__file__).parent / "configs"


def compose_run(overrides: list[str]) -> DictConfig:
    """The run's config as `python run.py OVERRIDES` composes it, outside a command (the check below, the tests;
    a command's own overrides go through compose_command); register_schemas must have run."""
    from hydra import compose, initialize_config_dir
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("config", overrides=overrides)


def compose_command(overrides: list[str]) -> DictConfig:
    """compose_run for a command's own overrides (the probes'): a misspelt key is refused with its nearest names
    first, as `python run.py` refuses it."""
    refuse_misspelt_overrides(overrides)
    return compose_run(overrides)


def refuse_misspelt_overrides(overrides: list[str]) -> None:
    """Refuse `trainer.epoch=5`, `quant.acc_bit=12` or `quant.rounding.grad_outpt=...` (a key its section's schema
    lacks: the run's, a fixed section's or the chosen member's, at any depth) with its nearest settings, where Hydra
    would only say the key is missing and offer to add it, `strategy=icrl` (a group member that does not exist)
    with the nearest members, and `tag=${sed}` (an interpolation of a key the config lacks) with the nearest keys,
    where Hydra fails with a traceback. Added (`+`), deleted and forced keys, Hydra's own, a member's keys where the
    member is swept (`quant=fp,hdqt`), swept values and overrides Hydra cannot parse or compose are left to Hydra."""
    try:
        parsed = OverridesParser.create().parse_overrides([o for o in overrides if "=" in o and o[0] != "-"])
    except HydraException:
        return
    interpolating = [o for o in parsed if INTERPOLATED_KEY.search(o.input_line) and not o.is_sweep_override()
                     and o.key_or_group.partition(".")[0] != "hydra"]  # Hydra's node interpolates its own keys
    members, kept, choice_swept = [], [], False
    for override in parsed:
        section, _, key = override.key_or_group.partition(".")
        if override.is_sweep_override():
            choice_swept |= not key and (section in (*MEMBER_GROUPS, "experiment") or "/" in section)
        if override.type == OverrideType.CHANGE and not override.package and "/" not in section:
            if not key:
                if not (CONFIGS / section).is_dir():  # a group (experiment=...) is Hydra's: it hints at `+`
                    _refuse_unknown(section, "", RunConfig)
                else:
                    _refuse_unknown_members(section, override)
            elif section in FIXED_SECTIONS:
                _refuse_unknown(key.split(".")[0], f"{section}.", FIXED_SECTIONS[section])
            elif section in MEMBER_GROUPS:
                members.append((section, key))
                continue
        if not override.is_sweep_override():
            kept.append(override.input_line)
    if not (members or interpolating) or choice_swept:
        return
    try:
        cfg = compose_run(kept)
    except (HydraException, OmegaConfBaseException):  # Hydra's to report, with the failing override
        return
    for section, key in members:  # each level of a nested key (quant.rounding.grad_output) against its schema
        node, path = cfg[section], f"{section}."
        for part in key.split("."):
            schema = OmegaConf.get_type(node)
            if not is_dataclass(schema):
                break
            _refuse_unknown(part, path, schema)
            node, path = _section(node, part), f"{path}{part}."
            if node is None:
                break
    # walked only when an override interpolates
    keys = {f"{path}{key}" for path, section in _sections(cfg) for key in section.keys()} if interpolating else set()
    for override in interpolating:
        _refuse_missing_interpolations(override, keys)


# `${key}` in an override's value: an absolute key of the config (resolvers, `${hydra:...}` and relative keys are
# Hydra's to resolve).
INTERPOLATED_KEY = re.compile(r"\$\{(\w[\w.]*)\}")


def _refuse_missing_interpolations(override, keys: set[str]) -> None:
    """Refuse an override whose value interpolates a key not among the config's `keys`, naming the nearest."""
    for key in INTERPOLATED_KEY.findall(override.input_line.partition("=")[2]):
        if key not in keys:
            hint = _did_you_mean(key, keys, lambda k: f"${{{k}}}")
            raise ValueError(f"{override.input_line} interpolates ${{{key}}}, which is not a setting; {hint}an "
                             "interpolation names a setting of the run (`--cfg job` prints them)")


def _section(node: DictConfig, key: str) -> DictConfig | None:
    """node[key] where it is a section whose own keys a nested override names, else None: a value is never read
    (benchmark.path is ??? until the command's own override is composed, an interpolation may need others)."""
    if OmegaConf.is_missing(node, key) or OmegaConf.is_interpolation(node, key):
        return None
    child = node[key]
    return child if isinstance(child, DictConfig) else None


def validate(cfg) -> None:
    """Refuse bad values before any data is loaded or any training starts, naming the key, the value and what
    is allowed (types were enforced when the config was composed)."""
    refuse_unknown_keys(cfg)
    try:
        settings = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as err:
        raise ValueError(f"{err.full_key} must be set: {err.full_key}=VALUE") from err
    check_settings(settings)
