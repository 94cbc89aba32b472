"""Config helpers shared by run.py and the tests: resolvers and the checks Hydra's schema cannot express."""
import re

from omegaconf import OmegaConf


def run_path(benchmark, model, strategy, quant, tag, seed) -> str:
    """Run folder relative to results_root: <benchmark>-<model>/<strategy>/<quant>[-<tag>]/seed<seed>."""
    quant_dir = f"{quant}-{tag}" if tag else str(quant)
    return f"{benchmark}-{model}/{strategy}/{quant_dir}/seed{seed}"


# Keys that may differ between two runs of the same experiment: they change how, not what, is computed.
RUN_INDEPENDENT = ("overwrite", "resume", "on_divergence", "logging", "results_root", "data_root")
RUN_INDEPENDENT_TRAINER = ("device", "num_workers", "checkpoint_every", "cuda_graph", "deterministic")


def comparable_config(cfg_dict: dict) -> dict:
    """The part of a resolved config that decides a run's results. Where a named benchmark's files lie is not
    part of it (they are checked on loading); the file of `benchmark=features` is."""
    out = {k: v for k, v in cfg_dict.items() if k not in RUN_INDEPENDENT}
    out["trainer"] = {k: v for k, v in out.get("trainer", {}).items() if k not in RUN_INDEPENDENT_TRAINER}
    benchmark = out.get("benchmark", {})
    if benchmark.get("name") != "features":
        out["benchmark"] = {k: v for k, v in benchmark.items() if k not in ("path", "root")}
    return out


def scaled_milestones(milestones, full_epochs, epochs) -> list:
    """A schedule's milestones (for `full_epochs` a task) moved to the same fractions of `epochs`, so that
    shortening a paper schedule with `trainer.epochs=N` alone keeps where its learning rate drops."""
    return sorted({max(1, round(m * epochs / full_epochs)) for m in milestones})


def gpu_count() -> int:
    """GPUs visible to this process, at least 1 (a sweep's default parallelism)."""
    import torch

    return max(torch.cuda.device_count(), 1)


