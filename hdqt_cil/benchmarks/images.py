"""benchmark=images: one's own image classes, as a folder or an archive (.tar, .tar.gz, .tar.xz, .zip) of
`train/<class>/*` and `test/<class>/*`, or of `<class>/*` alone (then `test_fraction` of each class is held out,
drawn by the seed). Any format Pillow reads; class names from the folders, or from a `classes.txt` beside them
(lines `<folder> <name>`: a name may hold what a folder name cannot).

Images are decoded once per machine (decoded.py) to uint8 (N, C, H, W): at their own size and channel count when
every image of both splits agrees (alpha is no channel), else at `benchmark.size` (resized, or padded with zeros
around the centre) and `benchmark.channels` (1: grey, 3: RGB). The model normalises with the training split's
per-channel mean and std. An image the layout leaves unread is refused or said, named, on every run (_check_layout),
from the source's list of image files, kept beside the decoded arrays (_image_paths).
"""
import io
import logging
import lzma
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import numpy as np
import torch
from omegaconf import MISSING
from PIL import Image, UnidentifiedImageError

from ..files import read_json, write_json
from ..settings import FRACTION, Rule, one_of, optional, setting
from .arrays import ArrayDataset, channel_mean_std
from .decoded import cache_entry, decoded_once, source_digest
from .split import BENCHMARKS, BenchmarkConfig, Loaded

SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
CLASSES_FILE = "classes.txt"
DECODER = "images-v2"  # names what _decode makes of the files: change it when that changes
LISTER = "images-files-v1"  # names what _files lists (the files _kept): change it when that changes
SPLITS = ("train", "test")
SIZE = Rule(lambda v: isinstance(v, list) and len(v) == 2 and all(isinstance(s, int) and s > 0 for s in v),
            "[height, width] in pixels")

log = logging.getLogger(__name__)


@dataclass
class ImagesConfig(BenchmarkConfig):
    loader: str = "images"
    root: str = MISSING  # the folder or archive
    size: Optional[List[int]] = setting(None, optional(SIZE))  # null: the images' own (all must agree)
    fit: str = setting("resize", one_of("resize", "pad"))  # how an image of another size reaches `size`
    channels: Optional[int] = setting(None, optional(Rule(lambda v: v in (1, 3), "1 or 3")))  # null: their own
    test_fraction: float = setting(0.2, FRACTION)  # held out per class when the source has no test/ tree
    n_experiences: Optional[int] = 5


def _hidden(name: str) -> bool:
    """What an OS or a tool leaves beside the images (.DS_Store, .ipynb_checkpoints/, a macOS zip's __MACOSX/)."""
    return name.startswith(".") or name == "__MACOSX"


def _kept(parts: tuple[str, ...]) -> bool:
    """An image file, outside anything hidden."""
    return Path(parts[-1]).suffix.lower() in SUFFIXES and not any(_hidden(p) for p in parts)


def _damaged(source: Path, reason: object, member: Optional[str]) -> ValueError:
    """The one refusal of an archive that breaks off while being read: its name and where reading stopped."""
    where = f" (reading stopped at {member})" if member else ""
    return ValueError(f"benchmark.root={source} is damaged or cut short{where}: {reason}; download or pack it again")


def _zip_files(source: Path, read: bool) -> list:
    """A zip's image files (see _files); the bytes' checksums are checked as they are read."""
    if not zipfile.is_zipfile(source):
        raise _damaged(source, "its end, the zip's list of files, is missing", None)
    member = None
    try:
        with zipfile.ZipFile(source) as zf:
            out = []
            for member in sorted(n for n in zf.namelist() if not n.endswith("/") and _kept(Path(n).parts)):
                out.append((tuple(Path(member).parts), zf.read(member) if read else None))
            return out
    except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as err:
        raise _damaged(source, err, member) from err


