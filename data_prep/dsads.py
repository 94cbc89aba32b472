"""UCI Daily and Sports Activities (DSADS) raw segments → 405 cross-position features per segment → NPZ file.

The release holds data/a01..a19/p1..p8/s01..s60.txt: 19 activities, 8 subjects, 60 five-second segments each, every
file 125 rows (25 Hz) × 45 comma-separated columns = 5 units (torso, right arm, left arm, right leg, left leg) × 9
(x, y, z of accelerometer, gyroscope, magnetometer). Each segment is one window, as in Wang et al.'s dsads.mat
(9,120 windows): 27 features of each sensor's magnitude (`position_features`), 81 per unit, 405 in all.

The release archive (dsads_raw.tar.xz, or the UCI zip) is read as it is; its files are checked against the
per-file sha256 list beside it (dsads_raw.contents.sha256) or given with --checksums, else by the zip's CRC-32s.
The check made is printed and recorded in the feature file (`contents_check`).

    python -m data_prep.dsads --archive PATH/dsads_raw.tar.xz --out data/dsads_features.npz
    python -m data_prep.dsads --raw-dir PATH/data --checksums PATH/dsads_raw.contents.sha256 --out ...
"""
import io
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from . import cli, position_features
from .sources import RawDataError, read_table

DSADS = cli.Dataset(
    name="dsads",
    url="https://archive.ics.uci.edu/static/public/256/daily+and+sports+activities.zip",
    archive_name="dsads_uci.zip",
    archive_sha256=None,  # no published digest could be checked from here; zip CRCs are verified on unpacking
    archive_bytes=None,
    marker="a01/p1/s01.txt",
    extractor="data_prep.dsads v1",
    n_features=405,
)
FS, SAMPLES, COLUMNS = 25.0, 125, 45
UNITS = ("T", "RA", "LA", "RL", "LL")  # torso, right arm, left arm, right leg, left leg
SENSORS = ("acc", "gyro", "mag")
ACTIVITIES = {
    1: "sitting", 2: "standing", 3: "lying on back", 4: "lying on right side", 5: "ascending stairs",
    6: "descending stairs", 7: "standing in an elevator still", 8: "moving around in an elevator",
    9: "walking in a parking lot", 10: "walking on a treadmill, 4 km/h, flat",
    11: "walking on a treadmill, 4 km/h, 15 deg inclined", 12: "running on a treadmill, 8 km/h",
    13: "exercising on a stepper", 14: "exercising on a cross trainer", 15: "cycling on an exercise bike, horizontal",
    16: "cycling on an exercise bike, vertical", 17: "rowing", 18: "jumping", 19: "playing basketball",
}


def _numbered(folder: Path, pattern: str) -> dict:
    """{number: path} of the entries of `folder` named like `pattern` (e.g. a(\\d\\d)); other names are ignored."""
    return {int(m[1]): p for p in sorted(folder.iterdir()) if (m := re.fullmatch(pattern, p.name))}


def segment_files(root: Path):
    """(activity, subject, segment, relative path) of every segment file, refusing a grid with holes.

    A partial release (fewer activities, subjects or segments) is accepted as long as every activity has the same
    subjects and every subject the same segments, so a missing file is named rather than silently skipped.
    """
    activities = _numbered(root, r"a(\d\d)")
    unknown = sorted(set(activities) - set(ACTIVITIES))
    if unknown:
        raise RawDataError(f"unknown activity folder a{unknown[0]:02d} (DSADS has a01..a19)")
    subject_dirs = [p for a in activities.values() for p in _numbered(a, r"p(\d)").values()]
    subjects = sorted({int(p.name[1:]) for p in subject_dirs})
    segments = sorted({n for p in subject_dirs for n in _numbered(p, r"s(\d\d)\.txt")})
    files = [(a, s, n, f"a{a:02d}/p{s}/s{n:02d}.txt") for a in activities for s in subjects for n in segments]
    for *_, name in files:
        if not (root / name).is_file():
            raise RawDataError(f"missing file {name}")
    return files


def read_segments(root: Path, names) -> np.ndarray:
    """All segment files as one (files, 125, 45) array; parsed in one go, file by file only to name a bad one."""
    blobs = [(root / name).read_bytes() for name in names]
    try:
        table = pd.read_csv(io.BytesIO(b"\n".join(b.strip() for b in blobs)), header=None, dtype=np.float64,
                            engine="c").to_numpy()
        ok = table.shape == (len(names) * SAMPLES, COLUMNS) and np.isfinite(table).all()
    except (ValueError, pd.errors.ParserError):
        ok = False
    if ok:
        return table.reshape(len(names), SAMPLES, COLUMNS)
    for name in names:  # find and name the culprit
        rows = read_table(root, name, COLUMNS, delimiter=",")
        if len(rows) != SAMPLES:
            raise RawDataError(f"{name}: expected {SAMPLES} rows, found {len(rows)}")
    raise RawDataError("the segment files could not be read together although each reads alone")


def segment_features(root: Path, names):
    """(features, feature names) of the given segment files."""
    raw = read_segments(root, names)  # (files, samples, 45)
    signals = raw.reshape(len(raw), SAMPLES, len(UNITS), len(SENSORS), 3).transpose(0, 2, 3, 4, 1)
    return position_features.position_table(signals, UNITS, SENSORS)


def build(root: Path) -> dict:
    files = segment_files(root)
    if len(files) != 19 * 8 * 60:
        print(f"note: a partial release, {len(files):,} of the 9,120 segment files")
    activity, subject, segment = (np.array([f[i] for f in files], np.int64) for i in range(3))
    names = [f[3] for f in files]
    chunks = cli.parallel_map(segment_features, [(root, names[i: i + 1000]) for i in range(0, len(names), 1000)],
                              desc="DSADS segments")
    feature_names = chunks[0][1]
    print(f"{len(files):,} windows: {len(set(activity.tolist()))} activities × {len(set(subject.tolist()))} subjects"
          f" × {len(set(segment.tolist()))} segments")
    return dict(X=np.concatenate([X for X, _ in chunks]), y=activity, subject=subject, feature_names=feature_names,
                class_names={a: ACTIVITIES[a] for a in sorted(set(activity.tolist()))}, segment=segment)


def main(argv=None) -> int:
    args = cli.parser(DSADS, __doc__).parse_args(argv)
    return cli.run(DSADS, args, build)


if __name__ == "__main__":
    sys.exit(main())
