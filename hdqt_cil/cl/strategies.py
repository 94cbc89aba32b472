"""One registered builder per strategy; each is a thin layer over avalanche's templates and plugins.

Every builder receives the same `common` keyword arguments (optimizer, criterion, batch sizes, epochs, device,
plugins, evaluator); a new strategy is one `@register` function here plus one file in configs/strategy/.
"""
from typing import Callable

from avalanche.training import ICaRL, JointTraining, Naive
from avalanche.core import SupervisedPlugin
from avalanche.training.templates import SupervisedTemplate
from torchvision.transforms import v2

from .bic import BiCPlugin
from .icarl import pycil_icarl_plugins
from .lwf import LwFPlugin

_BUILDERS: dict[str, Callable] = {}


def register(name: str):
    def add(builder):
        _BUILDERS[name] = builder
        return builder
    return add


def strategy_names() -> tuple[str, ...]:
    return tuple(sorted(_BUILDERS))


def build_strategy(cfg, trainer, model, common: dict, image_inputs: bool) -> SupervisedTemplate:
    """The avalanche strategy `cfg.name` around `model` (a models.Classifier)."""
    if cfg.name not in _BUILDERS:
        raise ValueError(f"unknown strategy {cfg.name!r}; choose one of {', '.join(strategy_names())}")
    return _BUILDERS[cfg.name](cfg, trainer, model, common, image_inputs)


@register("naive")
def _naive(cfg, trainer, model, common, image_inputs):
    return Naive(model=model, **common)


@register("joint")
def _joint(cfg, trainer, model, common, image_inputs):
    return JointTraining(model=model, **common)


@register("lwf")
def _lwf(cfg, trainer, model, common, image_inputs):
    common = {**common, "plugins": [*common["plugins"], LwFPlugin(cfg.lamb, cfg.temperature)]}
    return SupervisedTemplate(model=model, **common)


class _ScoreWithTrainedHead(SupervisedPlugin):
    """Evaluate iCaRL by its trained linear head instead of the nearest-mean-of-exemplars classifier."""

    def after_eval_forward(self, strategy, **kwargs):
        model = strategy.model
        strategy.mb_output = model.train_classifier(model.feature_extractor(strategy.mb_x))


@register("icarl")
def _icarl(cfg, trainer, model, common, image_inputs):
    if cfg.loss == "ce_kd":
        if cfg.eval_head != "linear":
            raise ValueError(f"strategy.eval_head={cfg.eval_head!r} needs strategy.loss=bce; loss=ce_kd (PyCIL's "
                             "iCaRL) is scored by its trained head: set strategy.eval_head=linear")
        plugins = [*common["plugins"], *pycil_icarl_plugins(model, trainer.memory_size, cfg.temperature)]
        return SupervisedTemplate(model=model, **{**common, "plugins": plugins})
    # Exemplars are raw uint8 images (the model normalises); replay gets the geometric augmentation.
    replay_tf = v2.Compose([v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()]) if image_inputs else None
    kwargs = {k: v for k, v in common.items() if k != "criterion"}  # iCaRL brings its own loss
    if cfg.eval_head == "linear":
        kwargs["plugins"] = [*kwargs["plugins"], _ScoreWithTrainedHead()]
    return ICaRL(feature_extractor=model.features, classifier=model.classifier,
                 memory_size=trainer.memory_size, buffer_transform=replay_tf,
                 fixed_memory=cfg.fixed_memory, **kwargs)


@register("bic")
def _bic(cfg, trainer, model, common, image_inputs):
    plugin = BiCPlugin(mem_size=trainer.memory_size, val_percentage=cfg.val_percentage, T=cfg.temperature,
                       stage_2_epochs=cfg.stage_2_epochs, lamb=cfg.lamb, lr=cfg.stage_2_lr)
    common = {**common, "plugins": [*common["plugins"], plugin]}
    return SupervisedTemplate(model=model, **common)
