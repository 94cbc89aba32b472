"""The feature-table loader: formats, refusals of bad input, filtering, splits and [-1, 1] scaling."""

import numpy as np
import torch
import pandas as pd
import pytest

from hdqt_cil.config import validate
from hdqt_cil.benchmarks import features, har


def _frame(n_subjects=10, per_class=4, classes=(1, 2, 3), seed=0):
    """Every subject has `per_class` rows of every class; features are noisy functions of the class."""
    rng = np.random.default_rng(seed)
    rows = [(s, c) for s in range(1, n_subjects + 1) for c in classes for _ in range(per_class)]
    subject, label = np.array(rows).T
    return pd.DataFrame({"acc_mean": label + rng.normal(size=len(rows)), "gyro_std": rng.normal(size=len(rows)),
                         "label": label, "subject": subject})


def test_csv_parquet_and_npz_load_alike(tmp_path):
    frame = _frame()
    frame.to_csv(tmp_path / "t.csv", index=False)
    frame.to_parquet(tmp_path / "t.parquet", index=False)
    np.savez(tmp_path / "t.npz", X=frame[["acc_mean", "gyro_std"]].to_numpy(), y=frame.label.to_numpy(),
             subject=frame.subject.to_numpy(), feature_names=np.array(["acc_mean", "gyro_std"]))
    csv, parquet, npz = (features.load_feature_table(tmp_path / name) for name in ("t.csv", "t.parquet", "t.npz"))
    np.testing.assert_array_equal(csv.X, parquet.X)
    for table in (csv, npz):
        assert table.X.dtype == np.float32 and table.X.shape == (120, 2)
        assert table.y.dtype == np.int64 and table.subject.dtype == np.int64
        assert table.feature_names == ["acc_mean", "gyro_std"]
    np.testing.assert_allclose(csv.X, npz.X, rtol=1e-6)
    assert (csv.y == npz.y).all() and (csv.subject == npz.subject).all()


def test_class_names_and_no_subject(tmp_path):
    frame = _frame().drop(columns="subject")
    frame["label"] = frame.label.map({1: "walk", 2: "sit", 3: "run"})
    frame.to_csv(tmp_path / "t.csv", index=False)
    table = features.load_feature_table(tmp_path / "t.csv")
    assert table.subject is None and table.class_names == {0: "run", 1: "sit", 2: "walk"}
    with pytest.raises(ValueError, match="needs a subject column; benchmark.split=auto or random splits"):
        features.subject_split(table)


@pytest.mark.parametrize("edit, message", [
    (lambda f: f.drop(columns="label"), "has no `label` column"),
    (lambda f: f.assign(gyro_std=f.gyro_std.astype(object).where(f.index != 5, "high")),
     r"\['gyro_std'\] are not numeric; e.g. column 'gyro_std' row 6 holds 'high'"),
    (lambda f: f.assign(acc_mean=f.acc_mean.where(f.index != 7, np.inf)), "'acc_mean' is inf in row 8"),
    (lambda f: f.assign(label=f.label + 0.5), "label must hold whole numbers"),
    (lambda f: f.assign(label=f.label.astype(object).where(f.index != 9, "x")),
     r"the `label` column holds numbers and also \['x'\] \(first in row 10\)"),
    (lambda f: f.assign(label=f.label.where(f.index != 5)), "label is empty in row 6; every row needs one"),
    (lambda f: _named(f, "abc").pipe(lambda g: g.assign(label=g.label.where(g.index != 4))),
     "the `label` column is empty in row 5"),
    (lambda f: f.assign(subject=f.subject.where(f.index != 2)), "subject is empty in row 3"),
])
def test_bad_csv_is_refused(tmp_path, edit, message):
    edit(_frame()).to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(ValueError, match=message):
        features.load_feature_table(tmp_path / "bad.csv")


