"""Higher-precision replay (strategy.hp_replay; the HDQT authors' `--quantReplaySize`).

After the last training epoch of every experience past the first, and before the strategy chooses its exemplars of
the new classes, the strategy trains `epochs` more epochs on `size` exemplars of its memory (the same number of each
class in it, the first in the memory's order; at least one a class), in one batch as the authors do, with every
quantized layer, the old model's included, at `bits`-bit operands and `acc_bits`-bit accumulators; then training
goes on at the scheme's own precision. The strategy's own training step runs (its loss, distillation included), at
the learning rate of the experience's last epoch; the 8-bit weight storage rounds after these steps too. The
model's BatchNorm layers train as in any step (`bn="train"`, the authors'), or stay in eval mode (`bn="eval"`):
normalising by their running statistics, which the phase's batches of old classes alone then leave unchanged. These
steps replay eagerly (not from CUDA graphs, which hold the scheme's own kernels) and are not counted in the run's
cost (docs/cost.md). Each phase's mean loss is logged and kept in `phases`. A phase that diverges (the monitor's
rule, after each of its epochs) stops the run as diverged there, before the experience's accuracy and checkpoint.
"""
import logging
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import fields

import torch
from avalanche.core import SupervisedPlugin
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import DataLoader

from ..quant import NonFiniteError, quantize_model, scheme_from_config
from ..quant.layers import QuantLayer
from ..quant.schemes import SCHEMES
from .checkpoint import experience_epochs
from .cost import CostCounter
from . import plugin_of
from .cuda_graphs import CudaGraphPlugin
from .monitor import Diverged, TrainingMonitor, divergence

log = logging.getLogger(__name__)

PHASE = "the higher-precision replay"  # how a divergence names the phase
RAISABLE = ("bits", "acc_bits")  # the settings a scheme needs for a higher-precision phase


def _raisable(scheme: str) -> bool:
    return set(RAISABLE) <= {f.name for f in fields(SCHEMES.settings(scheme))}


def higher_precision_scheme(quant: dict, bits: int, acc_bits: int | None):
    """The run's scheme (the `quant` settings) at `bits`-bit operands and `acc_bits`-bit accumulators; fp32 as it
    is (a float run's phase is the same replay at its own precision: the control)."""
    name = quant["name"]
    if name == "fp32":
        return scheme_from_config(quant)
    if not _raisable(name):
        raisable = [n for n in SCHEMES.names() if n == "fp32" or _raisable(n)]
        raise ValueError(f"strategy.hp_replay: quant={name} has no bits and acc_bits to raise; higher-precision "
                         f"replay runs under quant={', '.join(raisable)}")
    try:
        return scheme_from_config({**quant, "bits": bits, "acc": "int", "acc_bits": acc_bits})
    except ValueError as error:  # the scheme's own limits (LUQ's log2 grid: 2..5 bits), named by the settings given
        raise ValueError(f"strategy.hp_replay_bits={bits}, hp_replay_acc_bits={acc_bits} under quant={name}: "
                         f"{error}") from None


def exemplar_memory(strategy):
    """The strategy's exemplar memory (an avalanche dataset), or None where it keeps none: the `storage_policy` or
    `storage` buffer of the strategy or of one of its plugins."""
    for owner in (strategy, *strategy.plugins):
        storage = getattr(owner, "storage_policy", None) or getattr(owner, "storage", None)
        if storage is not None and hasattr(storage, "buffer"):
            return storage.buffer
    return None


