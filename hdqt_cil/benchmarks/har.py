"""HAR and other feature-table benchmarks: a feature file → subject-wise split → [-1, 1] features.

HAPT, DSADS and PAMAP2 feature files come from `data_prep/`; `benchmark=features` takes any table a
researcher brings (NPZ/CSV/Parquet with a `label` and optionally a `subject` column).
"""
from dataclasses import dataclass
from pathlib import Path
from typing import List

import numpy as np
import torch
from omegaconf import MISSING

from ..settings import BOOL, FRACTION, INT_LIST, one_of, setting
from .arrays import ArrayDataset
from .split import BENCHMARKS, BenchmarkConfig

_MAKERS = {"hapt": "python -m data_prep.hapt", "dsads": "python -m data_prep.dsads",
           "pamap2": "python -m data_prep.pamap2"}


@dataclass
class FeatureTableConfig(BenchmarkConfig):
    path: str = MISSING  # the feature file: data_prep's NPZ, or any CSV/Parquet/NPZ table
    drop_classes: List[int] = setting([], INT_LIST)  # the paper's filtering of classes and subjects
    drop_subjects: List[int] = setting([], INT_LIST)
    # subject-wise: ceil(train_fraction × subjects) train, chosen by seed (needs a subject column); or random
    split: str = setting("subject", one_of("subject", "random"))
    train_fraction: float = setting(0.8, FRACTION)
    normalise: bool = setting(True, BOOL)  # each feature to [-1, 1], fitted on the training split only


@BENCHMARKS.register("hapt", FeatureTableConfig)
@BENCHMARKS.register("dsads", FeatureTableConfig)
@BENCHMARKS.register("pamap2", FeatureTableConfig)
@BENCHMARKS.register("features", FeatureTableConfig)
def benchmark(cfg, seed: int):
    return (*load(cfg, seed), None, None)


def load(cfg, seed: int):
    """Train/test ArrayDatasets with labels relabelled 0..C-1 (sorted original ids) and their class names."""
    from . import features

    path = Path(cfg.path)
    if not path.exists():
        how = (f"make it with `{_MAKERS[cfg.name]} --raw-dir RAW --out {path}` (or --download)"
               if cfg.name in _MAKERS else "point benchmark.path at a CSV, Parquet or NPZ feature table")
        raise FileNotFoundError(f"feature file {path} not found for benchmark {cfg.name}; {how}")
    table = features.load_feature_table(path)
    table = features.filter_table(table, drop_classes=tuple(cfg.drop_classes), drop_subjects=tuple(cfg.drop_subjects))
    if cfg.split == "subject":
        train, test = features.subject_split(table, train_fraction=cfg.train_fraction, seed=seed)
    else:
        train, test = features.random_split(table, train_fraction=cfg.train_fraction, seed=seed)
    if cfg.normalise:
        train, test = features.minmax_normalise(train, test)
    classes = np.unique(table.y)
    relabel = {int(c): i for i, c in enumerate(classes)}
    names = [str(table.class_names.get(int(c), c)) if table.class_names else str(c) for c in classes]

    def dataset(t):
        return ArrayDataset(torch.from_numpy(np.ascontiguousarray(t.X, dtype=np.float32)),
                            [relabel[int(c)] for c in t.y])

    return dataset(train), dataset(test), names
