import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf

from hdqt_cil.strategies import check_fits
from hdqt_cil.config import run_path, validate
from hdqt_cil.quant import scheme_from_config

ROOT = Path(__file__).resolve().parents[1]

GROUPS = ["benchmark", "model", "strategy", "quant", "trainer"]


@pytest.mark.parametrize("group,member", [(g, p.stem) for g in GROUPS
                                          for p in sorted((ROOT / "hdqt_cil" / "configs" / g).glob("*.yaml"))])
def test_every_group_member_composes(make_cfg, group, member):
    needs = {"features": ["benchmark.path=table.csv"], "images": ["benchmark.root=pictures"]}
    cfg = make_cfg(f"{group}={member}", *(needs.get(member, []) if group == "benchmark" else []))
    OmegaConf.resolve(cfg)
    if group != "trainer":  # a benchmark's file names its loader; the data's name may differ (torchvision's sets)
        expected = "mlp" if (group, member) == ("model", "auto") else member  # auto: the digits' model
        assert (cfg[group].loader if group == "benchmark" else cfg[group].name) == expected
    validate(cfg)


PRESETS = sorted(p.stem for p in (ROOT / "hdqt_cil" / "configs" / "experiment").glob("*.yaml"))
ABLATIONS = [p for p in PRESETS if p.startswith("ablation_")]


@pytest.mark.parametrize("preset", [p for p in PRESETS if p not in ABLATIONS])
def test_experiment_presets_compose(make_cfg, preset):
    cfg = make_cfg(f"+experiment={preset}")
    validate(cfg)


@pytest.mark.parametrize("preset", ABLATIONS)
def test_ablation_presets_sweep_valid_schemes_into_separate_folders(make_cfg, preset):
    """Every value an ablation sweeps makes a valid HDQT scheme, and every sweep point gets its own run folder."""
    with initialize_config_dir(config_dir=str(ROOT / "hdqt_cil" / "configs"), version_base="1.3"):
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
        make_cfg("strategy=ewcc")
    assert "icarl" in str(err.value) and "bic" in str(err.value)


@pytest.mark.parametrize("overrides,message", [
    (["trainer.epochs=0"], "trainer.epochs=0 must be a positive integer"),
    (["trainer.batch_size=-4"], "trainer.batch_size=-4 must be a positive integer"),
    (["trainer.lr=0"], "trainer.lr=0.0 must be a positive number"),
    (["trainer.momentum=1"], "trainer.momentum=1.0 must be a number in [0, 1)"),
    (["trainer.weight_decay=-1e-4"], "trainer.weight_decay=-0.0001 must be a non-negative number"),
    (["trainer.milestones=[100,60]"], "trainer.milestones=[100, 60] must be a list of increasing positive"),
    (["trainer.checkpoint_every=-1"], "trainer.checkpoint_every=-1 must be a non-negative integer"),
    (["trainer.cuda_graph=maybe"], "trainer.cuda_graph='maybe' must be auto, true or false"),
    (["trainer.cuda_graph=1"], "trainer.cuda_graph=1 must be auto, true or false"),
    (["trainer.gamma=0"], "trainer.gamma=0.0 must be a number in (0, 1]"),
    (["trainer.device=gpu"], "trainer.device='gpu' must be auto, cpu, cuda or cuda:N"),
    (["trainer.memory_size=-5"], "trainer.memory_size=-5 must be a non-negative integer"),
    (["seed=-1"], "seed=-1 must be a non-negative integer"),
    (["quant=hdqt", "seed=-1"], "seed=-1 must be a non-negative integer"),  # quant.seed follows the run's seed
    (["tag=a/b"], "tag='a/b' must be a string without '/'"),
    (["on_divergence=ignore"], "on_divergence='ignore' must be one of stop, continue"),
    (["logging.progress=sometimes"], "logging.progress='sometimes' must be one of auto, on, off"),
    (["logging.epochs=-1"], "logging.epochs=-1 must be auto or a non-negative integer"),
    (["benchmark.n_experiences=0"], "benchmark.n_experiences=0 must be a positive integer or null"),
    (["benchmark=features"], "benchmark.path must be set: benchmark.path=VALUE"),
    (["benchmark.classes_per_exp=2"], "set exactly one of benchmark.n_experiences and benchmark.classes_per_exp"),
    (["benchmark.class_order=[1,1]"], "benchmark.class_order=[1, 1] must be a list of distinct class indices"),
    (["benchmark.scenario=domains"], "benchmark.scenario='domains' must be one of class, task, domain"),
    (["benchmark=hapt", "benchmark.split=kfold"], "benchmark.split='kfold' must be one of auto, subject, random"),
    (["benchmark=hapt", "benchmark.train_fraction=1"], "benchmark.train_fraction=1.0 must be a number strictly"),
    (["benchmark=cifar10", "benchmark.augment_on=tpu"], "benchmark.augment_on='tpu' must be one of cpu, gpu"),
    (["model=mlp", "model.hidden=0"], "model.hidden=0 must be a positive integer or null"),
    (["strategy=lwf", "strategy.lamb=-1"], "strategy.lamb=-1.0 must be a non-negative number"),
    (["strategy=lwf", "strategy.temperature=0"], "strategy.temperature=0.0 must be a positive number"),
    (["strategy=bic", "strategy.val_percentage=0"], "strategy.val_percentage=0.0 must be a number strictly"),
    (["strategy=icarl", "strategy.eval_head=cnn"], "strategy.eval_head='cnn' must be one of nme, linear"),
    (["strategy=icarl", "strategy.eval_head=nme"], "strategy.eval_head='nme' needs strategy.loss=bce"),
    (["strategy=dyn_der", "strategy.aux_weight=-1"], "strategy.aux_weight=-1.0 must be a non-negative number"),
    (["strategy=memo", "strategy.aux_weight=-1"], "strategy.aux_weight=-1.0 must be a non-negative number"),
    (["quant=hdqt", "quant.acc_bits=3"], "quant.acc_bits=3 must be null (no saturation) or an integer from"),
    (["quant=hot", "quant.hla_rank=2", "quant.hla_rank_ratio=0.5"], "quant.hla_rank=2 and quant.hla_rank_ratio"),
])
def test_bad_values_are_named(make_cfg, overrides, message):
    """The message starts with the setting the command named ('seed=-1', not the 'quant.seed' that follows it)."""
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        validate(make_cfg(*overrides))


