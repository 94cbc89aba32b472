"""diagnostics=light: what low-bit training does to a run's gradients, measured inside the run (docs/diagnostics.md).

On every `every`-th training batch of an experience (the first included), G = ∂loss/∂logits of that step (taken during
its backward) is sent back, before the update, through two copies of the model at the step's weights, on the same batch:
the quantized model as the step ran it (its stochastic rounding at the step's counters) and a float shadow (every layer
plain FP32, without TF32). For each Linear and Conv2d layer the weight gradient g_W and the input gradient g_x of the
two are compared (cosine similarity, relative L2 error ‖q − f‖ / ‖f‖, sign agreement where the float gradient is not
zero), for G whole and, once old classes exist, for G restricted to the old classes' logits and to the new ones'; so are
the two forwards: each layer's input and the logits (whole, old classes', new ones'), how far the quantized forward
drifts from the float one at the same weights; the quantized copy's tensors by role (input, weight, grad_output, g_x,
g_W) are summarised (max, min, mean, L2 norm). The quantized copy's ops are watched (`QuantizerWatch`, for G whole): the
share of nonzero values each quantizer rounds to level 0 (underflow), by its role, and each integer product's largest
tile sum against its accumulator's limit. The copies draw the same dropout masks from a forked generator: the run's own
random streams and numbers are untouched. Records are means over an experience's diagnosed batches, kept in the plugin
and in its epoch checkpoints, written with the run as diagnostics.json. On a GPU the measures are kernels
(kernels/measures.py), and where the run's steps are replayed from CUDA graphs its diagnosed batches are too
(`CapturedDiagnosis`), beside the next steps. diagnostics=full adds, at the end of each experience, the training loss's
landscape around the weights for the quantized model and its float shadow (trainer/landscape.py), and from the second
experience on the old experiences' test loss along the same directions.
"""
import contextlib
import copy
import math
import warnings
from dataclasses import dataclass

import torch
from avalanche.core import SupervisedPlugin
from torch import nn

from .. import kernels
from ..graph_replay import capturing_into, warm_up
from ..quant import preset, quantize_model
from ..quant.intmm import accumulator_limit, largest_tile_sum
from ..quant.layers import ROLE_CODES, ROLE_STRIDE, QuantLayer
from ..settings import POSITIVE, POSITIVE_INT, Rule, one_of, setting
from .landscape import filter_normalised_direction, loss_landscape, slice_summary

LEVELS = ("off", "light", "full")
ODD_POINTS = Rule(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 3 and v % 2 == 1,
                  "an odd integer >= 3 (the grid's middle point is the trained weights)")
GRADIENTS = ("g_W", "g_x")
COMPARED = (*GRADIENTS, "input")  # a layer's tensors compared with the float shadow's: its gradients and its input
ROLES = ("input", "weight", "grad_output", "g_x", "g_W")
ROLE_OF_CODE = {code: role for role, code in ROLE_CODES.items()}  # a quantizer's role, from its counter
PRODUCT_STATS = {"forward": "forward_saturated", "grad_input": "grad_input_saturated",
                 "grad_weight": "grad_weight_saturated"}  # a product, from the tally it adds to


@dataclass
class DiagnosticsConfig:
    level: str = setting("off", one_of(*LEVELS))  # off | light (gradient fidelity and statistics) | full (+ landscapes)
    every: int = setting(50, POSITIVE_INT)  # every Nth training batch of an experience, from its first
    # full: the loss landscape at the end of each experience on a grid of points² weights along two directions
    landscape_points: int = setting(21, ODD_POINTS)
    landscape_span: float = setting(1.0, POSITIVE)  # the grid spans [-span, span] of each direction
    landscape_batches: int = setting(4, POSITIVE_INT)  # training batches of the experience the loss is taken on


@dataclass(frozen=True)
class Landscape:
    """What diagnostics=full evaluates at the end of each experience (DiagnosticsConfig's landscape_*)."""
    points: int
    span: float
    batches: int


def _on_kernels(*tensors: torch.Tensor) -> bool:
    """Whether the measures of `tensors` run as the kernels' two launches (float32 on a GPU with the kernels)
    rather than torch's chain of about twenty ops: the diagnosis of a ResNet-32 batch takes thousands."""
    return all(t.is_cuda and t.dtype == torch.float32 and t.numel() for t in tensors) and kernels.available()


