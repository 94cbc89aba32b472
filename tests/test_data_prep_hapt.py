"""HAPT: windowing, features on a tiny generated release, refusals, idempotence; the real release when present."""
import dataclasses
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from data_prep import cli, hapt, uci_features
from hdqt_cil.benchmarks.features import load_feature_table

REAL_ARCHIVE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "hapt" / "hapt_raw.tar.xz"
ACTIVITIES = ["WALKING", "WALKING_UPSTAIRS", "WALKING_DOWNSTAIRS", "SITTING", "STANDING", "LAYING",
              "STAND_TO_SIT", "SIT_TO_STAND", "SIT_TO_LIE", "LIE_TO_SIT", "STAND_TO_LIE", "LIE_TO_STAND"]
SINE_HZ, SINE_G = 50 * 4 / 128, 0.4  # exactly FFT bin 4 of a 128-sample window; amplitude in g
# (experiment, user, activity, start, end): 300 samples → 3 windows, 100 → none, 256 → 3, 200 → 2
SEGMENTS = [(1, 1, 5, 1, 300), (1, 1, 7, 301, 400), (1, 1, 1, 401, 656), (2, 2, 1, 51, 250)]


def _write_rows(path: Path, rows, fmt="%.10g"):
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savetxt(path, np.atleast_2d(rows), fmt=fmt, delimiter=" ")


def make_release(base: Path) -> Path:
    """A two-experiment release in the official layout: subject 1 trains, subject 2 tests."""
    root = base / "HAPT Data Set"
    t = np.arange(700) / hapt.FS
    sine = SINE_G * np.sin(2 * np.pi * SINE_HZ * t)
    for experiment, user in ((1, 1), (2, 2)):
        acc = np.stack([sine, np.zeros_like(t), np.ones_like(t)], 1)  # gravity along z, motion along x
        gyro = np.stack([np.zeros_like(t), 0.5 * sine, np.zeros_like(t)], 1)
        _write_rows(root / hapt._recording("acc", experiment, user), acc)
        _write_rows(root / hapt._recording("gyro", experiment, user), gyro)
    _write_rows(root / "RawData/labels.txt", SEGMENTS, fmt="%d")
    for split, labels, subject in (("Train", [5, 5, 5, 1, 1, 1], 1), ("Test", [1, 1], 2)):
        _write_rows(root / f"{split}/y_{split.lower()}.txt", np.array(labels)[:, None], fmt="%d")
        _write_rows(root / f"{split}/subject_id_{split.lower()}.txt", np.full((len(labels), 1), subject), fmt="%d")
    (root / "activity_labels.txt").write_text("".join(f"{i} {n:<18}\n" for i, n in enumerate(ACTIVITIES, 1)))
    (root / "features.txt").write_text("".join(f"{uci_features.release_name(n):<32}\n"
                                               for n in uci_features.feature_names()))
    return root


@pytest.fixture
def release(tmp_path):
    return make_release(tmp_path / "raw")


def _run(*argv):
    return hapt.main([str(a) for a in argv])


def test_window_counts_follow_the_official_rule():
    lengths = np.array([127, 128, 191, 192, 300])
    segments = np.stack([np.ones(5), np.ones(5), np.ones(5), np.ones(5), lengths], 1).astype(np.int64)
    starts, segment = hapt.window_starts(segments)
    assert np.bincount(segment, minlength=5).tolist() == [0, 1, 1, 2, 3]
    assert starts[segment == 4].tolist() == [0, 64, 128]


def test_tiny_release_gives_official_order_and_sine_features(release, tmp_path):
    out = tmp_path / "hapt.npz"
    assert _run("--raw-dir", release.parent, "--out", out) == 0
    table = load_feature_table(out)
    with np.load(out) as npz:
        official_test = npz["official_test"]
    assert table.X.shape == (8, 561)
    assert table.y.tolist() == [5, 5, 5, 1, 1, 1, 1, 1] and table.subject.tolist() == [1] * 6 + [2] * 2
    assert official_test.tolist() == [False] * 6 + [True] * 2
    assert table.class_names[7] == "STAND_TO_SIT"
    row = dict(zip(table.feature_names, table.X[3]))  # a window away from the recording's ends
    # The sine survives the 20 Hz and gravity filters (the median filter trims its peaks by ~2 %).
    assert row["tBodyAcc-Mean-1"] == pytest.approx(0, abs=0.02)
    assert row["tBodyAcc-STD-1"] == pytest.approx(SINE_G / np.sqrt(2), rel=0.01)
    assert row["tBodyAcc-Energy-1"] == pytest.approx(SINE_G ** 2 / 2, rel=0.01)
    assert row["fBodyAcc-MaxInds-1"] == 4 and row["fBodyGyro-MaxInds-2"] == 4
    assert row["tGravityAcc-Mean-3"] == pytest.approx(1, abs=0.01)
    assert row["tZAxisAcc-AngleWRTGravity-1"] == pytest.approx(0, abs=0.01)
    assert row["tXAxisAcc-AngleWRTGravity-1"] == pytest.approx(np.pi / 2, abs=0.01)


def test_archive_and_reuse(release, tmp_path, capsys):
    archive = tmp_path / "hapt.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in release.rglob("*"):
            zf.write(path, path.relative_to(release))  # the UCI zip has no top folder
    out = tmp_path / "hapt.npz"
    assert _run("--archive", archive, "--out", out) == 0
    stamp = out.stat().st_mtime_ns
    assert _run("--archive", archive, "--out", out) == 0
    assert "reusing" in capsys.readouterr().out and out.stat().st_mtime_ns == stamp
    assert _run("--archive", archive, "--out", out, "--force") == 0 and out.stat().st_mtime_ns != stamp


