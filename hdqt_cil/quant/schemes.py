"""Quantized-training schemes: for each product of a layer, how its operands are quantized and how it accumulates.

A layer computes three products (docs/quant.md):
    forward      y   = x · Wᵀ      left = input x,            right = weight W
    grad_input   g_x = G · W       left = output gradient G,  right = W as the forward used it
    grad_weight  g_W = Gᵀ · x      left = output gradient G,  right = x as the forward used it
A `Product` says how each operand is quantized (a QuantSpec, or None: it enters as it is, i.e. float in the
forward and the forward's levels in the backward), whether both operands are Hadamard-transformed along the
contraction dimension first, and the accumulator (tile, acc_bits). Schemes are built from a flat config (the
Hydra group `quant`, one file a preset under hdqt_cil/configs/quant/ over the scheme's settings dataclass below) by one
registered builder per scheme name.

HOT (`HotScheme`) does not fit a `Product` triple: its forward is float, its two backward products have
different transforms (Hadamard along the output channels, HLA along the tokens), one of them reads a
compressed copy of the input saved by the forward (ABC), and the scale granularity of one operand is chosen per
layer (LQS). It has its own small dataclass; `quantize_model` gives its layers the HOT classes (quant/hot.py).
"""
from dataclasses import dataclass, fields
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from ..registry import Registry
from ..settings import BOOL, NON_NEGATIVE_INT, Rule, check_settings, one_of, setting
from .floats import EXP_BITS_RANGE, MAN_BITS_RANGE, FloatFormat, authors_format, bits_in
from .intmm import check_accumulation
from .quantizers import BITS_RANGE, GRANULARITIES, ROUNDINGS, QuantSpec

ROLES = ("input", "weight", "grad_output", "bwd_weight", "bwd_input")
BACKWARD_ROLES = ("grad_output", "bwd_weight", "bwd_input")
STES = ("authors", "clip", "none")
BACKENDS = ("auto", "torch", "cupy")
ACC_BITS_MAX = 32


@dataclass(frozen=True)
class Product:
    """One matrix product: its two operands' quantizers, the Hadamard transform and the accumulator: integer
    (acc_bits: tile sums saturate) or float (acc_format: tile sums rounded to it), or neither (exact sums)."""
    left: QuantSpec | None = None
    right: QuantSpec | None = None
    hadamard: bool = False
    tile: int | None = None
    acc_bits: int | None = None
    acc_format: FloatFormat | None = None

    def __post_init__(self):
        check_accumulation(self.tile, self.acc_bits, self.acc_format)


@dataclass(frozen=True)
class Scheme:
    """A complete quantized-training recipe.

    ste: the quantizer's own gradient in the forward. 'authors': zero where |t| > 2^(bits-1)-1 in raw units
    (the HDQT code's fixed threshold); 'clip': zero where t lies outside the clip range; 'none': pass through.
    When grad_input and grad_weight quantize G with the same spec and neither transforms it, G is quantized once
    and shared by both products (LUQ quantizes the output gradient once).
    """
    name: str
    forward: Product
    grad_input: Product
    grad_weight: Product
    hadamard_cap: int | None = None
    ste: str = "authors"
    seed: int = 0
    backend: str = "auto"

    def __post_init__(self):
        if self.ste not in STES:
            raise ValueError(f"ste={self.ste!r} is not allowed; choose one of {', '.join(STES)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r} is not allowed; choose one of {', '.join(BACKENDS)}")
        if self.forward.hadamard:
            raise ValueError("a Hadamard transform in the forward product is not supported")
        for label, product, integer in self._products():
            if product.hadamard and product.left is None and product.right is None:
                raise ValueError(f"{label}: a Hadamard transform needs a quantizer after it")
            if not integer and (product.acc_bits is not None or product.acc_format is not None):
                raise ValueError(f"{label}: an accumulator applies to integer products; quantize both operands first")

    def _products(self):
        """(label, product, whether both of its operands are integers)."""
        x_levels, w_levels = self.forward.left is not None, self.forward.right is not None
        g_levels = self.grad_input.left is not None
        yield "forward", self.forward, x_levels and w_levels
        yield "grad_input", self.grad_input, g_levels and (self.grad_input.right is not None or w_levels)
        g_levels = self.grad_weight.left is not None
        yield "grad_weight", self.grad_weight, g_levels and (self.grad_weight.right is not None or x_levels)

    @property
    def quantizes(self) -> bool:
        """False for a scheme that leaves every operand in float (the layers then run torch's own ops)."""
        return any(spec is not None for _, product, _ in self._products() for spec in (product.left, product.right))

    @property
    def shares_grad_output(self) -> bool:
        return (self.grad_input.left == self.grad_weight.left and self.grad_input.left is not None
                and not self.grad_input.hadamard and not self.grad_weight.hadamard)