@pytest.mark.parametrize("override,key,value", [
    ("trainer.epochs=ten", "trainer.epochs", "ten"),
    ("trainer.batch_size=1.5", "trainer.batch_size", "1.5"),
    ("trainer.lr=abc", "trainer.lr", "abc"),
    ("trainer.milestones=60", "trainer.milestones", "60"),
    ("seed=1.5", "seed", "1.5"),
    ("resume=maybe", "resume", "maybe"),
    ("trainer.deterministic=perhaps", "trainer.deterministic", "perhaps"),
    ("quant.bits=four", "quant.bits", "four"),
])
def test_values_of_the_wrong_type_are_refused_when_composing(make_cfg, override, key, value):
    """Hydra checks each value against its setting's type while composing, naming the key and the value."""
    with pytest.raises(ConfigCompositionException) as err:
        make_cfg(override)
    assert key in str(err.value) and value in str(err.value)


def test_bic_auto_distillation_weight_is_allowed(make_cfg):
    validate(make_cfg("strategy=bic", "strategy.lamb=-1"))


def test_icarl_memory_smaller_than_classes(make_cfg):
    cfg = make_cfg("trainer.memory_size=5")
    with pytest.raises(ValueError, match="memory_size=5 .* 10 classes"):
        check_fits(cfg.strategy, cfg.trainer, num_classes=10)


def test_memo_needs_an_exemplar_per_class_new_classes_each_experience_and_a_boolean_train_base(make_cfg):
    cfg = make_cfg("strategy=memo", "trainer.memory_size=5")
    with pytest.raises(ValueError, match="memory_size=5 .* MEMO needs at least one exemplar per class"):
        check_fits(cfg.strategy, cfg.trainer, num_classes=10)
    with pytest.raises(ValueError, match=re.escape("strategy=memo is made for benchmark.scenario=class|task")):
        check_fits(cfg.strategy, cfg.trainer, 5, "domain")
    with pytest.raises(ConfigCompositionException, match="strategy.train_base"):
        make_cfg("strategy=memo", "strategy.train_base=perhaps")


def test_run_folder_names_the_run(make_cfg):
    cfg = make_cfg("strategy=bic", "tag=acc12", "seed=3")
    assert run_path(cfg.benchmark.name, cfg.benchmark.scenario, cfg.model.name, cfg.strategy.name, cfg.quant.name,
                    cfg.tag, cfg.seed) == "digits-mlp/bic/fp32-acc12/seed3"
    assert run_path("hapt", "task", "mlp", "icarl", "hdqt", "", 0) == "hapt-task-mlp/icarl/hdqt/seed0"


@pytest.mark.parametrize("experiment, epochs, milestones", [
    ("cifar10_paper", None, [60, 100, 140]),
    ("cifar10_paper", 40, [14, 24, 33]),
    ("cifar100_paper", 8, [3, 5, 7]),
    ("har_paper", 30, [15]),
    ("har_paper", 1, [1]),
])
def test_shortened_paper_schedule_keeps_milestone_fractions(make_cfg, experiment, epochs, milestones):
    overrides = [f"+experiment={experiment}"] + ([f"trainer.epochs={epochs}"] if epochs else [])
    cfg = make_cfg(*overrides)
    assert list(cfg.trainer.milestones) == milestones
    validate(cfg)


def test_explicit_milestones_replace_the_scaled_ones(make_cfg):
    cfg = make_cfg("+experiment=cifar10_paper", "trainer.epochs=8", "trainer.milestones=[4]")
    assert list(cfg.trainer.milestones) == [4]