def _tar_files(source: Path, read: bool) -> list:
    """A tar's image files (see _files): one pass in the archive's order, as a compressed tar cannot seek back."""
    member = None
    try:
        with tarfile.open(source) as tf:
            out = []
            for m in tf:
                member = m.name
                if m.isfile() and _kept(Path(m.name).parts):
                    out.append((m.name, tuple(Path(m.name).parts), tf.extractfile(m).read() if read else None))
            return [(parts, data) for _, parts, data in sorted(out, key=lambda f: f[0])]
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as err:
        raise _damaged(source, err, member) from err


def _archive_kind(source: Path) -> Optional[str]:
    """'zip' or 'tar' by the file's first bytes (a cut-short zip has lost the directory zipfile looks for), or None
    for a file that is neither."""
    with open(source, "rb") as f:
        head = f.read(262)
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if head.startswith((b"\x1f\x8b", b"\xfd7zXZ\x00", b"BZh")) or head[257:262] == b"ustar":
        return "tar"
    return None


def _files(source: Path, read: bool) -> list[tuple[tuple[str, ...], Optional[bytes]]]:
    """(path parts below the source's top, the bytes where `read`) of every image file of a folder or an archive,
    sorted by path."""
    if source.is_dir():
        return [(p.relative_to(source).parts, p.read_bytes() if read else None) for p in sorted(source.rglob("*"))
                if p.is_file() and _kept(p.relative_to(source).parts)]
    kind = _archive_kind(source)
    if kind is None:
        raise ValueError(f"benchmark.root={source} is neither a folder nor a .tar/.tar.gz/.tar.xz/.zip archive")
    return _zip_files(source, read) if kind == "zip" else _tar_files(source, read)


def _image_paths(source: Path, digest: str) -> list[tuple[str, ...]]:
    """The paths of the source's image files (_files), listed once a source digest and kept beside its decoded
    arrays: the layout is checked on every run, and a compressed tar is listed only by decompressing all of it."""
    entry = cache_entry(LISTER, digest, ".json")
    if not entry.exists():
        write_json(entry, [parts for parts, _ in _files(source, read=False)])
    return [tuple(parts) for parts in read_json(entry)]


def _layout(paths) -> list[tuple[str, Optional[str], str]]:
    """(split, class folder, name) of each image path below one optional top folder (an archive of a folder): the
    split is the path's first folder where the source has a train/ folder (train, test or another), else ''; the
    class folder is None for an image not directly in one (deeper, or loose)."""
    top = bool(paths) and len(paths[0]) > 1 and all(len(p) > 2 and p[0] == paths[0][0] for p in paths) and \
        paths[0][0] not in SPLITS
    paths = [p[1:] if top else p for p in paths]
    tree = any(p[0] == "train" for p in paths)
    out = []
    for p in paths:
        split, rest = (p[0], p[1:]) if tree and len(p) > 1 else ("", p)
        out.append((split, rest[0] if len(rest) == 2 else None, "/".join(p)))
    return out


def _check_layout(source: Path, layout, test_fraction: float) -> None:
    """Every image the source holds is read, or the user is told: checked on every load (not inside the decoding,
    whose arrays are cached), so each run says it. A folder beside train/ is refused when there is no test/ (it was
    meant as the held-out images), said when there is; an image not directly in a class folder is refused; a
    test_fraction that a test/ tree leaves unused is said."""
    if not layout:
        raise ValueError(f"benchmark.root={source} holds no images ({', '.join(SUFFIXES)}) in train/<class>/, "
                         "test/<class>/ or <class>/ folders")
    splits = {s for s, _, _ in layout}
    others = sorted(splits - {"", *SPLITS})
    if others and "test" not in splits:
        raise ValueError(f"benchmark.root={source} has train/ and {others[0]}/ but no test/: rename {others[0]}/ to "
                         f"test/ to test on its images (or move it out to hold out benchmark.test_fraction of train/)")
    if others:
        log.warning("%s: the folders %s beside train/ and test/ are not read (only train/ and test/ are)", source,
                    [f"{o}/" for o in others])
    loose = next((n for s, c, n in layout if c is None and s in ("", *SPLITS)), None)
    if loose:
        raise ValueError(f"benchmark.root={source}: {loose} is not directly in a class folder: images are read from "
                         "<class>/*, or train/<class>/* and test/<class>/*; move it into one (or out)")
    if "test" in splits and test_fraction != ImagesConfig.test_fraction:
        log.warning("%s has its own test/ tree; benchmark.test_fraction=%g is not used", source, test_fraction)


