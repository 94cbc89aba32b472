"""Raw multichannel recordings of one's own → a feature file that `benchmark=features` reads.

    python -m data_prep.series --train TRAIN --test TEST --rate 50 --out features.npz
           [--window 128 --step 64] [--features uci|position] [--roles acc=0,1,2 gyro=3,4,5]

Inputs: the time-series classification archive's `.ts` files (UEA/UCR: one case a line, channels separated by
`:`, the class label last) or its `.arff` files (univariate, or multivariate with one relational attribute), or
NPZ arrays `X` (cases, channels, samples), `y`, optional `subject`, or a CSV of a row a sample (`case`, `label`,
optional `subject`, a column a channel). Each case is cut
into windows of `--window` samples, `--step` apart (default: the whole case, one window), at `--rate` Hz, and each
window becomes
- `uci`: the 561 UCI HAR features (data_prep/uci_features.py: noise and gravity filters and FFT bins derived from
  the rate and the window; needs an accelerometer and a gyroscope, 3 channels each, and a rate above 40 Hz);
- `position`: the 27 features of each 3-axis sensor's magnitude (data_prep/position_features.py; any number of
  3-channel sensors).
Channel roles: `--roles acc=0,1,2 gyro=3,4,5` (uci), or `--roles s1=0,1,2 s2=3,4,5` (position: names the
sensors); without it six channels are taken as accelerometer then gyroscope (uci), and any multiple of three as
sensors in order (position); what was taken is printed. `--test` keeps the release's own split: the output's
`split` column says train or test for every window (benchmark.split=given).
"""
import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

from . import feature_file, hapt, position_features, uci_features
from .cli import npz_path

EXTRACTOR = "data_prep.series v1"


class SeriesError(ValueError):
    """Input that cannot become features, with the file and what is wrong."""


def _stacked(path: Path, cases: list, labels: list):
    """(X (cases, channels, samples), labels) of a file's cases, which must share one shape."""
    if not cases:
        raise SeriesError(f"{path}: no cases after @data")
    if len({c.shape for c in cases}) != 1:
        raise SeriesError(f"{path}: cases of different shapes {sorted({c.shape for c in cases})[:3]} (channels, "
                          "samples); cut them to one length first")
    return np.stack(cases), np.asarray(labels)


def read_ts(path: Path):
    """(X (cases, channels, samples), labels as strings) of a `.ts` file with class labels and equal lengths."""
    header, cases, labels = {}, [], []
    data = False
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not data:
            if line.lower() == "@data":
                data = True
            elif line.startswith("@"):
                key, _, value = line[1:].partition(" ")
                header[key.lower()] = value.strip()
            continue
        *channels, label = line.split(":")
        if not channels:
            raise SeriesError(f"{path} line {number}: no channel values before the label")
        try:
            values = [np.asarray(c.split(","), dtype=np.float64) for c in channels]
        except ValueError as err:
            raise SeriesError(f"{path} line {number}: {err} (missing values '?' are not supported)") from err
        if len({len(v) for v in values}) != 1:
            raise SeriesError(f"{path} line {number}: channels of different lengths {[len(v) for v in values]}")
        cases.append(np.stack(values))
        labels.append(label.strip())
    if header.get("classlabel", "true").split()[0].lower() != "true":
        raise SeriesError(f"{path}: @classLabel false: the cases carry no class to learn")
    return _stacked(path, cases, labels)


def read_arff(path: Path):
    """(X (cases, channels, samples), labels as strings) of the archive's ARFF: univariate (a numeric attribute
    a sample, the class last) or multivariate (one relational attribute whose value is a quoted string of channels
    separated by \\n, values by commas, then the class)."""
    cases, labels, data = [], [], False
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("%"):
            continue
        if not data:
            data = line.lower() == "@data"
            continue
        if line.startswith("'"):
            quoted, _, label = line[1:].rpartition("'")
            rows = [r for r in quoted.replace("\\n", "\n").split("\n") if r]
            label = label.lstrip(",")
        else:
            *values, label = line.split(",")
            rows = [",".join(values)]
        try:
            cases.append(np.stack([np.asarray(r.split(","), dtype=np.float64) for r in rows]))
        except ValueError as err:
            raise SeriesError(f"{path} line {number}: {err} (missing values '?' and unequal channels are not "
                              "supported)") from err
        labels.append(label.strip().strip("'\""))
    return _stacked(path, cases, labels)


