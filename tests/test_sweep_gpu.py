"""Packing changes no result: a quantized CIFAR-format ResNet-32 run gives the same accuracy matrix, per-class
accuracies and losses bit for bit alone, packed with other runs on the GPU, and packed under CUDA MPS."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_cifar import write_torchvision_cifar

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def sweep(tmp_path, name, data_root, seeds, per_gpu, mps):
    out = tmp_path / name
    args = ["-m", "hydra/launcher=gpus", f"hydra.launcher.jobs_per_gpu={per_gpu}", f"hydra.launcher.mps={mps}",
            f"results_root={out}", f"data_root={data_root}", "benchmark=cifar10", "model=resnet32", "quant=hdqt",
            "strategy=icarl", "benchmark.verify=false", "benchmark.augment_on=gpu", "trainer.epochs=2",
            "trainer.batch_size=32", "trainer.memory_size=40", "logging.progress=off", f"seed={seeds}"]
    result = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((out / "cifar10-resnet32/icarl/hdqt/seed0/summary.json").read_text()), result.stdout


def test_a_run_packed_with_others_is_bit_identical_to_it_alone(tmp_path):
    write_torchvision_cifar(tmp_path / "data", "cifar10", per_class_train=48, per_class_test=8)
    alone, _ = sweep(tmp_path, "alone", tmp_path / "data", "0", 1, "off")
    packed, _ = sweep(tmp_path, "packed", tmp_path / "data", "0,1,2,3", 4, "off")
    under_mps, log = sweep(tmp_path, "mps", tmp_path / "data", "0,1,2,3", 4, "on")
    assert "CUDA MPS" in log
    for other in (packed, under_mps):
        assert other["status"] == alone["status"] == "complete"
        for key in ("acc_matrix", "class_acc", "train_loss"):
            assert other[key] == alone[key], key
