"""DSADS on tiny generated releases in the official layout: counts, shapes, filtering, a known sine, content checks,
refusals; the real release archive (shared/data/dsads) when present: shape, counts, checksums, features recomputed here.
"""
import contextlib
import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import SHARED_DATA
from data_prep import dsads
from hdqt_cil.benchmarks import features

REAL_ARCHIVE = SHARED_DATA / "dsads" / "dsads_raw.tar.xz"
REAL_LIST = SHARED_DATA / "dsads" / "dsads_raw.contents.sha256"
# segments whose features are recomputed here, all early in the archive so that reading them stops soon
SAMPLED = {"data/a01/p1/s01.txt": (1, 1, 1), "data/a01/p8/s60.txt": (1, 8, 60), "data/a02/p5/s17.txt": (2, 5, 17)}
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


def _run(*argv):
    return dsads.main([str(a) for a in argv])


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_checksum_list(release: Path, path: Path) -> Path:
    """`sha256sum` lines of every generated file, named as in the archive (data/aNN/pM/sKK.txt)."""
    path.write_text("".join(f"{_sha256(f)}  {f.relative_to(release.parent).as_posix()}\n"
                            for f in sorted(release.rglob("*.txt"))))
    return path


def contents_check(feature_file: Path) -> str:
    with np.load(feature_file) as npz:
        return str(npz["contents_check"])


def test_one_window_per_segment_and_the_sine(release, tmp_path, capsys):
    out = tmp_path / "dsads.npz"
    assert _run("--raw-dir", release.parent, "--out", out) == 0
    assert "contents: not checked (no per-file sha256 list" in capsys.readouterr().out
    assert contents_check(out).startswith("not checked")
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


def test_uci_zip_with_crlf_lines_gives_the_same_features_and_its_crcs_are_checked(release, tmp_path, capsys):
    archive = tmp_path / "dsads.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(release.rglob("*.txt")):
            zf.writestr(path.relative_to(release.parent).as_posix(), path.read_text().replace("\n", "\r\n"))
    assert _run("--archive", archive, "--out", tmp_path / "zip.npz") == 0
    assert _run("--raw-dir", release, "--out", tmp_path / "folder.npz") == 0
    from_zip, from_folder = (features.load_feature_table(tmp_path / f"{n}.npz") for n in ("zip", "folder"))
    assert from_zip.X.shape == (18, 405) and (from_zip.X == from_folder.X).all()
    expected = "zip CRC-32 of every member verified on unpacking (18 files; no per-file sha256 list)"
    assert f"contents: {expected}\n" in capsys.readouterr().out and contents_check(tmp_path / "zip.npz") == expected


def test_tar_xz_is_checked_against_the_list_beside_it(release, tmp_path, capsys):
    archive = tmp_path / "dsads_raw.tar.xz"
    with tarfile.open(archive, "w:xz") as tf:
        tf.add(release, "data")
    listing = write_checksum_list(release, tmp_path / "dsads_raw.contents.sha256")
    assert _run("--archive", archive, "--out", tmp_path / "d.npz") == 0
    expected = f"per-file sha256 against {listing}: 18 files verified"
    assert f"contents: {expected}\n" in capsys.readouterr().out and contents_check(tmp_path / "d.npz") == expected


def test_folder_of_any_name_is_checked_against_a_given_list(release, tmp_path, capsys):
    listing = write_checksum_list(release, tmp_path / "list.sha256")  # names data/aNN/...
    renamed = release.rename(release.with_name("segments"))
    (renamed / "notes.txt").write_text("not part of the release\n")
    assert _run("--raw-dir", renamed, "--checksums", listing, "--out", tmp_path / "d.npz") == 0
    assert (f"contents: per-file sha256 against {listing}: 18 files verified; files not in the list (unchecked): 1"
            in capsys.readouterr().out)


def _change_a_digit(path: Path):
    path.write_text(path.read_text().replace("0", "1", 1))


