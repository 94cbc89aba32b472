"""Quantizing a model: every nn.Linear and nn.Conv2d (groups=1) becomes the layer class that runs a scheme."""
import warnings

from torch import nn

from .compact import compact_neighbours
from .hot import HotConv2d, HotLinear
from .layers import QuantConv2d, QuantLinear, QuantLayer
from .schemes import HotScheme, Scheme


def _layer_classes(scheme) -> dict:
    """torch class → the quantized class that runs `scheme` (the one place that tells the schemes' layers apart)."""
    if isinstance(scheme, HotScheme):
        return {nn.Linear: HotLinear, nn.Conv2d: HotConv2d}
    return {nn.Linear: QuantLinear, nn.Conv2d: QuantConv2d}


def _torch_class(module: nn.Module, name: str):
    """nn.Linear / nn.Conv2d for a layer to quantize, or None to leave it in float (with a warning where that
    may surprise)."""
    if isinstance(module, QuantLayer):
        return nn.Linear if isinstance(module, nn.Linear) else nn.Conv2d
    if type(module) is nn.Linear:
        return nn.Linear
    if type(module) is nn.Conv2d:
        if module.groups != 1:
            return None  # grouped / depthwise convs stay float (HDQT and HOT quantize groups=1 only)
        if module.padding_mode == "zeros" and not isinstance(module.padding, str):
            return nn.Conv2d
        warnings.warn(f"{name}: Conv2d with padding={module.padding!r}, padding_mode={module.padding_mode!r} "
                      "is left in float")
    elif isinstance(module, (nn.Linear, nn.Conv2d)):
        warnings.warn(f"{name}: {type(module).__name__} subclasses a Linear/Conv2d and is left in float")
    return None


def quantize_model(model: nn.Module, scheme: Scheme | HotScheme) -> nn.Module:
    """Make every nn.Linear and nn.Conv2d (groups=1) of `model` quantized by `scheme`, in place; return `model`.

    Layers change class in place (QuantLinear subclasses nn.Linear), so parameters, their identity in the
    optimizer, hooks and state-dict keys stay as they were. Idempotent and cheap: call it again whenever layers
    may have appeared (avalanche's IncrementalClassifier replaces its Linear as classes arrive) or to switch
    schemes. Layer indices (for the random bits) follow module order; a new layer starts at the model's step.
    A HotScheme gives the layers HOT's classes (quant/hot.py), and with `abc=true` their neighbours (ReLU, max
    pooling, the norms, GELU) compact classes (quant/compact.py); switching between HOT and another scheme changes
    the classes again, keeping the parameters and the step.
    """
    step = max((m.step for m in model.modules() if isinstance(m, QuantLayer)), default=0)
    classes = _layer_classes(scheme)
    index = 0
    for name, module in model.named_modules():
        base = _torch_class(module, name)
        if base is None:
            continue
        cls = classes[base]
        if type(module) is cls:
            module.scheme, module.quant_name, module.quant_index = scheme, name, index
        else:
            layer_step = module.step if isinstance(module, QuantLayer) else step
            for buffer in getattr(module, "_extra_buffers", ()):
                if buffer not in cls._extra_buffers:
                    module._buffers.pop(buffer, None)
            module.__class__ = cls
            module._setup_quant(scheme, name, index, layer_step)
        index += 1
    compact = isinstance(scheme, HotScheme) and scheme.abc is True
    compact_neighbours(model, scheme.backend if compact else None, scheme.abc_bits if compact else None)
    return model
