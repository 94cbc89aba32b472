"""Low-precision float formats, pure torch: the reference definition of every float quantizer (docs/numerics.md,
"Float formats").

A value is rounded to a format of `exp_bits` exponent and `man_bits` mantissa bits in float32 arithmetic that is
exact: the quantum of a value's binade is a power of two, so v / quantum is exact and only the rounding of that
quotient to an integer decides (nearest, ties to even, or stochastic from the run's counters, rounding.py).

- `round_to_format`: IEEE-style with subnormals, saturating at the format's largest finite value (E4M3 as torch's
  float8_e4m3fn, E5M2 as float8_e5m2, E2M1 as float4_e2m1fn: equal to torch's casts within range); NaN propagates.
- `authors_float`: the HDQT authors' float quantizer (QuantizedCIL `quant.py` at da4ce01, `dynamic_fpQ`): no
  scale, no subnormals, no saturation to one maximum: the exponent floor(log2(|x| + 1e-32)) is clamped to
  [-bias, bias + 1] and the value's own mantissa, clamped to at most 1 - 2^-m *before* rounding (a value past the
  last mantissa of its binade rounds down to it), is kept at that exponent; zero stays zero.
- Scaled formats: `per_tensor` (FP8 training: one float32 scale, amax to the format's max), `microscaled` (OCP MX:
  one power-of-two E8M0 scale per block of 32 along a dimension) and `nvfp4` (one E4M3 scale per block of 16 and
  one float32 scale per tensor). Each returns (values on the format's grid, scale broadcastable to them).
"""
import math
from dataclasses import dataclass

import torch

from .rounding import Counter, round_nearest, round_stochastic

FLOAT_ROUNDINGS = ("nearest", "stochastic")
EXP_BITS_RANGE, MAN_BITS_RANGE = (1, 8), (0, 23)  # a float32 holds every such format exactly


def bits_in(value, bounds: tuple[int, int]) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and bounds[0] <= value <= bounds[1]


@dataclass(frozen=True)
class FloatFormat:
    """A sign bit, `exp_bits` exponent bits of bias 2^(exp_bits-1) - 1 and `man_bits` mantissa bits, with
    subnormals; `max` the largest finite magnitude (formats without infinities, as E4M3, use the top exponent)."""
    name: str
    exp_bits: int
    man_bits: int
    max: float

    def __post_init__(self):
        for field, value, (low, high) in (("exp_bits", self.exp_bits, EXP_BITS_RANGE),
                                          ("man_bits", self.man_bits, MAN_BITS_RANGE)):
            if not bits_in(value, (low, high)):
                raise ValueError(f"{self.name}: {field}={value!r} must be an integer in {low}..{high}")

    @property
    def bias(self) -> int:
        return 2 ** (self.exp_bits - 1) - 1

    @property
    def min_normal_exponent(self) -> int:
        return 1 - self.bias

    @property
    def smallest(self) -> float:
        """The smallest positive (subnormal) value."""
        return 2.0 ** (self.min_normal_exponent - self.man_bits)


E4M3 = FloatFormat("e4m3", 4, 3, 448.0)  # OCP FP8 E4M3 (torch.float8_e4m3fn): no infinities, S.1111.111 is NaN
E5M2 = FloatFormat("e5m2", 5, 2, 57344.0)  # OCP FP8 E5M2 (torch.float8_e5m2): IEEE-like, infinities above max
E2M1 = FloatFormat("e2m1", 2, 1, 6.0)  # OCP FP4 E2M1 (torch.float4_e2m1fn_x2): ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}
FORMATS = {f.name: f for f in (E4M3, E5M2, E2M1)}
FP8_DTYPES = {E4M3: torch.float8_e4m3fn, E5M2: torch.float8_e5m2}  # torch's own: nearest rounding is its cast


def _binade_exponent(magnitude: torch.Tensor) -> torch.Tensor:
    """floor(log2 m) exactly, for finite m > 0 (frexp: m = f · 2^e with f in [0.5, 1))."""
    return torch.frexp(magnitude)[1] - 1


def _round(v: torch.Tensor, rounding: str, counter: Counter | None) -> torch.Tensor:
    if rounding == "nearest":
        return round_nearest(v)
    if rounding == "stochastic":
        if counter is None:
            raise ValueError("stochastic rounding needs a Counter (seed, step, role) for its random bits")
        return round_stochastic(v, counter.uniform(v.shape, v.device))
    raise ValueError(f"rounding={rounding!r} is not allowed; choose one of {', '.join(FLOAT_ROUNDINGS)}")


