"""trainer.cuda_graph: every training iteration's forward and backward replayed from CUDA graphs (graph_replay.py), and
the forwards of evaluation and of the old model that LwF, iCaRL and BiC distil from.

The strategy's `forward` is routed through `CapturedTraining` for the length of each training experience and through
`CapturedInference` for the length of each evaluation (an eager quantized forward is bound by the host: on a GPU,
evaluating a quantized model took longer than training it); the old models the strategy distils from (the plugin
attributes it names, e.g. LwFPlugin's `old_model`, BiC's `model_old`) go through `CapturedInference` too. All are
handed back when the experience or the evaluation ends, so checkpoints pickle plain modules. The exemplar memory's
herding features (strategies/icarl.py) go through `CapturedInference` while it chooses. BiC's bias stage runs
eagerly as before. With trainer.compile (FP32 runs) the captured training step is torch.compile's. A NaN or Inf
reaching a quantizer inside a replay cannot raise at once (that would need a sync per step): it is checked at each
training epoch's end, before the divergence monitor and the epoch checkpoint see the epoch, and at each evaluation's
end.
"""
from contextlib import contextmanager

from avalanche.core import SupervisedPlugin
from torch import nn

from ..graph_replay import CapturedInference, CapturedTraining

class CudaGraphPlugin(SupervisedPlugin):
    """`teachers`: the strategy's plugin attributes that hold an old model to distil from (strategies/base.py);
    `compiled`: trainer.compile."""

    def __init__(self, teachers: tuple[str, ...] = (), compiled: bool = False):
        super().__init__()
        self.teacher_attributes, self.compiled = teachers, compiled
        self.captured: CapturedTraining | None = None
        self.inference: CapturedInference | None = None
        self.teachers: list[tuple[object, str, CapturedInference]] = []

    def _route(self, strategy) -> None:
        """strategy.forward through the training or the evaluation graphs, whichever phase is on (once)."""
        if "forward" in vars(strategy):
            return
        eager = strategy.forward

        def forward():
            graphs = self.captured if strategy.is_training else self.inference
            return eager() if graphs is None else graphs(strategy.mb_x)
        strategy.forward = forward

    def _unroute(self, strategy) -> None:
        """The class's own forward again once neither phase is on."""
        if self.captured is None and self.inference is None:
            del strategy.forward

    def before_training_exp(self, strategy, **kwargs):
        self.captured = CapturedTraining(strategy.model, compiled=self.compiled)
        self._route(strategy)
        for plugin in strategy.plugins:
            for name in self.teacher_attributes:
                teacher = getattr(plugin, name, None)
                if isinstance(teacher, nn.Module):
                    wrapped = CapturedInference(teacher)
                    setattr(plugin, name, wrapped)
                    self.teachers.append((plugin, name, wrapped))

    def after_training_epoch(self, strategy, **kwargs):
        self.captured.check()
        for _, _, wrapped in self.teachers:
            wrapped.check()

    @contextmanager
    def graphed(self, owner, name: str):
        """owner.<name>, a module run for inference (no gradients, eval mode), called through CUDA graphs for a
        while, then handed back with its graphs released and checked for non-finite values."""
        module = getattr(owner, name)
        wrapped = CapturedInference(module)
        setattr(owner, name, wrapped)
        try:
            yield
        finally:
            setattr(owner, name, module)
            wrapped.release()
            wrapped.check()

    @contextmanager
    def eager(self):
        """Training steps and the old models' forwards run eagerly for a while (a phase whose layers run other
        kernels than the captured ones: higher-precision replay)."""
        captured, self.captured = self.captured, None
        for plugin, name, wrapped in self.teachers:
            setattr(plugin, name, wrapped.module)
        try:
            yield
        finally:
            self.captured = captured
            for plugin, name, wrapped in self.teachers:
                setattr(plugin, name, wrapped)

    def after_training_exp(self, strategy, **kwargs):
        self.captured.release()
        self.captured = None
        self._unroute(strategy)
        for plugin, name, wrapped in self.teachers:
            if getattr(plugin, name) is wrapped:  # not yet replaced by this experience's model
                setattr(plugin, name, wrapped.module)
            wrapped.release()
        self.teachers = []

    def before_eval(self, strategy, **kwargs):
        self.inference = CapturedInference(strategy.model)
        self._route(strategy)

    def after_eval(self, strategy, **kwargs):
        inference, self.inference = self.inference, None
        self._unroute(strategy)
        inference.release()
        inference.check()
