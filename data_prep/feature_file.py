"""Writing feature files, and deciding whether an existing one can be reused instead of recomputed.

A file is the NPZ that `hdqt_cil.benchmarks.features.load_feature_table` reads: X (N, d) float32, y int64, subject
int64 and split ("train"/"test") where the data have them, feature_names, class_ids/class_names, plus `extractor`
(which code made it), `contents_check` (how the raw files were checked) and dataset-specific extras.
"""
import os
from pathlib import Path

import numpy as np

from hdqt_cil.benchmarks.features import load_feature_table


def save(path: Path, *, X, y, feature_names, class_names: dict, extractor: str, contents_check: str, subject=None,
         split=None, **extra):
    """Write atomically (a temporary file, then a rename), so an interrupted run never leaves a half file.
    `subject` (ids) and `split` ("train"/"test" per row: the data's own split) are written where given."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = sorted(class_names)
    optional = {name: np.asarray(values, dtype) for name, values, dtype in (("subject", subject, np.int64),
                                                                            ("split", split, str))
                if values is not None}
    partial = path.with_name(path.name + ".partial.npz")
    np.savez_compressed(partial, X=np.asarray(X, np.float32), y=np.asarray(y, np.int64),
                        feature_names=np.asarray(feature_names, str), class_ids=np.asarray(ids, np.int64),
                        class_names=np.asarray([class_names[i] for i in ids], str), extractor=np.asarray(extractor),
                        contents_check=np.asarray(contents_check), **optional, **extra)
    os.replace(partial, path)


def reusable(path: Path, extractor: str, n_features: int) -> bool:
    """True when `path` is a readable feature file made by this `extractor` with `n_features` columns."""
    path = Path(path)
    if not path.is_file():
        return False
    try:
        with np.load(path) as npz:
            made_by = str(npz["extractor"]) if "extractor" in npz.files else "unknown code"
        table = load_feature_table(path)
    except (OSError, ValueError, KeyError) as err:
        print(f"{path} is not a valid feature file ({err}); recomputing")
        return False
    if made_by != extractor:
        print(f"{path} was made by {made_by}, not {extractor}; recomputing")
        return False
    if table.X.shape[1] != n_features:
        print(f"{path} holds {table.X.shape[1]} features, expected {n_features}; recomputing")
        return False
    return True
