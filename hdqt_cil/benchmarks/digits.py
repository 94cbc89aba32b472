"""scikit-learn's bundled 8×8 handwritten digits: real data that needs no download (the default benchmark)."""
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from .arrays import ArrayDataset
from .split import BENCHMARKS, BenchmarkConfig, Loaded


@dataclass
class DigitsConfig(BenchmarkConfig):
    loader: str = "digits"
    n_experiences: Optional[int] = 5


def load(test_fraction: float = 0.3, split_seed: int = 0):
    """1,797 images flattened to 64 features in [0, 1]; a fixed stratified train/test split."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, digits.target, test_size=test_fraction, random_state=split_seed, stratify=digits.target
    )
    names = [str(c) for c in range(10)]
    return ArrayDataset(torch.from_numpy(x_tr), y_tr), ArrayDataset(torch.from_numpy(x_te), y_te), names


@BENCHMARKS.register("digits", DigitsConfig)
def benchmark(cfg, seed: int):
    return Loaded(*load(), split="scikit-learn's stratified 70/30 split of random_state 0, the same for every seed")
