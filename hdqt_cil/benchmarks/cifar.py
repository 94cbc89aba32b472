"""CIFAR-10/100 from torchvision's pickle format, and CIFAR-style images stored as JPEG folders.

Both end as uint8 (N, 3, 32, 32) tensors held in memory. Augmentation keeps uint8 (torchvision v2 per sample,
or benchmarks/augment.py per batch on the GPU); the model's first layer scales and normalises (models/__init__.py),
so exemplar memories, evaluation and every strategy see the same raw images.
"""
import io
import pickle
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from PIL import Image
from torchvision import datasets
from torchvision.datasets.utils import check_md5, download_and_extract_archive
from torchvision.transforms import v2
from tqdm.auto import tqdm

from ..settings import BOOL, Rule, one_of, setting
from .arrays import ArrayDataset
from .split import BENCHMARKS, BenchmarkConfig, Loaded
from .decoded import decoded_once, source_digest

_TORCHVISION = {"cifar10": datasets.CIFAR10, "cifar100": datasets.CIFAR100}
MEAN_STD = {"cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
             "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))}
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
DECODER = "cifar-rgb32-v1"  # names what _decode and _stack make of the files: change it when they change


@dataclass
class CifarConfig(BenchmarkConfig):
    # torchvision's pickle folder under root (cifar-10-batches-py, cifar-100-python), or a folder of
    # train|test/<class>/*.jpg images, or a .tar.xz of one.
    root: str = "${data_root}"
    download: bool = setting(False, BOOL)
    verify: bool = setting(True, BOOL)  # check torchvision's md5 of each pickle file
    n_experiences: Optional[int] = 5
    augment: bool = setting(True, BOOL)  # random crop (pad 4) + horizontal flip
    augment_on: str = setting("cpu", one_of("cpu", "gpu"))  # per sample in the data loader | per batch on the device
    # Brightness jitter, 63/255 as in the paper; 0 turns it off.
    color_jitter: float = setting(0.24706, Rule(lambda v: 0 <= v < 1, "a number in [0, 1)"))


def load(name: str, root: str, download: bool = False, verify: bool = True):
    """Train/test sets and class names of CIFAR-`name` found under `root`.

    `root` may hold torchvision's pickle folder (`cifar-10-batches-py` / `cifar-100-python`), a folder of
    `train|test/<class>/*.jpg` images, or a `.tar`/`.tar.xz` archive of such a folder; images are decoded once
    per machine (benchmarks/decoded.py).
    """
    tv = _TORCHVISION[name]
    root_path = Path(root).expanduser()
    pickle_dir = root_path / tv.base_folder
    if not pickle_dir.is_dir() and download:
        download_and_extract_archive(tv.url, str(root_path), filename=tv.filename, md5=tv.tgz_md5)
    if pickle_dir.is_dir():
        (x_tr, y_tr), (x_te, y_te), names = _read_pickles(tv, pickle_dir, verify)
    elif root_path.is_file() and ".tar" in root_path.name:
        (x_tr, y_tr), (x_te, y_te), names = decoded_once(root_path, _read_image_archive, DECODER,
                                                         source_digest(root_path, _IMAGE_SUFFIXES))
    elif (folder := _image_root(root_path)) is not None:
        (x_tr, y_tr), (x_te, y_te), names = decoded_once(folder, _read_image_folders, DECODER,
                                                         source_digest(folder, _IMAGE_SUFFIXES))
    elif ".tar" in root_path.name:  # an archive named, not there: no folder under it to look for
        raise FileNotFoundError(f"benchmark.root={root_path}: no such archive")
    else:
        raise FileNotFoundError(
            f"no {name} data under {root_path}: expected torchvision's folder {pickle_dir} "
            f"(pass benchmark.download=true to fetch it from {tv.url}), a folder with train/<class>/*.jpg and "
            f"test/<class>/*.jpg, or a .tar.xz archive of one"
        )
    return ArrayDataset(torch.from_numpy(x_tr), y_tr), ArrayDataset(torch.from_numpy(x_te), y_te), names


def train_transform(color_jitter: float):
    """Per-sample training augmentation on uint8 CHW tensors: crop (pad 4) + flip (+ brightness jitter)."""
    ops = [v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()]
    if color_jitter > 0:
        ops.append(v2.ColorJitter(brightness=color_jitter))
    return v2.Compose(ops)


def _read_pickles(tv, folder: Path, verify: bool):
    def read(entries):
        xs, ys = [], []
        for file_name, md5 in entries:
            path = folder / file_name
            if not path.is_file():
                raise FileNotFoundError(f"missing {path} (torchvision's {tv.__name__} format); "
                                        f"pass benchmark.download=true or copy the dataset there")
            if verify and not check_md5(str(path), md5):
                raise ValueError(f"{path} has the wrong checksum (expected md5 {md5}); re-download it, "
                                 f"or pass benchmark.verify=false to use it as it is")
            with open(path, "rb") as f:
                entry = pickle.load(f, encoding="latin1")
            xs.append(np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            ys.extend(entry["labels"] if "labels" in entry else entry["fine_labels"])
        return np.concatenate(xs), np.asarray(ys, dtype=np.int64)

    meta_path = folder / tv.meta["filename"]
    if not meta_path.is_file():
        raise FileNotFoundError(f"missing {meta_path} (class names of {tv.__name__})")
    with open(meta_path, "rb") as f:
        names = pickle.load(f, encoding="latin1")[tv.meta["key"]]
    return read(tv.train_list), read(tv.test_list), list(names)


def _image_root(path: Path):
    for candidate in (path, *sorted(p for p in path.glob("*") if p.is_dir())) if path.is_dir() else ():
        if (candidate / "train").is_dir() and (candidate / "test").is_dir():
            return candidate
    return None


def _decode(data: bytes) -> np.ndarray:
    img = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.uint8)
    if img.shape != (32, 32, 3):
        raise ValueError(f"expected 32×32 RGB images, got shape {img.shape}")
    return img.transpose(2, 0, 1)


def _stack(items, names):
    """items: (split, class_name, bytes) → per split (uint8 images, labels) in sorted file order."""
    out = {}
    for split in ("train", "test"):
        chosen = [(c, b) for s, c, b in items if s == split]
        if not chosen:
            raise FileNotFoundError(f"no {split} images found")
        x = np.stack([_decode(b) for _, b in tqdm(chosen, desc=f"decoding {split} images", leave=False,
                                                  disable=None)])
        out[split] = (x, np.asarray([names.index(c) for c, _ in chosen], dtype=np.int64))
    return out["train"], out["test"], names


def _read_image_folders(root: Path):
    names = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
    items = [(split, path.parent.name, path.read_bytes())
             for split in ("train", "test")
             for path in sorted((root / split).glob("*/*")) if path.suffix.lower() in _IMAGE_SUFFIXES]
    return _stack(items, names)


def _read_image_archive(archive: Path):
    items = []
    with tarfile.open(archive) as tf:
        for member in sorted((m for m in tf if m.isfile()), key=lambda m: m.name):
            parts = member.name.split("/")
            if len(parts) >= 3 and parts[-3] in ("train", "test") and parts[-1].lower().endswith(_IMAGE_SUFFIXES):
                items.append((parts[-3], parts[-2], tf.extractfile(member).read()))
    names = sorted({c for s, c, _ in items if s == "train"})
    return _stack(items, names)



@BENCHMARKS.register("cifar10", CifarConfig, images=True)
@BENCHMARKS.register("cifar100", CifarConfig, images=True)
def benchmark(cfg, seed: int):
    """The release's sets; augmentation per sample (augment_on=cpu) or none here (gpu: per batch,
    trainer/batch_augment.py)."""
    train, test, names = load(cfg.loader, cfg.root, download=cfg.download, verify=cfg.verify)
    per_sample = cfg.augment and cfg.augment_on == "cpu"
    return Loaded(train, test, names, "the release's training and test sets",
                  train_transform(cfg.color_jitter) if per_sample else None, MEAN_STD[cfg.loader])
