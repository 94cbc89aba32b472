"""Feature tables (one row per window): load, filter, split (by subject, at random, or as the table says), scale to
[-1, 1].

The HAR benchmarks read the NPZ files that `data_prep/` writes; `benchmark=features` reads any NPZ, CSV or Parquet
table a researcher brings: feature columns plus a `label` column and, optionally, a `subject` column and a `split`
column (`train` / `test`: the release's own split; NPZ keys X, y, subject, split). Plain numpy (pandas only for
CSV/Parquet), so data preparation can use it without torch.
"""
import hashlib
import math
import zipfile
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

LABEL, SUBJECT, SPLIT = "label", "subject", "split"
SPLIT_VALUES = ("train", "test")
MAKE_HINT = ("make one with `python -m data_prep.hapt|dsads|pamap2 --raw-dir RAW --out {path}` (docs/data.md), or "
             "bring a CSV/Parquet/NPZ with numeric feature columns and a `label` column (optionally `subject`)")
# The HDQT paper's filtering: classes and subjects that too few subjects/classes cover.
PAPER_FILTERS = {
    "hapt": dict(drop_classes=(8,), drop_subjects=(7, 28)),
    "pamap2": dict(drop_classes=(24,), drop_subjects=(3, 4, 9)),
    "dsads": dict(drop_classes=(), drop_subjects=()),
}


@dataclass(frozen=True)
class FeatureTable:
    X: np.ndarray  # (N, d) float32
    y: np.ndarray  # (N,) int64 class ids as in the source
    subject: np.ndarray | None  # (N,) int64, or None when the table has no subject column
    feature_names: list
    class_names: dict | None = None  # class id → name, when the source names its classes
    is_test: np.ndarray | None = None  # (N,) bool: the table's own split (a `split` column), when it has one

    def __len__(self):
        return len(self.y)

    def fingerprint(self) -> str:
        """A hash of the table's contents: features, labels, subjects and its own split."""
        h = hashlib.blake2b(digest_size=16)
        for part in (self.X, self.y, self.subject, self.is_test):
            h.update(b"-" if part is None else np.ascontiguousarray(part).tobytes())
        return h.hexdigest()

    def take(self, rows) -> "FeatureTable":
        return replace(self, X=self.X[rows], y=self.y[rows],
                       subject=None if self.subject is None else self.subject[rows],
                       is_test=None if self.is_test is None else self.is_test[rows])