ABC_MODES = ("columns", "pointwise")  # besides true and false: docs/quant.md "HOT"


@dataclass(frozen=True)
class HotScheme:
    """HOT (Kim et al., CVPR 2025; docs/quant.md "HOT"): float forward, compressed saved input, integer backward.

    gx_bits: g_x = G·W with G (stochastic) and W (SAWB, nearest) Hadamard-transformed along the output channels
    (block min(hadamard_cap, largest power of two dividing O)). gw_bits: g_W = Gᵀ·x with G (stochastic) and x
    HLA-compressed along the tokens (rank: `hla_rank` rows a block, or `hla_rank_ratio` of the block, or LP_L1's
    triangle when both are None). abc_bits: the compressed x (SAWB, nearest). `abc`, what the forward keeps for
    the backward: True: Linears and 1×1 convs the compressed x, k×k convs x in abc_bits, ReLU and max pooling
    their exact compact forms, the norms and GELU their inputs in abc_bits (quant/compact.py); 'columns': every
    layer the compressed x (a k×k conv's im2col matrix), the neighbours in float; 'pointwise': Linears and 1×1
    convs the compressed x, the rest in float; False: all in float. Only True's low-precision copies change
    gradients. Bits None: that operand stays float (its transform still applies).
    sliced_unfold: a k×k conv unfolds (im2col) a slice of samples at a time for x̃ and for g_x's columns, each
    slice at most the layer's input in size, so that no k²-times-the-input float buffer exists (the scales of x̃
    are per sample and g_x's product is per element: the same numbers on the CPU; on a GPU torch's per-sample sums
    of x̃ for SAWB end in other bits over slices of other sizes).
    lqs: choose per layer, on a calibration batch, per-token scales for G in g_x when e_token < lqs_threshold ·
    e_tensor (quant/lqs.py).
    """
    name: str = "hot"
    gx_bits: int | None = 4
    gw_bits: int | None = 8
    abc_bits: int | None = 8
    hadamard_cap: int | None = 16
    hla_rank: int | None = None
    hla_rank_ratio: float | None = None
    lqs: bool = True
    lqs_threshold: float = 0.5
    abc: bool | str = True
    sliced_unfold: bool = True
    seed: int = 0
    backend: str = "auto"

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r} is not allowed; choose one of {', '.join(BACKENDS)}")
        if not (isinstance(self.abc, bool) or self.abc in ABC_MODES):
            raise ValueError(f"abc={self.abc!r} is not allowed; choose one of true, false, {', '.join(ABC_MODES)}")
        if self.hla_rank is not None and self.hla_rank_ratio is not None:
            raise ValueError("hla_rank and hla_rank_ratio exclude each other; set one of them to null")

    @property
    def quantizes(self) -> bool:
        """True: the HOT layers always run their own backward (a float path still transforms)."""
        return True

    def grad_output_spec(self, per_token: bool) -> QuantSpec | None:
        """G in g_x: symmetric, max|G| / qmax, stochastic; per tensor or per token (row of (B, L, O))."""
        if self.gx_bits is None:
            return None
        return QuantSpec(self.gx_bits, "signed", "max", 1.0, "row" if per_token else "tensor", "stochastic")

    @property
    def weight_spec(self) -> QuantSpec | None:
        """W in g_x, after the Hadamard transform: SAWB clip, nearest, one scale."""
        return None if self.gx_bits is None else QuantSpec(self.gx_bits, "signed", "sawb", 1.0, "tensor", "nearest")

    @property
    def grad_weight_spec(self) -> QuantSpec | None:
        """G in g_W, after HLA: symmetric, max, stochastic; per sample where the product runs per sample."""
        return None if self.gw_bits is None else QuantSpec(self.gw_bits, "signed", "max", 1.0, "sample", "stochastic")

    @property
    def input_spec(self) -> QuantSpec | None:
        """x after HLA (the ABC copy): SAWB clip, nearest; per sample where the product runs per sample."""
        return None if self.abc_bits is None else QuantSpec(self.abc_bits, "signed", "sawb", 1.0, "sample", "nearest")


# ---------------------------------------------------------------------------------------------------------------
# settings: one dataclass a scheme (its schema for hdqt_cil/configs/quant/<name>.yaml), one builder a name

