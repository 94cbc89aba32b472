"""Integer matrix products with a narrow, saturating accumulator (docs/numerics.md "Tiled integer accumulation").

The contraction dimension K is cut into tiles; each tile's exact integer sum is saturated to ±(2^(acc_bits-1) - 1)
before the tiles are added exactly, or, with a float accumulator (`acc_format`), rounded to that float format by
the HDQT authors' quantizer (`floats.authors_float`; the rounded sums are integers still, so their total is exact).
Operands are float tensors holding integers; the float products are exact because the dtype is chosen from a bound
on the sums (float32 below 2^24, float64 below 2^53).
"""
import math

import torch

from .floats import FloatFormat, authors_float, authors_largest

_FLOAT32_EXACT = 2**24
_FLOAT64_EXACT = 2**53
_TF32_EXACT = 2**11  # TF32 keeps 10 mantissa bits: integer operands up to 2^11 survive its input rounding
_MAX_PARTIAL_ELEMENTS = 2**25  # bounds the (tiles, M, N) partial sums held at once


def accumulator_limit(acc_bits: int) -> int:
    return 2 ** (acc_bits - 1) - 1


def _exact_dtype(a_bound: float, b_bound: float, terms: int, device: torch.device) -> torch.dtype:
    """float32 when every partial sum of `terms` products is an integer below 2^24 (and TF32, if enabled, cannot
    round the operands), float64 when below 2^53."""
    bound = a_bound * b_bound * terms
    tf32 = device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
    if bound < _FLOAT32_EXACT and not (tf32 and max(a_bound, b_bound) >= _TF32_EXACT):
        return torch.float32
    if bound < _FLOAT64_EXACT:
        return torch.float64
    raise ValueError(f"integer product too wide to compute exactly: {terms} terms of up to {a_bound} x {b_bound}")


def check_accumulation(tile: int | None, acc_bits: int | None, acc_format: FloatFormat | None = None) -> None:
    """A positive tile and accumulator width, or None (the whole K is one tile; no saturation); an integer or a
    float accumulator, not both."""
    if tile is not None and tile < 1:
        raise ValueError(f"tile={tile} must be a positive number of K elements (or None for the whole K)")
    if acc_bits is not None and acc_bits < 1:
        raise ValueError(f"acc_bits={acc_bits} must be >= 1 (or None for no saturation)")
    if acc_bits is not None and acc_format is not None:
        raise ValueError(f"an integer accumulator (acc_bits={acc_bits}) and a float one ({acc_format.name}) exclude "
                         "each other")



