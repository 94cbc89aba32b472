"""Dynamic quantizers: a float32 tensor becomes float32 integer levels and a float32 scale (docs/numerics.md).

One formula for every scheme: v = t / s (true float32 division), then rounding, then clamp to the level range.
What varies is described by a `QuantSpec`; a granularity is only a choice of the dimensions a scale is taken over.
"""
from dataclasses import dataclass
import torch

from .rounding import Counter, round_nearest, round_stochastic, round_stochastic_log2

SIGNEDNESS = ("signed", "unsigned", "auto")
SCALE_RULES = ("max", "sawb")
GRANULARITIES = ("tensor", "sample", "row")
ROUNDINGS = ("nearest", "stochastic")
GRIDS = ("uniform", "log2")
BITS_RANGE = (2, 16)
LOG2_BITS_RANGE = (2, 5)

# SAWB's fitted constants for 4-bit grids (Choi et al. 2018), as LUQ uses them: alpha = C1 * rms(t) - C2 * mean|t|.
SAWB_C1, SAWB_C2 = 12.1, 12.2


def _choice(field: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{field}={value!r} is not allowed; choose one of {', '.join(map(str, allowed))}")


@dataclass(frozen=True)
class QuantSpec:
    """How one tensor is quantized.

    bits: 2..16 for the uniform grid. signedness: signed (levels ±(2^(b-1)-1)), unsigned (0..2^b-1), or auto
    (unsigned when the whole tensor has no negative value, as the HDQT authors do after a ReLU).
    scale: max (clip · max|t|) or sawb (SAWB's alpha; an unsigned grid spans [0, 2·alpha], as in the LUQ code).
    clip: the fraction of max|t| kept by the max rule (0.975 in the HDQT forward).
    granularity: tensor (one scale), sample (one per index of dim 0), row (one per row: the last dim reduced).
    grid: uniform integers, or log2 (sign + (bits-1) exponent bits: 0, ±1, ±2, ..., ±2^(2^(bits-1)-2); LUQ's FP4).
    """
    bits: int = 4
    signedness: str = "signed"
    scale: str = "max"
    clip: float = 1.0
    granularity: str = "tensor"
    rounding: str = "nearest"
    grid: str = "uniform"

    def __post_init__(self):
        _choice("signedness", self.signedness, SIGNEDNESS)
        _choice("scale", self.scale, SCALE_RULES)
        _choice("granularity", self.granularity, GRANULARITIES)
        _choice("rounding", self.rounding, ROUNDINGS)
        _choice("grid", self.grid, GRIDS)
        low, high = LOG2_BITS_RANGE if self.grid == "log2" else BITS_RANGE
        if not isinstance(self.bits, int) or not low <= self.bits <= high:
            raise ValueError(f"bits={self.bits!r} is out of range; a {self.grid} grid allows {low}..{high} bits")
        if not 0.0 < self.clip <= 1.0:
            raise ValueError(f"clip={self.clip!r} must be a fraction of max|t| in (0, 1]")
        if self.grid == "log2" and (self.signedness != "signed" or self.rounding != "stochastic"):
            raise ValueError("the log2 grid is defined for signed tensors with stochastic rounding only")

    @property
    def signed_max(self) -> int:
        """Largest level of the signed grid."""
        if self.grid == "log2":
            return 2 ** (2 ** (self.bits - 1) - 2)
        return 2 ** (self.bits - 1) - 1

    @property
    def unsigned_max(self) -> int:
        return 2**self.bits - 1

    @property
    def level_bound(self) -> int:
        """The largest level magnitude this spec can produce (a bound for exact integer products)."""
        return self.signed_max if self.signedness == "signed" else self.unsigned_max

    def scale_shape(self, shape) -> tuple[int, ...]:
        """The shape of the scale of a tensor of `shape` (broadcastable to it): 1 along reduction_dims."""
        dims = reduction_dims(len(shape), self.granularity)
        return tuple(1 if d in dims else size for d, size in enumerate(shape))


def reduction_dims(ndim: int, granularity: str) -> tuple[int, ...]:
    """The dimensions of an `ndim`-dimensional tensor that one scale spans: all (tensor), all but dim 0 (sample),
    the last (row)."""
    if granularity == "tensor":
        return tuple(range(ndim))
    if granularity == "sample":
        return tuple(range(1, ndim))
    return (ndim - 1,)


def require_counter(spec: QuantSpec, counter: Counter | None) -> None:
    """Stochastic rounding draws its random bits from a counter: refuse a stochastic spec without one."""
    if spec.rounding == "stochastic" and counter is None:
        raise ValueError("stochastic rounding needs a Counter (seed, step, role) for its random bits")


def is_signed(t: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """0-dim bool: whether the signed grid applies. 'auto' looks at the whole tensor, whatever the granularity."""
    if spec.signedness == "auto":
        return (t < 0).any()
    return torch.full((), spec.signedness == "signed", device=t.device)  # torch.full: no host-to-device copy


def _level_range(signed: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(lowest, highest) level as 0-dim float32 tensors on the tensor's device.

    Device tensors, not Python numbers: CUDA turns division by a host scalar into multiplication by its
    reciprocal, and the scale must be a true division c / qmax."""
    high = torch.where(signed, float(spec.signed_max), float(spec.unsigned_max))
    low = torch.where(signed, -float(spec.signed_max), 0.0)
    return low, high


def _scale(t: torch.Tensor, spec: QuantSpec, signed: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    dims = reduction_dims(t.dim(), spec.granularity)
    if t.numel() == 0:  # an empty batch: nothing to scale, no reduction over an empty dimension
        return t.new_ones(spec.scale_shape(t.shape))
    peak = t.abs().amax(dim=dims, keepdim=True) if dims else t.abs()
    if spec.scale == "max":
        clip_value = peak * torch.tensor(spec.clip, dtype=torch.float32)
    else:
        mean_square, mean_abs = sawb_moments(t, dims)
        rms = mean_square.sqrt() if dims else t.abs()
        alpha = torch.tensor(SAWB_C1, dtype=torch.float32) * rms - torch.tensor(SAWB_C2, dtype=torch.float32) * mean_abs
        alpha = alpha * torch.where(signed, 1.0, 2.0)
        clip_value = torch.where(alpha > 0, torch.minimum(alpha, peak), peak)
    scale = clip_value / high
    return torch.where(scale == 0, torch.ones_like(scale), scale)


def sawb_moments(t: torch.Tensor, dims: tuple[int, ...], out: torch.Tensor | None = None):
    """(mean of t², mean of |t|) over `dims`, kept: the float sums SAWB's clip is made of (torch's reductions; the
    kernels take them from here and apply the rest of the rule themselves). `out`: a (2, *kept shape) float32
    tensor the two means are written into (the same reductions), returned instead of the pair."""
    if not dims:  # each element its own group
        pair = t.square(), t.abs()
        return pair if out is None else torch.stack(pair, out=out)
    if out is None:
        return t.square().mean(dim=dims, keepdim=True), t.abs().mean(dim=dims, keepdim=True)
    torch.mean(t.square(), dim=dims, keepdim=True, out=out[0])
    torch.mean(t.abs(), dim=dims, keepdim=True, out=out[1])
    return out


def level_range(t: torch.Tensor, spec: QuantSpec) -> tuple:
    """(lowest, highest) level the quantization of t uses, for comparisons: Python floats when the spec fixes the
    sign (no device op), 0-dim float32 tensors when 'auto' reads it from t."""
    if spec.signedness == "signed":
        return -float(spec.signed_max), float(spec.signed_max)
    if spec.signedness == "unsigned":
        return 0.0, float(spec.unsigned_max)
    return _level_range(is_signed(t, spec), spec)


def within_levels(t: torch.Tensor, scale: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """Where t / scale lies within the level range (bool, t's shape): the values the quantizer does not clip (a
    NaN is outside). The clipping statistics and the clipped straight-through estimator both read it."""
    low, high = level_range(t, spec)
    v = t.to(torch.float32) / scale
    return (v >= low) & (v <= high)


def ste_threshold(spec: QuantSpec) -> int:
    """The 'authors' straight-through estimator's bound in raw units: 2^(bits-1) - 1, the HDQT code's fixed
    threshold, whatever the scale."""
    return 2 ** (spec.bits - 1) - 1


def ste_keep(t: torch.Tensor, inside: torch.Tensor | None, spec: QuantSpec, ste: str) -> torch.Tensor | None:
    """Where the forward quantizer passes its gradient (bool, t's shape): 'clip' where t was not clipped (`inside`,
    within_levels), 'authors' where |t| <= ste_threshold(spec); None for 'none' (everywhere)."""
    if ste == "clip":
        return inside
    return t.abs() <= ste_threshold(spec) if ste == "authors" else None


def compute_scale(t: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """float32 scale, broadcastable to t: (clip value of the group) / (largest level); 1 for an all-zero group."""
    t = t.to(torch.float32)
    signed = is_signed(t, spec)
    return _scale(t, spec, signed, _level_range(signed, spec)[1])


def quantize(t: torch.Tensor, spec: QuantSpec, counter: Counter | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(levels, scale): float32 integer levels of t and the float32 scale with t ≈ levels * scale.

    v = t / s in float32 (true division: ties on .5 are common after a Hadamard transform of integers, and
    t * (1/s) would move them), rounded, then clamped to the level range.
    """
    require_counter(spec, counter)
    t = t.to(torch.float32)
    signed = is_signed(t, spec)
    low, high = _level_range(signed, spec)
    scale = _scale(t, spec, signed, high)
    v = t / scale
    if spec.rounding == "nearest":
        rounded = round_nearest(v)
    else:
        u = counter.uniform(v.shape, v.device)
        rounded = round_stochastic_log2(v, u) if spec.grid == "log2" else round_stochastic(v, u)
    return rounded.clamp_(low, high), scale


def dequantize(levels: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return levels * scale
