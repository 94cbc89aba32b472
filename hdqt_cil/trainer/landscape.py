"""Loss landscapes of diagnostics=full (docs/diagnostics.md): a model's training loss on a 1-D and a 2-D slice
through its weights along filter-normalised random directions (Li et al., NeurIPS 2018, "Visualizing the Loss
Landscape of Neural Nets").

A direction d has, for every weight of two or more dimensions, Gaussian entries rescaled filter by filter (each
slice along the weight's first dimension, an output channel or row) to the norm of that filter of the weight, so
that a step of 1 along it is as large as the weight itself, whatever each layer's scale; biases and norm parameters
get no component. The loss is evaluated at θ + α·d1 (and θ + α·d1 + β·d2) for α, β on a grid over [-span, span],
on a copy of the model in eval mode: the run's own model, random streams and numbers are untouched.
"""
import copy

import torch
import torch.nn.functional as F
from torch import nn


def filter_normalised_direction(model: nn.Module, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """{parameter name: direction}: Gaussian, each filter scaled to its weight filter's norm; zero for parameters
    of fewer than two dimensions (biases, norm scales and shifts)."""
    direction = {}
    for name, weight in model.named_parameters():
        if weight.dim() < 2:
            direction[name] = torch.zeros_like(weight)
            continue
        d = torch.randn(weight.shape, generator=generator).to(weight)
        filters, d_filters = weight.detach().flatten(1), d.flatten(1)
        scale = filters.norm(dim=1) / d_filters.norm(dim=1).clamp_min(torch.finfo(d.dtype).tiny)
        direction[name] = (d_filters * scale.unsqueeze(1)).view_as(weight)
    return direction


def slice_summary(losses: list[float]) -> dict[str, float]:
    """A 1-D slice's loss at the weights (its centre point) and its rise: the mean of its two ends (±span) less the
    centre, negative where the weights are no minimum along the direction."""
    centre = losses[len(losses) // 2]
    return {"centre": centre, "rise": (losses[0] + losses[-1]) / 2 - centre}


def _loss(model: nn.Module, batches: list) -> float:
    """Mean cross-entropy of the model's logits over the batches' samples."""
    total, count = 0.0, 0
    for x, y in batches:
        total += F.cross_entropy(model(x), y, reduction="sum").item()
        count += len(y)
    return total / count


def loss_landscape(model: nn.Module, batches: list, directions: tuple[dict, dict], points: int,
                   span: float) -> dict:
    """{alphas, 1d: loss at θ + α·d1, 2d: [row α][column β] loss at θ + α·d1 + β·d2} on a copy of `model` in eval
    mode, an odd number of `points` values of α (and β) evenly over [-span, span], the middle one exactly 0: the 1-D
    slice is the 2-D grid's middle column."""
    probe = copy.deepcopy(model).eval()
    origin = {name: p.detach().clone() for name, p in probe.named_parameters()}
    half = points // 2
    alphas = [span * (i - half) / half for i in range(points)]

    def at(alpha: float, beta: float) -> float:
        with torch.no_grad():
            for name, p in probe.named_parameters():
                p.copy_(origin[name] + alpha * directions[0][name] + beta * directions[1][name])
            return _loss(probe, batches)
    grid = [[at(a, b) for b in alphas] for a in alphas]
    return {"alphas": alphas, "1d": [row[half] for row in grid], "2d": grid}
