"""A module's training forward and backward replayed from CUDA graphs: one launch each instead of thousands.

A quantized layer issues ~35 small kernels and torch ops a step, each costing host time; on a fast GPU the step is
bound by the host (docs/kernels.md, "The training step: CUDA graphs"). A captured step runs the same kernels with
the same arguments, so the results are bit-identical to eager execution: everything a step changes or draws from
(rounding steps, statistics, BatchNorm's running stats) is device memory the graph updates in place
(quant/layers.py).

`CapturedTraining(module)` is called like the module. A call in training mode with gradients on and a CUDA input
replays the graphs captured for that input shape (captured on first sight, up to `max_shapes` shapes); anything else
(eval, no_grad, other shapes, a changed set of trainable parameters) runs the module eagerly. torch's
`make_graphed_callables` does the same capture but warms up on uninitialised gradients (a NaN there trips the
layers' finite checks) and replaces the module's `forward`, which copies of the module (an old model kept for
distillation) would inherit. `CapturedInference(module)` does the same for eval calls without gradients (such an old
model's forward, which distillation runs on every training batch).
"""
import contextlib

import torch
from torch import nn

from .quant.stats import check_captured_steps
from .quant.streams import CAPTURE_PRIORITY


@contextlib.contextmanager
def _buffers_restored(module: nn.Module):
    """Warm-up and capture must not count: the module's buffers (BatchNorm statistics, rounding steps) are put back
    as they were before."""
    state = {name: b.clone() for name, b in module.named_buffers()}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, b in module.named_buffers():
                b.copy_(state[name])


_capture_streams: dict = {}


def capturing_into(graph: torch.cuda.CUDAGraph, pool=None, beside: bool = False):
    """torch.cuda.graph on a capture stream of the current device. torch's default capture stream is made once per
    process, on the device current at the first capture: a process that later trains on another GPU (a sweep
    worker given the next free slot) would capture that GPU's work on the first GPU's stream.

    cuBLAS keeps one workspace per stream, and a captured GEMM keeps the address of its capture stream's: graphs
    replayed while the others run (`beside`: the diagnoses, trainer/diagnostics.py) are captured on a second stream,
    or their float GEMMs (HOT's forward, the float shadow) would share the steps' workspace at the same time. Both
    capture streams are drawn from torch's pool of high priority, which no eager work draws from (torch hands out
    the streams of a priority in turn, and torch.cuda.Stream() takes the default one's), so neither is ever a
    stream that eager work or a layer's side stream runs on (quant/streams.py)."""
    device = torch.cuda.current_device()
    if (device, beside) not in _capture_streams:
        _capture_streams[device, beside] = torch.cuda.Stream(device, priority=CAPTURE_PRIORITY)
    return torch.cuda.graph(graph, pool=pool, stream=_capture_streams[device, beside])


