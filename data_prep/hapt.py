"""UCI HAPT v2.1 raw recordings → the 561 UCI features of every official window → one NPZ feature file.

Windows: each labelled segment of RawData/labels.txt (start and end are inclusive, 1-based rows of the experiment's
acc/gyro files) is cut into 128-sample windows with a 64-sample step, so a segment of n samples gives
floor((n - 128) / 64) + 1 windows (none when n < 128). This reproduces the release's 10,929 windows and its
Train/Test label and subject files row for row. Rows are written in the release's order: the windows of the
training subjects (in labels.txt order), then those of the test subjects; `official_test` marks the latter.

    python -m data_prep.hapt --archive PATH/hapt_raw.tar.xz --out data/hapt_features.npz
"""
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import ndimage, signal

from . import cli, uci_features, windowing
from .sources import RawDataError, read_integers, read_table

HAPT = cli.Dataset(
    name="hapt",
    url="https://archive.ics.uci.edu/static/public/341/"
        "smartphone+based+recognition+of+human+activities+and+postural+transitions.zip",
    archive_name="hapt_uci.zip",
    archive_sha256="4ac4ae064227c07045a99551876b54d204837e995e298b6488559e209b3deb09",
    archive_bytes=79_596_192,
    marker="RawData/labels.txt",
    extractor="data_prep.hapt v1",
    n_features=561,
)
FS = 50.0  # Hz
WINDOW, STEP = 128, 64  # 2.56 s windows, 50 % overlap
LABELS = "RawData/labels.txt"


@dataclass
class Release:
    """The release's segment list and its official window labels (train windows first, then test)."""

    segments: np.ndarray  # (n, 5): experiment, user, activity, start, end
    official_y: np.ndarray
    official_subject: np.ndarray
    n_official_train: int
    class_names: dict


def _recording(kind: str, experiment: int, user: int) -> str:
    return f"RawData/{kind}_exp{experiment:02d}_user{user:02d}.txt"


def _read_lines(root: Path, name: str) -> list:
    path = root / name
    if not path.is_file():
        raise RawDataError(f"missing file {name} (looked for {path})")
    return [line.strip() for line in path.read_text(encoding="latin-1").splitlines() if line.strip()]


def read_release(root: Path) -> Release:
    """Read and check the segment list, the official labels, class names and feature names, and that every recording
    labels.txt needs is present."""
    segments = read_integers(root, LABELS, 5)
    for i, (experiment, user, activity, start, end) in enumerate(segments):
        if not 1 <= start <= end:
            raise RawDataError(f"{LABELS} line {i + 1}: segment rows {start}..{end} are not 1 <= start <= end")
        for kind in ("acc", "gyro"):
            if not (root / _recording(kind, experiment, user)).is_file():
                raise RawDataError(f"missing file {_recording(kind, experiment, user)} (needed by {LABELS} "
                                   f"line {i + 1})")
    y_train, y_test = (read_integers(root, name, 1)[:, 0] for name in ("Train/y_train.txt", "Test/y_test.txt"))
    s_train, s_test = (read_integers(root, name, 1)[:, 0]
                       for name in ("Train/subject_id_train.txt", "Test/subject_id_test.txt"))
    if len(s_train) != len(y_train) or len(s_test) != len(y_test):
        raise RawDataError("Train/ or Test/ subject and label files differ in length")
    class_names = {}
    for i, line in enumerate(_read_lines(root, "activity_labels.txt")):
        number, _, name = line.partition(" ")
        if not number.isdigit() or not name.strip():
            raise RawDataError(f"activity_labels.txt line {i + 1}: expected 'id NAME', found {line!r}")
        class_names[int(number)] = name.strip()
    _check_feature_names(_read_lines(root, "features.txt"))
    return Release(segments, np.concatenate([y_train, y_test]), np.concatenate([s_train, s_test]),
                   len(y_train), class_names)


def _check_feature_names(listed: list):
    """features.txt must list our 561 features in our order (spelled the release's way)."""
    expected = [uci_features.release_name(n) for n in uci_features.feature_names()]
    for i in range(max(len(expected), len(listed))):
        ours, theirs = (names[i] if i < len(names) else "nothing" for names in (expected, listed))
        if ours != theirs:
            raise RawDataError(f"features.txt line {i + 1}: expected {ours}, found {theirs}")


def window_starts(segments: np.ndarray):
    """0-based first rows of every window and the index of its segment, in labels.txt order."""
    return windowing.sliding_windows(segments[:, 3] - 1, segments[:, 4] - segments[:, 3] + 1, WINDOW, STEP)


NOISE_CUTOFF, GRAVITY_CUTOFF = 20.0, 0.3  # Hz, the release's low-pass filters (features_info.txt)


