"""Hadamard low-rank approximation (HLA) along one dimension, with LBP-WHT's LP_L1 low-pass row selection.

HOT (docs/quant.md, "HOT") compresses the token / spatial dimension L of a weight-gradient product: a block
Hadamard transform of size n = L' (the largest power of two dividing L) is applied along L and only r of the n
rows of each block are kept. With P the kept rows of H_n (r × n), PᵀP / n is the orthogonal projection onto
their span, so

    Gᵀ · X ≈ Gᵀ · (PᵀP / n) · X = (P·G)ᵀ · (P·X) / n          (exact when r = n: H_nᵀ H_n = n I)

Which rows: order the rows of H_n by sequency (`sequency_order`); with s = √(largest power of 4 ≤ n), sequency
index k < s² stands for the 2-D sequency pair (a, b) = (k // s, k % s or s - 1 - k % s for odd k // s) — for
n = s² exactly the pair of the s × s Walsh basis image that row is — and LP_L1 keeps a + b ≤ s − 1 (a triangle
of s(s+1)/2 rows: 16 → 10, 64 → 36, 256 → 136, 1024 → 528). A rank other than that triangle (`rank` or
`rank_ratio`) takes rows in LP_L1 priority order: by a + b, then by sequency; rows with k ≥ s² come last.
"""
import math
from functools import lru_cache

import torch

from .hadamard import block_hadamard, sequency_order


def _check_block(n: int) -> None:
    if n < 1 or n & (n - 1):
        raise ValueError(f"an HLA block must be a power of two; got {n}")


def _side(n: int) -> int:
    """s = √(largest power of 4 ≤ n)."""
    return 1 << ((n.bit_length() - 1) // 2)


def _priority(n: int) -> list[tuple[int, int, int]]:
    """(L1 distance a + b, sequency k, natural row index) of every row of H_n; rows beyond the s × s square
    get the distance 2s (after every pair of the square)."""
    s, order = _side(n), sequency_order(n).tolist()
    rows = []
    for k, row in enumerate(order):
        if k < s * s:
            a, j = divmod(k, s)
            b = j if a % 2 == 0 else s - 1 - j
            rows.append((a + b, k, row))
        else:
            rows.append((2 * s, k, row))
    return sorted(rows)


def lp_l1_rank(n: int) -> int:
    """The number of rows of the LP_L1 triangle for a block of n: s(s+1)/2."""
    _check_block(n)
    s = _side(n)
    return s * (s + 1) // 2


def hla_rank(n: int, rank: int | None = None, rank_ratio: float | None = None) -> int:
    """The rows kept of a block of n: `rank` (at most n), ceil(rank_ratio · n) (at least 1), or the LP_L1
    triangle when both are None."""
    _check_block(n)
    if rank is not None and rank_ratio is not None:
        raise ValueError("give an HLA rank or a rank ratio, not both")
    if rank is not None:
        if rank < 1:
            raise ValueError(f"an HLA rank must be >= 1; got {rank}")
        return min(rank, n)
    if rank_ratio is not None:
        if not 0 < rank_ratio <= 1:
            raise ValueError(f"an HLA rank ratio must lie in (0, 1]; got {rank_ratio}")
        return min(n, max(1, math.ceil(rank_ratio * n - 1e-9)))
    return lp_l1_rank(n)


@lru_cache(maxsize=None)
def _rows(n: int, r: int) -> tuple[int, ...]:
    return tuple(sorted(row for _, _, row in _priority(n)[:r]))


def hla_rows(n: int, rank: int | None = None, rank_ratio: float | None = None) -> torch.Tensor:
    """Natural (Sylvester) row indices of H_n that HLA keeps, ascending (int64, CPU)."""
    return torch.tensor(_rows(n, hla_rank(n, rank, rank_ratio)), dtype=torch.int64)


@lru_cache(maxsize=64)
def _rows_on(n: int, r: int, device: torch.device) -> torch.Tensor:
    return torch.tensor(_rows(n, r), dtype=torch.int64).to(device)


@lru_cache(maxsize=64)
def hla_slots(n: int, r: int, device: torch.device) -> torch.Tensor:
    """int32 (n,) on `device`: each natural row's place among the r rows HLA keeps of a block of n, -1 where it
    is dropped (the form a kernel that writes only the kept rows reads)."""
    slots = torch.full((n,), -1, dtype=torch.int32)
    slots[list(_rows(n, r))] = torch.arange(r, dtype=torch.int32)
    return slots.to(device)


def hla_compress(t: torch.Tensor, block: int, rank: int, dim: int = -1, hadamard=block_hadamard) -> torch.Tensor:
    """P·t along `dim`: (..., L, ...) → (..., (L / block) · rank, ...), float32.

    Each block of `block` consecutive elements is transformed by the unnormalised H_block and its `rank`
    LP_L1 rows are kept (ascending natural index). `hadamard` is the transform to run (a backend's
    block_hadamard; the torch reference by default)."""
    length = t.shape[dim]
    if length % block:
        raise ValueError(f"HLA block {block} does not divide the dimension {length}")
    if block == 1:  # H_1 = (1) and its one row kept: nothing to transform, nothing to copy
        return t.to(torch.float32)
    transformed = hadamard(t, dim, block)
    if rank == block:
        return transformed
    d = dim % t.dim()
    kept = transformed.unflatten(d, (length // block, block)).index_select(d + 1, _rows_on(block, rank, t.device))
    return kept.flatten(d, d + 1)


def hla_reconstruct(c: torch.Tensor, block: int, rank: int, hadamard=block_hadamard) -> torch.Tensor:
    """Pᵀ·c / block along the last dimension: the inverse of `hla_compress` on the kept subspace, (..., L)."""
    blocks = c.shape[-1] // rank
    lead = c.shape[:-1]
    full = c.new_zeros(*lead, blocks, block, dtype=torch.float32)
    full.index_copy_(-1, _rows_on(block, rank, c.device), c.reshape(*lead, blocks, rank).to(torch.float32))
    return hadamard(full.reshape(*lead, blocks * block), -1, block) / block


def hla_projection(length: int, block: int, rank: int) -> torch.Tensor:
    """The dense (length × length) matrix Pᵀ P / block that HLA applies (for tests and analysis only)."""
    return hla_reconstruct(hla_compress(torch.eye(length), block, rank), block, rank)