def _own_channels(image: Image.Image) -> int:
    """1 for a grey image, else 3: alpha is no channel (RGBA reads as RGB, grey with alpha as grey), so one
    transparent image among opaque ones is not a mix."""
    return 1 if set(image.getbands()) - {"A", "a"} <= {"1", "L", "I", "F"} else 3


def _decode(label: str, data: bytes, cfg) -> np.ndarray:
    """One image as uint8 (C, H, W) at the configured channels and size (or its own); `label` names it."""
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError) as err:  # the former's text is only the buffer's repr
        reason = "" if isinstance(err, UnidentifiedImageError) else f" ({err})"
        raise ValueError(f"{label} is not an image Pillow can read{reason}; remove or replace it") from err
    channels = cfg.channels or _own_channels(image)
    image = image.convert("L" if channels == 1 else "RGB")
    if cfg.size is not None and list(image.size[::-1]) != list(cfg.size):
        height, width = cfg.size
        if cfg.fit == "resize":
            image = image.resize((width, height), Image.BILINEAR)
        else:
            if image.height > height or image.width > width:
                raise ValueError(f"{label} is {image.height}×{image.width}, larger than benchmark.size={cfg.size}: "
                                 "padding cannot shrink it (benchmark.fit=resize does)")
            canvas = Image.new(image.mode, (width, height))
            canvas.paste(image, ((width - image.width) // 2, (height - image.height) // 2))
            image = canvas
    array = np.asarray(image, dtype=np.uint8)
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def _check_agree(source: Path, files) -> None:
    """All the source's decoded images, train and test alike, agree in channels and size: the model takes one
    shape, and the training split's per-channel normalisation must fit the test images."""
    shapes = {}
    for name, image in files:
        shapes.setdefault(image.shape, name)
    if len(shapes) > 1:
        (first, a), (second, b) = list(shapes.items())[:2]
        kind = "channels" if first[0] != second[0] else "sizes"
        raise ValueError(f"{source}: images of mixed {kind}: {a} is {first}, {b} is {second} (channels, height, "
                         "width); set benchmark.channels and benchmark.size to bring them to one")


def read(source: Path, cfg):
    """Decode a source that _check_layout passed: ((x_train, y_train), (x_test, y_test), class folders), the test
    part empty when the source has no test tree."""
    files = _files(source, read=True)
    chosen = {split: [] for split in SPLITS}
    for (s, c, name), (_, data) in zip(_layout([p for p, _ in files]), files):
        if s in ("", *SPLITS):
            chosen[s or "train"].append((name, c, data))
    folders = sorted({c for _, c, _ in chosen["train"]})
    unseen = sorted({c for _, c, _ in chosen["test"]} - set(folders))
    if unseen:
        raise ValueError(f"{source}: test classes {unseen} have no training images")
    decoded = {split: [(n, c, _decode(f"{source}: {n}", d, cfg)) for n, c, d in chosen[split]] for split in SPLITS}
    _check_agree(source, [(n, x) for split in SPLITS for n, _, x in decoded[split]])
    out = []
    for split in SPLITS:
        if not decoded[split]:
            out.append((np.zeros((0, 1, 1, 1), np.uint8), np.zeros(0, np.int64)))
            continue
        out.append((np.stack([x for _, _, x in decoded[split]]),
                    np.asarray([folders.index(c) for _, c, _ in decoded[split]], np.int64)))
    return out[0], out[1], folders


def _check_class_folders(source: Path) -> None:
    """A class folder without images is a mistake to name, not a class to drop (a folder source; checked on every
    load, the decoded images being cached by the images' bytes alone)."""
    if not source.is_dir():
        return
    tree = source / "train" if (source / "train").is_dir() else source
    empty = [str(d.relative_to(source)) for d in sorted(tree.iterdir())
             if d.is_dir() and d.name != "test" and not _hidden(d.name)
             and not any(p.is_dir() or p.suffix.lower() in SUFFIXES for p in d.iterdir())]
    if empty:
        raise ValueError(f"{source}: the class folders {empty[:5]} hold no images ({', '.join(SUFFIXES)})")


def _listed_names(listing: Path) -> dict:
    """{folder: name} of a classes.txt, a line `<folder> <name>`; a line of another shape is refused, named."""
    names = {}
    for number, line in enumerate(listing.read_text().splitlines(), 1):
        if line.strip():
            fields = line.split(maxsplit=1)
            if len(fields) != 2:
                raise ValueError(f"{listing} line {number} is {line.strip()!r}: each line is `<folder> <name>`, the "
                                 "class folder, a space, then the class's name")
            names[fields[0]] = fields[1].strip()
    return names


def _class_names(source: Path, folders: list) -> list:
    """The classes' names: a classes.txt's, where the source holds one, else the folders'. It names every class
    folder, and no other: a folder it names that the source lacks is a typo or a class that went missing."""
    listing = (source if source.is_dir() else source.parent) / CLASSES_FILE
    if not listing.is_file():
        return list(folders)
    names = _listed_names(listing)
    missing = [f for f in folders if f not in names]
    if missing:
        raise ValueError(f"{listing} names no class for the folders {missing[:5]} (lines: <folder> <name>)")
    unknown = [f for f in names if f not in folders]
    if unknown:
        raise ValueError(f"{listing} names the folders {unknown[:5]}, which are not class folders of {source} (its "
                         f"class folders: {folders[:5]}{' ...' if len(folders) > 5 else ''})")
    return [names[f] for f in folders]


def _held_out(x, y, fraction: float, seed: int, folders: list):
    """`fraction` of each class (at least one image, at least one left) drawn by `seed` as the test part."""
    rng = np.random.default_rng(seed)
    test = np.zeros(len(y), bool)
    for c in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == c))
        if len(rows) < 2:
            raise ValueError(f"class '{folders[c]}' has {len(rows)} image: a held-out test image needs at least 2 "
                             "(add images, or a test/ tree)")
        test[rows[:min(max(round(fraction * len(rows)), 1), len(rows) - 1)]] = True
    return (x[~test], y[~test]), (x[test], y[test])


