"""benchmark=images on generated image folders and archives: layouts, sizes, channels, class names, held-out
test images by seed, the training split's normalisation, a short run; and every refusal, naming what is wrong."""
import io
import tarfile
import zipfile

import numpy as np
import pytest
from PIL import Image

from hdqt_cil.benchmarks import build_benchmark, images


def png(size=(6, 5), mode="L", value=0):
    buffer = io.BytesIO()
    Image.new(mode, size[::-1], value).save(buffer, format="PNG")
    return buffer.getvalue()


def make_tree(root, files):
    """files: {relative path: bytes}."""
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def two_splits(classes=("cat", "dog", "owl", "ant"), per=3, **kw):
    files = {}
    for c, name in enumerate(classes):
        for i in range(per):
            files[f"train/{name}/{i}.png"] = png(value=40 * c + i, **kw)
            files[f"test/{name}/{i}.png"] = png(value=40 * c + i + 1, **kw)
    return files


def tar(archive, files):
    """A tar of files ({name: bytes}), compressed as its name's last suffix says (.tar.gz, .tar.xz)."""
    with tarfile.open(archive, f"w:{archive.suffix[1:]}") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return archive


def bench(make_cfg, root, *overrides, seed=0):
    cfg = make_cfg("benchmark=images", f"benchmark.root={root}", "benchmark.n_experiences=2", *overrides)
    return build_benchmark(cfg.benchmark, seed)


def test_a_folder_of_train_and_test_trees(make_cfg, tmp_path):
    b = bench(make_cfg, make_tree(tmp_path / "set", two_splits()))
    assert b.input_shape == (1, 6, 5) and b.num_classes == 4 and b.class_names == ["ant", "cat", "dog", "owl"]
    assert b.split == "the source's train/ and test/ trees"
    assert b.input_norm[0][0] == pytest.approx(np.mean([40 * c + i for c in range(4) for i in range(3)]) / 255)


@pytest.mark.parametrize("kind", ["tar.xz", "zip"])
def test_an_archive_of_one_folder_reads_as_the_folder(make_cfg, tmp_path, kind):
    files = two_splits(mode="RGB")
    archive = tmp_path / f"set.{kind}"
    if kind == "zip":
        with zipfile.ZipFile(archive, "w") as zf:
            for name, data in files.items():
                zf.writestr(f"myset/{name}", data)
    else:
        tar(archive, {f"myset/{name}": data for name, data in files.items()})
    b = bench(make_cfg, archive)
    assert b.input_shape == (3, 6, 5) and b.class_names == ["ant", "cat", "dog", "owl"]


def test_one_tree_holds_out_test_images_by_seed_and_classes_txt_names_them(make_cfg, tmp_path):
    files = {f"{name}/{i}.png": png(value=i) for name in ("c1", "c2") for i in range(10)}
    root = make_tree(tmp_path / "set", files)
    (root / "classes.txt").write_text("c1 T-shirt/top\nc2 trouser\n")
    one, again, other = (bench(make_cfg, root, "benchmark.test_fraction=0.3", seed=s) for s in (0, 0, 5))
    assert one.class_names == ["T-shirt/top", "trouser"] and one.split.startswith("0.3 of each class held out")
    sizes = [len(ds) for ds in (one.scenario.train_stream[0].dataset, one.scenario.test_stream[0].dataset)]
    assert sizes == [7, 3]
    held = [sorted(x.flatten().tolist() for x, *_ in b.scenario.test_stream[0].dataset) for b in (one, again, other)]
    assert held[0] == held[1] != held[2]


def test_sizes_and_channels_brought_to_one(make_cfg, tmp_path):
    files = two_splits()
    files["train/cat/big.png"] = png(size=(8, 8), mode="RGB", value=200)
    root = make_tree(tmp_path / "set", files)
    with pytest.raises(ValueError, match=r"images of mixed channels: .* set benchmark.channels and benchmark.size"):
        bench(make_cfg, root)
    resized = bench(make_cfg, root, "benchmark.size=[8,8]", "benchmark.channels=3")
    assert resized.input_shape == (3, 8, 8)
    padded = bench(make_cfg, root, "benchmark.size=[8,8]", "benchmark.channels=1", "benchmark.fit=pad")
    image = next(x for x, *_ in padded.scenario.train_stream[0].dataset if x.sum() > 0)
    assert image.shape == (1, 8, 8) and image[0, 0, 0] == 0  # the padding
    with pytest.raises(ValueError, match=r"big.png is 8×8, larger than benchmark.size=\[6, 6\]"):
        bench(make_cfg, root, "benchmark.size=[6,6]", "benchmark.channels=1", "benchmark.fit=pad")