def _fidelity(quantized: torch.Tensor, reference: torch.Tensor) -> dict:
    """fidelity's measures as float64 0-dim tensors on the gradients' device (no sync)."""
    if _on_kernels(quantized, reference):
        return dict(zip(("cosine", "rel_error", "sign"), kernels.fidelity(quantized, reference).unbind()))
    q, f = quantized.double().reshape(-1), reference.double().reshape(-1)
    norm, q_norm = f.norm(), q.norm()
    # the same sign where f is not zero ⇔ q·f > 0 (exact in float64 for float32 gradients: no product underflows)
    measures = {"cosine": torch.where(q_norm > 0, q @ f / (q_norm * norm), 0.0),
                "rel_error": (q - f).norm() / norm,
                "sign": torch.count_nonzero(q * f > 0) / torch.count_nonzero(f).double()}
    return {name: torch.where(norm > 0, value, math.nan) for name, value in measures.items()}


def fidelity(quantized: torch.Tensor, reference: torch.Tensor) -> dict:
    """Cosine similarity, relative L2 error and sign agreement (where the reference is not zero) of two gradients;
    NaN where the reference is all zero."""
    return on_host(_fidelity(quantized, reference))


def _summary_statistics(t: torch.Tensor) -> dict:
    if _on_kernels(t):
        return dict(zip(("max", "min", "mean", "norm"), kernels.moments(t).unbind()))
    t = t.double()
    return {"max": t.max(), "min": t.min(), "mean": t.mean(), "norm": t.norm()}


def _tensor_leaves(tree) -> list:
    """The 0-dim tensors of a nested dict (or list), in a fixed walk order (`_filled`'s)."""
    leaves = []
    _walk(tree, leaves.append)
    return leaves


def _filled(tree, values):
    """`tree` with its tensor leaves replaced, in `_tensor_leaves`' order, by `values`."""
    values = iter(values)
    return _walk(tree, lambda _: next(values))


def _walk(node, leaf):
    if isinstance(node, dict):
        return {key: _walk(value, leaf) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
        return type(node)(_walk(value, leaf) for value in node)
    return leaf(node) if torch.is_tensor(node) else node


def _stacked(leaves: list) -> torch.Tensor:
    return torch.stack([t.double() for t in leaves])


def on_host(tree):
    """A nested dict (or list) whose leaves are 0-dim tensors (on one device) as the same of Python numbers: one
    device transfer for all of them, not a sync a value."""
    leaves = _tensor_leaves(tree)
    return _filled(tree, _stacked(leaves).tolist() if leaves else [])


def _layers(model: nn.Module) -> dict:
    return {name: m for name, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))}


def quantizer_steps(model: nn.Module) -> dict:
    """Each quantized layer's step counter: what its next forward's stochastic rounding draws from (device copies:
    read without a sync)."""
    return {name: m.quant_step.clone() for name, m in model.named_modules() if isinstance(m, QuantLayer)}


def replayed(model: nn.Module, steps: dict) -> nn.Module:
    """A copy of `model` whose quantized layers draw again from the counters `steps` (quantizer_steps)."""
    return _replaying(copy.deepcopy(model), steps)


def _replaying(twin: nn.Module, steps: dict) -> nn.Module:
    with torch.no_grad():
        for name, module in twin.named_modules():
            if name in steps:
                module.quant_step.copy_(steps[name])
    return twin


def float_shadow(model: nn.Module) -> nn.Module:
    """A copy of `model` at its weights whose every layer computes in plain FP32."""
    return quantize_model(copy.deepcopy(model), preset("fp32"))


def _structure(model: nn.Module) -> list:
    """What a kept copy of `model` must share with it to be refreshed by its state: modules, schemes, shapes."""
    return ([(name, type(m), getattr(m, "scheme", None)) for name, m in model.named_modules()]
            + [(name, t.shape, t.dtype, t.device) for name, t in (*model.named_parameters(), *model.named_buffers())])


def _flags(model: nn.Module) -> tuple:
    """What a copy takes from the model besides tensors: each module's mode and each parameter's requires_grad."""
    return (tuple(m.training for m in model.modules()), tuple(p.requires_grad for p in model.parameters()))


