"""An in-memory dataset of (input, label) pairs that avalanche can split by class."""
import torch
from torch.utils.data import Dataset


class ArrayDataset(Dataset):
    """Inputs held as one tensor (features, or uint8 CHW images) with integer labels in `.targets`.

    Holding the whole set in memory keeps small benchmarks (HAR features, 32×32 images) free of per-sample
    file I/O; avalanche reads `.targets` to split the classes into experiences.
    """

    def __init__(self, inputs: torch.Tensor, targets):
        targets = torch.as_tensor(targets, dtype=torch.long)
        if len(inputs) != len(targets):
            raise ValueError(f"{len(inputs)} inputs but {len(targets)} labels")
        self.inputs = inputs
        self.targets = targets.tolist()

    def __len__(self):
        return len(self.inputs)

    def __getitem__(self, i):
        return self.inputs[i], self.targets[i]