def test_bad_npz_and_missing_file_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"absent.npz not found; make one with `python -m data_prep"):
        features.load_feature_table(tmp_path / "absent.npz")
    np.savez(tmp_path / "a.npz", X=np.zeros(5), y=np.zeros(5, int))
    with pytest.raises(ValueError, match=r"X must be 2-D"):
        features.load_feature_table(tmp_path / "a.npz")
    np.savez(tmp_path / "b.npz", X=np.zeros((5, 2)), y=np.zeros(4, int))
    with pytest.raises(ValueError, match="5 feature rows but 4 labels"):
        features.load_feature_table(tmp_path / "b.npz")
    np.savez(tmp_path / "c.npz", features=np.zeros((5, 2)))
    with pytest.raises(ValueError, match=r"lacks the key\(s\) \['X', 'y'\]"):
        features.load_feature_table(tmp_path / "c.npz")
    (tmp_path / "d.xlsx").write_text("")
    with pytest.raises(ValueError, match="unknown feature table format"):
        features.load_feature_table(tmp_path / "d.xlsx")


def test_an_unnamed_column_such_as_a_saved_index_is_refused(tmp_path):
    """pandas writes the row index as a first column without a header unless index=False: with rows sorted by class
    it is a feature that gives the classes away."""
    _frame().to_csv(tmp_path / "with_index.csv")
    with pytest.raises(ValueError, match=r"column 'Unnamed: 0' has no header name; .*index=False"):
        features.load_feature_table(tmp_path / "with_index.csv")


def test_npz_class_names_are_numbered_as_a_csvs(tmp_path):
    frame = _named(_frame(), ("walk", "sit", "run"))
    np.savez(tmp_path / "t.npz", X=frame[["acc_mean", "gyro_std"]].to_numpy(), y=frame.label.to_numpy(str))
    npz, csv = features.load_feature_table(tmp_path / "t.npz"), features.load_feature_table(_save(frame, tmp_path))
    assert npz.class_names == csv.class_names == {0: "run", 1: "sit", 2: "walk"} and (npz.y == csv.y).all()


@pytest.mark.parametrize("arrays, message", [
    (dict(X=np.zeros((4, 2)), y=np.array([0, 1, None, 1], object)), r"y is an array of Python objects"),
    (dict(X=np.zeros((4, 2)), y=np.arange(4), feature_names=np.array(["a", "a"])),
     r"feature name\(s\) \['a'\] occur more than once"),
])
def test_npz_contents_that_cannot_be_a_table_are_named(tmp_path, arrays, message):
    np.savez(tmp_path / "t.npz", **arrays)
    with pytest.raises(ValueError, match=message):
        features.load_feature_table(tmp_path / "t.npz")


def test_files_that_are_not_csv_text_are_named(tmp_path):
    latin = tmp_path / "latin.csv"
    latin.write_bytes("f1,label\ncaf\xe9,1\n".encode("latin-1"))
    np.savez(tmp_path / "saved.npz", X=np.zeros((2, 1)), y=np.arange(2))
    (tmp_path / "saved.npz").rename(tmp_path / "npz_named.csv")
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "folder.csv").mkdir()
    for name, message in (("latin.csv", r"latin.csv is not UTF-8 text \(byte 0xe9 in line 2\)"),
                          ("npz_named.csv", r"npz_named.csv is not CSV text but a zip archive \(an NPZ\?\)"),
                          ("empty.csv", "empty.csv is empty"),
                          ("folder.csv", "folder.csv is a folder; a feature table is one")):
        with pytest.raises(ValueError, match=message):
            features.load_feature_table(tmp_path / name)


def test_parquet_without_engine_says_what_to_install(tmp_path, monkeypatch):
    def no_engine(path):
        raise ImportError("Unable to find a usable engine")
    monkeypatch.setattr(pd, "read_parquet", no_engine)
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    with pytest.raises(ImportError, match="pip install pyarrow"):
        features.load_feature_table(tmp_path / "t.parquet")


def test_filter_table_and_paper_filter():
    table = features.FeatureTable(np.zeros((6, 1), np.float32), np.array([1, 8, 2, 8, 1, 2]),
                                  np.array([7, 1, 28, 2, 3, 4]), ["f"])
    kept = features.paper_filter(table, "hapt")
    assert kept.y.tolist() == [1, 2] and kept.subject.tolist() == [3, 4]
    with pytest.raises(ValueError, match=r"cannot drop classes \[5\]"):
        features.filter_table(table, drop_classes=(5,))
    with pytest.raises(ValueError, match="no subject column"):
        features.filter_table(features.FeatureTable(table.X, table.y, None, ["f"]), drop_subjects=(1,))


