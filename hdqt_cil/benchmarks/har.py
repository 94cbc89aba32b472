"""HAR and other feature-table benchmarks: a feature file → a split (the table's own, by subject, or at random) →
[-1, 1] features.

HAPT, DSADS and PAMAP2 feature files come from `data_prep/`; `benchmark=features` takes any table a
researcher brings (NPZ/CSV/Parquet with a `label` and optionally a `subject` column).
"""
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

import numpy as np
import torch
from omegaconf import MISSING

from ..settings import BOOL, FRACTION, INT_LIST, Rule, one_of, setting
from .arrays import ArrayDataset
from .split import BENCHMARKS, BenchmarkConfig, Loaded

log = logging.getLogger(__name__)
_MAKERS = {"hapt": "python -m data_prep.hapt", "dsads": "python -m data_prep.dsads",
           "pamap2": "python -m data_prep.pamap2"}


CLASSES = Rule(lambda v: isinstance(v, list) and all(isinstance(c, (int, str)) and not isinstance(c, bool) for c in v),
               "a list of class numbers or names")


@dataclass
class FeatureTableConfig(BenchmarkConfig):
    path: str = MISSING  # the feature file: data_prep's NPZ, or any CSV/Parquet/NPZ table
    # the paper's filtering of classes (by number, or by name where the labels are names) and subjects
    drop_classes: List[Any] = setting([], CLASSES)
    drop_subjects: List[int] = setting([], INT_LIST)
    # auto: given where the data has its own split, else subject where the table has subjects, else random.
    # subject: ceil(train_fraction × subjects) train, chosen by seed (needs a subject column); random: stratified
    # by class, by seed; given: the data's own split, the same for every seed (a `split` column of train/test, or
    # test_path)
    split: str = setting("auto", one_of("auto", "subject", "random", "given"))
    test_path: Optional[str] = None  # the data's own test set as a table of its own (a release's test file)
    train_fraction: float = setting(0.8, FRACTION)
    normalise: bool = setting(True, BOOL)  # each feature to [-1, 1], fitted on the training split only

    def check(self, path: str) -> None:
        super().check(path)
        if self.test_path is not None and self.split not in ("given", "auto"):
            raise ValueError(f"{path}test_path={self.test_path!r} is the data's own test set: it needs "
                             f"{path}split=given or auto (got {path}split={self.split})")


@BENCHMARKS.register("hapt", FeatureTableConfig)
@BENCHMARKS.register("dsads", FeatureTableConfig)
@BENCHMARKS.register("pamap2", FeatureTableConfig)
@BENCHMARKS.register("features", FeatureTableConfig)
def benchmark(cfg, seed: int):
    return load(cfg, seed)


def _table(cfg, key: str):
    """The feature table that setting `key` (path, test_path) names, filtered by the config's drop lists."""
    from . import features

    path = Path(getattr(cfg, key))
    if not path.exists():
        how = (f"make it from the release's archive with `{_MAKERS[cfg.loader]} --archive ARCHIVE --out {path}` "
               "(or --raw-dir FOLDER, or --download; docs/data.md)"
               if cfg.loader in _MAKERS and key == "path" else
               f"point benchmark.{key} at a CSV, Parquet or NPZ feature table")
        raise FileNotFoundError(f"benchmark.{key}={path}: no such file (benchmark {cfg.name}); {how}")
    table = features.load_feature_table(path)
    return features.filter_table(table, drop_classes=tuple(cfg.drop_classes), drop_subjects=tuple(cfg.drop_subjects))


def load(cfg, seed: int) -> Loaded:
    """Train/test ArrayDatasets with labels relabelled 0..C-1 (sorted original ids), their class names and how
    they were split."""
    from . import features

    table = _table(cfg, "path")
    split = _split_of(cfg, table)
    if split == "subject":
        train, test = features.subject_split(table, train_fraction=cfg.train_fraction, seed=seed)
        how = f"by subject, drawn by seed {seed}: test subjects {sorted(set(test.subject.tolist()))}"
    elif split == "random":
        train, test = features.random_split(table, train_fraction=cfg.train_fraction, seed=seed)
        how = f"at random, stratified by class, drawn by seed {seed} ({cfg.train_fraction:g} train)"
    else:
        separate = None if cfg.test_path is None else _table(cfg, "test_path")
        train, test = features.given_split(table, separate)
        how = "the data's own: " + (f"the test table {cfg.test_path}" if separate is not None else
                                    f"the `{features.SPLIT}` column")
    if cfg.normalise:
        train, test = features.minmax_normalise(train, test)
    classes = np.unique(np.concatenate([train.y, test.y]))
    relabel = {int(c): i for i, c in enumerate(classes)}
    names = [str(train.class_names.get(int(c), c)) if train.class_names else str(c) for c in classes]

    def dataset(t):
        return ArrayDataset(torch.from_numpy(np.ascontiguousarray(t.X, dtype=np.float32)),
                            [relabel[int(c)] for c in t.y])

    source = table.fingerprint() + ("" if split != "given" or separate is None else separate.fingerprint())
    how = f"{how} (benchmark.split=auto)" if cfg.split == "auto" else how
    return Loaded(dataset(train), dataset(test), names, how, source=source,
                  domains=_subject_domains(cfg, split, train, test))


def _split_of(cfg, table) -> str:
    """The split to make: benchmark.split, or for auto the data's own split where it has one (a `split` column, a
    test table), by subject where the table has subjects (class-incremental), at random otherwise. A table's own
    split that another choice discards is said."""
    from . import features

    own = cfg.test_path is not None or table.is_test is not None
    if cfg.split == "auto":  # a domain-incremental run needs every subject on both sides: never by subject
        by_subject = table.subject is not None and cfg.scenario != "domain"
        split = "given" if own else "subject" if by_subject else "random"
    else:
        split = cfg.split
        if own and split != "given":
            log.warning("%s has its own `%s` column; benchmark.split=%s ignores it (benchmark.split=given or auto "
                        "keeps it)", cfg.path, features.SPLIT, split)
    if split == "given" and cfg.train_fraction != FeatureTableConfig.train_fraction:
        log.warning("benchmark.train_fraction=%g is not used: the data's own split decides which rows train",
                    cfg.train_fraction)
    return split


def _subject_domains(cfg, split: str, train, test):
    """scenario=domain: the subjects are the domains, so each must be in both sets (not split by subject)."""
    if cfg.scenario != "domain":
        return None
    if train.subject is None:
        raise ValueError(f"benchmark.scenario=domain takes {cfg.name}'s subjects as its domains, but its table has "
                         "no subject column")
    if split == "subject":
        raise ValueError(f"benchmark.scenario=domain takes {cfg.name}'s subjects as its domains, so each subject "
                         "needs training and test samples: set benchmark.split=random (or given), not subject")
    return train.subject, test.subject
