"""CIFAR augmentation on whole uint8 batches, on whatever device they are: random crop (zero padding 4),
horizontal flip, brightness jitter. The same operations as the per-sample torchvision pipeline in cifar.py,
vectorised so that a GPU-resident training set never waits for a CPU data loader.
"""
import torch
import torch.nn.functional as F


def augment_batch(x: torch.Tensor, padding: int = 4, brightness: float = 0.0) -> torch.Tensor:
    """x: uint8 (B, C, H, W) → augmented uint8 batch of the same shape."""
    b, _, h, w = x.shape
    padded = F.pad(x, (padding,) * 4)
    dy = torch.randint(0, 2 * padding + 1, (b, 1, 1), device=x.device)
    dx = torch.randint(0, 2 * padding + 1, (b, 1, 1), device=x.device)
    rows = (dy + torch.arange(h, device=x.device).view(1, h, 1)).expand(b, h, w)
    cols = (dx + torch.arange(w, device=x.device).view(1, 1, w)).expand(b, h, w)
    flip = torch.rand(b, 1, 1, device=x.device) < 0.5
    cols = torch.where(flip, dx + (w - 1) - torch.arange(w, device=x.device).view(1, 1, w), cols)
    batch = torch.arange(b, device=x.device).view(b, 1, 1).expand(b, h, w)
    out = padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)
    if brightness > 0:
        factor = torch.empty(b, 1, 1, 1, device=x.device).uniform_(1 - brightness, 1 + brightness)
        out = (out.float() * factor).clamp_(0, 255).round_().to(torch.uint8)
    return out.contiguous()
