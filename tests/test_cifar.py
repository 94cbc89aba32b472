"""The CIFAR loaders on generated files in torchvision's exact pickle format and in the JPEG-folder format."""
import hashlib
import io
import logging
import pickle
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from torchvision import datasets

from hdqt_cil.benchmarks import cifar
from hdqt_cil.experiment import run

ROOT = Path(__file__).resolve().parents[1]


def write_torchvision_cifar(root, name, per_class_train=3, per_class_test=1, seed=0):
    """Tiny files laid out and pickled exactly as torchvision's CIFAR-10/100 (latin1 pickles, uint8 rows)."""
    tv = {"cifar10": datasets.CIFAR10, "cifar100": datasets.CIFAR100}[name]
    n_classes = 10 if name == "cifar10" else 100
    label_key = "labels" if name == "cifar10" else "fine_labels"
    folder = root / tv.base_folder
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    expected = {}
    for split, entries, per_class in (("train", tv.train_list, per_class_train),
                                      ("test", tv.test_list, per_class_test)):
        labels = np.repeat(np.arange(n_classes), per_class)
        rng.shuffle(labels)
        chunks = np.array_split(np.arange(len(labels)), len(entries))
        xs = []
        for (file_name, _), idx in zip(entries, chunks):
            data = rng.integers(0, 256, size=(len(idx), 3072), dtype=np.uint8)
            xs.append(data)
            with open(folder / file_name, "wb") as f:
                pickle.dump({"data": data, label_key: labels[idx].tolist(), "batch_label": split}, f)
        expected[split] = (np.concatenate(xs).reshape(-1, 3, 32, 32), labels)
    names = [f"class{i}" for i in range(n_classes)]
    with open(folder / tv.meta["filename"], "wb") as f:
        pickle.dump({tv.meta["key"]: names}, f)
    return expected, names


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_pickle_format_round_trip(tmp_path, name):
    expected, names = write_torchvision_cifar(tmp_path, name)
    train, test, got_names = cifar.load(name, str(tmp_path), verify=False)
    assert got_names == names
    np.testing.assert_array_equal(train.inputs.numpy(), expected["train"][0])
    assert train.targets == expected["train"][1].tolist()
    np.testing.assert_array_equal(test.inputs.numpy(), expected["test"][0])


def test_checksum_mismatch_is_refused(tmp_path):
    write_torchvision_cifar(tmp_path, "cifar10")
    with pytest.raises(ValueError, match="data_batch_1 has the wrong checksum.*benchmark.verify=false"):
        cifar.load("cifar10", str(tmp_path), verify=True)


def test_missing_file_is_named(tmp_path):
    write_torchvision_cifar(tmp_path, "cifar100")
    (tmp_path / "cifar-100-python" / "test").unlink()
    with pytest.raises(FileNotFoundError, match="cifar-100-python/test"):
        cifar.load("cifar100", str(tmp_path), verify=False)


def test_empty_root_says_how_to_get_data(tmp_path):
    with pytest.raises(FileNotFoundError, match="benchmark.download=true"):
        cifar.load("cifar10", str(tmp_path))


def test_a_missing_archive_is_named_as_one(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"^benchmark.root={tmp_path}/cifar10_jpg.tar.xz: no such archive$"):
        cifar.load("cifar10", str(tmp_path / "cifar10_jpg.tar.xz"))


def _jpeg_bytes(rng):
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def write_jpeg_tree(root, classes=("cat", "dog", "frog", "ship"), per_class=(3, 1), seed=0):
    rng = np.random.default_rng(seed)
    for split, n in zip(("train", "test"), per_class):
        for c in classes:
            (root / "cifar10" / split / c).mkdir(parents=True)
            for i in range(n):
                (root / "cifar10" / split / c / f"{i:04d}.jpg").write_bytes(_jpeg_bytes(rng))
    return root / "cifar10"


def test_jpeg_folder_and_archive_agree(tmp_path):
    tree = write_jpeg_tree(tmp_path / "src")
    train, test, names = cifar.load("cifar10", str(tmp_path / "src"))
    assert names == ["cat", "dog", "frog", "ship"]
    assert train.inputs.shape == (12, 3, 32, 32) and test.inputs.shape == (4, 3, 32, 32)
    assert train.targets == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    archive = tmp_path / "cifar10_jpg.tar.xz"
    with tarfile.open(archive, "w:xz") as tf:
        tf.add(tree, arcname="cifar10")
    a_train, a_test, a_names = cifar.load("cifar10", str(archive))
    assert a_names == names
    np.testing.assert_array_equal(a_train.inputs.numpy(), train.inputs.numpy())
    np.testing.assert_array_equal(a_test.inputs.numpy(), test.inputs.numpy())


def test_icarl_resnet32_on_generated_cifar10(make_cfg, tmp_path):
    write_torchvision_cifar(tmp_path / "data", "cifar10", per_class_train=4, per_class_test=2)
    cfg = make_cfg("benchmark=cifar10", "model=resnet32", "strategy=icarl", "benchmark.verify=false",
                   "trainer.epochs=1", "trainer.batch_size=8", "trainer.memory_size=20", "trainer.device=cpu")
    summary = run(cfg, tmp_path / "run")
    assert np.array(summary["acc_matrix"], dtype=float).shape == (5, 5)
    assert summary["status"] == "complete"


LOAD_AND_HASH = """
import hashlib, logging, sys
from hdqt_cil.benchmarks import cifar
logging.basicConfig(level=logging.INFO, format="%(message)s")
train, test, names = cifar.load("cifar10", sys.argv[1])
print(hashlib.sha256(train.inputs.numpy().tobytes() + test.inputs.numpy().tobytes()).hexdigest(), names)
"""


def test_jobs_starting_together_decode_an_archive_once(tmp_path, monkeypatch, caplog):
    """Three processes load the same archive at once: one decodes it, all get the same arrays; a later load (in
    this process: the cache is the same) reads the cache, and an archive with other bytes is decoded again."""
    tree = write_jpeg_tree(tmp_path / "src", per_class=(30, 5))
    archive = tmp_path / "cifar10_jpg.tar.xz"
    with tarfile.open(archive, "w:xz") as tf:
        tf.add(tree, arcname="cifar10")
    monkeypatch.setenv("HDQT_CACHE", str(tmp_path / "cache"))

    procs = [subprocess.Popen([sys.executable, "-c", LOAD_AND_HASH, str(archive)], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    hashes = [out for out, _ in outs]
    assert sum(f"decoded {archive}" in err for _, err in outs) == 1 and len(set(hashes)) == 1

    def load_here():
        """(what LOAD_AND_HASH prints, whether the archive was decoded)"""
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="hdqt_cil.benchmarks.decoded"):
            train, test, names = cifar.load("cifar10", str(archive))
        digest = hashlib.sha256(train.inputs.numpy().tobytes() + test.inputs.numpy().tobytes()).hexdigest()
        return f"{digest} {names}\n", f"decoded {archive}" in caplog.text

    assert load_here() == (hashes[0], False)
    (tree / "test" / "cat" / "0000.jpg").write_bytes((tree / "test" / "dog" / "0000.jpg").read_bytes())
    with tarfile.open(archive, "w:xz") as tf:
        tf.add(tree, arcname="cifar10")
    changed, decoded = load_here()
    assert decoded and changed != hashes[0]
