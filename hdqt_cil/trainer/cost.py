"""What a run would cost on integer hardware: each experience's operation counts and energy estimate
(hdqt_cil/cost), tallied from the samples each phase processes, without touching a training step.

The first training forward of each Linear / Conv2d in an experience records the shape of a sample of its input (a
hook, removed once every layer has been seen; recorded afresh each experience, as a strategy may change the model
between them: dyn_der adds an extractor and widens its classifier). A frozen layer (its weight needs no gradient,
as dyn_der's old extractors and memo's old upper blocks) counts as an inference forward, plus its input's gradient
where the input needs one (memo's old upper blocks above shared blocks that train). An iteration only counts its
batch size; at an experience's end (and its evaluation's) the counts of a step at each batch size (the forward and
the backward, and the old model's forward where the strategy distils from one: LwF, iCaRL, BiC; evaluation forwards
apart) are multiplied by the steps taken at it. Not counted: BiC's bias-correction stage, iCaRL's herding
forwards, the higher-precision replay's steps, the optimizer's update, data loading (docs/cost.md).
"""
import copy
from collections import Counter
from contextlib import contextmanager

from avalanche.core import SupervisedPlugin
from torch import nn

from ..cost.counts import layer_tally
from .weight_storage import stored_weights

PHASES = ("forward", "backward", "teacher forward")


class CostCounter(SupervisedPlugin):
    """`teachers`: the strategy's plugin attributes that may hold an old model (strategies/base.py); `energy`: the
    cost config's EnergyTable; `weight_bits`: the bits the weights are stored in between steps (None: float32);
    `every_parameter`: every trained parameter is stored so (the authors' update), not only the weights."""
    weight_bits, weight_count, every_parameter = 32, 0, False  # what a counter from an older checkpoint holds
    _paused = False

    def __init__(self, energy, teachers: tuple[str, ...] = (), weight_bits: int | None = None,
                 every_parameter: bool = False):
        super().__init__()
        self.energy, self.teachers = energy, teachers
        self.weight_bits = 32 if weight_bits is None else weight_bits
        self.every_parameter = every_parameter
        self.weight_count = 0  # stored_weights' elements (the model may grow between experiences)
        self.shapes: dict[str, tuple] = {}  # layer name → (sample shape, whether its input needs a gradient)
        self.experiences: list[dict] = []
        self._modules: dict[str, nn.Module] = {}
        self._hooks = []

    def __getstate__(self):  # checkpoints keep the counts and shapes, not the hooks or the modules
        return {**self.__dict__, "_modules": {}, "_hooks": []}

    def epoch_state(self):
        """What an epoch checkpoint keeps of this plugin (trainer/checkpoint.py)."""
        return copy.deepcopy(self.experiences)

    def load_epoch_state(self, state) -> None:
        self.experiences = state

    def _watch(self, model: nn.Module) -> None:
        """The model's Linear / Conv2d layers; a hook records each one's sample shape at its first training
        forward (a frozen layer's forward in eval mode included), and the hooks go once every layer has one."""
        for handle in self._hooks:
            handle.remove()
        self._modules = {name: m for name, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))}
        self.shapes = {}

        def record(name):
            def hook(module, args):
                if name not in self.shapes and (module.training or not module.weight.requires_grad):
                    self.shapes[name] = (tuple(args[0].shape[1:]), args[0].requires_grad)
                    if set(self._modules) <= set(self.shapes):
                        for handle in self._hooks:
                            handle.remove()
                        self._hooks = []
            return hook
        self._hooks = [m.register_forward_pre_hook(record(name)) for name, m in self._modules.items()]

    def _counts(self, batches: Counter, training: bool, teacher: bool = False) -> dict[str, dict[str, Counter]]:
        """{layer: {phase: counts}} of the steps `batches` ({batch size: steps}) on the model as it is."""
        out = {}
        for name, layer in self._modules.items():
            shape, input_grad = self.shapes.get(name, (None, False))
            if shape is None:
                continue
            phases = out[name] = {p: Counter() for p in (PHASES if training else ("forward",))}
            trains = training and layer.weight.requires_grad
            for batch, steps in batches.items():
                tally = layer_tally(layer, (batch, *shape), input_grad and training, trains)
                for phase, counts in (("forward", tally.forward), ("backward", tally.backward)):
                    if phase in phases:
                        phases[phase].update({k: v * steps for k, v in counts.items()})
                if teacher:
                    inference = layer_tally(layer, (batch, *shape), False, False)
                    phases["teacher forward"].update({k: v * steps for k, v in inference.forward.items()})
        return out

    def before_training_exp(self, strategy, **kwargs):
        self._watch(strategy.model)
        self.weight_count = sum(w.numel() for w in stored_weights(strategy.model, self.every_parameter))
        teacher = any(isinstance(getattr(p, name, None), nn.Module) for p in strategy.plugins for name in self.teachers)
        self.experiences.append({"teacher": teacher, "training batches": Counter(), "evaluation batches": Counter(),
                                 "training": None, "layers": None})

    def after_training_iteration(self, strategy, **kwargs):
        if not self._paused:
            self.experiences[-1]["training batches"][len(strategy.mb_y)] += 1

    @contextmanager
    def paused(self):
        """Training steps taken meanwhile are not counted (higher-precision replay's, at other prices)."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    def after_training_exp(self, strategy, **kwargs):
        self._finish(self.experiences[-1])

    def _finish(self, exp: dict) -> None:
        """An experience's training counts, by phase and by layer, from its batches."""
        layers = self._counts(exp["training batches"], True, exp["teacher"])
        exp["layers"] = {name: sum(phases.values(), Counter()) for name, phases in layers.items()}
        exp["training"] = {p: sum((phases[p] for phases in layers.values()), Counter()) for p in PHASES}

    def after_eval_iteration(self, strategy, **kwargs):
        if self.experiences:  # an evaluation before any training is not the run's
            self.experiences[-1]["evaluation batches"][len(strategy.mb_y)] += 1

    def summary(self) -> dict:
        """Per experience: the training phases' counts and the evaluation's, and their energy; per layer, the
        training's counts over the run; the totals and the energy table used."""
        total, layers, experiences = Counter(), {}, []
        for exp in self.experiences:
            if exp["training"] is None:  # an experience cut short: its counts so far
                self._finish(exp)
            training = sum(exp["training"].values(), Counter())
            total.update(training)
            for name, counts in exp["layers"].items():
                layers.setdefault(name, Counter()).update(counts)
            evaluation = sum((p["forward"] for p in self._counts(exp["evaluation batches"], False).values()),
                             Counter())
            batches = exp["training batches"]
            experiences.append({"training samples": sum(b * n for b, n in batches.items()),
                                "steps": sum(batches.values()),
                                "training": {p: dict(c) for p, c in exp["training"].items()},
                                "evaluation": dict(evaluation), "training energy J": self.energy.joules(training)})
        int_macs = sum(v for k, v in total.items() if k.startswith("int_mac"))
        return {"energy table": {"name": self.energy.name, "source": self.energy.source},
                "weights stored": {"bits": self.weight_bits, "weights": self.weight_count,
                                   "MiB": self.weight_count * self.weight_bits / 8 / 2**20},
                "training": dict(total), "training int GMACs": int_macs / 1e9,
                "training energy J": self.energy.joules(total), "experiences": experiences,
                "layers": {name: dict(c) for name, c in layers.items()}}