def test_named_classes_are_dropped_by_name_or_number(make_cfg, tmp_path):
    path = _save(_named(_frame(), ("walk", "sit", "run")), tmp_path)  # numbered in sorted order: run 0, sit 1, walk 2
    for drop in ("[walk]", "[2]"):
        loaded = har.load(make_cfg("benchmark=features", f"benchmark.path={path}",
                                   f"benchmark.drop_classes={drop}").benchmark, 0)
        assert loaded.class_names == ["run", "sit"]
    with pytest.raises(ValueError, match=r"cannot drop classes \['emu'\]: not in the table \(classes \['0 \(run\)', "
                                         r"'1 \(sit\)', '2 \(walk\)'\]\)"):
        har.load(make_cfg("benchmark=features", f"benchmark.path={path}", "benchmark.drop_classes=[emu]").benchmark, 0)


def test_subject_split_takes_ceil_80_percent_of_subjects_by_seed(tmp_path):
    table = features.load_feature_table(_save(_frame(n_subjects=28), tmp_path))
    train, test = features.subject_split(table, 0.8, seed=1)
    assert len(set(train.subject.tolist())) == 23 and len(set(test.subject.tolist())) == 5
    assert not set(train.subject.tolist()) & set(test.subject.tolist())
    again, _ = features.subject_split(table, 0.8, seed=1)
    other, _ = features.subject_split(table, 0.8, seed=2)
    assert (again.subject == train.subject).all() and set(other.subject.tolist()) != set(train.subject.tolist())
    assert len(set(features.subject_split(features.load_feature_table(_save(_frame(n_subjects=10), tmp_path)),
                                          0.7, seed=0)[0].subject.tolist())) == 7  # 0.7 × 10 is 7, not 8


def test_a_class_without_test_samples_is_refused(tmp_path):
    frame = _frame(n_subjects=5)
    frame = frame[(frame.label != 3) | (frame.subject == 1)]  # class 3 only from subject 1
    table = features.load_feature_table(_save(frame, tmp_path))
    seed = next(s for s in range(100) if 1 in features.subject_split(
        features.filter_table(table, drop_classes=(3,)), 0.8, s)[0].subject)
    with pytest.raises(ValueError, match=r"^class 3: no test samples with the subject split of seed .*; drop them "
                                         r"\(benchmark.drop_classes=\[3\]\) or choose another seed"):
        features.subject_split(table, 0.8, seed)


def test_a_class_of_one_row_cannot_be_split_at_random_whatever_the_seed():
    lonely = features.FeatureTable(np.zeros((6, 1), np.float32), np.array([1, 1, 1, 1, 2, 3]), None, ["f"],
                                   class_names={1: "walk", 2: "emu", 3: "sit"})
    with pytest.raises(ValueError, match=r"^classes 2 \('emu'\), 3 \('sit'\): one row; a random split needs two of "
                                         r"a class .*benchmark.drop_classes=\[2, 3\]"):
        features.random_split(lonely)


def test_random_split_is_stratified(tmp_path):
    table = features.load_feature_table(_save(_frame(), tmp_path))
    train, test = features.random_split(table, 0.75, seed=0)
    assert np.bincount(train.y).tolist() == [0, 30, 30, 30] and np.bincount(test.y).tolist() == [0, 10, 10, 10]


def test_minmax_is_fitted_on_train_only():
    X = np.array([[0, 5, 1], [10, 5, 2], [5, 5, 3]], np.float32)
    train = features.FeatureTable(X[:2], np.array([0, 1]), None, ["a", "b", "c"])
    test = features.FeatureTable(X[2:], np.array([0]), None, ["a", "b", "c"])
    scaled_train, scaled_test = features.minmax_normalise(train, test)
    np.testing.assert_allclose(scaled_train.X, [[-1, 0, -1], [1, 0, 1]])
    np.testing.assert_allclose(scaled_test.X, [[0, 0, 3]])  # outside the training range: not clipped


