import numpy as np
import pytest
import torch

from hdqt_cil.quant.intmm import largest_tile_sum, tiled_int_matmul


def loop_reference(a, b, tile, acc_bits):
    """Plain loops over m, n, tiles and k, in Python integers."""
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    m_size, k_size = a.shape
    n_size = b.shape[1]
    tile = k_size if tile is None else tile
    limit = None if acc_bits is None else 2 ** (acc_bits - 1) - 1
    out = np.zeros((m_size, n_size), dtype=np.int64)
    for m in range(m_size):
        for n in range(n_size):
            total = 0
            for start in range(0, k_size, tile):
                partial = 0
                for k in range(start, min(start + tile, k_size)):
                    partial += int(a[m, k]) * int(b[k, n])
                if limit is not None:
                    partial = max(-limit, min(limit, partial))
                total += partial
            out[m, n] = total
    return out


def random_levels(shape, low, high, seed):
    return torch.randint(low, high + 1, shape, generator=torch.Generator().manual_seed(seed)).float()


@pytest.mark.parametrize("m,k,n,tile,acc_bits", [
    (3, 70, 4, 32, 8),      # tiles 32, 32, 6
    (5, 144, 3, 32, 8),     # the conv case of the spec: 4 tiles of 32 and one of 16
    (4, 20, 5, 32, 8),      # K <= tile: one tile
    (3, 50, 2, 7, 6),
    (4, 64, 4, None, 8),    # whole-K saturation
    (4, 64, 4, 16, None),   # no saturation
    (2, 33, 3, 1, 4),
])
def test_matches_loops(m, k, n, tile, acc_bits):
    a = random_levels((m, k), 0, 15, seed=k)
    b = random_levels((k, n), -7, 7, seed=k + 1)
    out = tiled_int_matmul(a, b, tile, acc_bits)
    np.testing.assert_array_equal(out.numpy(), loop_reference(a, b, tile, acc_bits))


def largest_by_loops(a, b, tile):
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    k_size = a.shape[-1]
    tile = k_size if tile is None else tile
    return max(abs(int(a[..., m, start:start + tile] @ b[..., start:start + tile, n]))
               for m in range(a.shape[-2]) for n in range(b.shape[-1]) for start in range(0, k_size, tile))


@pytest.mark.parametrize("seed", range(8))
def test_largest_tile_sum_is_the_largest_unsaturated_tile_sum(seed):
    g = torch.Generator().manual_seed(seed)
    m, k, n = (int(v) for v in torch.randint(1, 80, (3,), generator=g))
    tile = [None, 16, 32, 7][seed % 4]
    a, b = random_levels((m, k), -8, 15, seed), random_levels((k, n), -7, 7, seed + 100)
    assert largest_tile_sum(a, b, tile) == largest_by_loops(a, b, tile)
    assert largest_tile_sum(a, b, tile, bounds=(15, 7)) == largest_by_loops(a, b, tile)
    assert largest_tile_sum(a[:0], b, tile) == 0.0


def test_saturates_exactly_at_the_bounds():
    a = torch.full((2, 64), 15.0)
    b = torch.full((64, 2), 7.0)
    b[:, 1] = -7
    out, saturated = tiled_int_matmul(a, b, 32, 8, count_saturated=True)
    assert out.tolist() == [[254.0, -254.0], [254.0, -254.0]]  # two tiles at ±127
    assert saturated.item() == 8
    a = torch.full((1, 9), 15.0)  # one tile: 9 * 15 * 1 = 135 -> 127; 8 * 15 = 120 stays
    assert tiled_int_matmul(a, torch.ones(9, 1), 32, 8).item() == 127
    assert tiled_int_matmul(a[:, :8], torch.ones(8, 1), 32, 8).item() == 120