def round_to_format(x: torch.Tensor, fmt: FloatFormat, rounding: str = "nearest",
                    counter: Counter | None = None) -> torch.Tensor:
    """float32 `x` rounded to `fmt` (subnormals kept), finite values past ±max saturated to ±max, NaN kept. Nearest
    rounding to a format torch holds (FP8) is torch's cast of the saturated values: one kernel where the float32
    arithmetic of the other formats and of stochastic rounding takes a dozen, and the same values
    (tests/test_quant_floats.py)."""
    x = x.float()
    if rounding == "nearest" and fmt in FP8_DTYPES:
        return x.clamp(-fmt.max, fmt.max).to(FP8_DTYPES[fmt]).float()
    return rounded_in_float32(x, fmt, rounding, counter)


def rounded_in_float32(x: torch.Tensor, fmt: FloatFormat, rounding: str, counter: Counter | None) -> torch.Tensor:
    """round_to_format of float32 `x` in exact float32 arithmetic (module docstring), for any format and rounding."""
    magnitude = x.abs()
    finite = torch.isfinite(magnitude) & (magnitude > 0)
    exponent = _binade_exponent(torch.where(finite, magnitude, 1.0)).clamp(min=fmt.min_normal_exponent)
    quantum = torch.ldexp(torch.ones_like(magnitude), exponent - fmt.man_bits)
    rounded = (_round(magnitude / quantum, rounding, counter) * quantum).clamp(max=fmt.max)
    rounded = torch.where(finite, rounded, magnitude.clamp(max=fmt.max))  # 0 stays 0, ±inf saturate, NaN stays
    return torch.copysign(rounded, x)


def authors_format(exp_bits: int, man_bits: int) -> FloatFormat:
    """The format of the authors' quantizer: `exp_bits` and `man_bits`, no subnormals, no infinities."""
    return FloatFormat(f"e{exp_bits}m{man_bits}", exp_bits, man_bits, math.inf)


def authors_largest(fmt: FloatFormat) -> float:
    """The largest magnitude authors_float rounds to in `fmt`'s bits (its top exponent's largest mantissa)."""
    return 2.0 ** (2**fmt.exp_bits - 1 - fmt.bias) * (2 - 2.0 ** -fmt.man_bits)


def authors_float(x: torch.Tensor, exp_bits: int, man_bits: int) -> torch.Tensor:
    """The HDQT authors' float quantizer (module docstring): no scale, no subnormals, nearest (ties to even)."""
    fmt = authors_format(exp_bits, man_bits)
    x = x.float()
    magnitude = x.abs()
    exponent = torch.floor(torch.log2(magnitude + 1e-32)).int()  # their exponent, float32 log2 as they take it
    unit = torch.ldexp(torch.ones_like(magnitude), exponent)
    top = 1 - 2.0 ** -man_bits
    mantissa = round_nearest((magnitude / unit - 1).clamp(0, top) * 2**man_bits) / 2**man_bits
    kept = (exponent + fmt.bias).clamp(0, 2**exp_bits - 1) - fmt.bias
    result = torch.copysign(torch.ldexp(1 + mantissa, kept), x)
    return torch.where(x == 0, torch.zeros_like(result), result)


def _amax(x: torch.Tensor, dims) -> torch.Tensor:
    """max |x| over `dims` (kept), one reduction that takes |x| as it reads (no |x| tensor written first)."""
    return torch.linalg.vector_norm(x, math.inf, dims, keepdim=True) if x.numel() else x.new_ones([1] * x.dim())


def per_tensor(x: torch.Tensor, fmt: FloatFormat, rounding: str = "nearest", counter: Counter | None = None):
    """FP8 training's dynamic scaling: s = amax / fmt.max (1 where x is all zero); values = round(x / s)."""
    amax = _amax(x.float(), tuple(range(x.dim())))
    scale = torch.where(amax > 0, amax / fmt.max, 1.0)
    return round_to_format(x / scale, fmt, rounding, counter), scale


def _blocks(x: torch.Tensor, block: int, dim: int) -> torch.Tensor:
    """`x` with `dim` moved last and cut into (..., n_blocks, block): consecutive runs of `block` values from 0, the
    last one narrower where `block` does not divide the dimension (zero-padded, which no block amax sees)."""
    moved = x.movedim(dim, -1)
    pad = -moved.shape[-1] % block
    return torch.nn.functional.pad(moved, (0, pad)).unflatten(-1, (-1, block))


def _unblock(blocked: torch.Tensor, shape, dim: int) -> torch.Tensor:
    size = shape[dim]
    return blocked.flatten(-2)[..., :size].movedim(-1, dim).reshape(shape)


