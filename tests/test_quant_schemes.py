import pytest
from omegaconf import OmegaConf

from hdqt_cil.quant.schemes import SCHEMES, preset, preset_settings, scheme_from_config


@pytest.mark.parametrize("name", SCHEMES.names())
def test_config_files_are_the_presets(make_cfg, name):
    """Each hdqt_cil/configs/quant/<name>.yaml composes to its scheme's defaults, and the run's seed reaches the
    scheme."""
    cfg = make_cfg(f"quant={name}", "seed=0")
    assert OmegaConf.to_container(cfg.quant, resolve=True) == preset_settings(name)
    assert scheme_from_config(cfg.quant) == preset(name)
    if name != "fp32":
        assert scheme_from_config(make_cfg(f"quant={name}", "seed=7").quant).seed == 7


def test_int4_is_hdqt_without_the_hadamard_transform():
    hdqt, int4 = preset_settings("hdqt"), preset_settings("int4")
    assert {k for k in hdqt if hdqt[k] != int4[k]} == {"name", "hadamard"} and int4["hadamard"] is False


def test_hdqt_preset_is_the_paper():
    s = preset("hdqt")
    x, w = s.forward.left, s.forward.right
    assert (x.bits, x.signedness, x.scale, x.clip, x.rounding) == (4, "auto", "max", 0.975, "nearest")
    assert (w.signedness, w.clip) == ("signed", 0.975)
    assert (s.forward.tile, s.forward.acc_bits) == (32, 8)
    for product in (s.grad_input, s.grad_weight):
        assert product.hadamard and product.tile is None and product.acc_bits == 8
        assert product.left.rounding == "stochastic" and product.left.clip == 1.0
    assert s.grad_input.right.rounding == "nearest" and s.grad_weight.right.rounding == "stochastic"
    assert s.ste == "authors" and s.hadamard_cap is None
    assert not preset("int4").grad_input.hadamard
    assert not preset("fp32").quantizes and preset("luq").shares_grad_output


def test_hydra_overrides_reach_the_scheme(make_cfg):
    cfg = make_cfg("quant=hdqt", "quant.bits=3", "quant.acc_bits=12", "quant.tile=64", "quant.backward_tiling=true",
                   "quant.rounding.bwd_weight=stochastic", "quant.hadamard_cap=16", "seed=5")
    s = scheme_from_config(cfg.quant)
    assert s.forward.left.bits == 3 and s.forward.acc_bits == 12 and s.forward.tile == 64
    assert s.grad_input.tile == 64 and s.grad_weight.acc_bits == 12
    assert s.grad_input.right.rounding == "stochastic" and s.hadamard_cap == 16 and s.seed == 5


def test_the_authors_integer_backward_is_a_config(make_cfg):
    """Their `int` backward flags: the output gradient clipped at 0.975·max and rounded to nearest, in both
    backward products; the forward and the other operands as HDQT's."""
    literal = scheme_from_config(make_cfg("quant=hdqt", "quant.grad_clip=0.975", "quant.rounding.grad_output=nearest",
                                          "quant.rounding.bwd_input=nearest").quant)
    default = preset("hdqt")
    for product, plain in ((literal.grad_input, default.grad_input), (literal.grad_weight, default.grad_weight)):
        assert (product.left.clip, product.left.rounding, product.left.scale) == (0.975, "nearest", "max")
        assert product.right.clip == plain.right.clip == 1.0 and product.right.rounding == "nearest"
    assert literal.forward == default.forward


