"""benchmark=images: one's own image classes, as a folder or an archive (.tar, .tar.gz, .tar.xz, .zip) of
`train/<class>/*` and `test/<class>/*`, or of `<class>/*` alone (then `test_fraction` of each class is held out,
drawn by the seed). Any format Pillow reads; class names from the folders, or from a `classes.txt` beside them
(lines `<folder> <name>`: a name may hold what a folder name cannot).

Images are decoded once per machine (decoded.py) to uint8 (N, C, H, W): at their own size and channel count when
every image agrees, else at `benchmark.size` (resized, or padded with zeros around the centre) and
`benchmark.channels` (1: grey, 3: RGB). The model normalises with the training split's per-channel mean and std.
"""
import io
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import numpy as np
import torch
from omegaconf import MISSING
from PIL import Image, UnidentifiedImageError

from ..settings import FRACTION, Rule, one_of, optional, setting
from .arrays import ArrayDataset, channel_mean_std
from .decoded import decoded_once
from .split import BENCHMARKS, BenchmarkConfig, Loaded

SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
CLASSES_FILE = "classes.txt"
DECODER = "images-v1"  # names what _decode makes of the files: change it when that changes
SIZE = Rule(lambda v: isinstance(v, list) and len(v) == 2 and all(isinstance(s, int) and s > 0 for s in v),
            "[height, width] in pixels")


@dataclass
class ImagesConfig(BenchmarkConfig):
    loader: str = "images"
    root: str = MISSING  # the folder or archive
    size: Optional[List[int]] = setting(None, optional(SIZE))  # null: the images' own (all must agree)
    fit: str = setting("resize", one_of("resize", "pad"))  # how an image of another size reaches `size`
    channels: Optional[int] = setting(None, optional(Rule(lambda v: v in (1, 3), "1 or 3")))  # null: their own
    test_fraction: float = setting(0.2, FRACTION)  # held out per class when the source has no test/ tree
    n_experiences: Optional[int] = 5


def _items(source: Path) -> list[tuple[tuple[str, ...], bytes]]:
    """(path parts below the source's top, bytes) of every image file of a folder or an archive, sorted by path."""
    if source.is_dir():
        return [(p.relative_to(source).parts, p.read_bytes()) for p in sorted(source.rglob("*"))
                if p.is_file() and p.suffix.lower() in SUFFIXES]
    if zipfile.is_zipfile(source):
        with zipfile.ZipFile(source) as zf:
            names = sorted(n for n in zf.namelist() if not n.endswith("/") and Path(n).suffix.lower() in SUFFIXES)
            return [(tuple(Path(n).parts), zf.read(n)) for n in names]
    try:
        with tarfile.open(source) as tf:
            members = sorted((m for m in tf if m.isfile() and Path(m.name).suffix.lower() in SUFFIXES),
                             key=lambda m: m.name)
            return [(tuple(Path(m.name).parts), tf.extractfile(m).read()) for m in members]
    except tarfile.TarError as err:
        raise ValueError(f"benchmark.root={source} is neither a folder nor a .tar/.tar.gz/.tar.xz/.zip archive "
                         f"({err})") from err


def _layout(items) -> list[tuple[str, str, str, bytes]]:
    """(split or '', class folder, file name, bytes): `train|test/<class>/<file>` or `<class>/<file>`, below one
    optional top folder (an archive of a folder)."""
    parts = [p for p, _ in items]
    top = len(parts[0]) > 1 and all(len(p) > 2 and p[0] == parts[0][0] for p in parts) and \
        not {p[0] for p in parts} <= {"train", "test"}
    out = []
    for p, data in items:
        p = p[1:] if top else p
        if len(p) == 3 and p[0] in ("train", "test"):
            out.append((p[0], p[1], "/".join(p), data))
        elif len(p) == 2:
            out.append(("", p[0], "/".join(p), data))
    return out


