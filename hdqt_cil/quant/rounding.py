"""Rounding to integer levels: nearest (half to even) and unbiased stochastic rounding with counter-based bits.

The random bits are a pure function of (seed, step, role, element index), docs/numerics.md "Counter-based
random bits", so the CPU, torch on the GPU and the CuPy kernels draw the same numbers without sharing state.
"""
from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
_CPU_CHUNK = 2**18


def _signed_factor(c: int) -> int:
    """c or c - 2^32, whichever lies in [-2^31, 2^31): the same residue mod 2^32, and x * it stays inside int64
    for any x < 2^32, so (x * it) & 0xFFFFFFFF is the exact uint32 product without overflow."""
    return c - 2**32 if c >= 2**31 else c


_M1, _M2, _GOLDEN_FACTOR = _signed_factor(0x7FEB352D), _signed_factor(0x846CA68B), _signed_factor(_GOLDEN)


def _mix(x):
    """The 32-bit finaliser of docs/numerics.md (a 'lowbias32'-style integer hash), on x in [0, 2^32).

    Works on Python ints and on int64 tensors (the tensor is updated in place)."""
    if isinstance(x, int):
        x ^= x >> 16
        x = (x * _M1) & _MASK32
        x ^= x >> 15
        x = (x * _M2) & _MASK32
        return x ^ (x >> 16)
    x ^= x >> 16
    x.mul_(_M1).bitwise_and_(_MASK32)
    x ^= x >> 15
    x.mul_(_M2).bitwise_and_(_MASK32)
    x ^= x >> 16
    return x


def counter_key(seed: int, step, role: int):
    """The per-call key: mix(seed ^ mix(step * 0x9E3779B9 + role)), all modulo 2^32.

    `step` is an int, or an integer tensor (a layer's step counter on its device): the key is then a 0-dim int64
    tensor there, computed without a host round trip."""
    if not torch.is_tensor(step):
        return _mix((seed & _MASK32) ^ _mix((step * _GOLDEN + role) & _MASK32))
    key = _mix((step.to(torch.int64) & _MASK32).mul_(_GOLDEN_FACTOR).add_(role).bitwise_and_(_MASK32))
    key ^= seed & _MASK32
    return _mix(key)


def counter_uniform(shape, seed: int, step, role: int, device=None) -> torch.Tensor:
    """Uniform numbers in [0, 1), float32, one per element of `shape` in row-major order.

    u = float32(mix(index ^ key) >> 8) * 2^-24: 24 random bits, exactly representable, never 1.
    """
    numel = 1
    for size in shape:
        numel *= int(size)
    if numel > 2**32:
        raise ValueError(f"counter_uniform indexes elements with 32 bits; a tensor of {numel} elements is too large")
    device = torch.device("cpu") if device is None else torch.device(device)
    key = counter_key(seed, step.to(device) if torch.is_tensor(step) else step, role)
    # On the CPU, blocks that stay in cache are several times faster than whole-tensor passes; same numbers.
    chunk = _CPU_CHUNK if device.type == "cpu" else max(numel, 1)
    out = torch.empty(numel, dtype=torch.float32, device=device)
    for start in range(0, numel, chunk):
        stop = min(numel, start + chunk)
        bits = torch.arange(start, stop, dtype=torch.int64, device=device)
        bits ^= key
        _mix(bits)
        out[start:stop] = (bits >> 8).to(torch.float32).mul_(2.0**-24)
    return out.reshape(tuple(shape))


@dataclass(frozen=True)
class Counter:
    """Where a stochastic rounding draws its bits: the scheme seed, the layer's training step (an int, or the
    layer's step counter as an integer tensor) and the tensor role."""
    seed: int
    step: "int | torch.Tensor"
    role: int

    def uniform(self, shape, device=None) -> torch.Tensor:
        return counter_uniform(shape, self.seed, self.step, self.role, device)


def round_nearest(v: torch.Tensor) -> torch.Tensor:
    """Nearest integer, ties to even (torch.round; CUDA rintf)."""
    return torch.round(v)


def round_stochastic(v: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Unbiased stochastic rounding to integers: sign(v) * (floor|v| + [u < |v| - floor|v|]), E[result] = v."""
    magnitude = v.abs()
    lower = magnitude.floor()
    up = u < magnitude.sub_(lower)  # the fraction |v| - floor|v|, exact in float32
    return lower.add_(up).copysign_(v)


def round_stochastic_log2(v: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Unbiased stochastic rounding to the radix-2 grid {0, ±1, ±2, ±4, ...} (LUQ's FP4 gradient levels).

    |v| < 1 goes to 0 or 1 with probability |v| (LUQ's stochastic underflow); 2^k <= |v| < 2^(k+1) goes to 2^k
    or 2^(k+1) with probability (|v| - 2^k) / 2^k (LUQ's logarithmic unbiased rounding). Both the subtraction and
    the division by a power of two are exact.
    """
    magnitude = v.abs()
    _, exponent = torch.frexp(magnitude)
    power = torch.ldexp(torch.ones_like(magnitude), exponent - 1)  # 2^floor(log2 |v|)
    below_one = magnitude < 1
    lower = torch.where(below_one, 0.0, power)
    gap = torch.where(below_one, 1.0, power)
    up = u < (magnitude - lower) / gap
    return lower.add_(gap * up).copysign_(v)
