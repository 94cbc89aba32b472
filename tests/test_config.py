from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from hdqt_cil.config import run_path, validate, validate_against_benchmark
from hdqt_cil.quant import scheme_from_config

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


PRESETS = sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml"))
ABLATIONS = [p for p in PRESETS if p.startswith("ablation_")]


@pytest.mark.parametrize("preset", [p for p in PRESETS if p not in ABLATIONS])
def test_experiment_presets_compose(make_cfg, preset):
    cfg = make_cfg(f"+experiment={preset}")
    validate(cfg)


@pytest.mark.parametrize("preset", ABLATIONS)
def test_ablation_presets_sweep_valid_schemes_into_separate_folders(make_cfg, preset):
    """Every value an ablation sweeps makes a valid HDQT scheme, and every sweep point gets its own run folder."""
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        params = compose("config", overrides=[f"+experiment={preset}"], return_hydra_config=True).hydra.sweeper.params
    assert params, f"{preset} sweeps nothing"
    points = [[]]
    for key, values in params.items():
        points = [point + [f"{key}={value}"] for point in points for value in values.split(",")]
    tags = set()
    for point in points:
        cfg = make_cfg("quant=hdqt", f"+experiment=[har_paper,{preset}]", *point)
        validate(cfg)
        scheme_from_config(cfg.quant)
        tags.add(cfg.tag)
    assert len(tags) == len(points)


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