def test_features_benchmark_reads_a_csv(make_cfg, tmp_path):
    path = _save(_frame(n_subjects=10, classes=(1, 2, 3, 4)), tmp_path, "mine.csv")
    cfg = make_cfg("benchmark=features", f"benchmark.path={path}")
    loaded = har.load(cfg.benchmark, seed=0)
    train, test = loaded.train, loaded.test
    assert loaded.class_names == ["1", "2", "3", "4"] and len(train) == 8 * 16 and len(test) == 2 * 16
    assert float(train.inputs.min()) == -1.0 and float(train.inputs.max()) == 1.0
    assert loaded.split.startswith("by subject, drawn by seed 0: test subjects [")


def _save(frame, tmp_path, name="t.csv"):
    frame.to_csv(tmp_path / name, index=False)
    return tmp_path / name


@pytest.mark.parametrize("name,content,message", [
    ("header_only.csv", "f1,label\n", r"header_only.csv: no rows, only the header \['f1', 'label'\]"),
    ("text.npz", "not an archive", r"text.npz is not a NumPy .npz archive .*numpy.savez with X"),
])
def test_unreadable_tables_name_the_file_and_what_is_wrong(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        features.load_feature_table(path)


def test_a_cut_short_npz_is_named(tmp_path):
    path = tmp_path / "features.npz"
    np.savez(path, X=np.random.default_rng(0).normal(size=(400, 30)), y=np.arange(400) % 4)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"features.npz is (not a NumPy .npz archive .*or is cut short|damaged or "
                                         r"cut short)"):
        features.load_feature_table(path)


def test_a_single_array_saved_as_npz_is_named(tmp_path):
    path = tmp_path / "one.npz"
    with open(path, "wb") as handle:
        np.save(handle, np.zeros(3))
    with pytest.raises(ValueError, match="one.npz holds a single .npy array, not an .npz archive"):
        features.load_feature_table(path)


def test_a_run_folder_is_identified_by_its_datas_contents_not_their_place(make_cfg, tmp_path):
    """The same config on the same contents elsewhere reuses the finished run; on other contents at the same
    place it is refused, naming both fingerprints (a table must never show another dataset's numbers)."""
    from hdqt_cil.experiment import run

    frame = _frame(n_subjects=10, classes=(1, 2, 3, 4))
    first_path = _save(frame, tmp_path, "mine.csv")
    overrides = ("benchmark=features", "strategy=naive", "trainer.epochs=1", "trainer.device=cpu")
    first = run(make_cfg(*overrides, f"benchmark.path={first_path}"), tmp_path / "run")
    (tmp_path / "elsewhere").mkdir()
    moved = _save(frame, tmp_path / "elsewhere", "copy.csv")
    assert run(make_cfg(*overrides, f"benchmark.path={moved}"), tmp_path / "run") == first
    changed = frame.assign(acc_mean=frame.acc_mean + np.random.default_rng(1).normal(size=len(frame)))
    _save(changed, tmp_path, "mine.csv")
    with pytest.raises(FileExistsError, match=rf"other data \(contents fingerprint {first['data_fingerprint']}; "
                                              r"this run's data: [0-9a-f]{16}\)"):
        run(make_cfg(*overrides, f"benchmark.path={first_path}"), tmp_path / "run")


def _named(frame, names):
    """The frame's classes 1, 2, ... named (a `label` column of text)."""
    return frame.assign(label=frame.label.map(dict(enumerate(names, start=1))))


@pytest.mark.parametrize("seed", [0, 3, 7])
def test_the_datas_own_split_is_kept_exactly_for_every_seed(make_cfg, tmp_path, seed):
    """A `split` column (train/test) or a separate test table: the same rows test, whatever the seed."""
    frame = _named(_frame(n_subjects=2, classes=(1, 2, 3), per_class=5), ("walk", "run", "sit"))
    frame["split"] = np.where(frame.subject == 2, "test", "train")
    marked = _save(frame, tmp_path, "marked.csv")
    loaded = har.load(make_cfg("benchmark=features", f"benchmark.path={marked}", "benchmark.split=given").benchmark,
                      seed)
    assert len(loaded.train) == len(loaded.test) == 15 and loaded.split == "the data's own: the `split` column"
    train_only = _save(frame[frame.split == "train"].drop(columns="split"), tmp_path, "train.csv")
    test_path = _save(frame[frame.split == "test"].drop(columns="split"), tmp_path, "test.csv")
    separate = har.load(make_cfg("benchmark=features", f"benchmark.path={train_only}", "benchmark.split=given",
                                 f"benchmark.test_path={test_path}").benchmark, seed)
    assert separate.class_names == loaded.class_names == ["run", "sit", "walk"]
    assert torch.equal(separate.test.inputs, loaded.test.inputs) and separate.test.targets == loaded.test.targets