def test_refuses_malformed_and_missing_files(release, tmp_path, capsys):
    acc = release / hapt._recording("acc", 2, 2)
    lines = acc.read_text().splitlines()
    lines[41] = "0.1 oops 1"
    acc.write_text("\n".join(lines) + "\n")
    assert _run("--raw-dir", release, "--out", tmp_path / "x.npz") == 2
    assert "RawData/acc_exp02_user02.txt line 42: 'oops' is not a number" in capsys.readouterr().err
    (release / hapt._recording("gyro", 1, 1)).unlink()
    assert _run("--raw-dir", release, "--out", tmp_path / "x.npz") == 2
    assert "missing file RawData/gyro_exp01_user01.txt (needed by RawData/labels.txt line 1)" in capsys.readouterr().err
    assert not (tmp_path / "x.npz").exists()


def test_labels_disagreeing_with_official_files_are_refused(release, tmp_path, capsys):
    (release / "Test/y_test.txt").write_text("1\n2\n")
    assert _run("--raw-dir", release, "--out", tmp_path / "x.npz") == 2
    assert "label of window 8 is 1 from RawData/labels.txt but 2 at Test/ row 2" in capsys.readouterr().err


def test_feature_list_in_another_order_is_refused(release, tmp_path, capsys):
    lines = (release / "features.txt").read_text().splitlines()
    lines[3], lines[4] = lines[4], lines[3]
    (release / "features.txt").write_text("\n".join(lines) + "\n")
    assert _run("--raw-dir", release, "--out", tmp_path / "x.npz") == 2
    assert "features.txt line 4: expected tBodyAcc-STD-1, found tBodyAcc-STD-2" in capsys.readouterr().err


def test_download_failure_names_url_and_target(tmp_path, capsys):
    unreachable = dataclasses.replace(hapt.HAPT, url="http://127.0.0.1:9/hapt.zip")
    args = cli.parser(unreachable, "").parse_args(["--download", "--out", str(tmp_path / "hapt.npz")])
    assert cli.run(unreachable, args, hapt.build) == 2
    err = capsys.readouterr().err
    assert "http://127.0.0.1:9/hapt.zip" in err and str(tmp_path / "downloads" / "hapt_uci.zip") in err


@pytest.fixture(scope="session")
def real_features(tmp_path_factory):
    """The full release extracted once per session (about 15 s)."""
    if not REAL_ARCHIVE.is_file():
        pytest.skip(f"the HAPT raw archive is not at {REAL_ARCHIVE}")
    out = tmp_path_factory.mktemp("hapt") / "hapt_features.npz"
    assert _run("--archive", REAL_ARCHIVE, "--out", out) == 0
    return out


def _official_labels():
    """{name: values} of the release's Train/ and Test/ label and subject files, read in one pass over the tar."""
    wanted = {f"HAPT Data Set/{split}/{kind}_{split.lower()}.txt": f"{kind}_{split.lower()}"
              for split in ("Train", "Test") for kind in ("y", "subject_id")}
    with tarfile.open(REAL_ARCHIVE, "r:xz") as tf:
        return {wanted[m.name]: np.loadtxt(tf.extractfile(m), dtype=np.int64, ndmin=1) for m in tf if m.name in wanted}


def test_real_release_windows_match_the_official_files(real_features):
    out = real_features
    table = load_feature_table(out)
    official = _official_labels()
    y = np.concatenate([official["y_train"], official["y_test"]])
    subject = np.concatenate([official["subject_id_train"], official["subject_id_test"]])
    assert table.X.shape == (10_929, 561) and np.isfinite(table.X).all()
    assert np.bincount(table.y).tolist() == np.bincount(y).tolist()
    assert (table.y == y).all() and (table.subject == subject).all()
    assert (table.X.max(0) > table.X.min(0)).all(), "every feature varies"
    with np.load(out) as npz:  # the list beside the archive was found and every file checked against it
        listing = REAL_ARCHIVE.with_name("hapt_raw.contents.sha256")
        assert str(npz["contents_check"]) == f"per-file sha256 against {listing}: 131 files verified"


def test_uci_features_take_any_window_length_and_refuse_what_they_cannot_filter():
    """561 features from windows of any length from 16 samples (bands scaled to the spectrum: the release's at
    128), a 128-sample window unchanged; a recording below 40 Hz is refused, naming its rate."""
    from data_prep import hapt, uci_features

    rng = np.random.default_rng(0)
    acc, gyro = rng.normal(size=(600, 3)) + [0, 0, 9.8], rng.normal(size=(600, 3))
    for fs, length in ((50.0, 128), (100.0, 256), (50.0, 100), (64.0, 16)):
        signals = hapt.recording_signals(acc, gyro, fs)
        windows = {name: x[None, :length].transpose(0, 2, 1) for name, x in signals.items()}
        values, names = uci_features.feature_table(windows, fs)
        assert values.shape == (1, 561) and np.isfinite(values).all() and names == uci_features.feature_names()
    assert uci_features.bands(64) == ([(lo, lo + 7) for lo in range(1, 64, 8)]
                                      + [(lo, lo + 15) for lo in range(1, 64, 16)] + [(1, 24), (25, 48)])
    with pytest.raises(ValueError, match="windows of 12 samples are too short .* at least 16"):
        uci_features.feature_table({name: np.zeros((1, 3, 12)) for name in uci_features.TIME_3AXIS}, 50.0)
    with pytest.raises(ValueError, match="sampling rate of 10 Hz is too low .* more than 40 Hz"):
        hapt.recording_signals(acc, gyro, 10.0)
