"""Quantized-training schemes: for each product of a layer, how its operands are quantized and how it accumulates.

A layer computes three products (docs/quant.md):
    forward      y   = x · Wᵀ      left = input x,            right = weight W
    grad_input   g_x = G · W       left = output gradient G,  right = W as the forward used it
    grad_weight  g_W = Gᵀ · x      left = output gradient G,  right = x as the forward used it
A `Product` says how each operand is quantized (a QuantSpec, or None: it enters as it is, i.e. float in the
forward and the forward's levels in the backward), whether both operands are Hadamard-transformed along the
contraction dimension first, and the accumulator (tile, acc_bits). Schemes are built from a flat config (the
Hydra group `quant`, one file a preset under configs/quant/) by one registered builder per scheme name.

HOT (`HotScheme`) does not fit a `Product` triple: its forward is float, its two backward products have
different transforms (Hadamard along the output channels, HLA along the tokens), one of them reads a
compressed copy of the input saved by the forward (ABC), and the scale granularity of one operand is chosen per
layer (LQS). It has its own small dataclass; `quantize_model` gives its layers the HOT classes (quant/hot.py).
"""
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from .quantizers import BITS_RANGE, GRANULARITIES, ROUNDINGS, QuantSpec

ROLES = ("input", "weight", "grad_output", "bwd_weight", "bwd_input")
BACKWARD_ROLES = ("grad_output", "bwd_weight", "bwd_input")
STES = ("authors", "clip", "none")
BACKENDS = ("auto", "torch", "cupy")
ACC_BITS_MAX = 32
# Scale granularities that keep every scale constant along the contraction dimension (docs/quant.md, "Layouts").
# The forward quantizes per tensor: its levels are reused by backward products that contract over other dimensions.
ROLE_GRANULARITIES = {
    "grad_output": GRANULARITIES,
    "bwd_weight": ("tensor", "row"),
    "bwd_input": GRANULARITIES,
}


@dataclass(frozen=True)
class Product:
    """One matrix product: its two operands' quantizers, the Hadamard transform and the accumulator."""
    left: QuantSpec | None = None
    right: QuantSpec | None = None
    hadamard: bool = False
    tile: int | None = None
    acc_bits: int | None = None

    def __post_init__(self):
        if self.tile is not None and self.tile < 1:
            raise ValueError(f"tile={self.tile} must be >= 1 (or None: the whole contraction is one tile)")
        if self.acc_bits is not None and self.acc_bits < 1:
            raise ValueError(f"acc_bits={self.acc_bits} must be >= 1 (or None: no saturation)")


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
            if not integer and product.acc_bits is not None:
                raise ValueError(f"{label}: acc_bits applies to integer products; quantize both operands first")

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


