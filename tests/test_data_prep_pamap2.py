"""PAMAP2 on tiny generated releases in the official format: windows inside activity runs, NaN handling, options,
a known sine, nested archives and refusals."""
import zipfile

import numpy as np
import pytest

from data_prep import pamap2
from hdqt_cil.benchmarks import features

SINE_HZ, AMPLITUDE, OFFSET = 2.0, 1.5, 9.8  # hand accelerometer x; 2 Hz is FFT bin 10 of a 500-sample window
# activity runs (id, samples) per file; 5 s windows with a 2.5 s step
RUNS = {
    "Protocol/subject101.dat": [(0, 300), (1, 1200), (0, 100), (24, 850), (4, 520), (0, 80)],  # 3 + 2 + 1 windows
    "Protocol/subject102.dat": [(2, 1000), (0, 50)],  # 3 windows
    "Protocol/subject103.dat": [(3, 520)],  # 1 window
    "Optional/subject101.dat": [(0, 40), (9, 800)],  # 2 windows
}
LONG_GAP = ("Protocol/subject101.dat", slice(1650, 1760), 37 + 11)  # 110 NaNs of the ankle magnetometer y
SHORT_GAP = ("Protocol/subject101.dat", slice(350, 355), 20 + 7)  # 5 NaNs of the chest gyroscope x


def _recording(name, seed):
    activity = np.concatenate([np.full(n, a) for a, n in RUNS[name]])
    rows = len(activity)
    rng = np.random.default_rng(seed)
    table = rng.normal(0, 0.2, (rows, pamap2.COLUMNS))
    table[:, 0] = np.arange(rows) / pamap2.FS + 5.0
    table[:, 1] = activity
    table[:, 2] = np.where(np.arange(rows) % 11 == 0, 100.0, np.nan)  # heart rate at ~9 Hz, NaN in between
    table[:, 4] = OFFSET + AMPLITUDE * np.sin(2 * np.pi * SINE_HZ * np.arange(rows) / pamap2.FS)
    table[:, 5:7] = 0.0
    for gap_name, rows_, column in (LONG_GAP, SHORT_GAP):
        if gap_name == name:
            table[rows_, column] = np.nan
    return table


def make_release(base):
    root = base / "PAMAP2_Dataset"
    for seed, name in enumerate(RUNS):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = (" ".join("NaN" if np.isnan(v) else f"{v:.6g}" for v in row) for row in _recording(name, seed))
        path.write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture
def release(tmp_path):
    return make_release(tmp_path / "raw")


def _run(*argv):
    return pamap2.main([str(a) for a in argv])


def test_windows_nan_handling_and_the_sine(release, tmp_path, capsys):
    out = tmp_path / "pamap2.npz"
    assert _run("--raw-dir", release, "--out", out) == 0
    assert "9 windows from 3 recordings (1 dropped for missing data)" in capsys.readouterr().out
    table = features.load_feature_table(out)
    assert table.X.shape == (9, 243) and np.isfinite(table.X).all()
    assert table.y.tolist() == [1, 1, 1, 24, 4, 2, 2, 2, 3]  # the first rope-jumping window had 22 % missing
    assert table.subject.tolist() == [1] * 5 + [2] * 3 + [3]
    assert table.class_names[24] == "rope jumping" and table.feature_names[81] == "chest_acc_mean"
    row = dict(zip(table.feature_names, table.X[0]))  # holds the short gap, filled by interpolation
    assert row["hand_acc_mean"] == pytest.approx(OFFSET, abs=1e-5)
    assert row["hand_acc_std"] == pytest.approx(AMPLITUDE / np.sqrt(2) * np.sqrt(500 / 499), rel=1e-4)
    assert row["hand_acc_energy"] == pytest.approx(500 ** 2 * AMPLITUDE ** 2 / (2 * 499), rel=1e-4)
    assert {row["hand_acc_peak_bin4"], row["hand_acc_peak_bin5"]} == {10, 490}
    kept = features.filter_table(table, drop_classes=(24,), drop_subjects=(3,))
    assert kept.y.tolist() == [1, 1, 1, 4, 2, 2, 2]


def test_options_change_the_file_and_are_not_mixed_up_on_reuse(release, tmp_path, capsys):
    out = tmp_path / "pamap2.npz"
    assert _run("--raw-dir", release, "--out", out) == 0
    assert _run("--raw-dir", release, "--out", out, "--optional") == 0
    assert "recomputing" in capsys.readouterr().out
    table = features.load_feature_table(out)
    assert table.y.tolist()[-2:] == [9, 9] and table.subject.tolist()[-2:] == [1, 1]
    assert _run("--raw-dir", release, "--out", out, "--window", "1000", "--step", "500") == 0
    assert features.load_feature_table(out).y.tolist() == [1, 2]  # 10 s windows: only two runs are long enough


def test_nested_zip_as_in_the_uci_download(release, tmp_path):
    inner = tmp_path / "PAMAP2_Dataset.zip"
    with zipfile.ZipFile(inner, "w") as zf:
        for path in release.rglob("*.dat"):
            zf.write(path, path.relative_to(release.parent))
    outer = tmp_path / "pamap2.zip"
    with zipfile.ZipFile(outer, "w") as zf:
        zf.write(inner, inner.name)
    assert _run("--archive", outer, "--out", tmp_path / "p.npz") == 0
    assert len(features.load_feature_table(tmp_path / "p.npz")) == 9


@pytest.mark.parametrize("line, text, message", [
    (7, "5.06 8 NaN" + " 0.1" * 51, "Protocol/subject102.dat line 7: activity id 8.0 is not a PAMAP2 activity"),
    (3, "5.02 2 NaN" + " 0.1" * 50, "Protocol/subject102.dat line 3: expected 54 values, found 53"),
    (4, "5.03 2 NaN x" + " 0.1" * 50, "Protocol/subject102.dat line 4: 'x' is not a number"),
])
def test_malformed_lines_are_named(release, tmp_path, capsys, line, text, message):
    path = release / "Protocol/subject102.dat"
    lines = path.read_text().splitlines()
    lines[line - 1] = text
    path.write_text("\n".join(lines) + "\n")
    assert _run("--raw-dir", release, "--out", tmp_path / "p.npz") == 2
    assert message in capsys.readouterr().err