class ModelCopies:
    """The quantized copy and the float shadow of a diagnosed batch, made once and, while the model keeps its
    structure, brought to its weights, buffers, modes and frozen parameters in place (a deep copy of the model a
    diagnosed batch cost more than the copies' own passes)."""

    def __init__(self):
        self.structure, self.twin, self.shadow = None, None, None

    def at(self, model: nn.Module, steps: dict) -> tuple[nn.Module, nn.Module]:
        """(replayed(model, steps), float_shadow(model)), the same numbers."""
        structure = _structure(model)
        if structure != self.structure:
            self.structure, self.twin, self.shadow = structure, copy.deepcopy(model), float_shadow(model)
        else:
            self.take_flags(model)
            self.take_tensors(model)
        return _replaying(self.twin, steps), self.shadow

    def take_flags(self, model: nn.Module) -> None:
        """The copies' modules in the model's modes, their parameters frozen where the model's are."""
        modes, requires_grad = _flags(model)
        for kept in (self.twin, self.shadow):
            for module, training in zip(kept.modules(), modes):
                module.training = training
            for p, needed in zip(kept.parameters(), requires_grad):
                p.requires_grad_(needed)

    def sources(self, model: nn.Module) -> tuple[list, list]:
        """(the model's tensors, the copies' tensors they are copied into): the twin takes every parameter and
        buffer (the layers' counters and largest scales too), the shadow its own state's."""
        named = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        twin = {**dict(self.twin.named_parameters()), **dict(self.twin.named_buffers())}
        pairs = [(named[name], t) for name, t in twin.items()]
        pairs += [(named[name], t) for name, t in self.shadow.state_dict(keep_vars=True).items()]
        return [s.detach() for s, _ in pairs], [t.detach() for _, t in pairs]

    def take_tensors(self, model: nn.Module) -> None:
        """The copies' tensors set to the model's in place (launches only: no sync, and a CUDA graph may hold
        them)."""
        sources, targets = self.sources(model)
        with torch.no_grad():
            torch._foreach_copy_(targets, sources)


class QuantizerWatch:
    """A quantized layer's ops seen by the diagnostics (the layer's `ops_watch`): every call passes through
    unchanged; while `recording`, each quantizer's zero levels among its nonzero values are counted by role and
    each saturating integer product's largest tile sum (before saturation) is kept by product."""

    def __init__(self, layer: QuantLayer):
        self.layer, self.ops, self.recording = layer, None, True
        self.zeros: dict[str, list] = {}  # role: [zero levels of nonzero values, nonzero values] (device counts)
        self._pairs: dict[str, torch.Tensor] = {}  # role: the kernels' float64 pair that zeros' entries view
        self.tile_sums: dict[str, dict] = {}  # product: {largest (device), limit}

    def __call__(self, ops):
        self.ops = ops
        return self

    def __getattr__(self, name):
        return getattr(self.ops, name)

    def _underflow(self, t, levels, counter) -> None:
        if counter is not None:
            self.underflow(ROLE_OF_CODE[counter.role % ROLE_STRIDE], t, levels)

    def underflow(self, role: str, t, values) -> None:
        """While recording: the nonzero values of `t` that its quantizer's `values` (levels, or a float format's
        rounded values) hold as 0, counted for `role` (a float product's quantizers report here themselves)."""
        if not self.recording or t.numel() == 0:  # an empty tensor has no nonzero value
            return
        if _on_kernels(t) and values.is_cuda and values.dtype in (torch.int8, torch.float32):
            pair = self._pairs.get(role)
            if pair is None:
                pair = self._pairs[role] = torch.zeros(2, dtype=torch.float64, device=t.device)
                self.zeros[role] = list(pair.unbind())
            kernels.count_zero_levels(t, values, pair)
            return
        counts = self.zeros.setdefault(role, [0, 0])
        counts[0] = counts[0] + torch.count_nonzero((t != 0) & (values == 0))
        counts[1] = counts[1] + torch.count_nonzero(t)

    def tile_sum(self, tally, largest: torch.Tensor, limit: float) -> None:
        """While recording: the largest tile sum of a product (before its accumulator saturates or rounds it),
        kept with the accumulator's limit; the product is the one whose statistics `tally` is."""
        if not self.recording:
            return
        product = next(p for p, stat in PRODUCT_STATS.items() if self.layer._tally(stat).data_ptr() == tally.data_ptr())
        kept = self.tile_sums.setdefault(product, {"largest": largest, "limit": limit})
        kept["largest"] = torch.maximum(kept["largest"], largest)

    def _tile_sums(self, a, b, tile, acc_bits, bounds, tally) -> None:
        if self.recording and acc_bits is not None and tally is not None:
            self.tile_sum(tally, largest_tile_sum(a, b, tile, bounds), accumulator_limit(acc_bits))

    def quantize(self, t, spec, counter=None, worst=None, times=None):
        levels, scale = self.ops.quantize(t, spec, counter, worst=worst, times=times)
        self._underflow(t, levels, counter)
        return levels, scale

    def forward_quantize(self, t, spec, counter, ste, tally, worst=None):
        out = self.ops.forward_quantize(t, spec, counter, ste, tally, worst)
        self._underflow(t, out[0], counter)
        return out

    def hadamard_quantize(self, x, spec, counter=None, block=None, dim=-1, worst=None, times=None):
        levels, scale = self.ops.hadamard_quantize(x, spec, counter, block, dim, worst=worst, times=times)
        if self.recording:
            self._underflow(self.ops.block_hadamard(x, dim, block), levels, counter)
        return levels, scale

    def scaled_int_matmul(self, a, b, scale_a, scale_b, block=1, tile=32, acc_bits=8, bounds=None,
                          count_saturated=False, sum_batch=False, tally=None, keep=None, acc_format=None):
        self._tile_sums(a, b, tile, acc_bits, bounds, tally)
        return self.ops.scaled_int_matmul(a, b, scale_a, scale_b, block, tile, acc_bits, bounds, count_saturated,
                                          sum_batch, tally=tally, keep=keep, acc_format=acc_format)

    def col2im_int_matmul(self, a, b, scale_a, scale_b, block, tile, acc_bits, bounds, x_shape, kernel_size,
                          padding, dilation, stride, keep=None, tally=None, acc_format=None):
        self._tile_sums(a, b, tile, acc_bits, bounds, tally)
        return self.ops.col2im_int_matmul(a, b, scale_a, scale_b, block, tile, acc_bits, bounds, x_shape,
                                          kernel_size, padding, dilation, stride, keep, tally, acc_format=acc_format)

    def counts(self) -> dict:
        """What was recorded, on the device: {zeros: {role: [zero levels, nonzero values]}, tile_sums: {product:
        {largest, limit}}} (record's input, after on_host)."""
        return {"zeros": self.zeros, "tile_sums": self.tile_sums}

    def record(self) -> dict:
        """{underflow: {role: share}, tile_sums: {product: {largest, limit}}} of what was recorded."""
        return underflow_shares(on_host(self.counts()))