@dataclass(frozen=True)
class HotScheme:
    """HOT (Kim et al., CVPR 2025; docs/quant.md "HOT"): float forward, compressed saved input, integer backward.

    gx_bits: g_x = G·W with G (stochastic) and W (SAWB, nearest) Hadamard-transformed along the output channels
    (block min(hadamard_cap, largest power of two dividing O)). gw_bits: g_W = Gᵀ·x with G (stochastic) and x
    HLA-compressed along the tokens (rank: `hla_rank` rows a block, or `hla_rank_ratio` of the block, or LP_L1's
    triangle when both are None). abc_bits: the compressed x (SAWB, nearest), computed in the forward and saved
    instead of x when `abc` is on (True: every layer; 'pointwise': Linear and 1×1 convs only; False: none; the
    gradients are the same either way). Bits None: that operand stays float (its transform still applies).
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
    seed: int = 0
    backend: str = "auto"

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r} is not allowed; choose one of {', '.join(BACKENDS)}")
        if not (isinstance(self.abc, bool) or self.abc == "pointwise"):
            raise ValueError(f"abc={self.abc!r} is not allowed; choose one of true, false, pointwise")
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


# The config of every preset: the Python twin of configs/quant/<name>.yaml (a test keeps them equal).
_INTEGER_DEFAULTS = {
    "bits": 4, "acc_bits": 8, "tile": 32, "fwd_clip": 0.975, "hadamard": True, "hadamard_cap": None,
    "backward_tiling": False, "ste": "authors",
    "rounding": {"input": "nearest", "weight": "nearest", "grad_output": "stochastic",
                 "bwd_weight": "nearest", "bwd_input": "stochastic"},
    "granularity": {"grad_output": "sample", "bwd_weight": "tensor", "bwd_input": "sample"},
    "backend": "auto", "seed": 0,
}
PRESET_CONFIGS = {
    "fp32": {"name": "fp32"},
    "hdqt": {"name": "hdqt", **_INTEGER_DEFAULTS},
    "int4": {"name": "int4", **_INTEGER_DEFAULTS, "hadamard": False},
    "luq": {"name": "luq", "bits": 4, "acc_bits": 8, "tile": None, "ste": "none", "backend": "auto", "seed": 0},
    "hot": {"name": "hot", "gx_bits": 4, "gw_bits": 8, "abc_bits": 8, "hadamard_cap": 16, "hla_rank": None,
            "hla_rank_ratio": None, "lqs": True, "lqs_threshold": 0.5, "abc": True, "backend": "auto", "seed": 0},
}


def _build_float(cfg: dict) -> Scheme:
    return Scheme(cfg["name"], Product(), Product(), Product())


def _build_integer(cfg: dict) -> Scheme:
    """HDQT and plain INT4: forward max-clip quantizers; backward re-quantizers max|t|/qmax, with or without Hadamard."""
    bits, rounding, granularity = cfg["bits"], cfg["rounding"], cfg["granularity"]

    def spec(role: str, signedness="signed", clip=1.0) -> QuantSpec:
        return QuantSpec(bits, signedness, "max", clip, granularity.get(role, "tensor"), rounding[role])

    backward_tile = cfg["tile"] if cfg["backward_tiling"] else None
    backward = dict(hadamard=cfg["hadamard"], tile=backward_tile, acc_bits=cfg["acc_bits"])
    return Scheme(
        name=cfg["name"],
        forward=Product(spec("input", "auto", cfg["fwd_clip"]), spec("weight", clip=cfg["fwd_clip"]),
                        tile=cfg["tile"], acc_bits=cfg["acc_bits"]),
        grad_input=Product(spec("grad_output"), spec("bwd_weight"), **backward),
        grad_weight=Product(spec("grad_output"), spec("bwd_input"), **backward),
        hadamard_cap=cfg["hadamard_cap"], ste=cfg["ste"], seed=cfg["seed"], backend=cfg["backend"])


def _build_luq(cfg: dict) -> Scheme:
    """LUQ (Chmiel et al. 2023) as the HDQT authors ran it ('luq_corrected'): SAWB INT4 forward, nearest, saturated
    over the whole K; the output gradient in radix-2 FP4 with stochastic underflow and logarithmic unbiased
    rounding, quantized once; the backward products use the forward's INT4 levels and do not saturate."""
    bits = cfg["bits"]
    gradient = QuantSpec(bits, "signed", "max", 1.0, "tensor", "stochastic", grid="log2")
    return Scheme(
        name=cfg["name"],
        forward=Product(QuantSpec(bits, "auto", "sawb"), QuantSpec(bits, "signed", "sawb"),
                        tile=cfg["tile"], acc_bits=cfg["acc_bits"]),
        grad_input=Product(gradient, None),
        grad_weight=Product(gradient, None),
        ste=cfg["ste"], seed=cfg["seed"], backend=cfg["backend"])


def _build_hot(cfg: dict) -> HotScheme:
    return HotScheme(**cfg)


BUILDERS = {"fp32": _build_float, "hdqt": _build_integer, "int4": _build_integer, "luq": _build_luq,
            "hot": _build_hot}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_choice(key: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"quant.{key}={value!r} is not allowed; choose one of {', '.join(map(str, allowed))}")


def _merge(name: str, given: dict) -> dict:
    """The preset's config with `given` on top; unknown keys and roles are errors."""
    merged = {key: dict(value) if isinstance(value, dict) else value for key, value in PRESET_CONFIGS[name].items()}
    for key, value in given.items():
        if key not in merged:
            raise ValueError(f"quant.{key} is not a setting of quant={name}; its settings are {', '.join(merged)}")
        if isinstance(merged[key], dict):
            if not isinstance(value, dict):
                raise ValueError(f"quant.{key} must map roles to values; got {value!r}")
            for role, role_value in value.items():
                if role not in merged[key]:
                    raise ValueError(f"quant.{key}.{role}: unknown role; the roles are {', '.join(merged[key])}")
                merged[key][role] = role_value
        else:
            merged[key] = value
    return merged


# How each bits key may also be null (HOT: that operand stays float).
_BITS_KEYS = {"bits": "", **dict.fromkeys(("gx_bits", "gw_bits", "abc_bits"),
                                           " (8 and below run on the int8 kernels), or null (that operand stays float)")}


