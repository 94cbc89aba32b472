from pathlib import Path

import pytest
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from hdqt_cil.config import run_path, validate, validate_against_benchmark

ROOT = Path(__file__).resolve().parents[1]

GROUPS = ["benchmark", "model", "strategy", "quant", "trainer"]


@pytest.mark.parametrize("group,member", [(g, p.stem) for g in GROUPS
                                          for p in sorted((ROOT / "configs" / g).glob("*.yaml"))])
def test_every_group_member_composes(make_cfg, group, member):
    cfg = make_cfg(f"{group}={member}")
    OmegaConf.resolve(cfg)
    if group != "trainer":
        assert cfg[group].name == member
    validate(cfg)


@pytest.mark.parametrize("preset", sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml")))
def test_experiment_presets_compose(make_cfg, preset):
    cfg = make_cfg(f"+experiment={preset}")
    validate(cfg)


def test_unknown_member_lists_choices(make_cfg):
    with pytest.raises(MissingConfigException) as err:
        make_cfg("strategy=ewc")
    assert "icarl" in str(err.value) and "bic" in str(err.value)


@pytest.mark.parametrize("override,message", [
    ("trainer.epochs=0", "trainer.epochs=0"),
    ("trainer.batch_size=-4", "trainer.batch_size=-4"),
    ("trainer.lr=0", "trainer.lr=0"),
    ("benchmark.n_experiences=0", "benchmark.n_experiences=0"),
    ("logging.progress=sometimes", "logging.progress='sometimes'"),
])
def test_bad_values_are_named(make_cfg, override, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        validate(make_cfg(override))


def test_icarl_memory_smaller_than_classes(make_cfg):
    with pytest.raises(ValueError, match="memory_size=5 .* 10 classes"):
        validate_against_benchmark(make_cfg("trainer.memory_size=5"), num_classes=10)


def test_run_folder_names_the_run(make_cfg):
    cfg = make_cfg("strategy=bic", "tag=acc12", "seed=3")
    assert run_path(cfg.benchmark.name, cfg.model.name, cfg.strategy.name, cfg.quant.name, cfg.tag, cfg.seed) \
        == "digits-mlp/bic/fp32-acc12/seed3"
    assert Path(run_path("hapt", "mlp", "icarl", "hdqt", "", 0)).parts[-1] == "seed0"