def underflow_shares(counts: dict) -> dict:
    """QuantizerWatch.counts (on the host) as its record: the zero levels' share of the nonzero values by role."""
    return {"underflow": {role: zeros / seen if seen else 0.0 for role, (zeros, seen) in counts["zeros"].items()},
            "tile_sums": counts["tile_sums"]}


def watched(model: nn.Module) -> dict:
    """A QuantizerWatch on every quantized layer of `model` (set as its ops_watch), by layer name."""
    watches = {}
    for name, module in model.named_modules():
        if isinstance(module, QuantLayer):
            module.ops_watch = watches[name] = QuantizerWatch(module)
    return watches


@contextlib.contextmanager
def _seeded(seed: int, device: torch.device):
    """torch's random streams from `seed` for a while, the run's own put back after (the copies' dropout masks)."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def _float32_proper():
    """float32 products without TF32 inputs for a while (torch lets cuDNN's convolutions take TF32 by default): the
    float shadow's gradients are FP32's."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    kept = matmul.allow_tf32
    matmul.allow_tf32 = False
    try:
        with cudnn.flags(enabled=cudnn.enabled, benchmark=cudnn.benchmark, deterministic=cudnn.deterministic,
                         allow_tf32=False):
            yield
    finally:
        matmul.allow_tf32 = kept


class _Pass:
    """One forward of a batch through a model copy and backwards of G from its logits: each layer's input, g_x,
    grad_output (hooks) and g_W (with `float32`, without TF32: the float shadow's). The forward runs on leaf aliases
    of the copy's parameters (same storage), fresh for each pass: autograd nodes made on one stream (an eager pass)
    stay out of a CUDA-graph capture on another."""

    def __init__(self, model: nn.Module, x: torch.Tensor, float32: bool = False):
        self.model, self.layers = model, _layers(model)
        self.precision = _float32_proper if float32 else contextlib.nullcontext
        self.inputs, self.grads, self.hooks = {}, {}, []
        for name, layer in self.layers.items():
            self.hooks.append(layer.register_forward_hook(self._forward(name)))
            self.hooks.append(layer.register_full_backward_hook(self._backward(name)))
        # an integer batch (images augmented on the GPU, normalised in the model) has no gradient of its own
        self.x = x.detach().requires_grad_(x.is_floating_point())
        self.params, self.logits = None, None

    def forward(self) -> None:
        self.params = {name: p.detach().requires_grad_(p.requires_grad) for name, p in self.model.named_parameters()}
        with self.precision():
            self.logits = torch.func.functional_call(self.model, self.params, (self.x,))

    def _forward(self, name):
        def hook(module, inputs, output):
            self.inputs[name] = inputs[0].detach()
        return hook

    def _backward(self, name):
        def hook(module, grad_input, grad_output):
            record = self.grads.setdefault(name, {"grad_output": grad_output[0].detach()})
            if grad_input[0] is not None:
                record["g_x"] = grad_input[0].detach()
        return hook

    def backward(self, g: torch.Tensor) -> dict:
        """{layer: {g_W, g_x, grad_output, input}} of G = g."""
        self.grads = {}
        weights = {name: self.params[f"{name}.weight"] for name in self.layers}
        trained = {name: w for name, w in weights.items() if w.requires_grad}  # not frozen
        # the input among the differentiated tensors: the first layer's g_x is on no weight's path
        inputs = [self.x] if self.x.requires_grad else []
        with self.precision(), warnings.catch_warnings():
            # the first layer's hook fires without an input gradient where the batch is integer: g_x is not kept
            warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")
            grads = torch.autograd.grad(self.logits, list(trained.values()) + inputs, g, retain_graph=True,
                                        allow_unused=True)
        g_weights = dict(zip(trained, grads))
        out = {}
        for name in self.layers:
            record = dict(self.grads.get(name, {}))
            if name in self.inputs:
                record["input"] = self.inputs[name]
            if g_weights.get(name) is not None:
                record["g_W"] = g_weights[name]
            out[name] = record
        return out

    def close(self):
        """The hooks off the model, and the pass's tensors let go: the logits' autograd graph (kept for the
        backwards of G's parts, every activation in it) holds the backward hooks, which hold this pass, a cycle
        through autograd's nodes that Python's collector cannot see (it kept every diagnosed batch's
        activations)."""
        for hook in self.hooks:
            hook.remove()
        self.logits = self.params = None
        self.inputs, self.grads = {}, {}


def _parts(g: torch.Tensor, old: torch.Tensor | None) -> dict:
    """G (or the logits) whole and, once old classes exist (`old`: a mask over the logits), restricted to the old
    and the new."""
    return {"all": g} if old is None else {"all": g, "old": g * old, "new": g * ~old}


class _Diagnosis:
    """A diagnosed batch through the quantized copy (its quantizers watched) and the float shadow: `forwards`,
    each under the batch's seed so that both draw the same dropout masks, then `measures` of G's parts as a tree
    of 0-dim device tensors (nothing read back: a CUDA graph may capture it)."""

    def __init__(self, quantized: nn.Module, shadow: nn.Module, x: torch.Tensor):
        self.quantized = quantized
        self.watches = watched(quantized)
        self.passes = [_Pass(quantized, x), _Pass(shadow, x, float32=True)]

    def measures(self, g: torch.Tensor, old: torch.Tensor | None) -> dict:
        grads = {}
        for part, g_part in _parts(g, old).items():  # "all" first: the watches record its backward alone
            grads[part] = [p.backward(g_part) for p in self.passes]
            for watch in self.watches.values():
                watch.recording = False
        quantized, shadow = self.passes
        q_logits, f_logits = (_parts(p.logits.detach(), old) for p in self.passes)
        measured = {"watches": {name: watch.counts() for name, watch in self.watches.items()}, "layers": {},
                    "logits": {part: _fidelity(q, f_logits[part]) for part, q in q_logits.items()}}
        for name, module in quantized.layers.items():
            layer = measured["layers"][name] = {kind: {} for kind in COMPARED}
            for part, (q, f) in grads.items():
                for kind in GRADIENTS:
                    if kind in q[name] and kind in f[name]:
                        layer[kind][part] = _fidelity(q[name][kind], f[name][kind])
            if name in quantized.inputs and name in shadow.inputs:  # the forwards drifted apart by here
                layer["input"]["all"] = _fidelity(quantized.inputs[name], shadow.inputs[name])
            q = grads["all"][0][name]
            stats = {"weight": module.weight.detach(), **q}
            layer["stats"] = {role: _summary_statistics(stats[role]) for role in ROLES if role in stats}
        return measured

    def close(self) -> None:
        for p in self.passes:
            p.close()
        for module in self.quantized.modules():
            if isinstance(module, QuantLayer):
                module.ops_watch = None


def _measured(quantized: nn.Module, shadow: nn.Module, x: torch.Tensor, g: torch.Tensor, old, seed: int) -> dict:
    """A diagnosed batch's measures run eagerly, on the device (on_host reads them)."""
    diagnosis = _Diagnosis(quantized, shadow, x)
    try:
        for p in diagnosis.passes:
            with _seeded(seed, x.device):
                p.forward()
        return diagnosis.measures(g, old)
    finally:
        diagnosis.close()


def diagnose_batch(quantized: nn.Module, x: torch.Tensor, g: torch.Tensor, seed: int = 0) -> dict:
    """One batch's measures, as a diagnosed training batch records them (on the host), of `quantized` against its
    float shadow at the same weights, G = `g` at the logits: scripts/fidelity_probe.py compares a scheme's settings
    by them without training."""
    return on_host(_measured(quantized, float_shadow(quantized), x, g, None, seed))


class CapturedDiagnosis:
    """A diagnosed batch's copies, passes and measures replayed from CUDA graphs, beside the training that goes on
    (for a run whose steps are replayed: an eager diagnosis of a quantized ResNet is bound by the host's launches
    and cost several replayed steps).

    Four graphs share a pool: the copies take the model's tensors and the step's counters (as ModelCopies does
    eagerly), on the run's stream, so that the next update waits for nothing more; then on a stream of their own,
    overlapping the next steps, the quantized copy's forward and the shadow's (each replayed under the batch's seed,
    as the eager forwards draw) and every backward and measure into one static vector, read back by `collect`. They
    are captured on the first diagnosed batch of a kind (`key`: the input's shape, old classes or not, the model's
    structure, modes, frozen parameters and the addresses of its tensors, which the graphs read), after an eager
    diagnosis of that batch (its record, and the warm-up); the same records as the eager path, bit for bit."""

    def __init__(self, copies: ModelCopies, model: nn.Module, steps: dict, x: torch.Tensor, g: torch.Tensor,
                 old, seed: int):
        self.key = self.key_of(model, x, old)
        quantized, shadow = copies.at(model, steps)
        self.record = None

        def eager():
            self.record = on_host(_measured(quantized, shadow, x, g, old, seed))
        warm_up(eager, 1)
        sources, targets = copies.sources(model)
        self.steps = {name: t.clone() for name, t in steps.items()}
        self.x, self.g = x.clone(), g.clone()
        self.old = None if old is None else old.clone()
        diagnosis = _Diagnosis(quantized, shadow, self.x)
        self.take, *self.passes = (torch.cuda.CUDAGraph() for _ in range(3))
        self.measure = torch.cuda.CUDAGraph()
        pool = torch.cuda.graph_pool_handle()
        try:
            with capturing_into(self.take, pool, beside=True), torch.no_grad():
                torch._foreach_copy_(targets, sources)
                _replaying(quantized, self.steps)
            for graph, p in zip(self.passes, diagnosis.passes):
                with _seeded(seed, x.device), capturing_into(graph, pool, beside=True):
                    p.forward()
            with capturing_into(self.measure, pool, beside=True):
                measured = diagnosis.measures(self.g, self.old)
                self.values = _stacked(_tensor_leaves(measured))
        finally:
            diagnosis.close()
        self.template, self.replays = measured, 0
        self.stream, self.pending = torch.cuda.Stream(x.device), False

    @staticmethod
    def key_of(model: nn.Module, x: torch.Tensor, old) -> tuple:
        addresses = tuple(t.data_ptr() for t in (*model.parameters(), *model.buffers()))
        return (tuple(x.shape), x.dtype, x.device, old is None, tuple(_structure(model)), _flags(model), addresses)

    def start(self, model: nn.Module, steps: dict, x: torch.Tensor, g: torch.Tensor, old, seed: int) -> None:
        """Diagnose a batch of this graph's key: the copies take the model's state now, the rest runs on the
        graphs' own stream (`collect` reads it; a batch started before must have been collected)."""
        if self.pending:
            raise RuntimeError("a diagnosed batch's measures are still to be collected")
        run = torch.cuda.current_stream(x.device)
        run.wait_stream(self.stream)  # the previous batch's passes read what is overwritten now
        with torch.no_grad():
            torch._foreach_copy_([*self.steps.values(), self.x, self.g], [*(steps[n] for n in self.steps), x, g])
            if old is not None:
                self.old.copy_(old)
        self.take.replay()
        self.stream.wait_stream(run)
        with torch.cuda.stream(self.stream):
            for graph in self.passes:
                with _seeded(seed, x.device):
                    graph.replay()
            self.measure.replay()
        self.replays += 1
        self.pending = True

    def collect(self) -> dict | None:
        """The measures of the batch started last, on the host (None if none is pending): waits for its graphs
        alone, not for the run's stream."""
        if not self.pending:
            return None
        with torch.cuda.stream(self.stream):
            values = self.values.cpu().tolist()
        self.pending = False
        return _filled(self.template, values)


class GradientDiagnostics(SupervisedPlugin):
    """The plugin of diagnostics=light and full (module docstring): `experiences` holds one record per trained
    experience."""
    landscape: Landscape | None = None  # a plugin restored from a checkpoint written before full existed: light

    graphed = False  # a plugin restored from a checkpoint written before graphed diagnoses existed: eager

    def __init__(self, every: int = 50, landscape: Landscape | None = None, seed: int = 0, graphed: bool = False):
        super().__init__()
        self.every, self.landscape, self.seed, self.graphed = every, landscape, seed, graphed
        self.experiences: list[dict] = []
        self.old_tests: list | None = None  # the test sets by experience (the run sets them; not checkpointed)
        self._copies = ModelCopies()
        self._captured: CapturedDiagnosis | None = None  # with `graphed`, on a CUDA device
        self._steps: dict | None = None
        self._g: torch.Tensor | None = None

    def before_training_exp(self, strategy, **kwargs):
        k = strategy.clock.train_exp_counter
        self.experiences = [e for e in self.experiences if e["experience"] != k]
        self.experiences.append({"experience": k, "batches": 0, "layers": {}})

    def __getstate__(self):
        """A checkpoint keeps the records (a batch still being diagnosed collected first), not the kept model
        copies, their graphs or the test sets."""
        self._collect()
        return {**self.__dict__, "_copies": None, "_captured": None, "old_tests": None}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._copies, self._captured, self.old_tests = ModelCopies(), None, None

    def epoch_state(self) -> list:
        """What an epoch checkpoint keeps of this plugin (trainer/checkpoint.py): the records so far."""
        self._collect()
        return copy.deepcopy(self.experiences)

    def load_epoch_state(self, state: list) -> None:
        self.experiences = state

    def records(self) -> list[dict]:
        """diagnostics.json: the records, each with its layers' order in the model (`layer_order`: the file's
        objects are written with their keys sorted)."""
        return [{**exp, "layer_order": list(exp["layers"])} for exp in self.experiences]

    def after_training_exp(self, strategy, **kwargs):
        """diagnostics=full: the landscape of the quantized model and of its float shadow, along the same two
        directions (drawn from the run's seed and the experience), on the experience's first training batches
        (in their evaluation transform); from the second experience on, also on batches drawn at random (by the
        seed and the experience) from the earlier experiences' test sets."""
        self._collect()
        self._captured = None  # the next experience's model is another: its graphs' memory goes back
        if self.landscape is None:
            return
        spec, k = self.landscape, self.experiences[-1]["experience"]
        draws = self.seed * 1000003 + k  # the seed of the directions' and the old test batches' random draws
        generator = torch.Generator().manual_seed(draws)
        directions = tuple(filter_normalised_direction(strategy.model, generator) for _ in range(2))
        models = (("quantized", strategy.model), ("float", float_shadow(strategy.model)))
        slices = {"landscape": _first_batches(strategy.experience.dataset.eval(), strategy.train_mb_size, spec.batches,
                                              strategy.device)}
        if k > 0 and self.old_tests:
            old = torch.utils.data.ConcatDataset([t.eval() for t in self.old_tests[:k]])
            slices["old_test_landscape"] = _first_batches(old, strategy.eval_mb_size, spec.batches, strategy.device,
                                                          torch.Generator().manual_seed(draws))
        for key, batches in slices.items():
            self.experiences[-1][key] = {name: loss_landscape(model, batches, directions, spec.points, spec.span)
                                         for name, model in models}

    def _diagnosing(self, strategy) -> bool:
        return strategy.clock.train_exp_iterations % self.every == 0

    def before_forward(self, strategy, **kwargs):
        """The quantizers' counters the step's forward draws from (the quantized copy replays them)."""
        if strategy.is_training and self._diagnosing(strategy):
            self._steps = quantizer_steps(strategy.model)

    def after_forward(self, strategy, **kwargs):
        """A hook on the model's output as the strategy got it (mb_output here, before MEMO and dyn_der split off
        their auxiliary head's outputs: strategies/dyn_der.py), so that G arrives during the step's own backward with
        every term of the loss in it (a plugin's distillation too, the auxiliary head's). Not a forward hook on the
        model: a step replayed from CUDA graphs runs no module forward, and a step may call the model on other
        inputs too (ER-ACE's stored batch, avalanche iCaRL's probe of the first batch)."""
        if self._steps is not None and strategy.mb_output.requires_grad:
            strategy.mb_output.register_hook(self._keep_output_gradient)

    def _keep_output_gradient(self, g):
        self._g = g.detach().clone()

    def after_backward(self, strategy, **kwargs):
        """The step's weights are still those of its forward: the copies are made now."""
        if self._g is None:
            self._steps = None
            return
        steps, g, self._steps, self._g = self._steps, self._g, None, None
        old = [c for c in getattr(strategy.experience, "previous_classes", None) or [] if c < g.shape[-1]]
        mask = None
        if old:
            mask = torch.zeros(g.shape[-1], dtype=torch.bool, device=g.device)
            mask[old] = True
        self._record(strategy, steps, g, mask)

    def _record(self, strategy, steps: dict, g: torch.Tensor, old: torch.Tensor | None) -> None:
        """The diagnosed batch's measures, computed on the device and read back in one transfer; from CUDA graphs
        where the run's steps are (`graphed`) and the batch is on a GPU, beside the next steps."""
        seed, model, x = strategy.clock.train_iterations, strategy.model, strategy.mb_x
        if not (self.graphed and x.is_cuda):
            quantized, shadow = self._copies.at(model, steps)
            measured = on_host(_measured(quantized, shadow, x, g, old, seed))
        else:
            self._collect()
            if self._captured is not None and self._captured.key == CapturedDiagnosis.key_of(model, x, old):
                self._captured.start(model, steps, x, g, old, seed)  # collected at the next batch or epoch end
                return
            self._captured = None  # released before the next capture takes its memory
            self._captured = CapturedDiagnosis(self._copies, model, steps, x, g, old, seed)
            measured = self._captured.record
        self._fold(measured)

    def after_training_epoch(self, strategy, **kwargs):
        self._collect()

    def _collect(self) -> None:
        """The measures of a batch still running on the diagnosis graphs' stream, into the experience's record."""
        measured = None if self._captured is None else self._captured.collect()
        if measured is not None:
            self._fold(measured)

    def _fold(self, measured: dict) -> None:
        """A diagnosed batch's measures (on the host) into the experience's means."""
        record = self.experiences[-1]
        record["batches"] += 1
        n = record["batches"]
        for name, counts in measured["watches"].items():
            _watched_into(record["layers"].setdefault(name, {}), underflow_shares(counts), n)
        for part, values in measured["logits"].items():
            _mean_into(record.setdefault("logits", {}).setdefault(part, {}), values, n)
        for name, layer_measures in measured["layers"].items():
            layer = record["layers"].setdefault(name, {})
            for kind in COMPARED:
                for part, values in layer_measures[kind].items():
                    _mean_into(layer.setdefault(kind, {}).setdefault(part, {}), values, n)
            for role, values in layer_measures["stats"].items():
                _mean_into(layer.setdefault("stats", {}).setdefault(role, {}), values, n)

    def summary(self) -> list[dict]:
        """Per experience: the mean over layers of each gradient's fidelity, by part of G, of the layers' inputs' and
        of each role's underflow share; the logits' fidelity by part; the largest tile sum of each product over the
        layers, as a fraction of its limit."""
        out = []
        for exp in self.experiences:
            means, layers = {}, exp["layers"].values()
            for kind in COMPARED:
                for part in ("all", "old", "new"):
                    values = [layer[kind][part] for layer in layers if part in layer.get(kind, {})]
                    if values:
                        means[f"{kind} {part}"] = {m: _nanmean([v[m] for v in values]) for m in values[0]}
            roles = sorted({role for layer in layers for role in layer.get("underflow", {})})
            if roles:
                means["underflow"] = {role: _nanmean([layer["underflow"][role] for layer in layers
                                                      if role in layer.get("underflow", {})]) for role in roles}
            reach = {}
            for layer in layers:
                for product, kept in layer.get("tile_sums", {}).items():
                    reach[product] = max(reach.get(product, 0.0), kept["largest"] / kept["limit"])
            entry = {"experience": exp["experience"], "batches": exp["batches"], "mean over layers": means}
            if "logits" in exp:  # a record from before the forwards were compared has none
                entry["logits"] = exp["logits"]
            if reach:
                entry["largest tile sum / limit"] = reach
            for key in ("landscape", "old_test_landscape"):  # the 1-D slice: the loss at the weights, its rise at ±span
                if key in exp:
                    entry[key] = {name: slice_summary(found["1d"]) for name, found in exp[key].items()}
            out.append(entry)
        return out


def _first_batches(dataset, batch_size: int, count: int, device, shuffle: torch.Generator | None = None) -> list:
    """The first `count` batches of `dataset` (shuffled by `shuffle` where given) on `device`, under a forked
    random state: iterating a loader draws a seed, which must not move the run's own streams."""
    batches = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=shuffle is not None,
                                             generator=shuffle)
        for x, y, *_ in loader:
            batches.append((x.to(device), y.to(device)))
            if len(batches) == count:
                break
    return batches


def _watched_into(layer: dict, watched: dict, n: int) -> None:
    """A diagnosed batch's QuantizerWatch record into a layer's: underflow shares averaged over the batches, the
    largest tile sums kept."""
    _mean_into(layer.setdefault("underflow", {}), watched["underflow"], n)
    for product, seen in watched["tile_sums"].items():
        kept = layer.setdefault("tile_sums", {}).setdefault(product, dict(seen))
        kept["largest"] = max(kept["largest"], seen["largest"])


def _mean_into(mean: dict, values: dict, n: int) -> None:
    """The running mean over n observations: `mean` (of n - 1) updated in place with `values`."""
    for key, value in values.items():
        mean[key] = value if n == 1 or key not in mean else mean[key] + (value - mean[key]) / n


def _nanmean(values: list) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan
