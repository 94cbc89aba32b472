"""torchvision's image classification sets in torchvision's own formats under the data root: MNIST,
FashionMNIST, KMNIST (idx files), CIFAR10, CIFAR100 (pickles), SVHN (.mat); `benchmark.download=true` fetches them
where a network exists.

The images end as uint8 (N, C, H, W) tensors in memory, as the CIFAR benchmarks'; the per-channel mean and std
that the model's first layer normalises with are computed from the training split (and so are part of the run's
data). Nothing is augmented: these sets are taken as they are.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..settings import BOOL, one_of, setting
from .arrays import ArrayDataset, channel_mean_std
from .split import BENCHMARKS, BenchmarkConfig, Loaded

# name → how its train / test parts are asked for ("train": train=True/False; "split": split="train"/"test")
DATASETS = {"MNIST": "train", "FashionMNIST": "train", "KMNIST": "train", "CIFAR10": "train", "CIFAR100": "train",
            "SVHN": "split"}


@dataclass
class TorchvisionConfig(BenchmarkConfig):
    loader: str = "torchvision"
    dataset: str = setting("FashionMNIST", one_of(*DATASETS))  # torchvision.datasets.<dataset>
    root: str = "${data_root}"  # the folder torchvision's class reads (e.g. <root>/FashionMNIST/raw/*-ubyte)
    download: bool = setting(False, BOOL)
    n_experiences: Optional[int] = 5


def _part(cfg, train: bool):
    """(uint8 images (N, C, H, W), labels, class names) of the training or the test part."""
    from torchvision import datasets

    cls = getattr(datasets, cfg.dataset)
    which = {"train": train} if DATASETS[cfg.dataset] == "train" else {"split": "train" if train else "test"}
    try:
        data = cls(root=cfg.root, download=cfg.download, **which)
    except RuntimeError as err:  # torchvision: "Dataset not found or corrupted. You can use download=True ..."
        raise FileNotFoundError(f"benchmark.dataset={cfg.dataset}: no {cfg.dataset} in torchvision's format under "
                                f"{cfg.root} ({err}); set benchmark.root to the folder holding it, or "
                                "benchmark.download=true where a network exists") from err
    images = np.asarray(data.data)
    if images.ndim == 3:  # (N, H, W): one channel
        images = images[:, None]
    elif images.shape[-1] in (1, 3) and images.shape[1] not in (1, 3):  # (N, H, W, C), as the CIFAR pickles
        images = images.transpose(0, 3, 1, 2)
    labels = np.asarray(getattr(data, "targets", None) if hasattr(data, "targets") else data.labels, np.int64)
    names = getattr(data, "classes", None) or [str(c) for c in range(int(labels.max()) + 1)]
    return torch.from_numpy(np.ascontiguousarray(images, dtype=np.uint8)), labels, list(names)


@BENCHMARKS.register("torchvision", TorchvisionConfig, images=True)
def benchmark(cfg, seed: int) -> Loaded:
    train_x, train_y, names = _part(cfg, train=True)
    test_x, test_y, _ = _part(cfg, train=False)
    return Loaded(ArrayDataset(train_x, train_y), ArrayDataset(test_x, test_y), names,
                  f"torchvision's {cfg.dataset} training and test sets", input_norm=channel_mean_std(train_x))
