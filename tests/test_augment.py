import numpy as np
import torch
import torch.nn.functional as F

from hdqt_cil.benchmarks.augment import augment_batch
from hdqt_cil.experiment import run
from test_cifar import write_torchvision_cifar


def _crops(img, padding=4):
    padded = F.pad(img, (padding,) * 4)
    size = img.shape[-1]
    for dy in range(2 * padding + 1):
        for dx in range(2 * padding + 1):
            crop = padded[:, dy:dy + size, dx:dx + size]
            yield crop
            yield crop.flip(-1)


def test_every_output_is_a_padded_crop_or_its_mirror():
    torch.manual_seed(0)
    x = torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8)
    out = augment_batch(x)
    assert out.dtype == torch.uint8 and out.shape == x.shape
    for img, aug in zip(x, out):
        assert any(torch.equal(aug, c) for c in _crops(img))
    assert augment_batch(x).ne(out).any(), "two calls should draw different crops"


def test_half_of_the_images_are_mirrored():
    torch.manual_seed(2)
    x = torch.randint(0, 256, (400, 3, 8, 8), dtype=torch.uint8)
    out = augment_batch(x, padding=0)
    mirrored = sum(torch.equal(a, b.flip(-1)) for a, b in zip(out, x))
    unchanged = sum(torch.equal(a, b) for a, b in zip(out, x))
    assert mirrored + unchanged == 400 and 140 < mirrored < 260


def test_brightness_scales_each_image_by_one_factor():
    torch.manual_seed(1)
    x = torch.full((32, 3, 8, 8), 100, dtype=torch.uint8)
    out = augment_batch(x, padding=0, brightness=0.25)
    per_image = out.view(32, -1).float()
    assert torch.all(per_image == per_image[:, :1]), "a constant image stays constant"
    assert per_image.min() >= 75 and per_image.max() <= 125 and per_image.std() > 1


def test_gpu_style_augmentation_trains(make_cfg, tmp_path):
    write_torchvision_cifar(tmp_path / "data", "cifar10", per_class_train=4, per_class_test=2)
    cfg = make_cfg("benchmark=cifar10", "model=resnet32", "strategy=naive", "benchmark.verify=false",
                   "benchmark.augment_on=gpu", "trainer.epochs=1", "trainer.batch_size=8", "trainer.device=cpu")
    summary = run(cfg, tmp_path / "run")
    assert np.array(summary["acc_matrix"], dtype=float).shape == (5, 5)