SCHEMES = Registry("quant")
BITS = Rule(lambda v: isinstance(v, int) and not isinstance(v, bool) and BITS_RANGE[0] <= v <= BITS_RANGE[1],
            f"an integer in {BITS_RANGE[0]}..{BITS_RANGE[1]}")
OPTIONAL_BITS = Rule(lambda v: v is None or BITS.test(v),
                     f"an integer in {BITS_RANGE[0]}..{BITS_RANGE[1]} (8 and below run on the int8 kernels), or null "
                     "(that operand stays float)")
POWER_OF_TWO = Rule(lambda v: v is None or (isinstance(v, int) and v >= 1 and not v & (v - 1)),
                    "a power of two (or null: no cap)")
TILE = Rule(lambda v: v is None or (isinstance(v, int) and v >= 1),
            "a positive integer (or null: the whole K is one tile)")
UNIT_FRACTION = Rule(lambda v: 0 < v <= 1, "a number in (0, 1]")
EXP_BITS, MAN_BITS = (Rule(lambda v, r=bounds: bits_in(v, r), f"an integer in {bounds[0]}..{bounds[1]}")
                      for bounds in (EXP_BITS_RANGE, MAN_BITS_RANGE))
# An integer product's accumulator: int (tile sums saturate at acc_bits) | fp (each tile's sum rounded to an
# acc_exp_bits/acc_man_bits float by the HDQT authors' quantizer, their --quantAccFWD/BWD fp) | none (exact sums)
INTEGER_ACCUMULATORS = ("int", "fp", "none")


@dataclass
class QuantConfig:
    name: str = MISSING
    backend: str = setting("auto", one_of(*BACKENDS))  # torch | cupy | auto (the kernels for CUDA tensors)
    # The random bits of stochastic rounding: the run's seed unless set.
    seed: int = setting("${oc.select:seed,0}", NON_NEGATIVE_INT)


@dataclass
class Fp32Config:
    name: str = "fp32"


@dataclass
class RoundingConfig:
    """nearest | stochastic, per tensor role."""
    input: str = setting("nearest", one_of(*ROUNDINGS))
    weight: str = setting("nearest", one_of(*ROUNDINGS))
    grad_output: str = setting("stochastic", one_of(*ROUNDINGS))
    bwd_weight: str = setting("nearest", one_of(*ROUNDINGS))
    bwd_input: str = setting("stochastic", one_of(*ROUNDINGS))


@dataclass
class GranularityConfig:
    """Backward scales: tensor | sample (per sample in conv layers) | row. Each keeps its scales constant along
    the contraction of the product it enters (docs/quant.md, "Layouts")."""
    grad_output: str = setting("sample", one_of(*GRANULARITIES))
    bwd_weight: str = setting("tensor", one_of("tensor", "row"))
    bwd_input: str = setting("sample", one_of(*GRANULARITIES))


@dataclass
class IntegerAccumulatorConfig(QuantConfig):
    """The accumulator of a scheme's integer products (INTEGER_ACCUMULATORS)."""
    acc: str = setting("int", one_of(*INTEGER_ACCUMULATORS))
    # int: tile sums saturate at ±(2^(acc_bits-1)-1) (bits..32; null = never)
    acc_bits: Optional[int] = 8
    acc_exp_bits: int = setting(5, EXP_BITS)  # fp: the accumulator's format (default E5M2, the authors')
    acc_man_bits: int = setting(2, MAN_BITS)

    def check(self, path: str) -> None:
        if self.acc == "int":
            check_accumulator(self.acc_bits, self.bits, path)

    def accumulator(self) -> dict:
        """The products' accumulator settings (Product's acc_bits, acc_format)."""
        if self.acc == "fp":
            return {"acc_bits": None, "acc_format": authors_format(self.acc_exp_bits, self.acc_man_bits)}
        return {"acc_bits": self.acc_bits if self.acc == "int" else None, "acc_format": None}