@pytest.mark.parametrize("name, damage, message", [
    ("a19/p2/s01.txt", _change_a_digit, "data/a19/p2/s01.txt: sha256 {found}, expected {listed} (listed in {list})"),
    ("a02/p8/s02.txt", Path.unlink, "missing file data/a02/p8/s02.txt (listed in {list} with sha256 {listed})"),
])
def test_file_differing_from_the_list_is_refused(release, tmp_path, capsys, name, damage, message):
    listing = write_checksum_list(release, tmp_path / "list.sha256")
    listed = _sha256(release / name)
    damage(release / name)
    found = _sha256(release / name) if (release / name).exists() else None
    assert found != listed
    assert _run("--raw-dir", release, "--checksums", listing, "--out", tmp_path / "d.npz") == 2
    assert message.format(found=found, listed=listed, list=listing) in capsys.readouterr().err
    assert not (tmp_path / "d.npz").exists()


@pytest.mark.parametrize("lines, message", [
    (["{digest}  data/a01/p1/s01.txt", "not a checksum line"],
     "line 2: expected '<64 hex digits>  <path>', found 'not a checksum line'"),
    (["{digest}  HAPT Data Set/RawData/labels.txt"], "does not list a01/p1/s01.txt, so it is not a list of this release"),
])
def test_list_of_another_form_or_release_is_refused(release, tmp_path, capsys, lines, message):
    listing = tmp_path / "list.sha256"
    listing.write_text("\n".join(lines).format(digest=_sha256(release / "a01/p1/s01.txt")) + "\n")
    assert _run("--raw-dir", release, "--checksums", listing, "--out", tmp_path / "d.npz") == 2
    assert f"{listing} {message}" in capsys.readouterr().err


def _flip_a_byte_of(archive: Path, member: bytes):
    data = bytearray(archive.read_bytes())
    data[data.index(member) + 100] ^= 1
    archive.write_bytes(bytes(data))


def test_damaged_archives_are_refused_naming_where_reading_stopped(release, tmp_path, capsys):
    zipped = tmp_path / "dsads.zip"
    with zipfile.ZipFile(zipped, "w") as zf:  # stored, so a member's bytes appear as they are
        for path in sorted(release.rglob("*.txt")):
            zf.write(path, path.relative_to(release.parent))
    _flip_a_byte_of(zipped, (release / "a02/p1/s02.txt").read_bytes())
    assert _run("--archive", zipped, "--out", tmp_path / "d.npz") == 2
    assert (f"{zipped} is damaged or incomplete: reading stopped near member data/a02/p1/s02.txt (Bad CRC-32"
            in capsys.readouterr().err)
    truncated = tmp_path / "dsads_raw.tar.xz"
    with tarfile.open(truncated, "w:xz") as tf:
        tf.add(release, "data")
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    assert _run("--archive", truncated, "--out", tmp_path / "d.npz") == 2
    err = capsys.readouterr().err
    assert f"{truncated} is damaged or incomplete: reading stopped near member data/a" in err
    assert "end-of-stream marker" in err and "expected an intact .zip or .tar.* of the release" in err
    (tmp_path / "junk.zip").write_bytes(b"not an archive")
    assert _run("--archive", tmp_path / "junk.zip", "--out", tmp_path / "d.npz") == 2
    assert "junk.zip is neither a zip nor a tar archive" in capsys.readouterr().err
    assert not (tmp_path / "d.npz").exists()


def _replace_line(path: Path, number: int, edit):
    lines = path.read_text().splitlines()
    lines[number - 1] = edit(lines[number - 1])
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("damage, message", [
    (lambda r: (r / "a02/p8/s02.txt").unlink(), "missing file a02/p8/s02.txt"),
    (lambda r: _replace_line(r / "a19/p2/s01.txt", 1, lambda line: line.replace(",", ";")),
     "a19/p2/s01.txt line 1: expected 45 values, found 1"),
    (lambda r: _replace_line(r / "a01/p2/s01.txt", 7, lambda line: line + ",0.5"),
     "a01/p2/s01.txt line 7: expected 45 values, found 46"),
    (lambda r: (r / "a01/p1/s02.txt").write_text("\n".join((r / "a01/p1/s02.txt").read_text().splitlines()[:124])),
     "a01/p1/s02.txt: expected 125 rows, found 124"),
])
def test_damaged_release_is_refused(release, tmp_path, capsys, damage, message):
    damage(release)
    assert _run("--raw-dir", release, "--out", tmp_path / "d.npz") == 2
    assert message in capsys.readouterr().err