@pytest.mark.parametrize("change, message", [
    (lambda f: f.assign(split=np.where(f.subject == 2, "val", "train")), r"holds \['val'\]; it must say train or test"),
    (lambda f: f.drop(columns="split"), "benchmark.split=given needs a `split` column"),
    (lambda f: f.assign(split="train"), r"^classes 1, 2: no test samples with the table's `split` column; drop them "
                                        r"\(benchmark.drop_classes=\[1, 2\]\) or mark some of their rows"),
])
def test_a_given_split_that_is_not_one_is_refused(make_cfg, tmp_path, change, message):
    frame = _frame(n_subjects=2, classes=(1, 2))
    frame["split"] = np.where(frame.subject == 2, "test", "train")
    path = _save(change(frame), tmp_path)
    with pytest.raises(ValueError, match=message):
        har.load(make_cfg("benchmark=features", f"benchmark.path={path}", "benchmark.split=given").benchmark, 0)


def test_a_test_table_must_match_the_training_table(make_cfg, tmp_path):
    frame = _named(_frame(n_subjects=2, classes=(1, 2)), ("a", "b"))
    train = _save(frame[frame.subject == 1], tmp_path, "train.csv")
    cfg = ("benchmark=features", f"benchmark.path={train}", "benchmark.split=given")
    unseen = _save(frame[frame.subject == 2].assign(label="c"), tmp_path, "unseen.csv")
    with pytest.raises(ValueError, match=r"classes the training table has not: \['c'\]"):
        har.load(make_cfg(*cfg, f"benchmark.test_path={unseen}").benchmark, 0)
    test = frame[frame.subject == 2]
    for edited, differs in ((test.rename(columns={"gyro_std": "other"}),
                             r"lacks \['gyro_std'\]; has \['other'\] the training table has not"),
                            (test.drop(columns="gyro_std"), r"lacks \['gyro_std'\]; it needs"),
                            (test[["gyro_std", "acc_mean", "label", "subject"]],
                             r"holds them in another order \(column 1: 'gyro_std', training table: 'acc_mean'\)")):
        with pytest.raises(ValueError, match=rf"^the test table {differs}"):
            har.load(make_cfg(*cfg, f"benchmark.test_path={_save(edited, tmp_path, 'other.csv')}").benchmark, 0)
    with pytest.raises(FileNotFoundError, match=r"^benchmark.test_path=.*absent.csv: no such file .*point "
                                                r"benchmark.test_path at"):
        har.load(make_cfg(*cfg, f"benchmark.test_path={tmp_path / 'absent.csv'}").benchmark, 0)
    with pytest.raises(ValueError, match=r"test_path='x.csv' is the data's own test set: it needs "
                                         r"benchmark.split=given or auto \(got benchmark.split=random\)"):
        validate(make_cfg("benchmark=features", f"benchmark.path={train}", "benchmark.test_path=x.csv",
                          "benchmark.split=random"))


@pytest.mark.parametrize("columns, made", [
    (("subject", "split"), "the data's own: the `split` column"),
    (("subject",), "by subject, drawn by seed 0"),
    ((), "at random, stratified by class"),
])
def test_split_auto_takes_the_tables_own_split_else_subjects_else_random(make_cfg, tmp_path, columns, made):
    """What a researcher's table holds decides (benchmark.split=auto, the default), and the run says which."""
    frame = _frame(n_subjects=6, classes=(1, 2))
    frame["split"] = np.where(frame.subject == 6, "test", "train")
    path = _save(frame[["acc_mean", "gyro_std", "label", *columns]], tmp_path)
    loaded = har.load(make_cfg("benchmark=features", f"benchmark.path={path}").benchmark, 0)
    assert loaded.split.startswith(made) and loaded.split.endswith("(benchmark.split=auto)"), loaded.split
    if "split" in columns:
        assert len(loaded.test) == 8


