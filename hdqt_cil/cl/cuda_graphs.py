"""trainer.cuda_graph: every training iteration's forward and backward replayed from CUDA graphs (quant/capture.py).

The strategy's `forward` is routed through `CapturedTraining` for the length of each training experience; eval,
the old models kept for distillation and BiC's bias stage run eagerly as before. A NaN or Inf reaching a quantizer
inside a replayed step cannot raise at once (that would need a sync per step): it is checked at each epoch's end,
before the divergence monitor and the epoch checkpoint see the epoch.
"""
from avalanche.core import SupervisedPlugin

from ..quant.capture import CapturedTraining


class CudaGraphPlugin(SupervisedPlugin):
    def __init__(self):
        super().__init__()
        self.captured: CapturedTraining | None = None

    def before_training_exp(self, strategy, **kwargs):
        self.captured = captured = CapturedTraining(strategy.model)
        eager = strategy.forward

        def forward():
            return captured(strategy.mb_x) if strategy.is_training else eager()
        strategy.forward = forward

    def after_training_epoch(self, strategy, **kwargs):
        self.captured.check()

    def after_training_exp(self, strategy, **kwargs):
        self.captured.release()
        self.captured = None
        del strategy.forward  # the class's own again
