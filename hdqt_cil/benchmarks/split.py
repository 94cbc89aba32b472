"""Benchmark construction: a registered loader per dataset, then one split into experiences for all of them.

A dataset module registers `load(cfg, seed) -> Loaded` with `BENCHMARKS.register(loader, SettingsClass)`; its
settings extend `BenchmarkConfig`, which holds the split into experiences and the class order that every benchmark
shares.

The split uses avalanche's `nc_benchmark` (not `class_incremental_benchmark`: avalanche 0.6.0's iCaRL and BiC
read `n_classes_per_exp` and `classes_order`, which only the NC scenarios carry). Classes are relabelled 0..C-1 in
the order they arrive, so logits, exemplar memories and per-class tables all speak the same label space;
`class_names[order[i]]` names relabelled class i.

`scenario=domain` keeps every class in every experience and splits by the inputs' domain instead
(avalanche's `dataset_benchmark`): the loader's own domains where it has them (HAR: subjects, in groups drawn by
the seed), else, for images, one rotation a domain (`rotated_domains`).
"""
import hashlib
import re
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch
from avalanche.benchmarks import dataset_benchmark, nc_benchmark
from omegaconf import MISSING

from ..registry import Registry
from ..settings import BOOL, POSITIVE_INT, Rule, one_of, optional, setting

BENCHMARKS = Registry("benchmark")

CLASS_ORDER = Rule(lambda v: v is None or (len(v) > 0 and all(c >= 0 for c in v) and len(set(v)) == len(v)),
                   "a list of distinct class indices (a permutation of 0..C-1), or null")


# A benchmark's name becomes a folder name and a table's row label.
NAME = Rule(lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", v) is not None,
            "a name of letters, digits, '_', '.' and '-' (it names the run folders)")


@dataclass
class BenchmarkConfig:
    loader: str = MISSING  # the registered dataset module that reads the data (the config file's name)
    # What the runs' folders and tables call the data: the loader's name unless set (own data: benchmark.name=wisdm).
    name: str = setting("${.loader}", NAME)
    n_experiences: Optional[int] = setting(None, optional(POSITIVE_INT))
    # Or this many classes a task, the last taking the remainder (then n_experiences: null).
    classes_per_exp: Optional[int] = setting(None, optional(POSITIVE_INT))
    shuffle_classes: bool = setting(True, BOOL)  # the class order drawn from the seed; false: sorted
    # One class order for every seed (indices into the sorted class ids), e.g. PyCIL's
    # `np.random.seed(1993); np.random.permutation(C)`; null: shuffle_classes decides.
    class_order: Optional[List[int]] = setting(None, CLASS_ORDER)
    # class: one head over every class seen; task: the experience (task) is given at test time and the prediction
    # is made among its classes (training as for class); domain: every class in every experience, the experiences
    # differing in their inputs' domain (module docstring). The run's folder and the tables name the scenario
    # unless it is class.
    scenario: str = setting("class", one_of("class", "task", "domain"))

    def check(self, path: str) -> None:
        split = {"n_experiences": self.n_experiences, "classes_per_exp": self.classes_per_exp}
        if self.scenario == "domain" and self.n_experiences is None:
            raise ValueError(f"{path}scenario=domain splits by domain, not by class: set {path}n_experiences (the "
                             f"number of domains) instead of {path}classes_per_exp={self.classes_per_exp}")
        if sum(v is not None for v in split.values()) != 1:
            raise ValueError(f"set exactly one of {path}n_experiences and {path}classes_per_exp (got {split}); "
                             f"null clears one: {path}n_experiences=null {path}classes_per_exp=K")


@dataclass
class Loaded:
    """What a dataset module gives: the training and test sets (ArrayDatasets), class names by class id, how the
    two sets were split (said in every run's summary), and for images the per-sample training transform and the
    input normalisation (mean, std) per channel. `source`: a fingerprint of the data before any split or scaling
    the seed draws (HAR features split by subject), so that runs of several seeds count as runs on the same data;
    None where the sets do not depend on the seed."""
    train: object
    test: object
    class_names: list
    split: str
    train_transform: object = None
    input_norm: tuple | None = None
    source: str | None = None
    domains: tuple | None = None  # (training, test) per-sample domain ids (HAR: subjects), for scenario=domain


@dataclass
class Benchmark:
    scenario: object  # avalanche NCScenario (scenario=domain: a ClassificationScenario)
    input_shape: tuple
    num_classes: int
    class_order: list  # original class index of relabelled class i
    class_names: list
    input_norm: tuple | None = None  # (mean, std) per channel for uint8 images, applied by the model
    classes_per_exp: list | None = None  # None for scenario=domain: every class in every experience
    data_fingerprint: str = ""  # of the training and test sets' contents: the run's data, wherever it lies
    data_source: str = ""  # of the data before the seed's split (Loaded.source), else data_fingerprint
    split: str = ""  # how the training and test sets were split (Loaded.split)

    @property
    def n_experiences(self) -> int:
        return len(self.scenario.train_stream)

    @property
    def test_sizes(self) -> list[int]:
        """Each experience's number of test samples: its accuracy's weight in the accuracy on all seen ones."""
        return [len(experience.dataset) for experience in self.scenario.test_stream]

    def task_classes(self) -> list[tuple[int, int]]:
        """Each experience's (first, end) range of relabelled classes: its task's classes (every class, in every
        experience of a domain-incremental benchmark)."""
        if self.classes_per_exp is None:
            return [(0, self.num_classes)] * self.n_experiences
        ends = np.cumsum(self.classes_per_exp).tolist()
        return list(zip([0, *ends[:-1]], ends))


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
                         f"{name}; choose a divisor of {n_classes}, or tasks of K classes, the last taking the "
                         "remainder: benchmark.classes_per_exp=K benchmark.n_experiences=null")
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