@pytest.fixture(scope="module")
def real_release(tmp_path_factory):
    """The whole release archive converted once, as a user runs it: (feature file, printed output)."""
    if not REAL_ARCHIVE.is_file():
        pytest.skip(f"the DSADS release archive is not at {REAL_ARCHIVE}")
    out = tmp_path_factory.mktemp("dsads") / "dsads_features.npz"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert _run("--archive", REAL_ARCHIVE, "--out", out) == 0
    return out, printed.getvalue()


@pytest.fixture(scope="module")
def real_segments(real_release):
    """{name: bytes} of the SAMPLED segment files, read straight from the archive (stopping once all are found)."""
    found = {}
    with tarfile.open(REAL_ARCHIVE, "r:xz") as tf:
        for member in tf:
            if member.name in SAMPLED:
                found[member.name] = tf.extractfile(member).read()
                if len(found) == len(SAMPLED):
                    break
    return found


def test_real_release_gives_9120_windows_of_19_activities_and_8_subjects(real_release):
    out, _ = real_release
    table = features.load_feature_table(out)
    with np.load(out) as npz:
        segment = npz["segment"]
    assert table.X.shape == (9_120, 405) and np.isfinite(table.X).all()
    assert np.bincount(table.y).tolist() == [0] + [480] * 19 and len(table.class_names) == 19
    assert np.bincount(table.subject).tolist() == [0] + [1_140] * 8
    assert np.bincount(segment).tolist() == [0] + [152] * 60
    assert table.class_names[1] == "sitting" and table.class_names[19] == "playing basketball"
    assert (table.X.max(0) > table.X.min(0)).all(), "every feature varies"


def test_real_release_is_checked_file_by_file_against_its_list(real_release, real_segments):
    out, printed = real_release
    expected = f"per-file sha256 against {REAL_LIST}: 9,120 files verified"
    assert f"contents: {expected}\n" in printed and contents_check(out) == expected
    listed = {name: digest for digest, name in (line.split("  ", 1) for line in REAL_LIST.read_text().splitlines())}
    grid = {f"data/a{a:02d}/p{p}/s{s:02d}.txt" for a in range(1, 20) for p in range(1, 9) for s in range(1, 61)}
    assert set(listed) == grid
    for name, data in real_segments.items():
        assert hashlib.sha256(data).hexdigest() == listed[name]


def magnitude_features(x: np.ndarray) -> dict:
    """Some of the 27 features of one magnitude signal, from their definitions (docs/data.md), for N = 125."""
    n = len(x)
    one_sided = np.abs(np.fft.rfft(x))[1:]  # bins 1..62; the two-sided bins 63..124 mirror them
    return {"mean": x.mean(), "std": x.std(ddof=1), "min": x.min(), "range": x.max() - x.min(),
            "mean_crossings": np.count_nonzero(np.diff(np.sign(x - x.mean()))), "dc": abs(x.sum()),
            "energy": (n * np.sum(x ** 2) - x.sum() ** 2) / (n - 1),  # Parseval: mean |X_k|² over k = 1..N-1
            "peak5": one_sided.max(), "amp_mean": one_sided.mean(),
            "shape_mean": np.sum(np.arange(1, len(one_sided) + 1) * one_sided) / one_sided.sum()}


def test_real_features_equal_a_computation_from_the_raw_files(real_release, real_segments):
    out = real_release[0]
    table = features.load_feature_table(out)
    with np.load(out) as npz:
        segment = npz["segment"]
    units, sensors = ("T", "RA", "LA", "RL", "LL"), ("acc", "gyro", "mag")  # the release's column order
    for name, (activity, subject, number) in SAMPLED.items():
        raw = np.loadtxt(io.BytesIO(real_segments[name]), delimiter=",")
        assert raw.shape == (125, 45)
        (row,) = np.flatnonzero((table.y == activity) & (table.subject == subject) & (segment == number))
        values = dict(zip(table.feature_names, table.X[row].astype(np.float64)))
        for unit, sensor in (("T", "acc"), ("RA", "gyro"), ("LL", "mag")):
            first = 9 * units.index(unit) + 3 * sensors.index(sensor)
            x = np.sqrt(np.sum(raw[:, first: first + 3] ** 2, axis=1))
            for feature, expected in magnitude_features(x).items():
                assert values[f"{unit}_{sensor}_{feature}"] == pytest.approx(expected, rel=1e-5), (name, unit, feature)
