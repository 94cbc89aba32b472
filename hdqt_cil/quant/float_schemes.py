"""Float-format training schemes: every operand of a layer's three products a low-precision float (quant/floats.py),
summed in float32 or, per K tile, rounded to a float accumulator format (the HDQT authors' rounding).

- `fp8`: E4M3 inputs and weights, E5M2 output gradients, one dynamic scale a tensor (amax to the format's max),
  nearest rounding, float32 accumulation: FP8 training as torchao's tensorwise recipe runs it on Hopper.
- `mxfp4`: E2M1 values with an E8M0 scale per 32 along every product's K, after a Hadamard transform over blocks
  of 32 of both operands; the backward's operands rounded stochastically (Quartet's recipe, without its QuEST
  forward clipping).
- `nvfp4`: E2M1 values with an E4M3 scale per 16 and a float32 scale a tensor; the weight-gradient product's
  operands transformed by a 16-wide Hadamard with random signs; output gradients rounded stochastically (the
  NVFP4 training recipe).
- `fp`: the HDQT authors' float quantizer (`authors_float`: no scale, no subnormals) on every operand, HDQT's
  structure around it: tiles of 32 in the forward, Hadamard-domain backward over the whole K, each tile's sum
  rounded to E5M2, the forward's gradient zeroed past 0.975 · max|t| as their straight-through estimator does.

Meanings and defaults: docs/quant.md "Float formats"; the arithmetic: docs/numerics.md "Float training".
"""
from dataclasses import dataclass, make_dataclass
from typing import Optional

import torch

from ..settings import BOOL, Rule, setting, one_of
from .floats import E2M1, E4M3, E5M2, FloatFormat, FloatSpec, authors_format
from .schemes import EXP_BITS, MAN_BITS, POWER_OF_TWO, ROLES, SCHEMES, TILE, QuantConfig
ACCUMULATORS = ("none", "fp")  # float32 sums | each tile's sum rounded to acc_exp_bits/acc_man_bits
FLOAT_BACKENDS = ("auto", "torch")  # auto: the tensor cores where the GPU has them (quant/backend.py)


@dataclass(frozen=True)
class FormatProduct:
    """One product of float operands: their formats, the Hadamard transform along K (blocks of the largest power of
    two dividing K, at most `hadamard_cap`; `random_signs`: a random ±1 along K first), and the accumulator (`acc`:
    each K tile's sum rounded to this format by the authors' quantizer, tiles of `tile` or the whole K; block-scaled
    operands: their block)."""
    left: FloatSpec
    right: FloatSpec
    hadamard: bool = False
    hadamard_cap: int | None = None
    random_signs: bool = False
    acc: FloatFormat | None = None
    tile: int | None = None

    def __post_init__(self):
        if self.left.block != self.right.block:
            raise ValueError(f"both operands of a product need one scaling block; got {self.left.scaling} and "
                             f"{self.right.scaling}")

    @property
    def acc_spec(self) -> FloatSpec:
        return FloatSpec(self.acc, "none")


@dataclass(frozen=True)
class FloatScheme:
    """A float-format training recipe: the three products of every layer (quant/schemes.py names them) and the
    forward's straight-through estimator ('clip': the gradient zeroed where |t| > fwd_clip · max|t|, though the
    forward does not clip; 'none')."""
    name: str
    forward: FormatProduct
    grad_input: FormatProduct
    grad_weight: FormatProduct
    ste: str = "none"
    fwd_clip: float = 1.0
    seed: int = 0
    backend: str = "auto"

    def __post_init__(self):
        if self.backend not in FLOAT_BACKENDS:
            raise ValueError(f"backend={self.backend!r} is not allowed; choose one of {', '.join(FLOAT_BACKENDS)}")
        if self.forward.hadamard and not self.forward.left.block:
            raise ValueError("a Hadamard transform in the forward product needs block-scaled operands")
        if self.ste == "clip" and self.forward.left.block:
            raise ValueError("the clipping estimator applies to one scale an operand, not to block-scaled ones")

    @property
    def quantizes(self) -> bool:
        return True

    def keep(self, t: torch.Tensor) -> torch.Tensor | None:
        """Where the forward's quantizer passes its gradient (None: everywhere)."""
        if self.ste == "none":
            return None
        return t.abs() <= t.abs().amax() * torch.tensor(self.fwd_clip, dtype=torch.float32)


@dataclass
class FloatConfig(QuantConfig):
    # none: the value products summed in float32 | fp: each K tile's sum rounded to an acc_exp_bits/acc_man_bits
    # float by the authors' quantizer before the tiles are added (block-scaled formats: a tile is a block)
    acc: str = setting("none", one_of(*ACCUMULATORS))
    acc_exp_bits: int = setting(5, EXP_BITS)
    acc_man_bits: int = setting(2, MAN_BITS)
    # auto: the kernels where they run (fp8's products on the FP8 tensor cores of sm_89+ through torch._scaled_mm,
    # mxfp4's and nvfp4's on the int8 ones, the authors' quantizer and its rounded tile sums on kernels of their
    # own), the torch reference elsewhere; torch: the reference everywhere
    backend: str = setting("auto", one_of(*FLOAT_BACKENDS))

    def accumulator(self) -> FloatFormat | None:
        if self.acc == "none":
            return None
        return authors_format(self.acc_exp_bits, self.acc_man_bits)


