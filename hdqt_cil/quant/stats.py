"""What the quantized layers of a model count and carry between steps: saturation and clipping statistics, the
check for non-finite values in captured steps, and each layer's step counter."""
import math

import torch
from torch import nn

from .layers import STATS, NonFiniteError, QuantLayer


def quant_stats(model: nn.Module) -> dict[str, dict[str, float]]:
    """Per quantized layer, since the last reset: shares of saturated tile sums (per product) and of clipped
    forward values. One device transfer for the whole model."""
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, QuantLayer)]
    if not layers:
        return {}
    device = layers[0][1].quant_counts.device
    counts = torch.stack([m.quant_counts.to(device) for _, m in layers]).tolist()
    return {name: {stat: h / total if total else 0.0 for stat, h, total in zip(STATS, hits, totals)}
            for (name, _), (hits, totals) in zip(layers, counts)}


def check_captured_steps(model: nn.Module) -> None:
    """Raise NonFiniteError if a NaN or Inf reached a quantizer in a step replayed from a CUDA graph (one sync)."""
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, QuantLayer)]
    if not layers:
        return
    device = layers[0][1].quant_worst.device
    worst = torch.stack([m.quant_worst.to(device) for _, m in layers])
    if bool(worst.isfinite().all()):
        return
    for (name, m), row in zip(layers, worst.tolist()):
        for where, value in zip(("forward", "backward"), row):
            if not math.isfinite(value):
                raise NonFiniteError(f"layer '{name}': a non-finite value ({value}) reached a quantizer of the "
                                     f"{where} pass in a step replayed from a CUDA graph (scheme {m.scheme.name}); "
                                     "run the step without graph capture to see the tensor role")


def layer_steps(model: nn.Module) -> dict[str, int]:
    """Each quantized layer's training step (its stochastic-rounding counter), by name: state a checkpoint keeps."""
    return {name: m.step for name, m in model.named_modules() if isinstance(m, QuantLayer)}


def set_layer_steps(model: nn.Module, steps: dict[str, int]) -> None:
    for name, module in model.named_modules():
        if isinstance(module, QuantLayer):
            module.step = steps[name]


def reset_quant_stats(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, QuantLayer):
            module.quant_counts.zero_()