@BENCHMARKS.register("images", ImagesConfig, images=True)
def benchmark(cfg, seed: int) -> Loaded:
    source = Path(cfg.root).expanduser()
    if not source.exists():
        raise FileNotFoundError(f"benchmark.root={source} does not exist: give a folder or archive of "
                                "train/<class>/*, test/<class>/* (or <class>/*) images")
    _check_class_folders(source)
    digest = source_digest(source, SUFFIXES)
    _check_layout(source, _layout(_image_paths(source, digest)), cfg.test_fraction)
    decoder = f"{DECODER}-{cfg.size}-{cfg.fit}-{cfg.channels}"
    (x_tr, y_tr), (x_te, y_te), folders = decoded_once(source, lambda s: read(s, cfg), decoder, digest)
    names = _class_names(source, folders)
    empty = [names[c] for c in range(len(folders)) if not (y_tr == c).any()]
    if empty:
        raise ValueError(f"{source}: classes {empty} have no training images")
    if len(y_te):
        split = "the source's train/ and test/ trees"
    else:
        (x_tr, y_tr), (x_te, y_te) = _held_out(x_tr, y_tr, cfg.test_fraction, seed, folders)
        split = f"{cfg.test_fraction:g} of each class held out, drawn by seed {seed}"
    train_x = torch.from_numpy(np.ascontiguousarray(x_tr))
    return Loaded(ArrayDataset(train_x, y_tr), ArrayDataset(torch.from_numpy(np.ascontiguousarray(x_te)), y_te),
                  names, split, input_norm=channel_mean_std(train_x))
