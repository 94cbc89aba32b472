"""benchmark=torchvision on generated files in torchvision's own formats (MNIST's idx files): shapes, class
names, the training split's normalisation, a short run; and a missing dataset named with what to do."""
import struct

import numpy as np
import pytest

from hdqt_cil.benchmarks import build_benchmark
from hdqt_cil.benchmarks.arrays import channel_mean_std


def write_idx(folder, name, images, labels):
    """`name`'s raw folder as torchvision reads it: <folder>/<name>/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte."""
    raw = folder / name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for part, (x, y) in zip(("train", "t10k"), zip(images, labels)):
        (raw / f"{part}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, *x.shape) + x.tobytes())
        (raw / f"{part}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, len(y)) + y.tobytes())


def generated(seed=0, counts=(60, 30)):
    """`counts` random training and test images, as many of each of the 10 classes."""
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 256, (n, 28, 28), dtype=np.uint8) for n in counts]
    labels = [np.repeat(np.arange(10, dtype=np.uint8), n // 10) for n in counts]
    return images, labels


def test_fashion_mnist_in_torchvisions_format(make_cfg, tmp_path):
    images, labels = generated()
    write_idx(tmp_path, "FashionMNIST", images, labels)
    cfg = make_cfg("benchmark=torchvision", f"benchmark.root={tmp_path}")
    assert cfg.benchmark.name == "fashionmnist"
    bench = build_benchmark(cfg.benchmark, seed=0)
    assert bench.input_shape == (1, 28, 28) and bench.num_classes == 10 and bench.n_experiences == 5
    assert bench.class_names[0] == "T-shirt/top" and bench.split == "torchvision's FashionMNIST training and test sets"
    mean, std = bench.input_norm
    assert mean[0] == pytest.approx(images[0].mean() / 255) and std[0] == pytest.approx(images[0].std(ddof=1) / 255)


def test_a_short_run_on_it(make_cfg, tmp_path):
    """Two training images a class and one test image: a quantized ResNet-32 takes about 0.1 s an image on a CPU
    core."""
    from hdqt_cil.experiment import run

    write_idx(tmp_path, "MNIST", *generated(1, counts=(20, 10)))
    cfg = make_cfg("benchmark=torchvision", "benchmark.dataset=MNIST", f"benchmark.root={tmp_path}",
                   "strategy=naive", "trainer.epochs=1", "trainer.device=cpu", "quant=hdqt")
    summary = run(cfg, tmp_path / "run")
    assert summary["status"] == "complete" and summary["run"]["benchmark"] == "mnist"


def test_a_missing_dataset_says_where_it_looked_and_what_to_do(make_cfg, tmp_path):
    cfg = make_cfg("benchmark=torchvision", "benchmark.dataset=KMNIST", f"benchmark.root={tmp_path}")
    with pytest.raises(FileNotFoundError, match=rf"benchmark.dataset=KMNIST: no KMNIST .* under {tmp_path} .*"
                                                r"benchmark.download=true"):
        build_benchmark(cfg.benchmark, seed=0)


def test_channel_statistics_of_a_constant_channel():
    import torch

    images = torch.stack([torch.full((2, 2), 51, dtype=torch.uint8), torch.arange(4, dtype=torch.uint8).view(2, 2)])
    mean, std = channel_mean_std(images[None].expand(3, 2, 2, 2).contiguous())
    assert mean[0] == pytest.approx(0.2) and std[0] == 1.0 and std[1] == pytest.approx(np.std([0, 1, 2, 3] * 3,
                                                                                               ddof=1) / 255)


def test_channel_statistics_equal_float64_over_every_value():
    import torch

    rng = np.random.default_rng(0)
    for shape in [(7, 1, 5, 3), (40, 3, 8, 8), (3, 4, 2, 9)]:
        images = torch.from_numpy(rng.integers(0, 256, shape, dtype=np.uint8))
        mean, std = channel_mean_std(images)
        values = images.numpy().astype(np.float64).transpose(1, 0, 2, 3).reshape(shape[1], -1) / 255
        np.testing.assert_allclose(mean, values.mean(1), rtol=1e-12)
        np.testing.assert_allclose(std, values.std(1, ddof=1), rtol=1e-12)
