"""DSADS on tiny generated releases in the official layout: counts, shapes, filtering, a known sine, refusals."""
import zipfile

import numpy as np
import pytest

from data_prep import dsads
from hdqt_cil.data import features

ACTIVITIES, SUBJECTS, SEGMENTS = (1, 2, 19), (1, 2, 8), (1, 2)
BIN, AMPLITUDE, OFFSET = 10, 0.8, 9.8  # torso accelerometer x: 9.8 + 0.8 sin at FFT bin 10 (2 Hz)


def make_release(base):
    """data/aNN/pN/sNN.txt: 125 rows × 45 comma-separated values, as in the UCI zip."""
    root = base / "data"
    t = np.arange(dsads.SAMPLES)
    for a in ACTIVITIES:
        for p in SUBJECTS:
            for s in SEGMENTS:
                values = np.random.default_rng(a * 100 + p * 10 + s).normal(0, 0.1, (dsads.SAMPLES, dsads.COLUMNS))
                values[:, 0] = OFFSET + AMPLITUDE * np.sin(2 * np.pi * BIN * t / dsads.SAMPLES + 0.3)
                values[:, 1:3] = 0.0
                path = root / f"a{a:02d}" / f"p{p}" / f"s{s:02d}.txt"
                path.parent.mkdir(parents=True, exist_ok=True)
                np.savetxt(path, values, fmt="%.6f", delimiter=",")
    return root


@pytest.fixture
def release(tmp_path):
    return make_release(tmp_path / "raw")


def test_one_window_per_segment_and_the_sine(release, tmp_path):
    out = tmp_path / "dsads.npz"
    assert dsads.main(["--raw-dir", str(release.parent), "--out", str(out)]) == 0
    table = features.load_feature_table(out)
    n = len(ACTIVITIES) * len(SUBJECTS) * len(SEGMENTS)
    assert table.X.shape == (n, 405) and np.isfinite(table.X).all()
    assert np.bincount(table.y).tolist()[1:] == [6, 6] + [0] * 16 + [6]
    assert sorted(set(table.subject.tolist())) == list(SUBJECTS) and table.class_names[19] == "playing basketball"
    row = dict(zip(table.feature_names, table.X[0]))
    assert row["T_acc_mean"] == pytest.approx(OFFSET, abs=1e-5)
    assert row["T_acc_std"] == pytest.approx(AMPLITUDE / np.sqrt(2) * np.sqrt(125 / 124), rel=1e-4)
    assert row["T_acc_energy"] == pytest.approx(125 ** 2 * AMPLITUDE ** 2 / (2 * 124), rel=1e-4)
    assert {row["T_acc_peak_bin4"], row["T_acc_peak_bin5"]} == {BIN, 125 - BIN}
    assert min(row["T_acc_peak_bin5"], 125 - row["T_acc_peak_bin5"]) * dsads.FS / dsads.SAMPLES == 2.0  # Hz
    kept = features.filter_table(table, drop_classes=(19,), drop_subjects=(8,))
    assert len(kept) == 2 * 2 * 2 and set(kept.y.tolist()) == {1, 2} and 8 not in kept.subject
    train, test = features.subject_split(kept, 0.5, seed=0)
    assert len(set(train.subject.tolist())) == 1 and len(train) == len(test) == 4


def test_zip_archive_is_read(release, tmp_path):
    archive = tmp_path / "dsads.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in release.rglob("*.txt"):
            zf.write(path, path.relative_to(release.parent))
    assert dsads.main(["--archive", str(archive), "--out", str(tmp_path / "d.npz")]) == 0
    assert features.load_feature_table(tmp_path / "d.npz").X.shape == (18, 405)


@pytest.mark.parametrize("damage, message", [
    (lambda r: (r / "a02/p8/s02.txt").unlink(), "missing file a02/p8/s02.txt"),
    (lambda r: (r / "a19/p2/s01.txt").write_text((r / "a19/p2/s01.txt").read_text().replace(",", ";", 45)),
     "a19/p2/s01.txt line 1: expected 45 values, found 1"),
    (lambda r: (r / "a01/p1/s02.txt").write_text("\n".join((r / "a01/p1/s02.txt").read_text().splitlines()[:124])),
     "a01/p1/s02.txt: expected 125 rows, found 124"),
])
def test_damaged_release_is_refused(release, tmp_path, capsys, damage, message):
    damage(release)
    assert dsads.main(["--raw-dir", str(release), "--out", str(tmp_path / "d.npz")]) == 2
    assert message in capsys.readouterr().err