def microscaled(x: torch.Tensor, fmt: FloatFormat = E2M1, block: int = 32, dim: int = -1,
                rounding: str = "nearest", counter: Counter | None = None):
    """OCP MX: per block of `block` values along `dim`, the E8M0 scale 2^(floor(log2 amax) - emax(fmt)) (1 for an
    all-zero block; exponents clamped to E8M0's -127..127), values round(x / scale) in `fmt`, saturating."""
    blocked = _blocks(x.float(), block, dim)
    amax = blocked.abs().amax(dim=-1, keepdim=True)
    emax = math.frexp(fmt.max)[1] - 1  # floor(log2 max): 2 for E2M1
    shared = (_binade_exponent(torch.where(amax > 0, amax, 1.0)) - emax).clamp(-127, 127)
    scale = torch.where(amax > 0, torch.ldexp(torch.ones_like(amax), shared), 1.0)
    values = round_to_format(blocked / scale, fmt, rounding, counter)
    return _unblock(values, x.shape, dim), _unblock(scale.expand_as(values), x.shape, dim)


def nvfp4_tensor_scale(x: torch.Tensor) -> torch.Tensor:
    """NVFP4's float32 tensor scale t = amax / (E4M3.max · E2M1.max) (1 where x is all zero), 0-dim."""
    amax = _amax(x.float(), tuple(range(x.dim())))
    return torch.where(amax > 0, amax / (E4M3.max * E2M1.max), 1.0).reshape([])


def nvfp4(x: torch.Tensor, block: int = 16, dim: int = -1, rounding: str = "nearest", counter: Counter | None = None):
    """NVFP4: the tensor scale t (nvfp4_tensor_scale) and, per block of `block` values along `dim`, an E4M3 scale
    b = round_e4m3(amax_block / E2M1.max / t); values round_e2m1(x / (b · t)), saturating. Returns (values, b · t
    broadcast to them)."""
    x = x.float()
    tensor_scale = nvfp4_tensor_scale(x)
    blocked = _blocks(x, block, dim)
    block_amax = blocked.abs().amax(dim=-1, keepdim=True)
    block_scale = round_to_format(block_amax / E2M1.max / tensor_scale, E4M3)
    scale = torch.where(block_scale > 0, block_scale * tensor_scale, 1.0)
    values = round_to_format(blocked / scale, E2M1, rounding, counter)
    return _unblock(values, x.shape, dim), _unblock(scale.expand_as(values), x.shape, dim)


SCALINGS = {"none": None, "tensor": None, "mx": 32, "nv": 16}  # scaling → its block along the contraction


@dataclass(frozen=True)
class FloatSpec:
    """How one operand of a product is rounded to a float format, along its last dimension (the contraction).

    scaling: none (the HDQT authors' quantizer, `authors_float`: no scale, nearest only), tensor (`per_tensor`), mx
    (`microscaled`, E8M0 scales per 32) or nv (`nvfp4`: E2M1 with E4M3 scales per 16 under a tensor scale)."""
    fmt: FloatFormat
    scaling: str = "tensor"
    rounding: str = "nearest"

    def __post_init__(self):
        for name, value, allowed in (("scaling", self.scaling, tuple(SCALINGS)),
                                     ("rounding", self.rounding, FLOAT_ROUNDINGS)):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not allowed; choose one of {', '.join(allowed)}")
        if self.scaling == "none" and self.rounding != "nearest":
            raise ValueError("the authors' float quantizer (scaling=none) rounds to nearest only")
        if self.scaling == "nv" and self.fmt != E2M1:
            raise ValueError(f"NVFP4 scaling is defined for E2M1 values; got {self.fmt.name}")

    @property
    def block(self) -> int | None:
        """The values one scale covers along the contraction (None: the whole tensor or no scale)."""
        return SCALINGS[self.scaling]

    @property
    def bits(self) -> int:
        """An element's width: sign, exponent and mantissa."""
        return 1 + self.fmt.exp_bits + self.fmt.man_bits

    @property
    def largest(self) -> float:
        """The largest magnitude a value of the grid can take (the authors' format: its top exponent's)."""
        return self.fmt.max if self.scaling != "none" else authors_largest(self.fmt)


def unit_scale(t: torch.Tensor) -> torch.Tensor:
    """The scale of an unscaled operand (the authors' quantizer): a float32 1 on t's device."""
    return t.new_ones([], dtype=torch.float32)


def quantize_float(t: torch.Tensor, spec: FloatSpec, counter: Counter | None = None):
    """(values on spec's grid, float32 scale broadcastable to them, per block along the last dimension where the
    scaling has blocks) with t ≈ values · scale."""
    if spec.scaling == "none":
        return authors_float(t, spec.fmt.exp_bits, spec.fmt.man_bits), unit_scale(t)
    if spec.scaling == "tensor":
        return per_tensor(t, spec.fmt, spec.rounding, counter)
    if spec.scaling == "mx":
        return microscaled(t, spec.fmt, spec.block, -1, spec.rounding, counter)
    return nvfp4(t, spec.block, -1, spec.rounding, counter)