@pytest.mark.parametrize("change, message", [
    (lambda r: (r / "train" / "bee").mkdir(), r"class folders \['train/bee'\] hold no images"),
    (lambda r: make_tree(r, {"test/bee/0.png": png()}), r"test classes \['bee'\] have no training images"),
    (lambda r: make_tree(r, {"train/cat/9.png": b"not a png"}), r"set: train/cat/9.png is not an image Pillow can "
                                                                  r"read; remove or replace it$"),
    (lambda r: make_tree(r, {"train/cat/sub/9.png": png()}), r"set: train/cat/sub/9.png is not directly in a class "
                                                             r"folder: images are read from <class>/\*, or train/"),
    (lambda r: (r / "classes.txt").write_text("cat kitty\n"), r"classes.txt names no class for the folders \['ant'"),
    (lambda r: (r / "classes.txt").write_text("ant a\ncat,kitty\n"), r"classes.txt line 2 is 'cat,kitty': each "
                                                                      r"line is `<folder> <name>`"),
    (lambda r: (r / "classes.txt").write_text("ant a\ncat c\ndog d\nowl o\nemu e\n"),
     r"classes.txt names the folders \['emu'\], which are not class folders of"),
])
def test_refusals_name_what_is_wrong(make_cfg, tmp_path, change, message):
    root = make_tree(tmp_path / "set", two_splits())
    change(root)
    with pytest.raises(ValueError, match=message):
        bench(make_cfg, root)


@pytest.mark.parametrize("test_image, message", [
    (png(mode="RGB"), r"mixed channels: train/ant/0.png is \(1, 6, 5\), test/ant/0.png is \(3, 6, 5\)"),
    (png(size=(7, 5)), r"mixed sizes: train/ant/0.png is \(1, 6, 5\), test/ant/0.png is \(1, 7, 5\)"),
], ids=["channels", "sizes"])
def test_train_and_test_images_must_agree(make_cfg, tmp_path, test_image, message):
    files = two_splits()
    files.update({n: test_image for n in files if n.startswith("test/")})
    with pytest.raises(ValueError, match=message + r" .* set benchmark.channels and benchmark.size"):
        bench(make_cfg, make_tree(tmp_path / "set", files))


def test_alpha_is_no_channel(make_cfg, tmp_path):
    files = two_splits()
    files["train/cat/a.png"] = png(mode="LA")  # grey with alpha, among grey images
    assert bench(make_cfg, make_tree(tmp_path / "grey", files)).input_shape == (1, 6, 5)
    files = two_splits(mode="RGB")
    files["train/cat/a.png"] = png(mode="RGBA")
    assert bench(make_cfg, make_tree(tmp_path / "rgb", files)).input_shape == (3, 6, 5)


def test_a_folder_beside_train_is_refused_without_test_and_said_with_it(make_cfg, tmp_path, caplog):
    files = {n.replace("test/", "val/"): d for n, d in two_splits().items()}
    with pytest.raises(ValueError, match=r"has train/ and val/ but no test/: rename val/ to test/"):
        bench(make_cfg, make_tree(tmp_path / "noted", files))
    root = make_tree(tmp_path / "both", {**two_splits(), **files})
    with caplog.at_level("WARNING", logger="hdqt_cil.benchmarks.images"):
        b = bench(make_cfg, root, "benchmark.test_fraction=0.5")
    assert b.split == "the source's train/ and test/ trees"
    assert "the folders ['val/'] beside train/ and test/ are not read" in caplog.text
    assert "has its own test/ tree; benchmark.test_fraction=0.5 is not used" in caplog.text


def test_a_class_of_one_image_is_named_by_its_folder(make_cfg, tmp_path):
    files = {f"{name}/{i}.png": png() for name in ("ant", "cat") for i in range(3)}
    with pytest.raises(ValueError, match=r"class 'emu' has 1 image: a held-out test image needs at least 2"):
        bench(make_cfg, make_tree(tmp_path / "set", {**files, "emu/0.png": png()}))


def test_os_metadata_beside_the_images_is_not_read(make_cfg, tmp_path):
    archive = tmp_path / "set.zip"  # as macOS zips a folder: every file's metadata in __MACOSX/, named ._<file>
    with zipfile.ZipFile(archive, "w") as zf:
        for name, data in two_splits().items():
            zf.writestr(f"myset/{name}", data)
            zf.writestr(f"__MACOSX/myset/{name.rsplit('/', 1)[0]}/._{name.rsplit('/', 1)[1]}", b"metadata")
    assert bench(make_cfg, archive).class_names == ["ant", "cat", "dog", "owl"]