def recording_signals(acc: np.ndarray, gyro: np.ndarray, fs: float = FS) -> dict:
    """The five 3-axis time signals of features_info.txt for one recording sampled at `fs` Hz, each (samples, 3).

    Noise: a 3-sample median filter, then a 3rd-order Butterworth low-pass at 20 Hz. Gravity: a 3rd-order
    Butterworth low-pass at 0.3 Hz of the acceleration; body = acceleration - gravity. Filters run forward and
    backward (zero phase), so gravity does not lag the body signal. Jerk: the time derivative (central differences).
    The 20 Hz filter needs a sampling rate above 40 Hz (its cutoff below the Nyquist frequency): slower recordings
    are refused, not filtered into something else.
    """
    if not fs > 2 * NOISE_CUTOFF:
        raise ValueError(f"a sampling rate of {fs:g} Hz is too low for the UCI signals' {NOISE_CUTOFF:g} Hz noise "
                         f"filter: it needs more than {2 * NOISE_CUTOFF:g} Hz (the release's: {FS:g} Hz)")
    noise = signal.butter(3, NOISE_CUTOFF, fs=fs, output="sos")
    acc, gyro = (signal.sosfiltfilt(noise, ndimage.median_filter(x, size=(3, 1), mode="nearest"), axis=0)
                 for x in (acc, gyro))
    gravity = signal.sosfiltfilt(signal.butter(3, GRAVITY_CUTOFF, fs=fs, output="sos"), acc, axis=0)
    body = acc - gravity
    return {"tBodyAcc": body, "tGravityAcc": gravity, "tBodyAccJerk": np.gradient(body, 1 / fs, axis=0),
            "tBodyGyro": gyro, "tBodyGyroJerk": np.gradient(gyro, 1 / fs, axis=0)}


def recording_features(root: Path, experiment: int, user: int, starts: np.ndarray):
    """Features of the windows starting at rows `starts` of one experiment's recordings."""
    acc = read_table(root, _recording("acc", experiment, user), 3)
    gyro = read_table(root, _recording("gyro", experiment, user), 3)
    if len(acc) != len(gyro):
        raise RawDataError(f"{_recording('gyro', experiment, user)} has {len(gyro)} rows but "
                           f"{_recording('acc', experiment, user)} has {len(acc)}")
    if starts.max() + WINDOW > len(acc):
        raise RawDataError(f"{LABELS} marks rows up to {starts.max() + WINDOW} of experiment {experiment}, but "
                           f"{_recording('acc', experiment, user)} has only {len(acc)} rows")
    rows = starts[:, None] + np.arange(WINDOW)
    windows = {name: x[rows].transpose(0, 2, 1) for name, x in recording_signals(acc, gyro).items()}
    return uci_features.feature_table(windows, FS)


def _check_against_release(y, subject, release: Release):
    """The recomputed windows must be the release's windows: same count, labels and subjects, row for row."""
    if len(y) != len(release.official_y):
        raise RawDataError(f"{LABELS} gives {len(y):,} windows but Train/ and Test/ list "
                           f"{len(release.official_y):,}")
    for what, ours, theirs in (("label", y, release.official_y), ("subject", subject, release.official_subject)):
        diff = np.flatnonzero(ours != theirs)
        if len(diff):
            row = diff[0]
            where = (f"Train/ row {row + 1}" if row < release.n_official_train
                     else f"Test/ row {row - release.n_official_train + 1}")
            raise RawDataError(f"{what} of window {row + 1} is {ours[row]} from {LABELS} but {theirs[row]} at {where}")


def build(root: Path) -> dict:
    release = read_release(root)
    starts, segment = window_starts(release.segments)
    experiment, user = release.segments[segment, 0], release.segments[segment, 1]
    X = np.empty((len(starts), HAPT.n_features), np.float32)
    rows = [np.flatnonzero(experiment == e) for e in np.unique(experiment)]
    results = cli.parallel_map(recording_features, [(root, int(experiment[r[0]]), int(user[r[0]]), starts[r])
                                                    for r in rows], desc="HAPT experiments")
    for r, (values, names) in zip(rows, results):
        X[r] = values
    train_subjects = np.unique(release.official_subject[: release.n_official_train])
    official_test = ~np.isin(user, train_subjects)
    order = np.concatenate([np.flatnonzero(~official_test), np.flatnonzero(official_test)])
    y, subject = release.segments[segment, 2][order], user[order]
    _check_against_release(y, subject, release)
    print(f"{len(y):,} windows = {int((~official_test).sum()):,} train + {int(official_test.sum()):,} test, "
          "labels and subjects equal to the release's Train/ and Test/ files")
    return dict(X=X[order], y=y, subject=subject, feature_names=names, class_names=release.class_names,
                official_test=official_test[order], experiment=experiment[order])


def main(argv=None) -> int:
    args = cli.parser(HAPT, __doc__).parse_args(argv)
    return cli.run(HAPT, args, build)


if __name__ == "__main__":
    sys.exit(main())