@pytest.mark.parametrize("cfg,message", [
    ({"name": "hdqt", "grad_clip": 0}, r"quant.grad_clip=0.0 must be a fraction of max\|g\| in \(0, 1\]"),
    ({"name": "hdqt", "bits": 1}, r"quant.bits=1 must be an integer in 2..16"),
    ({"name": "hdqt", "bits": 17}, "quant.bits=17"),
    ({"name": "hdqt", "acc_bits": 3}, r"quant.acc_bits=3 must be null \(no saturation\).*quant.bits=4.*to 32"),
    ({"name": "hdqt", "acc_bits": 33}, "quant.acc_bits=33"),
    ({"name": "hdqt", "tile": 0}, "quant.tile=0 must be a positive integer"),
    ({"name": "hdqt", "tile": -32}, "quant.tile=-32"),
    ({"name": "hadamard"}, "unknown quantization scheme quant.name='hadamard'; choose one of fp, fp32, fp8, hdqt"),
    ({"name": "hdqt", "bitz": 4}, "quant.bitz is not a setting of quant=hdqt; its settings are name, backend"),
    ({"name": "fp32", "bits": 4}, "quant.bits is not a setting of quant=fp32"),
    ({"name": "hdqt", "rounding": {"activations": "nearest"}}, "quant.rounding.activations is not a setting"),
    ({"name": "hdqt", "rounding": {"input": "up"}}, "quant.rounding.input='up' must be one of nearest, stochastic"),
    ({"name": "hdqt", "granularity": {"bwd_weight": "sample"}}, "granularity.bwd_weight='sample'"),
    ({"name": "hdqt", "hadamard_cap": 24}, "quant.hadamard_cap=24 must be a power of two"),
    ({"name": "hdqt", "ste": "hard"}, "quant.ste='hard'"),
    ({"name": "hdqt", "backend": "triton"}, "quant.backend='triton'"),
    ({"name": "hdqt", "fwd_clip": 1.5}, "quant.fwd_clip=1.5"),
    ({"name": "hdqt", "bits": "four"}, "quant.bits='four'"),
    ({"name": "hot", "abc": "sometimes"}, "quant.abc='sometimes' must be true, false, columns or pointwise"),
    ({"name": "luq", "bits": 6}, "bits=6 is out of range; a log2 grid allows 2..5"),
])
def test_bad_configs_name_the_value(cfg, message):
    with pytest.raises(ValueError, match=message):
        scheme_from_config(cfg)


def test_unknown_hydra_key_is_refused(make_cfg):
    from hydra.errors import ConfigCompositionException
    with pytest.raises(ConfigCompositionException, match="bitz"):
        make_cfg("quant=hdqt", "quant.bitz=3")


@pytest.mark.parametrize("name", ["hdqt", "int4", "luq"])
def test_an_integer_scheme_takes_a_float_accumulator(make_cfg, name):
    """quant.acc=fp: every integer product's tile sums rounded to acc_exp_bits/acc_man_bits (LUQ: its forward);
    acc=none: exact sums; a run made before the setting existed is the same experiment as acc=int."""
    from hdqt_cil.config import comparable_config

    scheme = scheme_from_config(make_cfg(f"quant={name}", "quant.acc=fp", "quant.acc_man_bits=3").quant)
    assert scheme.forward.acc_bits is None and scheme.forward.acc_format.name == "e5m3"
    if name != "luq":
        assert scheme.grad_input.acc_format == scheme.grad_weight.acc_format == scheme.forward.acc_format
    exact = scheme_from_config(make_cfg(f"quant={name}", "quant.acc=none").quant)
    assert exact.forward.acc_bits is None and exact.forward.acc_format is None
    now = OmegaConf.to_container(make_cfg(f"quant={name}"), resolve=True)
    before = {**now, "quant": {k: v for k, v in now["quant"].items() if k not in ("acc", "acc_exp_bits",
                                                                                 "acc_man_bits")}}
    assert comparable_config(before) == comparable_config(now)
    fp = OmegaConf.to_container(make_cfg(f"quant={name}", "quant.acc=fp"), resolve=True)
    assert comparable_config(fp) != comparable_config(now)
    with pytest.raises(ValueError, match="quant.acc='float'"):
        scheme_from_config({"name": name, "acc": "float"})


def test_a_run_under_a_float_accumulator(make_cfg, tmp_path):
    from hdqt_cil.experiment import run

    args = ("strategy=naive", "quant=hdqt", "trainer.epochs=1", "trainer.device=cpu", "benchmark.n_experiences=2")
    fp = run(make_cfg(*args, "quant.acc=fp"), tmp_path / "fp")
    integer = run(make_cfg(*args), tmp_path / "int")
    assert fp["status"] == integer["status"] == "complete"
    assert fp["train_loss"] != integer["train_loss"]
    assert "e5m2" in str(fp["cost"]) and "e5m2" not in str(integer["cost"])