def load_feature_table(path) -> FeatureTable:
    """Read an NPZ (keys X, y, optional subject), CSV or Parquet feature table and check it."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder; a feature table is one .csv, .csv.gz, .parquet or .npz file")
    if not path.is_file():
        raise FileNotFoundError(f"feature table {path} not found; {MAKE_HINT.format(path=path)}")
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    if suffix == ".npz":
        table = _from_npz(path)
    elif suffix in (".csv", ".csv.gz", ".parquet", ".pq"):
        table = _from_frame(_read_frame(path, suffix), path)
    else:
        raise ValueError(f"{path}: unknown feature table format {suffix!r}; use .npz, .csv or .parquet")
    _check(table, path)
    return table


# What a file's first bytes say it is, for a table whose suffix promises another format.
_MAGIC = {b"PK\x03\x04": "a zip archive (an NPZ?): name it .npz", b"PAR1": "a Parquet file: name it .parquet",
          b"\x93NUMPY": "a single NumPy array (.npy), not a table"}


def _read_frame(path: Path, suffix: str):
    import pandas as pd

    if suffix.startswith(".csv"):
        with open(path, "rb") as f:
            head = f.read(8)
        found = next((what for magic, what in _MAGIC.items() if head.startswith(magic)), None)
        if found and suffix == ".csv":
            raise ValueError(f"{path} is not CSV text but {found}")
        try:
            return pd.read_csv(path)
        except UnicodeDecodeError as err:
            raise ValueError(f"{path} is not UTF-8 text ({_first_undecodable(path)}); save it as UTF-8, e.g. "
                             "pandas.read_csv(path, encoding=...).to_csv(new, index=False)") from err
        except pd.errors.EmptyDataError as err:
            raise ValueError(f"{path} is empty: a feature table needs a header line and rows") from err
        except pd.errors.ParserError as err:
            raise ValueError(f"{path} is not a well-formed CSV table: {err}") from err
    try:
        return pd.read_parquet(path)
    except ImportError as err:
        raise ImportError(f"reading {path} needs a Parquet engine: pip install pyarrow (or save it as CSV)") from err


# What a damaged or cut-short archive raises while it is opened or its arrays are read.
_DAMAGED = (zipfile.BadZipFile, EOFError, zlib.error)


def _first_undecodable(path: Path) -> str:
    """Where a CSV stops being UTF-8 (pandas reports an offset within the chunk it was decoding)."""
    import gzip

    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    try:
        raw.decode("utf-8")
        return "its encoding"
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        return f"byte {raw[err.start]:#04x} in line {line}"


def _from_npz(path: Path) -> FeatureTable:
    try:
        npz = np.load(path, allow_pickle=False)
    except (ValueError, OSError, *_DAMAGED) as err:  # numpy's message for a non-archive advises unpickling
        raise ValueError(f"{path} is not a NumPy .npz archive ({type(err).__name__}) or is cut short; a feature NPZ "
                         "is written by numpy.savez with X (N, d), y (N,) and optionally subject (N,) and "
                         "feature_names (d,)") from err
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise ValueError(f"{path} holds a single .npy array, not an .npz archive of X, y (and subject)")
    try:
        X, y, subject, split, names, classes = _npz_arrays(npz, path)
    except _DAMAGED as err:
        raise ValueError(f"{path} is damaged or cut short ({type(err).__name__}: {err}); write it again") from err
    if X.ndim != 2:
        raise ValueError(f"{path}: X must be 2-D (windows × features), found shape {X.shape}")
    if np.asarray(y).dtype.kind in "SU":  # class names, numbered as a CSV's are
        y, classes = _class_ids(np.asarray(y), path, "y")
    y = _integer_labels(y, path, "y")
    subject = None if subject is None else _integer_labels(subject, path, "subject")
    return FeatureTable(X.astype(np.float32), y, subject, names or [f"f{i}" for i in range(X.shape[1])], classes,
                        None if split is None else _test_rows(split, path))


def _npz_arrays(npz, path):
    """(X, y, subject, split, feature names, class names) of an open feature NPZ; what is optional may be None."""
    with npz:
        missing = [k for k in ("X", "y") if k not in npz.files]
        if missing:
            raise ValueError(f"{path} lacks the key(s) {missing} (it has {sorted(npz.files)}); a feature NPZ holds "
                             "X (N, d), y (N,) and optionally subject (N,) and feature_names (d,)")

        def array(key):
            if key not in npz.files:
                return None
            try:
                return npz[key]
            except ValueError as err:  # numpy refuses to unpickle an array of Python objects
                raise ValueError(f"{path}: {key} is an array of Python objects (dtype=object); save numbers, or "
                                 f"names as text (numpy.asarray(values, str))") from err

        X, y = array("X"), array("y")
        if X.dtype.kind not in "iuf":
            raise ValueError(f"{path}: X must be numeric, found dtype {X.dtype}")
        names = array("feature_names")
        ids, class_names = array("class_ids"), array("class_names")
        classes = None if ids is None or class_names is None else {int(i): str(n) for i, n in zip(ids, class_names)}
        return X, y, array("subject"), array("split"), None if names is None else [str(n) for n in names], classes


def _integer_labels(values, path, what):
    values = np.asarray(values)
    if values.ndim != 1:
        raise ValueError(f"{path}: {what} must be 1-D, found shape {values.shape}")
    if values.dtype.kind in "iu":
        return values.astype(np.int64)
    if values.dtype.kind == "f" and np.isnan(values).any():
        raise ValueError(f"{path}: {what} is empty in row {np.flatnonzero(np.isnan(values))[0] + 1}; every row needs "
                         "one")
    if values.dtype.kind == "f" and np.isfinite(values).all() and (values == np.round(values)).all():
        return values.astype(np.int64)
    raise ValueError(f"{path}: {what} must hold whole numbers, found dtype {values.dtype} (e.g. {values[:3]})")


def _class_ids(labels, path, what: str):
    """Class names numbered in sorted order, and the names by number. Labels hold class numbers or class names:
    numbers with a few other entries (a typo, a stray header line) would otherwise become classes of their own,
    with a sample or two each, and an empty entry a class named 'nan'."""
    import pandas as pd

    empty = pd.isna(pd.Series(labels)).to_numpy()
    if empty.any():
        raise ValueError(f"{path}: {what} is empty in row {np.flatnonzero(empty)[0] + 1}; every row needs a label")
    numeric = pd.to_numeric(pd.Series(labels), errors="coerce").notna().to_numpy()
    if numeric.any() and not numeric.all():
        rows = np.flatnonzero(~numeric)
        odd = sorted({str(labels[r]) for r in rows})
        raise ValueError(f"{path}: {what} holds numbers and also {odd[:5]} (first in row {rows[0] + 1}); labels are "
                         "class numbers or class names, not both")
    names, ids = np.unique(np.asarray(labels).astype(str), return_inverse=True)
    return ids, dict(enumerate(names.tolist()))


def _test_rows(values, path) -> np.ndarray:
    """The `split` column as a bool array (True: a test row); anything but train/test is refused, named."""
    values = np.char.lower(np.asarray(values).astype(str))
    bad = sorted(set(values.tolist()) - set(SPLIT_VALUES))
    if bad:
        raise ValueError(f"{path}: the `{SPLIT}` column holds {bad[:5]}; it must say {' or '.join(SPLIT_VALUES)} "
                         "for every row")
    return values == "test"


def _from_frame(frame, path: Path) -> FeatureTable:
    import pandas as pd

    if frame.empty:
        raise ValueError(f"{path}: no rows, only the header {list(frame.columns)}")
    if LABEL not in frame.columns:
        raise ValueError(f"{path} has no `{LABEL}` column (columns: {list(frame.columns)[:10]}...); name the class "
                         f"column `{LABEL}` (and the subject column, if any, `{SUBJECT}`)")
    features = frame.drop(columns=[c for c in (LABEL, SUBJECT, SPLIT) if c in frame.columns])
    unnamed = [c for c in features.columns if str(c).startswith("Unnamed: ")]
    if unnamed:  # pandas' name for a column without a header: most often the index that to_csv writes first
        raise ValueError(f"{path}: column {unnamed[0]!r} has no header name; if it is the row index that "
                         "DataFrame.to_csv writes (a row number, which can give the classes away), write the table "
                         "with index=False; if it is a feature, name it")
    bad = [c for c in features.columns if not pd.api.types.is_numeric_dtype(features[c])]
    if bad:
        column = features[bad[0]]
        rows = np.flatnonzero(pd.to_numeric(column, errors="coerce").isna().to_numpy())
        row = int(rows[0]) if len(rows) else 0
        raise ValueError(f"{path}: feature column(s) {bad[:5]} are not numeric; e.g. column {bad[0]!r} row "
                         f"{row + 1} holds {column.iloc[row]!r}")
    labels, class_names = frame[LABEL].to_numpy(), None
    if labels.dtype.kind in "OSU":
        labels, class_names = _class_ids(labels, path, f"the `{LABEL}` column")
    y = _integer_labels(labels, path, LABEL)
    subject = _integer_labels(frame[SUBJECT].to_numpy(), path, SUBJECT) if SUBJECT in frame.columns else None
    is_test = _test_rows(frame[SPLIT].to_numpy(), path) if SPLIT in frame.columns else None
    return FeatureTable(features.to_numpy(np.float32), y, subject, [str(c) for c in features.columns], class_names,
                        is_test)


def _check(table: FeatureTable, path: Path):
    n, d = table.X.shape
    if n == 0 or d == 0:
        raise ValueError(f"{path}: empty feature table ({n} rows × {d} features)")
    for what, values in (("labels", table.y), ("subjects", table.subject), ("split entries", table.is_test)):
        if values is not None and len(values) != n:
            raise ValueError(f"{path}: {n} feature rows but {len(values)} {what}")
    if len(table.feature_names) != d:
        raise ValueError(f"{path}: {d} feature columns but {len(table.feature_names)} feature names")
    names, counts = np.unique(table.feature_names, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"{path}: feature name(s) {names[counts > 1].tolist()[:5]} occur more than once; each "
                         "feature needs a name of its own")
    finite = np.isfinite(table.X)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        raise ValueError(f"{path}: feature {table.feature_names[col]!r} is {table.X[row, col]} in row {row + 1}; "
                         "features must be finite")


def filter_table(table: FeatureTable, drop_classes=(), drop_subjects=()) -> FeatureTable:
    """Drop rows of the given classes (numbers, or names where the table names its classes) and subjects (each
    must occur in the table: a typo is an error)."""
    ids = {name: i for i, name in (table.class_names or {}).items()}
    drop_classes = [ids.get(c, c) for c in drop_classes]
    absent = sorted(set(drop_classes) - set(table.y.tolist()), key=str)
    if absent:
        known = sorted(set(table.y.tolist()))
        raise ValueError(f"cannot drop classes {absent}: not in the table (classes "
                         f"{[f'{i} ({table.class_names[i]})' for i in known] if table.class_names else known})")
    keep = ~np.isin(table.y, list(drop_classes))
    if drop_subjects:
        if table.subject is None:
            raise ValueError("cannot drop subjects: the table has no subject column")
        absent = sorted(set(drop_subjects) - set(table.subject.tolist()))
        if absent:
            raise ValueError(f"cannot drop subjects {absent}: not in the table")
        keep &= ~np.isin(table.subject, list(drop_subjects))
    return table.take(keep)


def paper_filter(table: FeatureTable, dataset: str) -> FeatureTable:
    """The HDQT paper's filtering of `dataset` (hapt: class 8, subjects 7 and 28; pamap2: class 24, subjects 3, 4,
    9)."""
    return filter_table(table, **PAPER_FILTERS[dataset])


def _check_split(train: FeatureTable, test: FeatureTable, how: str, remedy: str):
    """Every class must be learnable and testable: a class missing on either side is an error, not a silent gap."""
    classes = set(train.y.tolist()) | set(test.y.tolist())
    for side, part in (("training", train), ("test", test)):
        missing = sorted(classes - set(part.y.tolist()))
        if missing:
            raise ValueError(f"{_classes(missing, train)}: no {side} samples with {how}; drop them "
                             f"(benchmark.drop_classes={missing}) or {remedy}")


def _classes(ids, table: FeatureTable) -> str:
    """Class ids as a message names them: with their names where the table has names."""
    named = [f"{i} ({table.class_names[i]!r})" if table.class_names else str(i) for i in ids]
    return f"class{'es' if len(ids) > 1 else ''} {', '.join(named)}"


def subject_split(table: FeatureTable, train_fraction: float = 0.8, seed: int = 0):
    """ceil(train_fraction × #subjects) subjects, drawn by `seed`, train; the others test (HDQT's HAR protocol)."""
    if table.subject is None:
        raise ValueError("a subject-wise split needs a subject column; benchmark.split=auto or random splits this "
                         "table at random, stratified by class")
    subjects = np.unique(table.subject)
    n_train = math.ceil(round(train_fraction * len(subjects), 9))
    if not 0 < n_train < len(subjects):
        raise ValueError(f"train_fraction={train_fraction} of {len(subjects)} subjects leaves no training or no test "
                         "subject")
    train_subjects = np.random.default_rng(seed).permutation(subjects)[:n_train]
    in_train = np.isin(table.subject, train_subjects)
    train, test = table.take(in_train), table.take(~in_train)
    _check_split(train, test, f"the subject split of seed {seed} (test subjects "
                              f"{sorted(set(subjects.tolist()) - set(train_subjects.tolist()))})",
                 "choose another seed, or split at random (benchmark.split=random)")
    return train, test


def given_split(table: FeatureTable, test: FeatureTable | None = None):
    """The split the data come with: the rows a `split` column marks `test` (the same for every seed), or with
    `test`, that whole table (a release's separate test file)."""
    if test is None:
        if table.is_test is None:
            raise ValueError(f"benchmark.split=given needs a `{SPLIT}` column (train/test) in the table, or a "
                             "separate test table: benchmark.test_path=FILE")
        train, test = table.take(~table.is_test), table.take(table.is_test)
        how, remedy = f"the table's `{SPLIT}` column", "mark some of their rows `train` and some `test` there"
    else:
        _refuse_other_features(table.feature_names, test.feature_names)
        train, test = table, _labelled_as(test, table)
        how, remedy = "the separate test table", "give each table rows of them"
    _check_split(train, test, how, remedy)
    return train, test


def _refuse_other_features(train: list, test: list) -> None:
    """The test table must hold the training table's feature columns in the same order; say how it differs."""
    if test == train:
        return
    lacks, extra = [n for n in train if n not in test], [n for n in test if n not in train]
    if lacks or extra:
        differs = "; ".join(part for part in (f"lacks {lacks[:5]}" if lacks else "",
                                             f"has {extra[:5]} the training table has not" if extra else "") if part)
    else:
        at = next(i for i, (a, b) in enumerate(zip(train, test)) if a != b)
        differs = f"holds them in another order (column {at + 1}: {test[at]!r}, training table: {train[at]!r})"
    raise ValueError(f"the test table {differs}; it needs the training table's feature columns, in order")


def _labelled_as(test: FeatureTable, train: FeatureTable) -> FeatureTable:
    """`test` with its class ids those of `train` (tables that name their classes number them each in its own
    sorted order); a class named in the test table alone is refused."""
    if (test.class_names is None) != (train.class_names is None):
        raise ValueError("the training and test tables must both name their classes or both number them "
                         f"(`{LABEL}` column of text in one, of numbers in the other)")
    if train.class_names is None:
        return test
    ids = {name: i for i, name in train.class_names.items()}
    unseen = sorted(set(test.class_names.values()) - set(ids))
    if unseen:
        raise ValueError(f"the test table has classes the training table has not: {unseen}")
    return replace(test, y=np.array([ids[test.class_names[int(c)]] for c in test.y], dtype=np.int64),
                   class_names=train.class_names)


def random_split(table: FeatureTable, train_fraction: float = 0.8, seed: int = 0):
    """A split stratified by class: round(train_fraction × n) rows of each class train (at least one each side)."""
    ids, counts = np.unique(table.y, return_counts=True)
    if (counts < 2).any():
        single = ids[counts < 2].tolist()
        raise ValueError(f"{_classes(single, table)}: one row; a random split needs two of a class (one to train, one "
                         f"to test); drop them (benchmark.drop_classes={single}) or add rows")
    rng = np.random.default_rng(seed)
    in_train = np.zeros(len(table), bool)
    for c in np.unique(table.y):
        rows = rng.permutation(np.flatnonzero(table.y == c))
        n_train = min(max(round(train_fraction * len(rows)), 1), len(rows) - 1)
        in_train[rows[:n_train]] = True
    train, test = table.take(in_train), table.take(~in_train)
    _check_split(train, test, f"the random split of seed {seed}", "choose another seed")
    return train, test


@dataclass(frozen=True)
class MinMaxScaler:
    """Per-feature affine map of the fitted range onto [-1, 1]; a constant feature maps to 0.

    Fitted on the training split only, so test values may fall outside [-1, 1] (they are not clipped).
    """

    low: np.ndarray
    high: np.ndarray

    def apply(self, table: FeatureTable) -> FeatureTable:
        span = self.high - self.low
        scaled = np.divide(2.0 * (table.X - self.low), span, out=np.zeros_like(table.X), where=span > 0)
        return replace(table, X=np.where(span > 0, scaled - 1.0, 0.0).astype(np.float32))


def fit_minmax(train: FeatureTable) -> MinMaxScaler:
    return MinMaxScaler(train.X.min(0), train.X.max(0))


def minmax_normalise(train: FeatureTable, test: FeatureTable):
    """Both splits scaled with the training split's per-feature range."""
    scaler = fit_minmax(train)
    return scaler.apply(train), scaler.apply(test)
