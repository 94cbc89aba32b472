"""Block-diagonal Walsh–Hadamard transform (unnormalised Sylvester matrices) without ever forming a matrix.

H_n is the Sylvester matrix of order n (a power of two): H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]], so
H_n = H_nᵀ and H_n·H_n = n·I. HDQT applies it block-diagonally along one dimension of a tensor, the block
being the largest power of two that divides that dimension (docs/numerics.md, "Hadamard transform").
"""
import torch


def hadamard_block_size(n: int, cap: int | None = None) -> int:
    """Largest power of two dividing `n` (1 for odd n), at most `cap` when a cap is given.

    The authors' rule (their `biggest_power2_factor`): 1024 → 1024, 100 → 4, 561 → 1. A cap must itself be a
    power of two so that the capped block still divides `n`.
    """
    if n < 1:
        raise ValueError(f"a Hadamard block needs a dimension >= 1; got {n}")
    block = n & -n
    if cap is not None:
        if cap < 1 or cap & (cap - 1):
            raise ValueError(f"hadamard_cap must be a power of two >= 1; got {cap}")
        block = min(block, cap)
    return block


def checked_block(size: int, block: int | None) -> int:
    """The Hadamard block for a dimension of `size`: `block`, or by default the largest power of two dividing
    `size`; refused unless it is a power of two dividing `size`."""
    block = hadamard_block_size(size) if block is None else block
    if block < 1 or block & (block - 1) or size % block:
        raise ValueError(f"Hadamard block {block} must be a power of two dividing the dimension {size}")
    return block


def block_hadamard(x: torch.Tensor, dim: int = -1, block: int | None = None) -> torch.Tensor:
    """x transformed by I ⊗ H_block along `dim` (float32), by the in-place iterative radix-2 butterfly.

    Stage h (h = 1, 2, 4, ..., block/2) replaces every pair (a, b) = (x[i], x[i+h]) with i & h == 0 by
    (a + b, a - b): exactly the additions, in the order, that docs/numerics.md fixes for the kernels, so
    the float32 results agree bit for bit. O(n log n) work, never a dense matrix.
    """
    size = x.shape[dim]
    block = checked_block(size, block)
    if block == 1:
        return x.to(torch.float32, copy=True)
    moved = x.movedim(dim, -1).to(torch.float32)
    lead = moved.shape[:-1]
    # a fresh row-major buffer whatever x's strides: the kernels' layout too, so that a float reduction over the
    # result (SAWB's sums) runs in one order on both backends
    src = moved.reshape(*lead, size // block, block).clone(memory_format=torch.contiguous_format)
    dst = torch.empty_like(src)
    h = 1
    while h < block:
        pairs_src = src.view(*lead, size // block, block // (2 * h), 2, h)
        pairs_dst = dst.view_as(pairs_src)
        low, high = pairs_src[..., 0, :], pairs_src[..., 1, :]
        torch.add(low, high, out=pairs_dst[..., 0, :])
        torch.sub(low, high, out=pairs_dst[..., 1, :])
        src, dst = dst, src
        h *= 2
    return src.reshape(*lead, size).movedim(-1, dim)


def sequency_order(n: int) -> torch.Tensor:
    """Indices of the rows of the Sylvester H_n sorted by sequency (number of sign changes along the row).

    Row `order[k]` of H_n changes sign exactly k times: order[k] = bit_reverse(gray(k)) over log2(n) bits.
    HOT's low-pass selection keeps the lowest-sequency rows.
    """
    if n < 1 or n & (n - 1):
        raise ValueError(f"sequency_order needs a power of two; got {n}")
    bits = n.bit_length() - 1
    k = torch.arange(n, dtype=torch.int64)
    gray = k ^ (k >> 1)
    order = torch.zeros_like(gray)
    for bit in range(bits):
        order |= ((gray >> bit) & 1) << (bits - 1 - bit)
    return order
