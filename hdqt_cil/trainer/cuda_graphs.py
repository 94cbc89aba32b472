"""trainer.cuda_graph: every training iteration's forward and backward replayed from CUDA graphs (graph_replay.py),
and the forward of the old model that LwF, iCaRL and BiC distil from.

The strategy's `forward` is routed through `CapturedTraining` for the length of each training experience, and the
old models the strategy distils from (the plugin attributes it names, e.g. LwFPlugin's `old_model`, BiC's
`model_old`) through `CapturedInference`;
both are handed back before the experience's end, so checkpoints pickle plain modules. Eval and BiC's bias stage
run eagerly as before. A NaN or Inf reaching a quantizer inside a replay cannot raise at once (that would need a
sync per step): it is checked at each epoch's end, before the divergence monitor and the epoch checkpoint see the
epoch.
"""
from avalanche.core import SupervisedPlugin
from torch import nn

from ..graph_replay import CapturedInference, CapturedTraining

class CudaGraphPlugin(SupervisedPlugin):
    """`teachers`: the strategy's plugin attributes that hold an old model to distil from (strategies/base.py)."""

    def __init__(self, teachers: tuple[str, ...] = ()):
        super().__init__()
        self.teacher_attributes = teachers
        self.captured: CapturedTraining | None = None
        self.teachers: list[tuple[object, str, CapturedInference]] = []

    def before_training_exp(self, strategy, **kwargs):
        self.captured = captured = CapturedTraining(strategy.model)
        eager = strategy.forward

        def forward():
            return captured(strategy.mb_x) if strategy.is_training else eager()
        strategy.forward = forward
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

    def after_training_exp(self, strategy, **kwargs):
        self.captured.release()
        self.captured = None
        del strategy.forward  # the class's own again
        for plugin, name, wrapped in self.teachers:
            if getattr(plugin, name) is wrapped:  # not yet replaced by this experience's model
                setattr(plugin, name, wrapped.module)
            wrapped.release()
        self.teachers = []