def _decode(name: str, data: bytes, cfg) -> np.ndarray:
    """One image as uint8 (C, H, W) at the configured channels and size (or its own)."""
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError) as err:
        raise ValueError(f"{name}: not an image Pillow can read ({err})") from err
    channels = cfg.channels or (1 if image.mode in ("1", "L", "I", "I;16", "F") else 3)
    image = image.convert("L" if channels == 1 else "RGB")
    if cfg.size is not None and list(image.size[::-1]) != list(cfg.size):
        height, width = cfg.size
        if cfg.fit == "resize":
            image = image.resize((width, height), Image.BILINEAR)
        else:
            if image.height > height or image.width > width:
                raise ValueError(f"{name} is {image.height}×{image.width}, larger than benchmark.size={cfg.size}: "
                                 "padding cannot shrink it (benchmark.fit=resize does)")
            canvas = Image.new(image.mode, (width, height))
            canvas.paste(image, ((width - image.width) // 2, (height - image.height) // 2))
            image = canvas
    array = np.asarray(image, dtype=np.uint8)
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def _stack(files, what: str) -> np.ndarray:
    """The decoded images of one split, which must agree in channels and size."""
    shapes = {}
    for name, image in files:
        shapes.setdefault(image.shape, name)
    if len(shapes) > 1:
        (first, a), (second, b) = list(shapes.items())[:2]
        kind = "channels" if first[0] != second[0] else "sizes"
        raise ValueError(f"{what}: images of mixed {kind}: {a} is {first}, {b} is {second} (channels, height, "
                         "width); set benchmark.channels and benchmark.size to bring them to one")
    return np.stack([image for _, image in files])


def read(source: Path, cfg):
    """Decode the source: ((x_train, y_train), (x_test, y_test), class folders), the test part empty when the
    source has no test tree."""
    items = _layout(_items(source))
    if not items:
        raise ValueError(f"benchmark.root={source} holds no images ({', '.join(SUFFIXES)}) in train/<class>/, "
                         "test/<class>/ or <class>/ folders")
    folders = sorted({c for s, c, _, _ in items if s in ("", "train")})
    out = []
    for split in ("train", "test"):
        chosen = [(n, c, d) for s, c, n, d in items if s == split or (split == "train" and s == "")]
        unseen = sorted({c for _, c, _ in chosen} - set(folders))
        if unseen:
            raise ValueError(f"{source}: test classes {unseen} have no training images")
        if not chosen:
            out.append((np.zeros((0, 1, 1, 1), np.uint8), np.zeros(0, np.int64)))
            continue
        images = _stack([(n, _decode(n, d, cfg)) for n, _, d in chosen], f"{source} ({split})")
        out.append((images, np.asarray([folders.index(c) for _, c, _ in chosen], np.int64)))
    return out[0], out[1], folders


def _check_class_folders(source: Path) -> None:
    """A class folder without images is a mistake to name, not a class to drop (a folder source; checked on every
    load, the decoded images being cached by the images' bytes alone)."""
    if not source.is_dir():
        return
    tree = source / "train" if (source / "train").is_dir() else source
    empty = [str(d.relative_to(source)) for d in sorted(tree.iterdir())
             if d.is_dir() and d.name != "test" and not any(p.is_dir() or p.suffix.lower() in SUFFIXES
                                                            for p in d.iterdir())]
    if empty:
        raise ValueError(f"{source}: the class folders {empty[:5]} hold no images ({', '.join(SUFFIXES)})")


def _class_names(source: Path, folders: list) -> list:
    """The classes' names: a classes.txt's, where the source holds one, else the folders'."""
    listing = (source if source.is_dir() else source.parent) / CLASSES_FILE
    if not listing.is_file():
        return list(folders)
    names = dict(line.split(maxsplit=1) for line in listing.read_text().splitlines() if line.strip())
    missing = [f for f in folders if f not in names]
    if missing:
        raise ValueError(f"{listing} names no class for the folders {missing[:5]} (lines: <folder> <name>)")
    return [names[f].strip() for f in folders]


def _held_out(x, y, fraction: float, seed: int):
    """`fraction` of each class (at least one image, at least one left) drawn by `seed` as the test part."""
    rng = np.random.default_rng(seed)
    test = np.zeros(len(y), bool)
    for c in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == c))
        if len(rows) < 2:
            raise ValueError(f"class {c} has {len(rows)} image: a held-out test image needs at least 2")
        test[rows[:min(max(round(fraction * len(rows)), 1), len(rows) - 1)]] = True
    return (x[~test], y[~test]), (x[test], y[test])


@BENCHMARKS.register("images", ImagesConfig, images=True)
def benchmark(cfg, seed: int) -> Loaded:
    source = Path(cfg.root).expanduser()
    if not source.exists():
        raise FileNotFoundError(f"benchmark.root={source} does not exist: give a folder or archive of "
                                "train/<class>/*, test/<class>/* (or <class>/*) images")
    _check_class_folders(source)
    decoder = f"{DECODER}-{cfg.size}-{cfg.fit}-{cfg.channels}"
    (x_tr, y_tr), (x_te, y_te), folders = decoded_once(source, lambda s: read(s, cfg), decoder, SUFFIXES)
    names = _class_names(source, folders)
    empty = [names[c] for c in range(len(folders)) if not (y_tr == c).any()]
    if empty:
        raise ValueError(f"{source}: classes {empty} have no training images")
    if len(y_te):
        split = "the source's train/ and test/ trees"
    else:
        (x_tr, y_tr), (x_te, y_te) = _held_out(x_tr, y_tr, cfg.test_fraction, seed)
        split = f"{cfg.test_fraction:g} of each class held out, drawn by seed {seed}"
    train_x = torch.from_numpy(np.ascontiguousarray(x_tr))
    return Loaded(ArrayDataset(train_x, y_tr), ArrayDataset(torch.from_numpy(np.ascontiguousarray(x_te)), y_te),
                  names, split, input_norm=channel_mean_std(train_x))