def contents_fingerprint(datasets) -> str:
    """The run's data, wherever it lies: a hash of its datasets' fingerprints, in order."""
    return hashlib.blake2b(" ".join(d.fingerprint() for d in datasets).encode(), digest_size=8).hexdigest()


def build_benchmark(cfg, seed: int) -> Benchmark:
    """Split benchmark `cfg.name` (read by its loader) into experiences (see `experience_sizes`); the class order
    is `benchmark.class_order` when set, else shuffled by `seed` (see `class_order`)."""
    loaded = BENCHMARKS.builder(cfg.loader)(cfg, seed)
    if cfg.scenario == "domain":
        return _domain_benchmark(cfg, seed, loaded)
    train, test, names = loaded.train, loaded.test, loaded.class_names
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
        train_transform=loaded.train_transform, eval_transform=None,
    )
    contents = contents_fingerprint([train, test])
    return Benchmark(scenario, tuple(train.inputs.shape[1:]), len(classes), order, list(names), loaded.input_norm,
                     sizes, contents, loaded.source or contents, loaded.split)


def domain_groups(domains: np.ndarray, n: int, seed: int, name: str) -> list[np.ndarray]:
    """The distinct domain ids in `n` groups of near-equal size, drawn by `seed` (a permutation split in order)."""
    values = np.unique(domains)
    if len(values) < n:
        raise ValueError(f"benchmark.n_experiences={n} domains need at least as many distinct domains; {name} has "
                         f"{len(values)}")
    return [np.sort(g) for g in np.array_split(np.random.RandomState(seed).permutation(values), n)]


def rotated_domains(train, test, n: int, seed: int) -> tuple[list, list, list[float]]:
    """Images: domain k turned anticlockwise by k·180/n degrees. Experience k trains on the k-th of `n` parts of the
    training set (drawn by `seed`, each class split evenly) and is tested on the whole test set, rotated alike."""
    from torchvision.transforms.functional import rotate

    angles = [k * 180.0 / n for k in range(n)]
    labels = np.asarray(train.targets)
    rng = np.random.RandomState(seed)
    parts = [[] for _ in range(n)]
    for c in np.unique(labels):
        for k, rows in enumerate(np.array_split(rng.permutation(np.flatnonzero(labels == c)), n)):
            parts[k].append(rows)

    def turned(angle):  # quarter turns exactly, other angles interpolated (nearest)
        quarters, rest = divmod(angle, 90.0)
        return lambda x: torch.rot90(x, int(quarters), dims=(-2, -1)) if rest == 0 else rotate(x, angle)

    everything = np.arange(len(test))
    return ([train.take(np.sort(np.concatenate(parts[k])), turned(a)) for k, a in enumerate(angles)],
            [test.take(everything, turned(a)) for a in angles], angles)


def _domain_benchmark(cfg, seed: int, loaded: Loaded) -> Benchmark:
    """Every class in every experience; experience k holds domain group k's training and test samples."""
    train, test, names, n = loaded.train, loaded.test, loaded.class_names, cfg.n_experiences
    if loaded.domains is not None:
        groups = domain_groups(np.concatenate(loaded.domains), n, seed, cfg.name)
        parts = []
        for dataset, domains in zip((train, test), loaded.domains):
            parts.append([dataset.take(np.flatnonzero(np.isin(domains, g))) for g in groups])
        for k, (part, group) in enumerate(zip(parts[1], groups)):
            if not len(part) or not len(parts[0][k]):
                raise ValueError(f"domain group {k} ({group.tolist()}) of {cfg.name} has no "
                                 f"{'test' if not len(part) else 'training'} samples")
        how = f"domains: {[g.tolist() for g in groups]}"
    elif train.inputs.ndim == 4:
        *parts, angles = rotated_domains(train, test, n, seed)
        how = f"domains: rotations by {[round(a, 2) for a in angles]} degrees"
    else:
        raise ValueError(f"benchmark.scenario=domain needs domains: {cfg.name} has neither per-sample domains "
                         "(HAR subjects with benchmark.split=random or given) nor images to rotate")
    scenario = dataset_benchmark(parts[0], parts[1], train_transform=loaded.train_transform, eval_transform=None)
    contents = contents_fingerprint(parts[0] + parts[1])
    classes = sorted(set(train.targets))
    return Benchmark(scenario, tuple(train.inputs.shape[1:]), len(classes), classes, list(names), loaded.input_norm,
                     None, contents, loaded.source or contents, f"{loaded.split}; {how}")
