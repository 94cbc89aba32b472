"""The one place where continual learning meets quantized training: a plugin holding the configured scheme.

Every strategy gets it. The model is quantized before the strategy copies it, so the old models that LwF,
iCaRL and BiC keep for distillation are quantized like the new one (as in the paper); the call is repeated at
each experience start in case a strategy added layers. Per epoch, the layers' counters (shares of saturated
tile sums and of clipped values) are read once and kept in `epochs`.

HOT's LQS (quant/lqs.py) runs at the start of the first training experience, on one batch of that experience's
training data, while some HOT layer is still uncalibrated: the choice lives in the layers' buffers, so a resumed
run (whose checkpoint holds calibrated layers) does not calibrate again. The result is kept in `calibration`
(the run writes it to lqs.json).
"""
import logging

import torch
import torch.nn.functional as F
from avalanche.core import SupervisedPlugin
from torch.utils.data import DataLoader

from ..quant import quant_stats, quantize_model, reset_quant_stats, scheme_from_config
from ..quant.lqs import calibrate_lqs, lqs_pending

log = logging.getLogger(__name__)


def calibration_batch(dataset, batch_size: int, seed: int, device):
    """(x, y) of `batch_size` samples of `dataset` drawn without replacement by a generator of its own (the
    global RNG streams, and so the training that follows, are untouched)."""
    generator = torch.Generator().manual_seed(seed)
    indices = torch.randperm(len(dataset), generator=generator)[:batch_size].tolist()
    collate = getattr(dataset, "collate_fn", None)
    batch = next(iter(DataLoader(dataset, batch_size=len(indices), sampler=indices, collate_fn=collate)))
    return batch[0].to(device), batch[1].to(device)


class QuantizationPlugin(SupervisedPlugin):
    def __init__(self, quant_cfg):
        super().__init__()
        self.scheme = scheme_from_config(quant_cfg)
        self.epochs: list[dict] = []
        self.calibration: dict = {}

    def apply(self, model):
        return quantize_model(model, self.scheme)

    def before_training_exp(self, strategy, **kwargs):
        self.apply(strategy.model)
        if lqs_pending(strategy.model):
            self.calibrate(strategy)
        reset_quant_stats(strategy.model)

    def calibrate(self, strategy) -> None:
        """LQS on one batch of the current experience's training data (cross-entropy on the model's logits:
        the choice depends on how the output gradient spreads over tokens, not on the loss's exact form)."""
        dataset = strategy.adapted_dataset if strategy.adapted_dataset is not None else strategy.experience.dataset
        x, y = calibration_batch(dataset, strategy.train_mb_size, self.scheme.seed, strategy.device)
        layers = calibrate_lqs(strategy.model, x, y, F.cross_entropy)
        self.calibration = {"experience": strategy.clock.train_exp_counter, "batch_size": len(y),
                            "threshold": self.scheme.lqs_threshold, "layers": layers}
        per_token = [name for name, choice in layers.items() if choice["per_token"]]
        log.info("LQS: per-token output-gradient scales in %d of %d layers%s", len(per_token), len(layers),
                 f" ({', '.join(per_token)})" if per_token else "")

    def epoch_state(self):
        """What an epoch checkpoint keeps of this plugin (trainer/checkpoint.py)."""
        return list(self.epochs)

    def load_epoch_state(self, state) -> None:
        self.epochs = state

    def after_training_epoch(self, strategy, **kwargs):
        if self.scheme.quantizes:
            self.epochs.append({"experience": strategy.clock.train_exp_counter,
                                "epoch": strategy.clock.train_exp_epochs + 1,
                                "layers": quant_stats(strategy.model)})
            reset_quant_stats(strategy.model)
