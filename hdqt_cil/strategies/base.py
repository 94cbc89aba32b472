"""The strategies: each a thin layer over avalanche's templates and plugins, registered with its settings.

A strategy module registers `build(cfg, trainer, model, common, data)` with `STRATEGIES.register(name,
SettingsClass, ...)`, where `common` holds the keyword arguments every avalanche template takes (optimizer,
criterion, batch sizes, epochs, device, plugins, evaluator) and `data` the benchmark's facts a strategy may
need (DataFacts). What a strategy tells the run besides:
- `joint=True`: it trains once, on every experience's data together (the upper bound), after the last one;
- `teachers=(...)`: the attributes of its plugins that hold an old model it distils from, which the run replays
  from CUDA graphs (trainer/cuda_graphs.py);
- `fits(cfg, trainer, num_classes)`: its checks against the benchmark (e.g. memory for one exemplar a class);
- `scenarios=(...)`: the scenarios it is made for, where not all (iCaRL and BiC need new classes each experience).
"""
from dataclasses import dataclass
from typing import NamedTuple, Optional

from avalanche.training import JointTraining, Naive
from avalanche.training.templates import SupervisedTemplate
from omegaconf import MISSING

from ..quant.schemes import ACC_BITS_MAX, BITS
from ..registry import Registry, load_members
from ..settings import POSITIVE_INT, Rule, one_of, optional, setting

STRATEGIES = Registry("strategy")


class DataFacts(NamedTuple):
    """What a strategy may need to know of the benchmark it is built for."""
    image_inputs: bool  # images (uint8, normalised by the model), not feature vectors
    n_experiences: int


@dataclass
class StrategyConfig:
    name: str = MISSING
    # Higher-precision replay (trainer/hp_replay.py): after each experience past the first, this many exemplars are
    # trained on for hp_replay_epochs epochs at hp_replay_bits-bit operands and hp_replay_acc_bits-bit accumulators
    # (null: float); null: off. Strategies with an exemplar memory only.
    hp_replay: Optional[int] = setting(None, optional(POSITIVE_INT))
    hp_replay_epochs: int = setting(2, POSITIVE_INT)
    hp_replay_bits: int = setting(8, BITS)
    hp_replay_acc_bits: Optional[int] = setting(16, Rule(
        lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and 2 <= v <= ACC_BITS_MAX),
        f"an integer in 2..{ACC_BITS_MAX}, at least hp_replay_bits, or null (float accumulators)"))
    # The BatchNorm layers during the phase: train (the authors': normalised by the phase's batch, whose statistics
    # the running ones take up) or eval (normalised by the running statistics, which stay as training left them).
    hp_replay_bn: str = setting("train", one_of("train", "eval"))


@dataclass
class NaiveConfig(StrategyConfig):
    """Plain fine-tuning: the lower bound."""
    name: str = "naive"


@dataclass
class JointConfig(StrategyConfig):
    """Every experience at once: the upper bound."""
    name: str = "joint"


@STRATEGIES.register("naive", NaiveConfig)
def _naive(cfg, trainer, model, common, data):
    return Naive(model=model, **common)


@STRATEGIES.register("joint", JointConfig, joint=True)
def _joint(cfg, trainer, model, common, data):
    return JointTraining(model=model, **common)


def build_strategy(cfg, trainer, model, common: dict, data: DataFacts) -> SupervisedTemplate:
    """The avalanche strategy `cfg.name` around `model` (a models.Classifier)."""
    return STRATEGIES.builder(cfg.name)(cfg, trainer, model, common, data)


def training_steps(name: str, n_experiences: int) -> list[int]:
    """The experiences after which strategy `name` trains: each one, or (joint) only the last, on all of them."""
    return [n_experiences - 1] if STRATEGIES.facts(name).get("joint") else list(range(n_experiences))


def teachers(name: str) -> tuple[str, ...]:
    return STRATEGIES.facts(name).get("teachers", ())


SCENARIOS = ("class", "task", "domain")


def check_fits(cfg, trainer, num_classes: int, scenario: str = "class") -> None:
    """The strategy's own checks against the benchmark's scenario and class count (ValueError naming what to
    change)."""
    made_for = STRATEGIES.facts(cfg.name).get("scenarios", SCENARIOS)
    if scenario not in made_for:
        load_members()
        fit = sorted(name for name in STRATEGIES.names()
                     if scenario in STRATEGIES.facts(name).get("scenarios", SCENARIOS))
        raise ValueError(f"strategy={cfg.name} is made for benchmark.scenario={'|'.join(made_for)} (it expects new "
                         f"classes in each experience), not {scenario}; strategies for {scenario}: {', '.join(fit)}")
    fits = STRATEGIES.facts(cfg.name).get("fits")
    if fits is not None:
        fits(cfg, trainer, num_classes)