@dataclass
class HdqtConfig(IntegerAccumulatorConfig):
    """HDQT (Schiemer et al., CoLLAs 2025): 4-bit inputs, 8-bit tiled accumulators, Hadamard-domain backward.
    Meanings: docs/quant.md; the numeric rules: docs/numerics.md."""
    name: str = "hdqt"
    bits: int = setting(4, BITS)  # input levels: signed ±(2^(bits-1)-1), unsigned 0..2^bits-1
    tile: Optional[int] = setting(32, TILE)  # forward K tile (null = the whole K saturates once)
    fwd_clip: float = setting(0.975, Rule(lambda v: 0 < v <= 1, "a fraction of max|t| in (0, 1]"))
    # The fraction of max|g| the output gradient's quantizer keeps in both backward products; the HDQT authors'
    # `int` backward flags clip it at 0.975 (with nearest rounding: quant.rounding.grad_output=nearest).
    grad_clip: float = setting(1.0, Rule(lambda v: 0 < v <= 1, "a fraction of max|g| in (0, 1]"))
    hadamard: bool = setting(True, BOOL)  # backward operands Hadamard-transformed along the contraction
    hadamard_cap: Optional[int] = setting(None, POWER_OF_TWO)  # largest Hadamard block (null: no cap)
    backward_tiling: bool = setting(False, BOOL)  # backward products tiled like the forward (the paper: whole K)
    ste: str = setting("authors", one_of(*STES))  # authors (zero where |t| > 2^(bits-1)-1) | clip | none
    rounding: RoundingConfig = setting(RoundingConfig())
    granularity: GranularityConfig = setting(GranularityConfig())


@dataclass
class Int4Config(HdqtConfig):
    """Plain INT4: HDQT's quantizers and accumulators without the Hadamard transform."""
    name: str = "int4"
    hadamard: bool = setting(False, BOOL)


@dataclass
class LuqConfig(IntegerAccumulatorConfig):
    """LUQ (Chmiel et al., ICLR 2023) as the HDQT authors ran it: SAWB INT4 forward; the output gradient in radix-2
    FP4 with stochastic underflow and logarithmic unbiased rounding (docs/quant.md). The accumulator settings
    apply to the forward product (the backward's do not saturate)."""
    name: str = "luq"
    bits: int = setting(4, BITS)  # forward INT4 levels; the gradient: 1 sign + (bits-1) exponent bits
    tile: Optional[int] = setting(None, TILE)  # the authors' LUQ saturates the whole-K sum
    ste: str = setting("none", one_of(*STES))  # LUQ's straight-through estimator passes every gradient


@dataclass
class HotConfig(QuantConfig):
    """HOT (Kim et al., CVPR 2025): float forward; g_x = G·W on Hadamard-domain operands, g_W = Gᵀ·x after a
    Hadamard low-rank approximation (HLA) along the tokens; the forward saves that compressed x (ABC); LQS picks
    per-tensor or per-token scales for G per layer on one training batch (docs/quant.md, "HOT")."""
    name: str = "hot"
    gx_bits: Optional[int] = setting(4, OPTIONAL_BITS)  # G (stochastic) and W (SAWB, nearest) in g_x
    gw_bits: Optional[int] = setting(8, OPTIONAL_BITS)  # G after HLA in g_W (stochastic)
    abc_bits: Optional[int] = setting(8, OPTIONAL_BITS)  # the saved x after HLA (SAWB, nearest)
    hadamard_cap: Optional[int] = setting(16, POWER_OF_TWO)  # g_x block: min(cap, largest power of two dividing O)
    # Rows kept per HLA block (at most the block), or as a fraction of it; both null: LP_L1's triangle.
    hla_rank: Optional[int] = setting(None, Rule(lambda v: v is None or (isinstance(v, int) and v >= 1),
                                                 "a positive integer (rows kept per HLA block) or null"))
    hla_rank_ratio: Optional[float] = setting(None, Rule(lambda v: v is None or UNIT_FRACTION.test(v),
                                                         "a fraction of the HLA block in (0, 1] or null"))
    lqs: bool = setting(True, BOOL)  # layer-wise quantizer selection before the first experience
    lqs_threshold: float = setting(0.5, UNIT_FRACTION)  # per-token scales when e_token < threshold · e_tensor
    # What the forward keeps: true (compact: ABC, 8-bit k×k conv inputs and BatchNorm, ReLU bit masks) | columns
    # (ABC in every layer, k×k convs' im2col matrices included) | pointwise (ABC in Linears and 1x1 convs) | false.
    abc: Any = setting(True, Rule(lambda v: isinstance(v, bool) or v in ABC_MODES,
                                  f"true, false, {' or '.join(ABC_MODES)}"))
    # k×k convs unfold a slice of samples at a time (at most the layer's input in size): less memory
    sliced_unfold: bool = setting(True, BOOL)

    def check(self, path: str) -> None:
        if self.hla_rank is not None and self.hla_rank_ratio is not None:
            raise ValueError(f"{path}hla_rank={self.hla_rank!r} and {path}hla_rank_ratio={self.hla_rank_ratio!r} "
                             "exclude each other; set one of them to null")