@pytest.mark.parametrize("overrides, lines", [
    ([], ["schedule: 100 epochs a task; lr 0.01, ×0.1 after epoch 50"]),
    (["trainer.epochs=5"], ["schedule: 5 epochs a task, shortened from har_paper's 100; lr 0.01, ×0.1 after epoch 2"]),
    (["trainer.epochs=5", "trainer.milestones=[3,50]"],
     ["schedule: 5 epochs a task, shortened from har_paper's 100; lr 0.01, ×0.1 after epoch 3",
      "trainer.milestones [50] lie at or beyond trainer.epochs=5: the learning rate never drops there within a task "
      "(set milestones below 5, or [])"]),
    (["trainer.milestones=[]"], ["schedule: 100 epochs a task; lr 0.01, constant"]),
])
def test_a_run_states_its_schedule_and_a_milestone_it_never_reaches(make_cfg, overrides, lines):
    from hdqt_cil.trainer.optim import PerExperienceSGD

    cfg = make_cfg("+experiment=har_paper", *overrides)
    t = cfg.trainer
    described = PerExperienceSGD(t.lr, list(t.milestones), t.gamma).describe(t.epochs, cfg.preset, cfg.preset_epochs)
    assert described == lines


def test_a_preset_names_itself_and_its_label_does_not_split_a_run_folder(make_cfg):
    from hdqt_cil.config import comparable_config

    cfg = make_cfg("+experiment=cifar10_paper", "trainer.epochs=60")
    assert (cfg.preset, cfg.preset_epochs, list(cfg.trainer.milestones)) == ("cifar10_paper", 170, [21, 35, 49])
    plain = OmegaConf.to_container(cfg, resolve=True)
    unlabelled = {k: v for k, v in plain.items() if k not in ("preset", "preset_epochs")}
    assert comparable_config(plain) == comparable_config(unlabelled)


def test_a_run_folder_written_before_benchmarks_had_loaders_still_matches():
    from hdqt_cil.config import comparable_config

    before = {"seed": 0, "benchmark": {"name": "hapt", "path": "/old/hapt.npz", "classes_per_exp": 2}}
    now = {"seed": 0, "benchmark": {"loader": "hapt", "name": "hapt", "path": "/new/hapt.npz", "classes_per_exp": 2}}
    renamed = {"seed": 0, "benchmark": {"loader": "features", "name": "hapt", "path": "x", "classes_per_exp": 2}}
    assert comparable_config(before) == comparable_config(now) != comparable_config(renamed)


def test_a_hot_run_folder_tells_sliced_from_whole_unfolding_but_not_the_backend(make_cfg):
    """sliced_unfold changes a GPU run's last bits (x̃'s per-sample sums reduced over slices of other sizes), so
    it tells runs apart as the other HOT settings do; the backend only says where the same products run."""
    from omegaconf import OmegaConf

    from hdqt_cil.config import comparable_config

    def comparable(*overrides):
        return comparable_config(OmegaConf.to_container(make_cfg("quant=hot", *overrides), resolve=True))
    before = comparable()
    assert before != comparable("quant.sliced_unfold=false") != comparable("quant.abc=columns") != before
    assert comparable("quant.backend=torch") == before  # where the products run, as the device
    with pytest.raises(Exception, match="quant.sliced_unfold"):
        make_cfg("quant=hot", "quant.sliced_unfold=sometimes")


@pytest.mark.parametrize("overrides, model", [
    ([], "mlp"), (["benchmark=hapt"], "mlp"), (["benchmark=features", "benchmark.path=t.csv"], "mlp"),
    (["benchmark=cifar10"], "resnet32"), (["benchmark=images", "benchmark.root=p"], "resnet32"),
    (["benchmark=torchvision"], "resnet32"), (["benchmark=cifar10", "model=mlp"], "mlp"),
    (["benchmark=hapt", "model=resnet32"], "resnet32"),
])
def test_the_default_model_is_the_one_the_benchmarks_inputs_call_for(make_cfg, overrides, model):
    cfg = make_cfg(*overrides)
    folder = run_path(cfg.benchmark.name, "class", cfg.model.name, "icarl", "hdqt", "", 0)
    assert cfg.model.name == model and folder.split("/")[0].endswith(f"-{model}")


@pytest.mark.parametrize("strategy", ["replay", "der", "er_ace", "gdumb", "agem"])
def test_rehearsal_without_memory_is_refused(make_cfg, strategy):
    cfg = make_cfg(f"strategy={strategy}", "trainer.memory_size=0")
    with pytest.raises(ValueError, match=f"trainer.memory_size=0: {strategy} replays stored samples"):
        check_fits(cfg.strategy, cfg.trainer, num_classes=10)
    one = make_cfg(f"strategy={strategy}", "trainer.memory_size=1")
    check_fits(one.strategy, one.trainer, num_classes=10)
