"""HAR and other feature-table benchmarks: a feature file → subject-wise split → [-1, 1] features.

HAPT, DSADS and PAMAP2 feature files come from `data_prep/`; `benchmark=features` takes any table a
researcher brings (NPZ/CSV/Parquet with a `label` and optionally a `subject` column).
"""
from pathlib import Path

import numpy as np
import torch

from .arrays import ArrayDataset

_MAKERS = {"hapt": "python -m data_prep.hapt", "dsads": "python -m data_prep.dsads",
           "pamap2": "python -m data_prep.pamap2"}


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
    elif cfg.split == "random":
        train, test = features.random_split(table, train_fraction=cfg.train_fraction, seed=seed)
    else:
        raise ValueError(f"benchmark.split={cfg.split!r}; choose subject or random")
    if cfg.normalise:
        train, test = features.minmax_normalise(train, test)
    classes = np.unique(table.y)
    relabel = {int(c): i for i, c in enumerate(classes)}
    names = [str(table.class_names.get(int(c), c)) if table.class_names else str(c) for c in classes]

    def dataset(t):
        return ArrayDataset(torch.from_numpy(np.ascontiguousarray(t.X, dtype=np.float32)),
                            [relabel[int(c)] for c in t.y])

    return dataset(train), dataset(test), names