def read_csv(path: Path):
    """(X (cases, channels, samples), labels, subjects or None) of a CSV with a row a sample: a `case` column
    (rows of one case together, in time order), its `label`, optionally `subject`, and a column a channel."""
    import pandas as pd

    frame = pd.read_csv(path)
    missing = [c for c in ("case", "label") if c not in frame.columns]
    if missing:
        raise SeriesError(f"{path} has no {missing} column(s): a recording CSV has a row a sample with `case`, "
                          "`label`, optionally `subject`, and a column a channel")
    channels = [c for c in frame.columns if c not in ("case", "label", "subject")]
    groups = list(frame.groupby("case", sort=False))
    lengths = {len(g) for _, g in groups}
    if len(lengths) != 1:
        raise SeriesError(f"{path}: cases of different lengths {sorted(lengths)[:3]}; cut them to one length first")
    for name, group in groups:
        if group["label"].nunique() != 1:
            raise SeriesError(f"{path}: case {name} has several labels {sorted(group['label'].unique())[:3]}")
    X = np.stack([g[channels].to_numpy(np.float64).T for _, g in groups])
    labels = np.asarray([g["label"].iloc[0] for _, g in groups])
    subjects = np.asarray([g["subject"].iloc[0] for _, g in groups]) if "subject" in frame.columns else None
    return X, labels, subjects


# The input formats, in one place for the reader's refusal and the command's help.
FORMATS = (".ts or .arff (UEA/UCR), .npz of X (cases, channels, samples), y and optional subject, or .csv of a row "
           "a sample")


def read_series(path: Path):
    """(X (cases, channels, samples), labels, subjects or None) of a `.ts` or an NPZ file."""
    if not path.is_file():
        raise SeriesError(f"{path} not found")
    if path.suffix.lower() in (".ts", ".arff"):
        return (*(read_ts if path.suffix.lower() == ".ts" else read_arff)(path), None)
    if path.suffix.lower() == ".npz":
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in ("X", "y") if k not in npz.files]
            if missing:
                raise SeriesError(f"{path} lacks {missing}: it needs X (cases, channels, samples) and y (cases,)")
            X, y = npz["X"], npz["y"]
            subject = npz["subject"] if "subject" in npz.files else None
        if X.ndim != 3 or len(y) != len(X):
            raise SeriesError(f"{path}: X must be (cases, channels, samples) with a label a case; got X {X.shape}, "
                              f"y {np.shape(y)}")
        return X.astype(np.float64), np.asarray(y), subject
    if path.suffix.lower() == ".csv":
        return read_csv(path)
    raise SeriesError(f"{path}: unknown format {path.suffix!r}; use {FORMATS}")


def windows(X: np.ndarray, window: int | None, step: int | None):
    """(windows (n, channels, window), the case of each): every case cut into `window`-sample windows, `step`
    apart (the whole case when `window` is None)."""
    samples = X.shape[-1]
    window = window or samples
    step = step or window
    if window > samples:
        raise SeriesError(f"--window {window} is longer than the cases' {samples} samples")
    starts = np.arange(0, samples - window + 1, step)
    cut = np.stack([X[..., s:s + window] for s in starts], 1)  # (cases, starts, channels, window)
    return cut.reshape(-1, X.shape[1], window), np.repeat(np.arange(len(X)), len(starts))


