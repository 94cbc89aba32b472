"""Config helpers shared by run.py and the tests: resolvers and the checks Hydra's schema cannot express."""
from omegaconf import OmegaConf


def run_path(benchmark, model, strategy, quant, tag, seed) -> str:
    """Run folder relative to results_root: <benchmark>-<model>/<strategy>/<quant>[-<tag>]/seed<seed>."""
    quant_dir = f"{quant}-{tag}" if tag else str(quant)
    return f"{benchmark}-{model}/{strategy}/{quant_dir}/seed{seed}"


def gpu_count() -> int:
    """GPUs visible to this process, at least 1 (a sweep's default parallelism)."""
    import torch

    return max(torch.cuda.device_count(), 1)


def register_resolvers() -> None:
    for name, fn in (("run_path", run_path), ("gpu_count", gpu_count)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive integer")


def validate(cfg) -> None:
    """Refuse bad values before any data is loaded or any training starts."""
    t = cfg.trainer
    for key in ("epochs", "batch_size", "eval_batch_size"):
        _positive_int(t[key], f"trainer.{key}")
    if not isinstance(t.memory_size, int) or t.memory_size < 0:
        raise ValueError(f"trainer.memory_size={t.memory_size!r} must be a non-negative integer")
    if not isinstance(t.num_workers, int) or t.num_workers < 0:
        raise ValueError(f"trainer.num_workers={t.num_workers!r} must be a non-negative integer")
    if not t.lr > 0:
        raise ValueError(f"trainer.lr={t.lr!r} must be positive")
    if any(not isinstance(m, int) or m <= 0 for m in t.milestones):
        raise ValueError(f"trainer.milestones={list(t.milestones)} must be positive epoch numbers")
    split = {k: cfg.benchmark.get(k) for k in ("n_experiences", "classes_per_exp")}
    if sum(v is not None for v in split.values()) != 1:
        raise ValueError(f"set exactly one of benchmark.n_experiences and benchmark.classes_per_exp (got {split})")
    for key, value in split.items():
        if value is not None:
            _positive_int(value, f"benchmark.{key}")
    if cfg.on_divergence not in ("stop", "continue"):
        raise ValueError(f"on_divergence={cfg.on_divergence!r}; choose stop or continue")
    if cfg.logging.progress not in ("auto", "on", "off"):
        raise ValueError(f"logging.progress={cfg.logging.progress!r}; choose auto, on or off")


def validate_against_benchmark(cfg, num_classes: int) -> None:
    if cfg.strategy.name == "icarl" and cfg.trainer.memory_size < num_classes:
        raise ValueError(f"trainer.memory_size={cfg.trainer.memory_size} is smaller than the {num_classes} classes "
                         f"of {cfg.benchmark.name}: iCaRL needs at least one exemplar per class")
    if cfg.strategy.name == "bic" and int(cfg.strategy.val_percentage * cfg.trainer.memory_size) < num_classes:
        raise ValueError(f"BiC holds out val_percentage × memory_size = "
                         f"{int(cfg.strategy.val_percentage * cfg.trainer.memory_size)} exemplars for its bias "
                         f"layer, fewer than the {num_classes} classes; raise trainer.memory_size")