def _validate(cfg: dict) -> None:
    """Ranges with the config key in every message, so an override like quant.bits=1 says what is wrong. Every
    check runs where its key exists: `_merge` has already refused keys that the named scheme does not have."""
    for key, null in _BITS_KEYS.items():
        value = cfg.get(key)
        if value is not None and (not _is_int(value) or not BITS_RANGE[0] <= value <= BITS_RANGE[1]):
            raise ValueError(f"quant.{key}={value!r} is out of range; allowed: integers "
                             f"{BITS_RANGE[0]}..{BITS_RANGE[1]}{null}")
    bits = cfg.get("bits")
    acc_bits = cfg.get("acc_bits")
    if acc_bits is not None and (not _is_int(acc_bits) or not bits <= acc_bits <= ACC_BITS_MAX):
        raise ValueError(f"quant.acc_bits={acc_bits!r} is out of range; allowed: null (no saturation) or integers "
                         f"from quant.bits={bits} (an accumulator narrower than its inputs means nothing) "
                         f"to {ACC_BITS_MAX}")
    tile = cfg.get("tile")
    if tile is not None and (not _is_int(tile) or tile < 1):
        raise ValueError(f"quant.tile={tile!r} must be a positive integer (or null: the whole K is one tile)")
    clip = cfg.get("fwd_clip", 1.0)
    if not isinstance(clip, (int, float)) or not 0 < clip <= 1:
        raise ValueError(f"quant.fwd_clip={clip!r} must be a fraction of max|t| in (0, 1]")
    cap = cfg.get("hadamard_cap")
    if cap is not None and (not _is_int(cap) or cap < 1 or cap & (cap - 1)):
        raise ValueError(f"quant.hadamard_cap={cap!r} must be a power of two (or null: no cap)")
    for flag in ("hadamard", "backward_tiling", "lqs"):
        if flag in cfg and not isinstance(cfg[flag], bool):
            raise ValueError(f"quant.{flag}={cfg[flag]!r} must be true or false")
    if "ste" in cfg:
        _check_choice("ste", cfg["ste"], STES)
    if "backend" in cfg:
        _check_choice("backend", cfg["backend"], BACKENDS)
    for role, value in cfg.get("rounding", {}).items():
        _check_choice(f"rounding.{role}", value, ROUNDINGS)
    for role, value in cfg.get("granularity", {}).items():
        _check_choice(f"granularity.{role}", value, ROLE_GRANULARITIES[role])
    seed = cfg.get("seed", 0)
    if not _is_int(seed) or seed < 0:
        raise ValueError(f"quant.seed={seed!r} must be a non-negative integer")
    rank, ratio = cfg.get("hla_rank"), cfg.get("hla_rank_ratio")
    if rank is not None and (not _is_int(rank) or rank < 1):
        raise ValueError(f"quant.hla_rank={rank!r} must be a positive integer (rows kept per HLA block, at most "
                         "the block) or null (LP_L1's triangle, or hla_rank_ratio)")
    if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1):
        raise ValueError(f"quant.hla_rank_ratio={ratio!r} must be a fraction of the HLA block in (0, 1] "
                         "(1 = full rank) or null (LP_L1's triangle, or hla_rank)")
    if rank is not None and ratio is not None:
        raise ValueError(f"quant.hla_rank={rank!r} and quant.hla_rank_ratio={ratio!r} exclude each other; "
                         "set one of them to null")
    threshold = cfg.get("lqs_threshold")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                  or not 0 < threshold <= 1):
        raise ValueError(f"quant.lqs_threshold={threshold!r} must lie in (0, 1]: per-token scales are chosen when "
                         "e_token < lqs_threshold · e_tensor")
    if "abc" in cfg and not (isinstance(cfg["abc"], bool) or cfg["abc"] == "pointwise"):
        raise ValueError(f"quant.abc={cfg['abc']!r} is not allowed; choose one of true (every layer), "
                         "pointwise (Linear and 1x1 convs), false")


def scheme_from_config(cfg) -> Scheme | HotScheme:
    """Build the scheme named by cfg['name'] from a dict or DictConfig; missing keys take the preset's values."""
    given = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    name = given.pop("name", None)
    if name not in BUILDERS:
        raise ValueError(f"unknown quantization scheme quant.name={name!r}; choose one of {', '.join(BUILDERS)}")
    merged = _merge(name, given)
    _validate(merged)
    return BUILDERS[name](merged)


def preset(name: str) -> Scheme | HotScheme:
    """The scheme of a preset with its defaults (the paper's settings)."""
    return scheme_from_config({"name": name})