def test_batched_and_broadcast():
    a = random_levels((3, 4, 70), -7, 7, seed=0)
    b = random_levels((70, 5), -7, 7, seed=1)
    b_batched = random_levels((3, 70, 5), -7, 7, seed=2)
    out = tiled_int_matmul(a, b, 32, 8)
    out_batched = tiled_int_matmul(a, b_batched, 32, 8)
    for i in range(3):
        np.testing.assert_array_equal(out[i].numpy(), loop_reference(a[i], b, 32, 8))
        np.testing.assert_array_equal(out_batched[i].numpy(), loop_reference(a[i], b_batched[i], 32, 8))


def test_wide_integers_use_float64_exactly():
    a = torch.full((1, 4096), 32767.0)
    b = torch.full((4096, 1), 32767.0)
    out = tiled_int_matmul(a, b, None, None)
    assert out.dtype == torch.float64 and out.item() == 4096 * 32767**2


def test_known_bounds_give_the_same_result():
    a, b = random_levels((4, 40), 0, 15, 3), random_levels((40, 6), -7, 7, 4)
    assert torch.equal(tiled_int_matmul(a, b, 16, 8), tiled_int_matmul(a, b, 16, 8, bounds=(15, 7)))


@pytest.mark.parametrize("kwargs,message", [({"tile": 0}, "tile=0"), ({"acc_bits": 0}, "acc_bits=0")])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiled_int_matmul(torch.ones(2, 3), torch.ones(3, 2), **kwargs)


def test_sum_entries_adds_in_order_from_positive_zero():
    """The order is the definition (the GPU epilogue keeps it): 1e8 + 1 loses the 1 in float32, so the sum of
    (1e8, 1, -1e8) is 0 in this order (1 in others); a single -0.0 comes back as +0.0."""
    from hdqt_cil.quant import sum_entries

    t = torch.tensor([1e8, 1.0, -1e8]).reshape(3, 1, 1)
    assert sum_entries(t).item() == 0.0
    assert sum_entries(t.flip(0)).item() == 0.0 and sum_entries(t[[0, 2, 1]]).item() == 1.0
    zero = sum_entries(torch.tensor([[[-0.0]]]))
    assert zero.item() == 0.0 and not torch.signbit(zero).item()
    x = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(0))
    assert sum_entries(x).shape == (4, 5)
    assert torch.equal(sum_entries(x), ((((x[0, 0] + 0) + x[0, 1]) + x[0, 2]) + x[1, 0] + x[1, 1]) + x[1, 2])


@pytest.mark.parametrize("tile", [32, 7, None])
def test_a_float_accumulator_rounds_every_tile_sum(tile):
    """acc_format: each tile's exact sum rounded by the authors' quantizer (E5M2: 2 mantissa bits), the rounded
    sums added; saturated where a sum lies beyond the format's largest value (E2M1: 6)."""
    from hdqt_cil.quant.floats import authors_float, authors_format

    a, b = random_levels((9, 70), -7, 7, seed=3), random_levels((70, 5), -7, 7, seed=4)
    a64, b64 = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    width = 70 if tile is None else tile
    for exp_bits, man_bits in ((5, 2), (2, 1)):
        fmt = authors_format(exp_bits, man_bits)
        expected, saturated = np.zeros((9, 5)), 0
        for start in range(0, 70, width):
            sums = torch.tensor(a64[:, start:start + width] @ b64[start:start + width], dtype=torch.float32)
            expected += authors_float(sums, exp_bits, man_bits).double().numpy()
            saturated += int((sums.abs() > (6 if exp_bits == 2 else 1.75 * 2**16)).sum())
        out, count = tiled_int_matmul(a, b, tile, None, count_saturated=True, acc_format=fmt)
        np.testing.assert_array_equal(out.numpy(), expected)
        assert count.item() == saturated
        assert not np.array_equal(expected, a64 @ b64), "a rounding of no effect tests nothing"
    with pytest.raises(ValueError, match="exclude each other"):
        tiled_int_matmul(a, b, 32, 8, acc_format=fmt)