def test_a_split_that_discards_the_tables_own_is_said(make_cfg, tmp_path, caplog):
    frame = _frame(n_subjects=4, classes=(1, 2))
    frame["split"] = np.where(frame.subject == 4, "test", "train")
    path = _save(frame, tmp_path)
    with caplog.at_level("WARNING"):
        har.load(make_cfg("benchmark=features", f"benchmark.path={path}", "benchmark.split=random").benchmark, 0)
    assert f"{path} has its own `split` column; benchmark.split=random ignores it" in caplog.text
    caplog.clear()
    har.load(make_cfg("benchmark=features", f"benchmark.path={path}", "benchmark.split=given").benchmark, 0)
    assert "ignores it" not in caplog.text and "not used" not in caplog.text
    har.load(make_cfg("benchmark=features", f"benchmark.path={path}", "benchmark.train_fraction=0.5").benchmark, 0)
    assert "benchmark.train_fraction=0.5 is not used: the data's own split decides" in caplog.text


def test_a_feature_file_without_subjects_but_with_its_split_is_saved_and_read(tmp_path):
    from data_prep import feature_file

    X, y = np.arange(12, dtype=np.float32).reshape(6, 2), np.array([0, 1, 0, 1, 0, 1])
    feature_file.save(tmp_path / "f.npz", X=X, y=y, feature_names=["a", "b"], class_names={0: "sit", 1: "walk"},
                      extractor="test", contents_check="none", split=["train"] * 4 + ["test"] * 2)
    table = features.load_feature_table(tmp_path / "f.npz")
    assert table.subject is None and table.is_test.tolist() == [False] * 4 + [True] * 2
    train, test = features.given_split(table)
    assert test.X.tolist() == [[8, 9], [10, 11]] and table.class_names == {0: "sit", 1: "walk"}


def test_own_data_named_gets_its_folders_and_table_rows(make_cfg, tmp_path):
    from hdqt_cil.experiment import run, run_table

    path = _save(_frame(n_subjects=10, classes=(1, 2, 3, 4)), tmp_path, "mine.csv")
    cfg = make_cfg("benchmark=features", f"benchmark.path={path}", "benchmark.name=wisdm", "strategy=naive",
                   "trainer.epochs=1", "trainer.device=cpu")
    assert cfg.benchmark.loader == "features"
    folder = tmp_path / "runs" / "wisdm-mlp" / "naive" / "fp32" / "seed0"
    summary = run(cfg, folder)
    assert summary["run"]["benchmark"] == "wisdm" and "| wisdm | class | mlp | naive | fp32 |" in run_table(folder)


def test_seeds_split_the_subjects_differently_yet_count_as_runs_on_the_same_data(make_cfg, tmp_path):
    """Each seed draws its own subject split and scaling (other training sets, other run fingerprints); the tables
    still average the seeds in one row, while a changed feature file makes a row of its own."""
    from hdqt_cil.experiment import run
    from hdqt_cil.results.tables import aggregate, collect_runs

    frame = _frame(n_subjects=10, classes=(1, 2, 3, 4))
    common = ["benchmark=features", "benchmark.name=mine", "strategy=naive", "trainer.epochs=1", "trainer.device=cpu"]
    summaries = [run(make_cfg(*common, f"benchmark.path={_save(frame, tmp_path, 'a.csv')}", f"seed={seed}"),
                     tmp_path / "runs" / f"seed{seed}") for seed in (0, 1)]
    assert summaries[0]["data_fingerprint"] != summaries[1]["data_fingerprint"]
    assert summaries[0]["data_source"] == summaries[1]["data_source"]
    changed = frame.copy()
    changed.loc[0, "gyro_std"] += 1.0
    run(make_cfg(*common, f"benchmark.path={_save(changed, tmp_path, 'b.csv')}"), tmp_path / "runs" / "changed")
    agg = aggregate(collect_runs(tmp_path / "runs"))
    assert sorted(agg.seeds.tolist()) == [1, 2]