def damaged(tmp_path, kind):
    """A cut-short .tar.gz or .zip, or a zip whose image's bytes changed after it was packed."""
    files = two_splits(per=20)
    archive = tmp_path / f"set.{kind}"
    if kind == "tar.gz":
        tar(archive, files)
    else:
        with zipfile.ZipFile(archive, "w") as zf:  # stored: the image's bytes appear as they are
            for name, data in files.items():
                zf.writestr(name, data)
    raw = archive.read_bytes()
    if kind == "zip-crc":
        at = raw.index(files["test/ant/0.png"]) + 20
        archive.write_bytes(raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1:])
    else:
        archive.write_bytes(raw[:len(raw) // 2])
    return archive


@pytest.mark.parametrize("kind, where", [
    ("tar.gz", r" \(reading stopped at [a-z]+/[a-z]+/\d+.png\): Compressed file ended"),
    ("zip", r": its end, the zip's list of files, is missing"),
    ("zip-crc", r" \(reading stopped at test/ant/0.png\): Bad CRC-32"),
])
def test_a_damaged_archive_is_named(make_cfg, tmp_path, kind, where):
    archive = damaged(tmp_path, kind)
    with pytest.raises(ValueError, match=rf"set.{kind} is damaged or cut short{where}.*; download or pack it again$"):
        bench(make_cfg, archive)


def listings(monkeypatch, tmp_path):
    """A cache of this test's own, and the sources listed without their bytes (the layout check's listing), one
    entry a listing."""
    monkeypatch.setenv("HDQT_CACHE", str(tmp_path / "cache"))
    listed, files = [], images._files

    def spy(source, read):
        if not read:
            listed.append(source.name)
        return files(source, read)
    monkeypatch.setattr(images, "_files", spy)
    return listed


def test_a_tar_gz_is_listed_once_and_its_layout_said_on_every_run(make_cfg, tmp_path, caplog, monkeypatch):
    listed = listings(monkeypatch, tmp_path)
    files = two_splits()
    val = {n.replace("test/", "val/"): d for n, d in files.items() if n.startswith("test/")}
    said = tar(tmp_path / "said.tar.gz", {**files, **val})
    refused = tar(tmp_path / "refused.tar.gz", {n: d for n, d in {**files, **val}.items() if not n.startswith("test/")})
    for _ in range(2):
        caplog.clear()
        with caplog.at_level("WARNING", logger="hdqt_cil.benchmarks.images"):
            assert bench(make_cfg, said).class_names == ["ant", "cat", "dog", "owl"]
        assert "the folders ['val/'] beside train/ and test/ are not read" in caplog.text
        with pytest.raises(ValueError, match=r"has train/ and val/ but no test/: rename val/ to test/"):
            bench(make_cfg, refused)
        monkeypatch.setattr(tarfile, "open", lambda *a, **k: pytest.fail("a listed archive was opened again"))
    assert listed == ["said.tar.gz", "refused.tar.gz"]


def test_a_changed_archive_is_listed_again(make_cfg, tmp_path, monkeypatch):
    listed = listings(monkeypatch, tmp_path)
    archive = tar(tmp_path / "set.tar.gz", two_splits())
    for _ in range(2):
        assert bench(make_cfg, archive).class_names == ["ant", "cat", "dog", "owl"]
    tar(archive, {**two_splits(), "train/emu/0.png": png(), "test/emu/0.png": png(), "train/emu/new/1.png": png()})
    with pytest.raises(ValueError, match=r"train/emu/new/1.png is not directly in a class folder"):
        bench(make_cfg, archive)
    assert listed == ["set.tar.gz", "set.tar.gz"]


def test_a_short_run_with_an_image_model(make_cfg, tmp_path):
    from hdqt_cil.experiment import run

    root = make_tree(tmp_path / "set", two_splits(mode="RGB"))
    cfg = make_cfg("benchmark=images", f"benchmark.root={root}", "benchmark.name=pets", "benchmark.n_experiences=2",
                   "model=resnet32", "strategy=naive", "trainer.epochs=1", "trainer.device=cpu", "quant=hdqt")
    summary = run(cfg, tmp_path / "run")
    assert summary["status"] == "complete" and summary["run"]["benchmark"] == "pets"
    assert len(summary["input_norm"][0]) == 3 and summary["input_norm"][1][0] > 0  # stored with the run