def check_accumulator(acc_bits, bits: int, path: str) -> None:
    if acc_bits is not None and not bits <= acc_bits <= ACC_BITS_MAX:
        raise ValueError(f"{path}acc_bits={acc_bits!r} must be null (no saturation) or an integer from "
                         f"{path}bits={bits} (an accumulator narrower than its inputs means nothing) to {ACC_BITS_MAX}")


@SCHEMES.register("fp32", Fp32Config)
def _build_float(cfg) -> Scheme:
    return Scheme(cfg.name, Product(), Product(), Product())


@SCHEMES.register("hdqt", HdqtConfig)
@SCHEMES.register("int4", Int4Config)
def _build_integer(cfg) -> Scheme:
    """HDQT and plain INT4: forward max-clip quantizers; backward re-quantizers max|t|/qmax (the output gradient's
    clipped by grad_clip), with or without Hadamard."""
    def spec(role: str, signedness="signed", clip=1.0) -> QuantSpec:
        return QuantSpec(cfg.bits, signedness, "max", clip, getattr(cfg.granularity, role, "tensor"),
                         getattr(cfg.rounding, role))

    backward = dict(hadamard=cfg.hadamard, tile=cfg.tile if cfg.backward_tiling else None, **cfg.accumulator())
    return Scheme(
        name=cfg.name,
        forward=Product(spec("input", "auto", cfg.fwd_clip), spec("weight", clip=cfg.fwd_clip),
                        tile=cfg.tile, **cfg.accumulator()),
        grad_input=Product(spec("grad_output", clip=cfg.grad_clip), spec("bwd_weight"), **backward),
        grad_weight=Product(spec("grad_output", clip=cfg.grad_clip), spec("bwd_input"), **backward),
        hadamard_cap=cfg.hadamard_cap, ste=cfg.ste, seed=cfg.seed, backend=cfg.backend)


@SCHEMES.register("luq", LuqConfig)
def _build_luq(cfg) -> Scheme:
    """LUQ as the HDQT authors ran it ('luq_corrected'): SAWB INT4 forward, nearest, saturated over the whole K;
    the output gradient in radix-2 FP4 with stochastic underflow and logarithmic unbiased rounding, quantized
    once; the backward products use the forward's INT4 levels and do not saturate."""
    gradient = QuantSpec(cfg.bits, "signed", "max", 1.0, "tensor", "stochastic", grid="log2")
    return Scheme(
        name=cfg.name,
        forward=Product(QuantSpec(cfg.bits, "auto", "sawb"), QuantSpec(cfg.bits, "signed", "sawb"),
                        tile=cfg.tile, **cfg.accumulator()),
        grad_input=Product(gradient, None),
        grad_weight=Product(gradient, None),
        ste=cfg.ste, seed=cfg.seed, backend=cfg.backend)


@SCHEMES.register("hot", HotConfig)
def _build_hot(cfg) -> HotScheme:
    return HotScheme(**{f.name: getattr(cfg, f.name) for f in fields(HotScheme)})


def scheme_from_config(cfg) -> Scheme | HotScheme:
    """The scheme named by cfg['name'] from the `quant` config group (a DictConfig) or a plain dict of settings:
    what is not given takes the scheme's defaults; every value is checked, naming `quant.<key>`."""
    given = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    name = given.get("name")
    if name not in SCHEMES.names():
        raise ValueError(f"unknown quantization scheme quant.name={name!r}; choose one of {', '.join(SCHEMES.names())}")
    settings = OmegaConf.to_object(_settings_node(name, given))
    check_settings(settings, "quant.")
    return SCHEMES.builder(name)(settings)


def _settings_node(name: str, given: dict) -> DictConfig:
    """Scheme `name`'s settings with `given` on top (outside a run, the seed defaults to 0)."""
    schema = SCHEMES.settings(name)
    unbound_seed = {"seed": 0} if any(f.name == "seed" for f in fields(schema)) else {}
    try:
        return OmegaConf.merge(OmegaConf.structured(schema), unbound_seed, given)
    except ConfigKeyError as err:
        raise ValueError(f"quant.{err.full_key} is not a setting of quant={name}; its settings are "
                         f"{', '.join(f.name for f in fields(schema))}") from err
    except ValidationError as err:
        raise ValueError(f"quant.{err.full_key}={err.value!r}: {err.msg}") from err


def preset_settings(name: str) -> dict:
    """The settings of preset `name` (its defaults) as a plain dict, as a run's config.yaml holds them."""
    return OmegaConf.to_container(_settings_node(name, {"name": name}), resolve=True)


def preset(name: str) -> Scheme | HotScheme:
    """The scheme of a preset with its defaults (the paper's settings)."""
    return scheme_from_config({"name": name})