def check_product(a: torch.Tensor, b: torch.Tensor, tile: int | None, acc_bits: int | None,
                  acc_format: FloatFormat | None = None) -> None:
    """What a tiled integer product takes: matrices (..., M, K) and (..., K, N), and check_accumulation's tile
    and accumulator."""
    check_accumulation(tile, acc_bits, acc_format)
    if a.dim() < 2 or b.dim() < 2:
        raise ValueError(f"matrix operands need two dimensions; got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if b.shape[-2] != a.shape[-1]:
        raise ValueError(f"contraction sizes differ: a has K={a.shape[-1]}, b has K={b.shape[-2]}")


def tiled_int_matmul(a: torch.Tensor, b: torch.Tensor, tile: int | None = 32, acc_bits: int | None = 8,
                     bounds: tuple[float, float] | None = None, count_saturated: bool = False,
                     acc_format: FloatFormat | None = None):
    """Σ_tiles clamp(Σ_{k in tile} a[..., m, k] b[..., k, n], ±L), L = 2^(acc_bits-1) - 1.

    a (..., M, K) and b (..., K, N) hold integers (leading dims broadcast). Tiles are consecutive runs of `tile`
    elements of K from 0, the last possibly narrower; tile=None saturates the whole-K sum once; acc_bits=None
    never saturates. With `acc_format` (acc_bits None) each tile's sum is rounded by floats.authors_float to that
    format instead of clamped (saturated: beyond its largest value). `bounds` = (max|a|, max|b|) when the caller
    knows them (skips two reductions and a device sync). Returns the exact result in float32, or in float64 where
    the bound K·max|a|·max|b| (twice that with a float accumulator, which may round up) reaches 2^24; with
    count_saturated=True also the number of saturated tile sums (0-dim tensor; the number of tile sums is
    out.numel() * number of tiles).
    """
    check_product(a, b, tile, acc_bits, acc_format)
    k = a.shape[-1]
    if bounds is None:
        bounds = tuple(torch.stack([a.abs().amax(), b.abs().amax()]).tolist()) if a.numel() and b.numel() else (0, 0)
    if acc_format is not None:  # each tile's sum rounded, not clamped; a rounded sum may exceed the exact bound
        limit, terms = authors_largest(acc_format), 2 * max(k, 1)  # beyond `limit` the rounding clamps: saturated

        def settle(sums):
            return authors_float(sums, acc_format.exp_bits, acc_format.man_bits).to(sums.dtype)
    else:
        limit, terms = (None if acc_bits is None else accumulator_limit(acc_bits)), max(k, 1)

        def settle(sums):
            return sums.clamp(-limit, limit)
    tile = k if tile is None or tile >= k or limit is None else tile
    tiles = -(-k // tile) if k else 1
    dtype = _exact_dtype(*bounds, terms=terms, device=a.device)

    if tiles == 1:
        out = torch.matmul(a.to(dtype), b.to(dtype))
        saturated = None if limit is None else (out.abs() > limit).sum()
        out = out if limit is None else settle(out)
        return _result(out, saturated, count_saturated)

    out, saturated = 0, 0
    for partial in _tile_chunks(a, b, tile, dtype):
        saturated = saturated + (partial.abs() > limit).sum()
        out = out + settle(partial).sum(dim=-3)
    return _result(out, saturated, count_saturated)


def _tile_chunks(a: torch.Tensor, b: torch.Tensor, tile: int, dtype: torch.dtype):
    """The exact sums of a's and b's K tiles (consecutive runs of `tile` from 0, the last possibly narrower) in
    `dtype`, as (..., tiles, M, N) chunks of tiles in K order, at most _MAX_PARTIAL_ELEMENTS held at once."""
    k = a.shape[-1]
    tiles = max(1, -(-k // tile))
    pad = tiles * tile - k
    a_tiles = torch.nn.functional.pad(a.to(dtype), (0, pad)).unflatten(-1, (tiles, tile)).movedim(-2, -3)
    b_tiles = torch.nn.functional.pad(b.to(dtype), (0, 0, 0, pad)).unflatten(-2, (tiles, tile))
    rows, cols = a.shape[-2], b.shape[-1]
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]).numel()
    chunk = max(1, _MAX_PARTIAL_ELEMENTS // max(1, batch * rows * cols))
    for start in range(0, tiles, chunk):
        yield torch.matmul(a_tiles[..., start:start + chunk, :, :], b_tiles[..., start:start + chunk, :, :])


def largest_tile_sum(a: torch.Tensor, b: torch.Tensor, tile: int | None,
                     bounds: tuple[float, float] | None = None) -> torch.Tensor:
    """max |Σ_{k in tile} a[..., m, k] b[..., k, n]| over every output element and K tile of the product
    tiled_int_matmul forms (tile None: the whole K), before any saturation: how far its sums reach into an
    accumulator's range, as a float64 0-dim tensor on the operands' device (read without a sync where `bounds`
    are given). 0 for an empty product."""
    check_product(a, b, tile, None)
    if not (a.numel() and b.numel()):
        return torch.zeros((), dtype=torch.float64, device=a.device)
    k = a.shape[-1]
    bounds = bounds or tuple(torch.stack([a.abs().amax(), b.abs().amax()]).tolist())
    dtype = _exact_dtype(*bounds, terms=max(k, 1), device=a.device)
    tile = k if tile is None or tile >= k else tile
    return torch.stack([largest_magnitude(chunk) for chunk in _tile_chunks(a, b, tile, dtype)]).amax().double()


def largest_magnitude(t: torch.Tensor) -> torch.Tensor:
    """max |t| (a NaN propagates) in one pass over t: its maximum and minimum together, not a copy of |t| first
    (the chunks of tile sums it reads are the largest tensors a diagnosed batch makes)."""
    low, high = torch.aminmax(t)
    return torch.maximum(high, -low)


def _result(out: torch.Tensor, saturated, count_saturated: bool):
    if not count_saturated:
        return out
    return out, saturated if saturated is not None else torch.zeros((), dtype=torch.int64, device=out.device)


def tile_sums(a_shape, b_shape, tile: int | None, acc_bits: int | None, acc_format: FloatFormat | None = None) -> int:
    """How many tile sums a product a (..., M, K) · b (..., K, N) forms (its saturation statistics' total):
    one per output element and K tile, one per element where nothing saturates per tile."""
    lead = torch.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    (m, k), n = a_shape[-2:], b_shape[-1]
    tiles = 1 if tile is None or (acc_bits is None and acc_format is None) else max(1, math.ceil(k / tile))
    return math.prod(lead) * m * n * tiles


def epilogue_block(block: int) -> int:
    """`block`, the n of the epilogue's (s_a · s_b) / n, checked to be a power of two (a Hadamard block or 1): then
    / n is exact scaling, equal to * (1/n) bit for bit, on every device and in the kernels (torch on CUDA divides
    by a Python number through its reciprocal, which differs from the quotient for other n)."""
    if isinstance(block, bool) or int(block) != block or block < 1 or int(block) & (int(block) - 1):
        raise ValueError(f"the epilogue's block must be a power of two (1, 2, 4, ...); got {block}")
    return int(block)


def sum_entries(t: torch.Tensor) -> torch.Tensor:
    """Σ of t (..., M, N) over its leading dims, (M, N): the matrices added one at a time in t's dtype, in order,
    to a total that starts at +0 (docs/numerics.md "Epilogue": the order the GEMM kernel keeps when it sums a
    batch of products, so that both backends give the same bits; torch's sum has no fixed order)."""
    total = torch.zeros(t.shape[-2:], dtype=t.dtype, device=t.device)
    for entry in t.reshape(-1, *t.shape[-2:]):
        total = total + entry
    return total
