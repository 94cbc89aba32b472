"""data_prep.series on generated recordings in the time-series archive's .ts format and as NPZ arrays: windows,
both feature sets, channel roles given and taken, the release's split kept; refusals named."""
import numpy as np
import pytest

from data_prep import series
from hdqt_cil.benchmarks import features


def recordings(cases=6, channels=6, samples=200, seed=0, hz=(1.0, 2.0, 3.0)):
    """Class k's cases oscillate at hz[k] on every channel (50 Hz rate), plus noise; gravity on channel 2."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / 50.0
    y = np.arange(cases) % 3
    X = np.stack([np.sin(2 * np.pi * hz[k] * t)[None].repeat(channels, 0) for k in y])
    X = X + 0.1 * rng.normal(size=X.shape)
    X[:, 2] += 9.8
    return X, y


def write_ts(path, X, y):
    lines = ["@problemName generated", "@timeStamps false", "@univariate false", "@classLabel true walk run sit",
             "@data"]
    names = ("walk", "run", "sit")
    lines += [":".join(",".join(f"{v:.6f}" for v in channel) for channel in case) + f":{names[k]}"
              for case, k in zip(X, y)]
    path.write_text("\n".join(lines) + "\n")
    return path


def run(*argv):
    return series.main([str(a) for a in argv])


def test_ts_train_and_test_files_become_a_feature_table_with_its_split(tmp_path, capsys):
    X, y = recordings()
    train, test = write_ts(tmp_path / "g_TRAIN.ts", X, y), write_ts(tmp_path / "g_TEST.ts", *recordings(seed=1))
    assert run("--train", train, "--test", test, "--rate", 50, "--window", 100, "--step", 50,
               "--out", tmp_path / "f.npz") == 0
    out = capsys.readouterr().out
    assert "channels: sensor1=[0, 1, 2], sensor2=[3, 4, 5] (taken by default" in out
    table = features.load_feature_table(tmp_path / "f.npz")
    assert table.X.shape == (2 * 6 * 3, 2 * 27)  # 2 files × 6 cases × 3 windows; 2 sensors × 27
    assert table.class_names == {0: "run", 1: "sit", 2: "walk"} and table.subject is None
    assert table.is_test.sum() == 18 and not table.is_test[:18].any()
    train_part, test_part = features.given_split(table)
    assert len(train_part) == len(test_part) == 18


def test_npz_arrays_to_the_uci_features_with_roles(tmp_path, capsys):
    bins = (4, 8, 12)  # frequencies on the bins of a 128-sample window at 50 Hz
    X, y = recordings(channels=7, samples=256, hz=tuple(b * 50 / 128 for b in bins))
    np.savez(tmp_path / "r.npz", X=X, y=y, subject=np.arange(6) // 2)
    assert run("--train", tmp_path / "r.npz", "--rate", 50, "--window", 128, "--step", 64, "--features", "uci",
               "--roles", "acc=0,1,2", "gyro=4,5,6", "--out", tmp_path / "f.npz") == 0
    table = features.load_feature_table(tmp_path / "f.npz")
    assert table.X.shape == (6 * 3, 561) and np.isfinite(table.X).all()
    assert table.subject.tolist() == np.repeat(np.arange(6) // 2, 3).tolist() and table.is_test is None
    peak = table.X[:, table.feature_names.index("fBodyAcc-MaxInds-1")]  # each class's dominant bin
    assert peak.tolist() == [bins[k] for k in np.repeat(y, 3)]


@pytest.mark.parametrize("channels, args, message", [
    (7, ("--features", "uci"), "7 channels cannot be told apart: give --roles acc=i,j,k gyro=l,m,n"),
    (7, (), "7 channels are not a multiple of 3"),
    (6, ("--roles", "s=0,1"), "role s=[0, 1]: a sensor has 3 channels among 0..5"),
    (6, ("--window", "500"), "--window 500 is longer than the cases' 200 samples"),
    (6, ("--features", "uci", "--rate", "20"), "sampling rate of 20 Hz is too low"),
])
def test_refusals_write_nothing_and_name_the_cause(tmp_path, capsys, channels, args, message):
    write_ts(tmp_path / "t.ts", *recordings(channels=channels))
    argv = ["--train", tmp_path / "t.ts", "--out", tmp_path / "f.npz", *args]
    assert run(*argv, *(() if "--rate" in args else ("--rate", 50))) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "f.npz").exists()


def test_an_out_file_not_named_npz_is_refused(tmp_path, capsys):
    """The feature file is an NPZ archive, and the benchmarks read a file by its suffix: `--out walk.csv` would
    make a file that `benchmark.path=walk.csv` then fails to read as CSV."""
    write_ts(tmp_path / "t.ts", *recordings())
    with pytest.raises(SystemExit) as ended:
        run("--train", tmp_path / "t.ts", "--rate", 50, "--out", tmp_path / "walk.csv")
    assert ended.value.code == 2 and "walk.csv: a feature file is a NumPy .npz archive; name it .npz" in \
        capsys.readouterr().err
    assert not (tmp_path / "walk.csv").exists()


def test_unequal_cases_and_unknown_formats_are_named(tmp_path):
    bad = tmp_path / "b.ts"
    bad.write_text("@classLabel true a b\n@data\n1,2,3:a\n1,2:b\n")
    with pytest.raises(series.SeriesError, match=r"b.ts: cases of different shapes"):
        series.read_series(bad)
    with pytest.raises(series.SeriesError, match=r"unknown format '.txt'"):
        (tmp_path / "x.txt").write_text("1,2,3\n")
        series.read_series(tmp_path / "x.txt")


def test_arff_files_multivariate_and_univariate_read_as_the_ts_file(tmp_path):
    X, y = recordings(cases=4, channels=3, samples=20)
    names = ("walk", "run", "sit")
    multi = ["@relation g", "@attribute relationalAtt relational",
             *[f"@attribute t{i} numeric" for i in range(20)], "@end relationalAtt", "@attribute class {walk,run,sit}",
             "@data"]
    multi += ["'" + "\\n".join(",".join(f"{v:.6f}" for v in c) for c in case) + f"',{names[k]}"
              for case, k in zip(X, y)]
    (tmp_path / "m.arff").write_text("\n".join(multi) + "\n")
    from_arff = series.read_series(tmp_path / "m.arff")
    from_ts = series.read_series(write_ts(tmp_path / "m.ts", X, y))
    assert np.array_equal(from_arff[0], from_ts[0]) and from_arff[1].tolist() == from_ts[1].tolist()
    uni = ["@relation u", *[f"@attribute a{i} numeric" for i in range(20)], "@attribute target {walk,run,sit}",
           "@data"] + [",".join(f"{v:.6f}" for v in case[0]) + f",{names[k]}" for case, k in zip(X, y)]
    (tmp_path / "u.arff").write_text("\n".join(uni) + "\n")
    single = series.read_series(tmp_path / "u.arff")
    assert single[0].shape == (4, 1, 20) and np.array_equal(single[0][:, 0], from_ts[0][:, 0])


def test_a_csv_of_a_row_a_sample_reads_as_the_npz_arrays(tmp_path):
    import pandas as pd

    X, y = recordings(cases=4, channels=3, samples=10)
    rows = [{"case": f"c{i}", "label": int(y[i]), "subject": i // 2, **{f"ch{c}": X[i, c, t] for c in range(3)}}
            for i in range(4) for t in range(10)]
    pd.DataFrame(rows).to_csv(tmp_path / "r.csv", index=False)
    got, labels, subjects = series.read_series(tmp_path / "r.csv")
    assert np.allclose(got, X) and labels.tolist() == y.tolist() and subjects.tolist() == [0, 0, 1, 1]
    pd.DataFrame(rows[:-1]).to_csv(tmp_path / "short.csv", index=False)
    with pytest.raises(series.SeriesError, match="cases of different lengths"):
        series.read_series(tmp_path / "short.csv")


def test_help_lists_every_format_it_reads(capsys):
    with pytest.raises(SystemExit):
        series.main(["--help"])
    shown = capsys.readouterr().out
    assert all(suffix in shown for suffix in (".ts", ".arff", ".npz", ".csv")), shown