def spread_over_classes(targets: list[int], size: int) -> list[int]:
    """Indices of `size` // (classes in `targets`) samples of each class (at least one), the first of each in order."""
    per_class = max(1, size // len(set(targets)))
    taken, picked = defaultdict(int), []
    for index, target in enumerate(targets):
        if taken[target] < per_class:
            taken[target] += 1
            picked.append(index)
    return picked


@contextmanager
def batchnorm_mode(model: nn.Module, bn: str):
    """`model`'s BatchNorm layers in train mode (bn="train": normalised by each batch, whose statistics the running
    ones take up) or in eval mode (by their running statistics, left unchanged), their own modes restored after."""
    norms = {m: m.training for m in model.modules() if isinstance(m, _BatchNorm)}
    for norm in norms:
        norm.train(bn == "train")
    try:
        yield
    finally:
        for norm, training in norms.items():
            norm.train(training)


class HigherPrecisionReplay(SupervisedPlugin):
    """`teachers`: the strategy's plugin attributes that may hold an old model (strategies/base.py)."""
    bn = "train"  # what a plugin restored from a checkpoint written before the setting existed did

    def __init__(self, size: int, epochs: int, scheme, bits: int, acc_bits: int | None,
                 teachers: tuple[str, ...] = (), bn: str = "train"):
        super().__init__()
        self.size, self.epochs, self.scheme, self.bits, self.acc_bits = size, epochs, scheme, bits, acc_bits
        self.teachers, self.bn = teachers, bn
        self.phases: list[dict] = []
        self._losses: list[torch.Tensor] | None = None

    def check(self, strategy, name: str) -> None:
        if exemplar_memory(strategy) is None:
            raise ValueError(f"strategy.hp_replay={self.size}: strategy={name} keeps no exemplar memory to replay; "
                             "use a strategy with one (icarl with loss=ce_kd, bic, replay, der, er_ace, gdumb, "
                             "dyn_der, memo) or strategy.hp_replay=null")

    def _models(self, strategy) -> list[nn.Module]:
        teachers = [getattr(p, name, None) for p in strategy.plugins for name in self.teachers]
        return [strategy.model, *(t for t in teachers if isinstance(t, nn.Module))]

    @contextmanager
    def _phase(self, strategy, loader):
        """The strategy on `loader`, its quantized layers at the higher precision, its BatchNorm layers in `bn` mode,
        eager, uncounted; all restored. The models are looked up once the graphs are set aside: until then an old
        model is its graphs' wrapper."""
        graphs, cost = plugin_of(strategy, CudaGraphPlugin), plugin_of(strategy, CostCounter)
        with graphs.eager() if graphs else nullcontext(), cost.paused() if cost else nullcontext():
            models = self._models(strategy)
            schemes = [{m: m.scheme for m in model.modules() if isinstance(m, QuantLayer)} for model in models]
            dataloader, self._losses = strategy.dataloader, []
            for model in models:
                quantize_model(model, self.scheme)
            try:
                strategy.dataloader = loader
                with batchnorm_mode(strategy.model, self.bn):
                    yield
            finally:
                strategy.dataloader = dataloader
                for layers in schemes:
                    for layer, scheme in layers.items():
                        layer.scheme = scheme
                self._losses = None

    def after_training_iteration(self, strategy, **kwargs):
        if self._losses is not None:
            self._losses.append(strategy.loss.detach())

    def after_training_epoch(self, strategy, **kwargs):
        clock = strategy.clock
        if clock.train_exp_counter == 0 or clock.train_exp_epochs + 1 < experience_epochs(strategy):
            return
        memory = exemplar_memory(strategy)
        if memory is None or len(memory) == 0:
            return
        exemplars = memory.subset(spread_over_classes([int(t) for t in memory.targets], self.size))
        loader = DataLoader(exemplars, batch_size=len(exemplars), shuffle=True,
                            collate_fn=getattr(exemplars, "collate_fn", None))
        with self._phase(strategy, loader):
            for epoch in range(1, self.epochs + 1):
                self._train_epoch(strategy, epoch)
            loss = torch.stack(self._losses).mean().item()
        self.phases.append({"experience": clock.train_exp_counter, "exemplars": len(exemplars),
                            "epochs": self.epochs, "loss": loss})
        log.info("experience %d: higher-precision replay of %d exemplars, %d epochs at %s: mean loss %.4f",
                 clock.train_exp_counter + 1, len(exemplars), self.epochs, self.precision, loss)

    def _train_epoch(self, strategy, epoch: int) -> None:
        """One epoch of the phase; a divergence in it (the monitor's rule, against the experience's first-epoch
        loss, or a NaN reaching a quantizer) raises Diverged naming the phase."""
        experience, start = strategy.clock.train_exp_counter, len(self._losses)
        try:
            strategy.training_epoch()
        except NonFiniteError as error:
            raise Diverged(experience, epoch, str(error), PHASE) from error
        mean = torch.stack(self._losses[start:]).mean().item()
        what = divergence(strategy.model, mean, plugin_of(strategy, TrainingMonitor).first_epoch_loss())
        if what is not None:
            raise Diverged(experience, epoch, what, PHASE)

    @property
    def precision(self) -> str:
        """What the phases run at: a float run's own precision (the control), else the raised bits."""
        if self.scheme.name == "fp32":
            return "fp32's own float precision"
        accumulators = "float" if self.acc_bits is None else f"{self.acc_bits}-bit"
        return f"{self.bits}-bit operands and {accumulators} accumulators"

    def epoch_state(self):
        """What an epoch checkpoint keeps of this plugin (trainer/checkpoint.py)."""
        return list(self.phases)

    def load_epoch_state(self, state) -> None:
        self.phases = state
