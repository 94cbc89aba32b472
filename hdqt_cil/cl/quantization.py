"""The one place where continual learning meets quantized training: a plugin holding the configured scheme.

Every strategy gets it. The model is quantized before the strategy copies it, so the old models that LwF,
iCaRL and BiC keep for distillation are quantized like the new one (as in the paper); the call is repeated at
each experience start in case a strategy added layers. Per epoch, the layers' counters (shares of saturated
tile sums and of clipped values) are read once and kept in `epochs`.
"""
from avalanche.core import SupervisedPlugin

from ..quant import quant_stats, quantize_model, reset_quant_stats, scheme_from_config


class QuantizationPlugin(SupervisedPlugin):
    def __init__(self, quant_cfg):
        super().__init__()
        self.scheme = scheme_from_config(quant_cfg)
        self.epochs: list[dict] = []

    def apply(self, model):
        return quantize_model(model, self.scheme)

    def before_training_exp(self, strategy, **kwargs):
        self.apply(strategy.model)
        reset_quant_stats(strategy.model)

    def after_training_epoch(self, strategy, **kwargs):
        if self.scheme.quantizes:
            self.epochs.append({"experience": strategy.clock.train_exp_counter,
                                "epoch": strategy.clock.train_exp_epochs + 1,
                                "layers": quant_stats(strategy.model)})
            reset_quant_stats(strategy.model)