@dataclass
class Fp8Config(FloatConfig):
    """FP8 (torchao's tensorwise recipe): E4M3 x and W, E5M2 output gradients, a dynamic scale a tensor."""
    name: str = "fp8"
    tile: Optional[int] = setting(32, TILE)  # the K tile of acc=fp (null: the whole K)


@dataclass
class Mxfp4Config(FloatConfig):
    """MXFP4 (OCP Microscaling; Quartet): E2M1 values, an E8M0 scale per 32 along K."""
    name: str = "mxfp4"
    hadamard: bool = setting(True, BOOL)  # both operands of every product over blocks of 32 along K
    stochastic_backward: bool = setting(True, BOOL)  # the backward's operands rounded stochastically


@dataclass
class Nvfp4Config(FloatConfig):
    """NVFP4: E2M1 values, an E4M3 scale per 16 along K, a float32 scale a tensor."""
    name: str = "nvfp4"
    hadamard: bool = setting(True, BOOL)  # the weight gradient's operands, over blocks of 16 with random signs
    stochastic_gradients: bool = setting(True, BOOL)  # output gradients rounded stochastically


def _per_role(name: str, default: int, rule: Rule) -> type:
    """A settings class with one number of bits per operand role (quant/schemes.py ROLES), each `default`."""
    return make_dataclass(name, [(role, int, setting(default, rule)) for role in ROLES])


ExpBitsConfig, ManBitsConfig = _per_role("ExpBitsConfig", 5, EXP_BITS), _per_role("ManBitsConfig", 2, MAN_BITS)


@dataclass
class FpConfig(FloatConfig):
    """The HDQT authors' float quantizer (QuantizedCIL `dynamic_fpQ`) on every operand, E5M2 by default."""
    name: str = "fp"
    exp_bits: ExpBitsConfig = setting(ExpBitsConfig())  # per operand role
    man_bits: ManBitsConfig = setting(ManBitsConfig())
    acc: str = setting("fp", one_of(*ACCUMULATORS))
    tile: Optional[int] = setting(32, TILE)  # forward K tile of the accumulator (null: the whole K)
    backward_tiling: bool = setting(False, BOOL)  # backward products tiled like the forward (the authors: whole K)
    hadamard: bool = setting(True, BOOL)  # backward operands transformed along the contraction
    hadamard_cap: Optional[int] = setting(None, POWER_OF_TWO)
    fwd_clip: float = setting(0.975, Rule(lambda v: 0 < v <= 1, "a fraction of max|t| in (0, 1]"))


def _scheme(cfg, forward, grad_input, grad_weight, **extra) -> FloatScheme:
    return FloatScheme(cfg.name, forward, grad_input, grad_weight, seed=cfg.seed, backend=cfg.backend, **extra)


@SCHEMES.register("fp8", Fp8Config)
def _build_fp8(cfg) -> FloatScheme:
    x, w, g = FloatSpec(E4M3), FloatSpec(E4M3), FloatSpec(E5M2)
    acc = dict(acc=cfg.accumulator(), tile=cfg.tile)
    return _scheme(cfg, FormatProduct(x, w, **acc), FormatProduct(g, w, **acc), FormatProduct(g, x, **acc))


@SCHEMES.register("mxfp4", Mxfp4Config)
def _build_mxfp4(cfg) -> FloatScheme:
    nearest = FloatSpec(E2M1, "mx")
    backward = FloatSpec(E2M1, "mx", "stochastic" if cfg.stochastic_backward else "nearest")
    common = dict(hadamard=cfg.hadamard, hadamard_cap=32, acc=cfg.accumulator())
    return _scheme(cfg, FormatProduct(nearest, nearest, **common), FormatProduct(backward, backward, **common),
                   FormatProduct(backward, backward, **common))


@SCHEMES.register("nvfp4", Nvfp4Config)
def _build_nvfp4(cfg) -> FloatScheme:
    nearest = FloatSpec(E2M1, "nv")
    gradient = FloatSpec(E2M1, "nv", "stochastic" if cfg.stochastic_gradients else "nearest")
    acc = cfg.accumulator()
    return _scheme(cfg, FormatProduct(nearest, nearest, acc=acc), FormatProduct(gradient, nearest, acc=acc),
                   FormatProduct(gradient, nearest, hadamard=cfg.hadamard, hadamard_cap=16, random_signs=True, acc=acc))


@SCHEMES.register("fp", FpConfig)
def _build_authors_float(cfg) -> FloatScheme:
    def spec(role: str) -> FloatSpec:
        return FloatSpec(authors_format(getattr(cfg.exp_bits, role), getattr(cfg.man_bits, role)), "none")

    acc = cfg.accumulator()
    backward = dict(hadamard=cfg.hadamard, hadamard_cap=cfg.hadamard_cap, acc=acc,
                    tile=cfg.tile if cfg.backward_tiling else None)
    return _scheme(cfg, FormatProduct(spec("input"), spec("weight"), acc=acc, tile=cfg.tile),
                   FormatProduct(spec("grad_output"), spec("bwd_weight"), **backward),
                   FormatProduct(spec("grad_output"), spec("bwd_input"), **backward),
                   ste="clip", fwd_clip=cfg.fwd_clip)
