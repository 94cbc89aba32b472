"""What a run would cost on integer hardware: each experience's operation counts and energy estimate
(hdqt_cil/cost), tallied from the samples each phase processes, without touching a training step.

The first forward of each Linear / Conv2d records the shape of a sample of its input (a hook, removed once every
layer has been seen in training and in evaluation); a training iteration then adds the counts of a step at its
batch size (computed once a batch size, cached): the forward and the backward, and the old model's forward where
the strategy distils from one (LwF, iCaRL, BiC). Evaluation iterations add their forwards apart. Not counted:
BiC's bias-correction stage, iCaRL's herding forwards, the optimizer's update, data loading (docs/cost.md).
"""
from collections import Counter

from avalanche.core import SupervisedPlugin
from torch import nn

from ..cost.counts import layer_tally

PHASES = ("forward", "backward", "teacher forward")


class CostCounter(SupervisedPlugin):
    """`teachers`: the strategy's plugin attributes that may hold an old model (strategies/base.py); `energy`: the
    cost config's EnergyTable."""

    def __init__(self, energy, teachers: tuple[str, ...] = ()):
        super().__init__()
        self.energy, self.teachers = energy, teachers
        self.shapes: dict[str, tuple] = {}  # layer name → (sample shape, whether its input needs a gradient)
        self.experiences: list[dict] = []
        self.layers: dict[str, Counter] = {}
        self._modules: dict[str, nn.Module] = {}
        self._hooks, self._cache = [], {}
        self._teacher = False

    def __getstate__(self):  # checkpoints keep the counts and shapes, not the hooks, modules or cache
        return {**self.__dict__, "_modules": {}, "_hooks": [], "_cache": {}}

    def epoch_state(self):
        """What an epoch checkpoint keeps of this plugin (trainer/checkpoint.py)."""
        return {"experiences": self.experiences, "layers": self.layers}

    def load_epoch_state(self, state) -> None:
        self.experiences, self.layers = state["experiences"], state["layers"]

    def _watch(self, model: nn.Module) -> None:
        """The model's Linear / Conv2d layers; a hook records each one's sample shape at its first training
        forward, and the hooks go once every layer has one."""
        self._modules = {name: m for name, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))}
        self._cache = {}  # a strategy may add layers; the scheme's layers may change class
        if self._hooks or set(self._modules) <= set(self.shapes):
            return

        def record(name):
            def hook(module, args):
                if name not in self.shapes and module.training:
                    self.shapes[name] = (tuple(args[0].shape[1:]), args[0].requires_grad)
                    if set(self._modules) <= set(self.shapes):
                        for handle in self._hooks:
                            handle.remove()
                        self._hooks = []
            return hook
        self._hooks = [m.register_forward_pre_hook(record(name)) for name, m in self._modules.items()]

    def _step(self, batch: int, training: bool) -> dict[str, dict[str, Counter]]:
        """{layer: {phase: counts}} of one step at `batch` (training: forward and backward; else a forward)."""
        key = (batch, training)
        if key not in self._cache:
            step = {}
            for name, layer in self._modules.items():
                if name in self.shapes:
                    shape, input_grad = self.shapes[name]
                    tally = layer_tally(layer, (batch, *shape), input_grad and training, training)
                    step[name] = {"forward": tally.forward, "backward": tally.backward} if training else \
                        {"forward": tally.forward}
            self._cache[key] = step
        return self._cache[key]

    def before_training_exp(self, strategy, **kwargs):
        self._watch(strategy.model)
        self._teacher = any(isinstance(getattr(p, name, None), nn.Module) for p in strategy.plugins
                            for name in self.teachers)
        self.experiences.append({"training": {p: Counter() for p in PHASES}, "evaluation": Counter(),
                                 "training samples": 0, "steps": 0})

    def after_training_iteration(self, strategy, **kwargs):
        batch = len(strategy.mb_y)
        current = self.experiences[-1]
        current["training samples"] += batch
        current["steps"] += 1
        for name, phases in self._step(batch, True).items():
            layer = self.layers.setdefault(name, Counter())
            for phase, counts in phases.items():
                current["training"][phase].update(counts)
                layer.update(counts)
        if self._teacher:
            for phases in self._step(batch, False).values():
                current["training"]["teacher forward"].update(phases["forward"])

    def after_eval_iteration(self, strategy, **kwargs):
        if not self.experiences or not self._modules or not set(self._modules) <= set(self.shapes):
            return  # evaluation before any training, or a layer not yet seen in training
        for phases in self._step(len(strategy.mb_y), False).values():
            self.experiences[-1]["evaluation"].update(phases["forward"])

    def summary(self) -> dict:
        """Per experience: the training phases' counts and the evaluation's, and their energy; per layer, the
        training's counts over the run; the totals and the energy table used."""
        total = Counter()
        experiences = []
        for exp in self.experiences:
            training = Counter()
            for counts in exp["training"].values():
                training.update(counts)
            total.update(training)
            experiences.append({**{k: exp[k] for k in ("training samples", "steps")},
                                "training": {p: dict(c) for p, c in exp["training"].items()},
                                "evaluation": dict(exp["evaluation"]),
                                "training energy J": self.energy.joules(training)})
        int_macs = sum(v for k, v in total.items() if k.startswith("int_mac"))
        return {"energy table": {"name": self.energy.name, "source": self.energy.source},
                "training": dict(total), "training int GMACs": int_macs / 1e9,
                "training energy J": self.energy.joules(total), "experiences": experiences,
                "layers": {name: dict(c) for name, c in self.layers.items()}}
