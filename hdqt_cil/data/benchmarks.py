"""Benchmark construction: a dataset loader per name, then one class-incremental split for all of them.

The split uses avalanche's `nc_benchmark` (not `class_incremental_benchmark`: avalanche 0.6.0's iCaRL and BiC
read `n_classes_per_exp` and `classes_order`, which only the NC scenarios carry). Classes are relabelled 0..C-1 in
the order they arrive, so logits, exemplar memories and per-class tables all speak the same label space;
`class_names[order[i]]` names relabelled class i.
"""
from dataclasses import dataclass

import numpy as np
from avalanche.benchmarks import nc_benchmark

from . import cifar, digits, har

BENCHMARKS = ("digits", "cifar10", "cifar100", "hapt", "dsads", "pamap2", "features")


@dataclass
class Benchmark:
    scenario: object  # avalanche NCScenario
    input_shape: tuple
    num_classes: int
    class_order: list  # original class index of relabelled class i
    class_names: list
    input_norm: tuple | None = None  # (mean, std) per channel for uint8 images, applied by the model
    classes_per_exp: list | None = None

    @property
    def n_experiences(self) -> int:
        return len(self.scenario.train_stream)


def _load(cfg, seed: int):
    """(train set, test set, class names, per-sample train transform, input normalisation) of `cfg.name`."""
    name = cfg.name
    if name == "digits":
        return (*digits.load(), None, None)
    if name in ("cifar10", "cifar100"):
        train, test, names = cifar.load(name, cfg.root, download=cfg.download, verify=cfg.verify)
        per_sample = cfg.augment and cfg.augment_on == "cpu"
        return train, test, names, cifar.train_transform(cfg.color_jitter) if per_sample else None, cifar.MEAN_STD[name]
    if name in ("hapt", "dsads", "pamap2", "features"):
        return (*har.load(cfg, seed), None, None)
    raise ValueError(f"unknown benchmark {name!r}; choose one of {', '.join(BENCHMARKS)}")


def experience_sizes(n_classes: int, n_experiences, classes_per_exp, name: str) -> list[int]:
    """Classes per experience: `n_experiences` equal parts (must divide), or `classes_per_exp` each with the
    remainder in the last experience (the paper's HAPT: 11 classes → 2,2,2,2,2,1)."""
    if classes_per_exp:
        if not 1 <= classes_per_exp <= n_classes:
            raise ValueError(f"benchmark.classes_per_exp={classes_per_exp} must be in 1..{n_classes} for {name}")
        full, rest = divmod(n_classes, classes_per_exp)
        return [classes_per_exp] * full + ([rest] if rest else [])
    if not n_experiences or n_experiences < 1 or n_classes % n_experiences:
        raise ValueError(f"benchmark.n_experiences={n_experiences} does not divide the {n_classes} classes of "
                         f"{name}; choose a divisor of {n_classes}, or set benchmark.classes_per_exp")
    return [n_classes // n_experiences] * n_experiences


def class_order(classes: list, fixed, shuffle: bool, seed: int, name: str) -> list[int]:
    """The order in which `classes` (the sorted class indices 0..C-1) arrive: `fixed` when given (a permutation
    of them, e.g. PyCIL's `np.random.seed(1993); np.random.permutation(C)`), whatever `shuffle` and `seed` say;
    else a permutation drawn from `seed` when `shuffle`, else sorted."""
    if fixed is not None:
        fixed = [int(c) for c in fixed]
        if sorted(fixed) != list(classes):
            raise ValueError(f"benchmark.class_order={fixed} must be a permutation of 0..{len(classes) - 1}, the "
                             f"{len(classes)} classes of {name} (indices into its sorted class ids)")
        return fixed
    order = np.random.RandomState(seed).permutation(classes) if shuffle else classes
    return [int(c) for c in order]


def build_benchmark(cfg, seed: int) -> Benchmark:
    """Split benchmark `cfg.name` into experiences (see `experience_sizes`); the class order is
    `benchmark.class_order` when set, else shuffled by `seed` (see `class_order`)."""
    train, test, names, train_tf, input_norm = _load(cfg, seed)
    classes = sorted(set(train.targets))
    sizes = experience_sizes(len(classes), cfg.get("n_experiences"), cfg.get("classes_per_exp"), cfg.name)
    missing = sorted(set(classes) - set(test.targets))
    if missing:
        raise ValueError(f"classes {[names[c] for c in missing]} of {cfg.name} have no test samples")
    order = class_order(classes, cfg.get("class_order"), cfg.shuffle_classes, seed, cfg.name)
    scenario = nc_benchmark(
        train, test, n_experiences=len(sizes), task_labels=False, shuffle=False,
        per_exp_classes={len(sizes) - 1: sizes[-1]} if sizes[-1] != sizes[0] else None,
        fixed_class_order=order, class_ids_from_zero_from_first_exp=True,
        train_transform=train_tf, eval_transform=None,
    )
    return Benchmark(scenario, tuple(train.inputs.shape[1:]), len(classes), order, list(names), input_norm, sizes)
