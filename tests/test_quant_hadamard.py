import numpy as np
import pytest
import scipy.linalg
import torch

from hdqt_cil.quant.hadamard import block_hadamard, hadamard_block_size, sequency_order


@pytest.mark.parametrize("n", [1, 2, 4, 8, 64, 256])
def test_h_times_h_is_n_identity(n):
    identity = torch.eye(n)
    assert torch.equal(block_hadamard(block_hadamard(identity)), n * identity)


@pytest.mark.parametrize("size,block", [(32, 32), (96, 32), (100, 4), (48, 16), (24, 8)])
def test_equals_dense_block_diagonal_sylvester(size, block):
    x = torch.randn(5, size, generator=torch.Generator().manual_seed(size))
    dense = scipy.linalg.block_diag(*[scipy.linalg.hadamard(block)] * (size // block))
    expected = x.double().numpy() @ dense.T
    np.testing.assert_allclose(block_hadamard(x, block=block).double().numpy(), expected, rtol=1e-5, atol=1e-4)


def test_integer_inputs_transform_exactly():
    x = torch.randint(-7, 8, (3, 128)).float()
    dense = torch.from_numpy(scipy.linalg.hadamard(128)).float()
    assert torch.equal(block_hadamard(x), x @ dense.T)


def test_any_dimension_and_default_block():
    x = torch.randn(12, 7, 40)
    moved = block_hadamard(x.transpose(0, 2), dim=0).transpose(0, 2)
    assert torch.equal(block_hadamard(x, dim=-1), moved)
    assert torch.equal(block_hadamard(x, dim=-1), block_hadamard(x, dim=2, block=8))  # 40 = 8 * 5


def test_linearity():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 64, generator=g), torch.randn(4, 64, generator=g)
    torch.testing.assert_close(block_hadamard(2.5 * x - 3 * y), 2.5 * block_hadamard(x) - 3 * block_hadamard(y))


@pytest.mark.parametrize("n,cap,expected", [(1024, None, 1024), (100, None, 4), (561, None, 1), (405, None, 1),
                                            (243, None, 1), (128, None, 128), (1024, 64, 64), (12, 16, 4),
                                            (96, 16, 16)])
def test_block_rule(n, cap, expected):
    assert hadamard_block_size(n, cap) == expected


def test_odd_dimension_is_left_as_it_is():
    x = torch.randn(3, 561)
    assert torch.equal(block_hadamard(x), x)


@pytest.mark.parametrize("call,message", [
    (lambda: hadamard_block_size(0), "dimension >= 1"),
    (lambda: hadamard_block_size(64, cap=12), "power of two"),
    (lambda: block_hadamard(torch.zeros(2, 12), block=8), "dividing the dimension 12"),
])
def test_bad_blocks(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("n", [1, 2, 16, 64, 1024])
def test_sequency_order_counts_sign_changes(n):
    rows = torch.from_numpy(scipy.linalg.hadamard(n))[sequency_order(n)]
    changes = (rows[:, 1:] != rows[:, :-1]).sum(dim=1)
    assert torch.equal(changes, torch.arange(n))
