"""LQS, HOT's layer-wise quantizer selection: per layer, per-tensor or per-token scales for G in g_x.

Once, before training, on one calibration batch: a full-precision forward and backward (the HOT layers run
torch's own ops and keep no state), the raw output gradient G of every HOT layer in its g_x layout (B, L, O),
and for each layer e = ‖G − Q(G)‖ (Frobenius) of its gx_bits stochastic quantization (max scale) per tensor and
per token (row). Per token is chosen iff e_token < lqs_threshold · e_tensor (0.5: the paper, and the authors'
code, which compares the same two errors). The choice is stored in each layer's `lqs_choice` buffer, so it
travels with the weights (state dict, checkpoints). The random bits are the layer's own, from a role of
their own (docs/numerics.md: code 6) at step 0, so a calibration is reproducible.

Nothing here knows about continual learning: the caller gives the batch (a training batch) and the loss.
"""
import dataclasses

import torch

from .compact import torch_neighbours
from .hot import hot_layers
from .quantizers import quantize


def _capture(layer, store: list):
    def hook(module, inputs, output):
        if output.requires_grad:
            store.append(output)
    return layer.register_forward_hook(hook)


def _token_rows(layer, grad: torch.Tensor) -> torch.Tensor:
    rows, _ = layer._hot_grad_layouts(grad.to(torch.float32))
    return rows


def quantization_errors(layer, g_rows: torch.Tensor) -> tuple[float, float]:
    """(e_tensor, e_token): ‖G − Q(G)‖ for the layer's g_x quantizer of G per tensor and per token."""
    scheme = layer.scheme
    if scheme.gx_bits is None:  # g_x in float: measure at 4 bits, so that the choice still means something
        scheme = dataclasses.replace(scheme, gx_bits=4)
    counter = layer._counter("lqs.grad_output", 0)
    errors = []
    for per_token in (False, True):
        levels, scale = quantize(g_rows, scheme.grad_output_spec(per_token), counter)
        errors.append(float((g_rows - levels * scale).norm()))
    return errors[0], errors[1]


def calibrate_lqs(model: torch.nn.Module, inputs, targets, loss_fn, threshold: float | None = None) -> dict:
    """Choose and store per-tensor or per-token g_x scales for every HOT layer of `model`; return
    {layer name: {"per_token": bool, "error_tensor": e, "error_token": e}}.

    One forward and backward of `loss_fn(model(inputs), targets)` in full precision. Parameters' .grad, buffers
    (BatchNorm running statistics), the train/eval mode and the layers' step counters are left as they were.
    `threshold` overrides each layer's scheme's lqs_threshold."""
    layers = hot_layers(model)
    if not layers:
        return {}
    modes = {m: m.training for m in model.modules()}
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    outputs = {name: [] for name, _ in layers}
    hooks = [_capture(layer, outputs[name]) for name, layer in layers]
    try:
        for _, layer in layers:
            layer.lqs_float = True
        model.train()
        with torch.enable_grad(), torch_neighbours(model):
            loss = loss_fn(model(inputs), targets)
            captured = [(name, out) for name, _ in layers for out in outputs[name]]
            grads = torch.autograd.grad(loss, [out for _, out in captured], allow_unused=True)
    finally:
        for hook in hooks:
            hook.remove()
        for _, layer in layers:
            layer.lqs_float = False
        for module, mode in modes.items():
            module.train(mode)
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name in buffers and not name.endswith("lqs_choice"):
                    b.copy_(buffers[name])
    per_layer = {name: [] for name, _ in layers}
    for (name, _), grad in zip(captured, grads):
        if grad is not None:
            per_layer[name].append(grad)
    result = {}
    for name, layer in layers:
        if not per_layer[name]:
            continue  # not reached by the loss: stays as it is
        e_tensor = e_token = 0.0
        for grad in per_layer[name]:  # a layer called several times: squared errors add up
            t, k = quantization_errors(layer, _token_rows(layer, grad))
            e_tensor, e_token = e_tensor + t * t, e_token + k * k
        e_tensor, e_token = e_tensor ** 0.5, e_token ** 0.5
        limit = layer.scheme.lqs_threshold if threshold is None else threshold
        per_token = e_token < limit * e_tensor
        layer.set_lqs(per_token)
        result[name] = {"per_token": per_token, "error_tensor": e_tensor, "error_token": e_token}
    return result


def lqs_pending(model: torch.nn.Module) -> bool:
    """Whether `model` has HOT layers whose scheme asks for LQS and that are not calibrated yet."""
    return any(layer.scheme.lqs and not layer.lqs_calibrated for _, layer in hot_layers(model))


def lqs_choices(model: torch.nn.Module) -> dict[str, str]:
    """{layer name: 'token' | 'tensor' | 'uncalibrated'} of every HOT layer."""
    return {name: "token" if layer.lqs_per_token else "tensor" if layer.lqs_calibrated else "uncalibrated"
            for name, layer in hot_layers(model)}