def register_resolvers() -> None:
    for name, fn in (("run_path", run_path), ("scaled_milestones", scaled_milestones), ("gpu_count", gpu_count)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _one_of(*choices):
    return (lambda v: v in choices), "one of " + ", ".join(map(str, choices))


POSITIVE_INT = (lambda v: _is_int(v) and v > 0), "a positive integer"
NON_NEGATIVE_INT = (lambda v: _is_int(v) and v >= 0), "a non-negative integer"
OPTIONAL_POSITIVE_INT = (lambda v: v is None or POSITIVE_INT[0](v)), "a positive integer or null"
POSITIVE = (lambda v: _is_number(v) and v > 0), "a positive number"
NON_NEGATIVE = (lambda v: _is_number(v) and v >= 0), "a non-negative number"
FRACTION = (lambda v: _is_number(v) and 0 < v < 1), "a number strictly between 0 and 1"
BOOL = (lambda v: isinstance(v, bool)), "true or false"

# The schema: (key, strategy member it applies to or None for all, check, what is allowed). Every value a user
# may override is checked here by type and range, before any data is loaded; Hydra itself refuses unknown keys
# and group members, and the quant group checks its own keys (quant/schemes.py).
RULES = [
    ("seed", None, *NON_NEGATIVE_INT),
    ("tag", None, lambda v: isinstance(v, str) and "/" not in v, "a string without '/'"),
    ("overwrite", None, *BOOL),
    ("resume", None, *BOOL),
    ("on_divergence", None, *_one_of("stop", "continue")),
    ("logging.progress", None, *_one_of("auto", "on", "off")),
    ("logging.epochs", None, lambda v: v == "auto" or NON_NEGATIVE_INT[0](v), "auto or a non-negative integer"),
    ("logging.csv", None, *BOOL),
    ("logging.tensorboard", None, *BOOL),
    ("trainer.epochs", None, *POSITIVE_INT),
    ("trainer.batch_size", None, *POSITIVE_INT),
    ("trainer.eval_batch_size", None, *POSITIVE_INT),
    ("trainer.lr", None, *POSITIVE),
    ("trainer.momentum", None, lambda v: _is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
    ("trainer.weight_decay", None, *NON_NEGATIVE),
    ("trainer.milestones", None,
     lambda v: isinstance(v, list) and all(_is_int(m) and m > 0 for m in v) and v == sorted(set(v)),
     "a list of increasing positive epoch numbers, e.g. [60,100,140] (or [])"),
    ("trainer.gamma", None, lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    ("trainer.device", None, lambda v: isinstance(v, str) and re.fullmatch(r"auto|cpu|cuda(:\d+)?", v) is not None,
     "auto, cpu, cuda or cuda:N"),
    ("trainer.num_workers", None, *NON_NEGATIVE_INT),
    ("trainer.checkpoint_every", None, *NON_NEGATIVE_INT),
    ("trainer.cuda_graph", None, lambda v: v == "auto" or isinstance(v, bool), "auto, true or false"),
    ("trainer.deterministic", None, *BOOL),
    ("trainer.memory_size", None, *NON_NEGATIVE_INT),
    ("benchmark.n_experiences", None, *OPTIONAL_POSITIVE_INT),
    ("benchmark.classes_per_exp", None, *OPTIONAL_POSITIVE_INT),
    ("benchmark.shuffle_classes", None, *BOOL),
    ("benchmark.class_order", None,
     lambda v: v is None or (isinstance(v, list) and len(v) > 0 and all(_is_int(c) and c >= 0 for c in v)
                             and len(set(v)) == len(v)),
     "a list of distinct class indices (a permutation of 0..C-1), or null"),
    ("benchmark.download", None, *BOOL),
    ("benchmark.verify", None, *BOOL),
    ("benchmark.augment", None, *BOOL),
    ("benchmark.augment_on", None, *_one_of("cpu", "gpu")),
    ("benchmark.color_jitter", None, lambda v: _is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
    ("benchmark.normalise", None, *BOOL),
    ("benchmark.split", None, *_one_of("subject", "random")),
    ("benchmark.train_fraction", None, *FRACTION),
    ("benchmark.drop_classes", None, lambda v: isinstance(v, list) and all(map(_is_int, v)), "a list of labels"),
    ("benchmark.drop_subjects", None, lambda v: isinstance(v, list) and all(map(_is_int, v)), "a list of subject ids"),
    ("model.hidden", None, *OPTIONAL_POSITIVE_INT),
    ("strategy.lamb", "lwf", *NON_NEGATIVE),
    ("strategy.lamb", "bic", lambda v: v == -1 or NON_NEGATIVE[0](v), "-1 (old/all classes) or a non-negative number"),
    ("strategy.temperature", None, *POSITIVE),
    ("strategy.val_percentage", None, *FRACTION),
    ("strategy.stage_2_epochs", None, *POSITIVE_INT),
    ("strategy.stage_2_lr", None, *POSITIVE),
    ("strategy.fixed_memory", None, *BOOL),
    ("strategy.eval_head", None, *_one_of("nme", "linear")),
    ("strategy.loss", "icarl", *_one_of("bce", "ce_kd")),
]

_ABSENT = object()


def validate(cfg) -> None:
    """Refuse bad values before any data is loaded or any training starts, naming the key, the value and what
    is allowed."""
    container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    for key, member, check, allowed in RULES:
        if member is not None and cfg.strategy.name != member:
            continue
        node = container
        for part in key.split("."):
            node = node.get(part, _ABSENT) if isinstance(node, dict) else _ABSENT
        if node is not _ABSENT and node != "???" and not check(node):
            raise ValueError(f"{key}={node!r} must be {allowed}")
    split = {k: cfg.benchmark.get(k) for k in ("n_experiences", "classes_per_exp")}
    if sum(v is not None for v in split.values()) != 1:
        raise ValueError(f"set exactly one of benchmark.n_experiences and benchmark.classes_per_exp (got {split})")


def validate_against_benchmark(cfg, num_classes: int) -> None:
    if cfg.strategy.name == "icarl" and cfg.trainer.memory_size < num_classes:
        raise ValueError(f"trainer.memory_size={cfg.trainer.memory_size} is smaller than the {num_classes} classes "
                         f"of {cfg.benchmark.name}: iCaRL needs at least one exemplar per class")
    if cfg.strategy.name == "bic" and int(cfg.strategy.val_percentage * cfg.trainer.memory_size) < num_classes:
        raise ValueError(f"BiC holds out val_percentage × memory_size = "
                         f"{int(cfg.strategy.val_percentage * cfg.trainer.memory_size)} exemplars for its bias "
                         f"layer, fewer than the {num_classes} classes; raise trainer.memory_size")
