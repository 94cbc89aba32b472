"""ArrayDataset in checkpoints: written as a reference to the live dataset with the same contents, not copied."""
import gc
import io

import dill
import pytest
import torch
from torch.utils.data import Subset

from hdqt_cil.benchmarks.arrays import ArrayDataset


def _round_trip(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer, pickle_module=dill)  # as avalanche's save_checkpoint does
    size = buffer.tell()
    buffer.seek(0)
    return torch.load(buffer, pickle_module=dill, weights_only=False), size


def test_a_checkpoint_refers_to_the_live_dataset_instead_of_copying_it():
    data = ArrayDataset(torch.randint(0, 256, (1000, 3, 32, 32), dtype=torch.uint8), [i % 10 for i in range(1000)])
    memory = {"exemplars": Subset(data, [3, 14, 15]), "val": Subset(data, [9, 26]), "whole": data}
    loaded, size = _round_trip(memory)
    assert size < 10_000 < data.inputs.numel()
    assert loaded["whole"] is data and loaded["exemplars"].dataset is data and loaded["val"].dataset is data
    assert loaded["exemplars"].indices == [3, 14, 15]


def test_the_reference_finds_equal_contents_in_another_object_and_tells_datasets_apart():
    inputs = torch.randn(50, 7)
    labels = [i % 3 for i in range(50)]
    original = ArrayDataset(inputs, labels)
    buffer = io.BytesIO()
    torch.save(original, buffer, pickle_module=dill)
    del original
    gc.collect()
    other = inputs.clone()
    other[17, 3] += 1e-3
    different = ArrayDataset(other, labels)  # same size, other contents
    buffer.seek(0)
    with pytest.raises(LookupError, match="dataset of 50 samples .* has not loaded"):
        torch.load(buffer, pickle_module=dill, weights_only=False)
    rebuilt = ArrayDataset(inputs.clone(), list(labels))  # what a resumed run loads from the same files
    buffer.seek(0)
    assert torch.load(buffer, pickle_module=dill, weights_only=False) is rebuilt
    assert different.fingerprint() != rebuilt.fingerprint()
    assert ArrayDataset(inputs, [2 - y for y in labels]).fingerprint() != rebuilt.fingerprint()