def parse_roles(text: list[str] | None, channels: int, kind: str) -> dict[str, list[int]]:
    """{role: channel indices} from `name=i,j,k` words, or the default for `kind` (stated by the caller)."""
    if text:
        roles = {}
        for word in text:
            name, _, indices = word.partition("=")
            try:
                roles[name] = [int(i) for i in indices.split(",")]
            except ValueError as err:
                raise SeriesError(f"--roles {word!r}: write name=i,j,k with channel indices") from err
    elif kind == "uci":
        if channels != 6:
            raise SeriesError(f"the uci features need an accelerometer and a gyroscope; {channels} channels cannot "
                              "be told apart: give --roles acc=i,j,k gyro=l,m,n")
        roles = {"acc": [0, 1, 2], "gyro": [3, 4, 5]}
    else:
        if channels % 3:
            raise SeriesError(f"the position features take 3-axis sensors; {channels} channels are not a multiple "
                              "of 3: give --roles name=i,j,k for each sensor")
        roles = {f"sensor{i + 1}": [3 * i, 3 * i + 1, 3 * i + 2] for i in range(channels // 3)}
    for name, indices in roles.items():
        if len(indices) != 3 or not all(0 <= i < channels for i in indices):
            raise SeriesError(f"role {name}={indices}: a sensor has 3 channels among 0..{channels - 1}")
    if kind == "uci" and set(roles) != {"acc", "gyro"}:
        raise SeriesError(f"the uci features take --roles acc=... gyro=...; got {sorted(roles)}")
    return roles


def features(X: np.ndarray, kind: str, roles: dict, rate: float, window: int | None, step: int | None):
    """(values (windows, d), names, the case of each window) of cases X (cases, channels, samples). The uci
    signals are filtered over a whole case, then cut (as the UCI release filters whole recordings)."""
    if kind == "uci":
        signals = [hapt.recording_signals(case[roles["acc"]].T, case[roles["gyro"]].T, rate) for case in X]
        cut = {}
        for name in uci_features.TIME_3AXIS:
            cut[name], case = windows(np.stack([s[name].T for s in signals]), window, step)
        return (*uci_features.feature_table(cut, rate), case)
    cut, case = windows(X, window, step)
    sensors = np.stack([cut[:, idx] for idx in roles.values()], 1)[:, None]  # (n, 1 position, sensors, 3, samples)
    return (*position_features.position_table(sensors, ["all"], list(roles)), case)


def build(args) -> dict:
    parts = [("train", args.train)] + ([("test", args.test)] if args.test else [])
    read = {split: read_series(path) for split, path in parts}
    channels = {split: X.shape[1] for split, (X, _, _) in read.items()}
    if len(set(channels.values())) != 1:
        raise SeriesError(f"the files have different channel counts {channels}")
    roles = parse_roles(args.roles, next(iter(channels.values())), args.features)
    print(f"channels: {', '.join(f'{name}={idx}' for name, idx in roles.items())}"
          + ("" if args.roles else " (taken by default: --roles sets them)"))
    classes = sorted({str(label) for _, y, _ in read.values() for label in y})
    values, y, subject, split = [], [], [], []
    for name, (X, labels, subjects) in read.items():
        table, names, case = features(X, args.features, roles, args.rate, args.window, args.step)
        values.append(table)
        y.append([classes.index(str(labels[c])) for c in case])
        subject.append(subjects[case] if subjects is not None else np.full(len(case), -1))
        split += [name] * len(case)
    has_subjects = all(s is not None for _, _, s in read.values())
    return {"X": np.concatenate(values), "y": np.concatenate(y), "feature_names": names,
            "class_names": dict(enumerate(classes)), "subject": np.concatenate(subject) if has_subjects else None,
            "split": split if args.test else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m data_prep.series", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", type=Path, required=True, help=f"the cases: {FORMATS}")
    p.add_argument("--test", type=Path, help="the release's own test cases: kept as the split column")
    p.add_argument("--rate", type=float, required=True, help="sampling rate in Hz")
    p.add_argument("--window", type=int, help="samples a window [the whole case]")
    p.add_argument("--step", type=int, help="samples between window starts [--window]")
    p.add_argument("--features", choices=("uci", "position"), default="position")
    p.add_argument("--roles", nargs="+", help="name=i,j,k channel indices (uci: acc= and gyro=)")
    p.add_argument("--out", type=npz_path, required=True, help="the feature file to write (.npz)")
    args = p.parse_args(argv)
    try:
        arrays = build(args)
    except (SeriesError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in (args.train, args.test) if path)).hexdigest()
    check = f"sha256 of the input files {digest[:16]} (no published list to check them against)"
    feature_file.save(args.out, extractor=EXTRACTOR, contents_check=check, **arrays)
    n, d = arrays["X"].shape
    print(f"wrote {args.out}: {n:,} windows × {d} features ({args.features}) of {len(arrays['class_names'])} classes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