def warm_up(run, times: int) -> None:
    """run() `times` times on a side stream, so that lazy initialisation (kernel loads, cuBLAS handles, torch.compile's
    compilation for the shape) stays out of the graphs; anything run() made is released when it returns. Once is
    enough: the capture runs the same code on the same shapes, and each warm-up of a quantized model is a whole eager
    step (about ten times a replayed one), paid again at every capture: each experience's model and its last batch
    shape."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(times):
            run()
    torch.cuda.current_stream().wait_stream(side)


def _functional(module: nn.Module, compiled: bool):
    """The module as a function of its parameters and input; with `compiled`, that function under torch.compile
    (inductor's fused kernels, captured into the graphs like any others)."""
    def forward(params: dict, x: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(module, params, (x,))
    return torch.compile(forward) if compiled else forward


def _recompiles_allowed():
    """Every capture compiles the same function for its own input shape and model (each experience's classifier is
    wider; after the first change torch compiles for dynamic sizes), so the recompiles could add up past torch's
    default limit, above which it would run the function eagerly; a replay calls no compiled code, so the number
    is bounded by the captures."""
    return torch._dynamo.config.patch(recompile_limit=1 << 16)


# torch.compile may compile a step again on its second call (its guards on the first call's state): a capture must
# not compile, so a compiled step warms up this many times.
COMPILED_WARMUP = 3


class _Graphs:
    """The forward and backward graphs of one input shape, with their static input, output and gradients.

    Warm-up and capture run the module on leaf aliases of its trainable parameters (same storage, so the graphs
    read the live weights): autograd nodes that earlier eager steps attached to the parameters themselves, and
    that a kept loss may still hold, belong to the default stream and may not join a capture."""

    def __init__(self, module: nn.Module, x: torch.Tensor, named_params: dict, warmup: int, compiled: bool):
        self.params = tuple(named_params.values())
        self.x = x.detach().clone()
        aliases = {name: p.detach().requires_grad_() for name, p in named_params.items()}
        leaves = tuple(aliases.values())
        forward = _functional(module, compiled)

        def run():
            return forward(aliases, self.x)

        def step():  # its graph holds the aliases' AccumulateGrad nodes, made on the side stream: released on
            y = run()  # return, so that the capture makes its own on the capture stream
            torch.autograd.grad(y, leaves, torch.zeros_like(y), allow_unused=True)

        with _buffers_restored(module), _recompiles_allowed():
            warm_up(step, warmup)
            pool = torch.cuda.graph_pool_handle()
            self.forward, self.backward = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            with capturing_into(self.forward, pool):
                y = run()
            self.grad_y = torch.zeros_like(y)
            with capturing_into(self.backward, pool):
                self.grads = torch.autograd.grad(y, leaves, self.grad_y, allow_unused=True)
            self.y = y.detach()


class _Replay(torch.autograd.Function):
    """Copy the input in, replay the forward; the backward copies the output gradient in and replays."""

    @staticmethod
    def forward(ctx, graphs: _Graphs, x, *params):
        graphs.x.copy_(x)
        graphs.forward.replay()
        ctx.graphs = graphs
        return graphs.y.detach()

    @staticmethod
    def backward(ctx, grad_y):
        graphs = ctx.graphs
        graphs.grad_y.copy_(grad_y)
        graphs.backward.replay()
        return None, None, *(None if g is None else g.detach() for g in graphs.grads)


class _InferenceGraph:
    """The forward graph of one input shape, without gradients, with its static input and output."""

    def __init__(self, module: nn.Module, x: torch.Tensor, warmup: int):
        self.x = x.detach().clone()
        with _buffers_restored(module), torch.no_grad():
            warm_up(lambda: module(self.x), warmup)
            self.graph = torch.cuda.CUDAGraph()
            with capturing_into(self.graph):
                self.y = module(self.x)


class _Captured:
    """What both captures share: graphs by input shape (up to `max_shapes`, each warmed up `warmup` times), the
    count of replays, the finite check after them and the release of the graphs."""

    @staticmethod
    def _require_current(x: torch.Tensor) -> None:
        """Streams and graphs belong to the current device: a capture of an input elsewhere fails inside CUDA."""
        if x.device.index != torch.cuda.current_device():
            raise ValueError(f"CUDA-graph capture of an input on {x.device} while cuda:{torch.cuda.current_device()} "
                             f"is the current device; make it current first (torch.cuda.set_device)")

    def __init__(self, module: nn.Module, max_shapes: int = 2, warmup: int = 1):
        if max_shapes < 1 or warmup < 1:
            raise ValueError(f"max_shapes={max_shapes} and warmup={warmup} must both be >= 1")
        self.module, self.max_shapes, self.warmup = module, max_shapes, warmup
        self.graphs: dict[tuple, object] = {}
        self.replays = 0

    def check(self) -> None:
        """Raise NonFiniteError if a replay fed a NaN or Inf to a quantizer (one sync; a no-op before any
        replay)."""
        if self.replays:
            check_captured_steps(self.module)

    def release(self) -> None:
        """Free the graphs and their memory pools."""
        self.graphs.clear()


class CapturedInference(_Captured):
    """Call `module` through CUDA graphs where an inference call allows it: in eval mode, without gradients, on a
    CUDA input of a shape captured before (up to `max_shapes`); anything else runs the module eagerly. For the
    old model that distillation strategies run on every training batch, whose quantized forward is otherwise
    as host-bound as an eager step. Other attributes are the module's."""

    def __getattr__(self, name):  # only for names the wrapper lacks
        if name == "module":
            raise AttributeError(name)
        return getattr(self.module, name)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        module = self.module
        if module.training or torch.is_grad_enabled() or not x.is_cuda:
            return module(x)
        key = (tuple(x.shape), x.dtype, x.device)
        graph = self.graphs.get(key)
        if graph is None:
            if len(self.graphs) >= self.max_shapes:
                return module(x)
            self._require_current(x)
            graph = self.graphs[key] = _InferenceGraph(module, x, self.warmup)
        graph.x.copy_(x)
        graph.graph.replay()
        self.replays += 1
        return graph.y.clone()  # the next replay overwrites the static output


class CapturedTraining(_Captured):
    """Call `module` through CUDA graphs where a training call allows it (module docstring); with `compiled`, the
    captured forward and backward are torch.compile's (trainer.compile: FP32 models)."""

    def __init__(self, module: nn.Module, max_shapes: int = 2, warmup: int = 1, compiled: bool = False):
        super().__init__(module, max_shapes, max(warmup, COMPILED_WARMUP) if compiled else warmup)
        self.compiled = compiled

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        module = self.module
        if not (module.training and torch.is_grad_enabled() and x.is_cuda):
            return module(x)
        named = {name: p for name, p in module.named_parameters() if p.requires_grad}
        params = tuple(named.values())
        key = (tuple(x.shape), x.dtype, x.device)
        graphs = self.graphs.get(key)
        if graphs is not None and (len(graphs.params) != len(params)
                                   or any(a is not b for a, b in zip(graphs.params, params))):
            del self.graphs[key]  # the trainable parameters changed: capture again
            graphs = None
        if graphs is None:
            if len(self.graphs) >= self.max_shapes:
                return module(x)
            self._require_current(x)
            graphs = self.graphs[key] = _Graphs(module, x, named, self.warmup, self.compiled)
        self.replays += 1
        return _Replay.apply(graphs, x, *params)
