"""PAMAP2 Physical Activity Monitoring raw .dat files → 243 cross-position features per window → NPZ file.

Each Protocol/subject1NN.dat (and, with --optional, Optional/subject1NN.dat) is a space-separated table at 100 Hz
with 54 columns: timestamp, activity id, heart rate, then 17 columns for each of the IMUs on the hand (wrist),
chest and ankle (temperature, 3-D acc ±16 g, 3-D acc ±6 g, 3-D gyro, 3-D magnetometer, 4 orientation values).
Missing samples are NaN.

- Windows: 5 s (500 samples) with a 50 % step, inside each run of one activity; activity 0 (transient) is dropped.
- Sensors: the ±16 g accelerometer (the one the release recommends), gyroscope and magnetometer of each IMU, each
  reduced to its magnitude and described by the 27 cross-position features (`position_features`): 3 × 3 × 27 = 243.
- Missing values: each used channel is linearly interpolated over its NaN gaps (edges take the nearest value); a
  window in which more than 10 % of any used channel was missing is dropped (and counted).
- Subjects 101..109 become 1..9. The paper's filtering (class 24, subjects 3, 4, 9) is left to the benchmark.

    python -m data_prep.pamap2 --raw-dir PATH/PAMAP2_Dataset --out data/pamap2_features.npz
"""
import dataclasses
import re
import sys
from pathlib import Path

import numpy as np

from . import cli, position_features, windowing
from .sources import RawDataError, line_number, read_table

PAMAP2 = cli.Dataset(
    name="pamap2",
    url="https://archive.ics.uci.edu/static/public/231/pamap2+physical+activity+monitoring.zip",
    archive_name="pamap2_uci.zip",
    archive_sha256=None,  # no published digest could be checked from here; zip CRCs are verified on unpacking
    archive_bytes=None,
    marker="Protocol/subject101.dat",
    extractor="data_prep.pamap2 v1",
    n_features=243,
)
FS, COLUMNS = 100.0, 54
IMUS = {"hand": 3, "chest": 20, "ankle": 37}  # first column of each IMU's 17
SENSORS = {"acc": 1, "gyro": 7, "mag": 10}  # offsets inside an IMU block (acc = the ±16 g accelerometer)
WINDOW, STEP = 500, 250
MAX_MISSING = 0.1
ACTIVITIES = {
    1: "lying", 2: "sitting", 3: "standing", 4: "walking", 5: "running", 6: "cycling", 7: "Nordic walking",
    9: "watching TV", 10: "computer work", 11: "car driving", 12: "ascending stairs", 13: "descending stairs",
    16: "vacuum cleaning", 17: "ironing", 18: "folding laundry", 19: "house cleaning", 20: "playing soccer",
    24: "rope jumping",
}
USED_COLUMNS = [imu + offset + axis for imu in IMUS.values() for offset in SENSORS.values() for axis in range(3)]


def recordings(root: Path, optional: bool):
    """(relative name, subject, is_optional) of the .dat files, Protocol first, by subject."""
    found = []
    for folder in ("Protocol", "Optional") if optional else ("Protocol",):
        for path in sorted((root / folder).glob("*.dat")) if (root / folder).is_dir() else []:
            match = re.fullmatch(r"subject1(\d\d)\.dat", path.name)
            if match is None:
                raise RawDataError(f"unexpected file {folder}/{path.name} (expected subject1NN.dat)")
            found.append((f"{folder}/{path.name}", int(match[1]), folder == "Optional"))
    return found


def fill_gaps(x: np.ndarray):
    """Linear interpolation of each column over its NaNs (edges: nearest value); returns (filled, was_missing)."""
    missing = np.isnan(x)
    filled = x.copy()
    rows = np.arange(len(x))
    for c in np.flatnonzero(missing.any(0)):
        ok = ~missing[:, c]
        filled[:, c] = np.interp(rows, rows[ok], x[ok, c]) if ok.any() else 0.0
    return filled, missing


def recording_windows(root: Path, name: str, window: int, step: int):
    """Features, activities and the count of windows dropped for missing data, of one .dat file."""
    table = read_table(root, name, COLUMNS, allow_nan=True)
    activity = table[:, 1]
    bad = np.flatnonzero(~np.isin(activity, [0, *ACTIVITIES]))
    if len(bad):
        line = line_number((root / name).read_bytes(), bad[0])
        raise RawDataError(f"{name} line {line}: activity id {activity[bad[0]]} is not a PAMAP2 activity")
    starts, lengths, values = windowing.constant_runs(activity.astype(np.int64))
    labelled = values != 0
    first, run = windowing.sliding_windows(starts[labelled], lengths[labelled], window, step)
    signals, missing = fill_gaps(table[:, USED_COLUMNS])
    rows = first[:, None] + np.arange(window)
    keep = missing[rows].mean(1).max(1) <= MAX_MISSING
    rows = rows[keep]
    windows = signals[rows].reshape(len(rows), window, len(IMUS), len(SENSORS), 3).transpose(0, 2, 3, 4, 1)
    X, names = position_features.position_table(windows, tuple(IMUS), tuple(SENSORS))
    return X, values[labelled][run][keep], names, int((~keep).sum())


def build(root: Path, window=WINDOW, step=STEP, optional=False) -> dict:
    files = recordings(root, optional)
    results = cli.parallel_map(recording_windows, [(root, name, window, step) for name, *_ in files],
                               desc="PAMAP2 recordings", max_jobs=4)
    parts = [(X, y, np.full(len(y), subject), np.full(len(y), is_optional))
             for (X, y, _, _), (_, subject, is_optional) in zip(results, files)]
    dropped = sum(result[3] for result in results)
    X, y, subject, optional_session = (np.concatenate(column) for column in zip(*parts))
    counts = ", ".join(f"{a}: {n}" for a, n in zip(*np.unique(y, return_counts=True)))
    print(f"{len(y):,} windows from {len(files)} recordings ({dropped} dropped for missing data); "
          f"per activity {counts}")
    return dict(X=X, y=y, subject=subject, feature_names=results[0][2],
                class_names={int(a): ACTIVITIES[int(a)] for a in np.unique(y)}, optional_session=optional_session)


def main(argv=None) -> int:
    p = cli.parser(PAMAP2, __doc__)
    p.add_argument("--optional", action="store_true", help="also read Optional/ (activities 9-11, 18-20)")
    p.add_argument("--window", type=int, default=WINDOW, help=f"window length in samples [{WINDOW}]")
    p.add_argument("--step", type=int, default=STEP, help=f"step between windows in samples [{STEP}]")
    args = p.parse_args(argv)
    options = f"window={args.window} step={args.step}" + (" optional" if args.optional else "")
    dataset = dataclasses.replace(PAMAP2, extractor=f"{PAMAP2.extractor} {options}")
    return cli.run(dataset, args, lambda root: build(root, args.window, args.step, args.optional))


if __name__ == "__main__":
    sys.exit(main())
