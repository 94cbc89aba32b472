"""trainer.weight_bits: the model's weights kept at `bits`-bit levels between optimizer steps, as an integer device
stores them (the HDQT authors' 8-bit weight storage, `quantWgtStoreBits`; docs/quant.md "Weight storage").

After every optimizer step each Conv2d and Linear weight (quantized by the scheme or not, the classifier included)
is rounded to the nearest level of its own per-tensor scale, max|w| / (2^(bits-1) - 1), by the quantizer every
scheme uses (`hdqt_cil.quant.quantize`); at each experience's start too, so that new layers start on the grid.
SGD's momentum and weight decay act on these stored weights as on float ones. Biases and normalisation stay float.
`every_parameter` (trainer.weight_update=authors): every trained parameter is stored so, biases and normalisation
too, as the authors' optimizer does (its update itself: trainer/optim.py `sgd_settings`).
"""
import torch
from avalanche.core import SupervisedPlugin
from torch import nn

from ..quant import QuantSpec, quantize


def stored_weights(model: nn.Module, every_parameter: bool = False) -> list[torch.Tensor]:
    """The tensors an integer device would store in `bits` bits: every Conv2d and Linear weight, or with
    `every_parameter` (the authors' update) every trained parameter."""
    if every_parameter:
        return [p for p in model.parameters() if p.requires_grad]
    return [m.weight for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]


class WeightStorage(SupervisedPlugin):
    def __init__(self, bits: int, every_parameter: bool = False):
        super().__init__()
        self.spec = QuantSpec(bits, "signed", "max", 1.0, "tensor", "nearest")
        self.every_parameter = every_parameter

    @torch.no_grad()
    def store(self, model: nn.Module) -> None:
        for weight in stored_weights(model, self.every_parameter):
            levels, scale = quantize(weight, self.spec)
            weight.copy_(levels * scale)

    def before_training_exp(self, strategy, **kwargs):
        self.store(strategy.model)

    def after_update(self, strategy, **kwargs):
        self.store(strategy.model)
