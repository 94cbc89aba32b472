"""quant=hot: LP_L1 rows, HLA, the HOT layers' gradients and saved bytes, LQS, config, training, GPU bit-identity."""
import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hdqt_cil.quant import (HotConv2d, HotLinear, HotScheme, QuantLinear, block_hadamard, calibrate_lqs,
                            hadamard_block_size, hla_compress, hla_rank, hla_reconstruct, hla_rows, lp_l1_rank,
                            lqs_choices, lqs_pending, preset, quant_stats, quantize, quantize_model,
                            scheme_from_config)
from hdqt_cil.quant.backend import resolve_ops
from hdqt_cil.quant.compact import restore, store
from hdqt_cil.quant.hla import hla_projection
from hdqt_cil.quant.lqs import quantization_errors

FULL_PRECISION = {"name": "hot", "gx_bits": None, "gw_bits": None, "abc_bits": None, "hla_rank_ratio": 1.0}


pytestmark = pytest.mark.usefixtures("one_thread")


def sylvester(n):
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def sign_changes(row):
    return int((row[1:] != row[:-1]).sum())


# ------------------------------------------------------------------------------------------------- LP_L1 and HLA

@pytest.mark.parametrize("n,rows", [(16, 10), (64, 36), (256, 136), (1024, 528)])
def test_lp_l1_keeps_the_2d_sequency_triangle(n, rows):
    """H_{s²} = H_s ⊗ H_s: natural row p·s + q is the s × s Walsh image of sequencies (seq p, seq q); LP_L1
    keeps seq p + seq q <= s - 1."""
    s = int(round(n ** 0.5))
    h_s = sylvester(s)
    expected = sorted(p * s + q for p in range(s) for q in range(s)
                      if sign_changes(h_s[p]) + sign_changes(h_s[q]) <= s - 1)
    assert lp_l1_rank(n) == rows == len(expected)
    assert hla_rows(n).tolist() == expected


def test_lp_l1_beyond_powers_of_four_and_the_rank_options():
    h = sylvester(32)
    sequency = {r: sign_changes(h[r]) for r in range(32)}
    kept = hla_rows(32).tolist()  # s = 4: the triangle among the 16 lowest-sequency rows
    assert len(kept) == 10 and all(sequency[r] < 16 for r in kept) and 0 in kept
    assert [hla_rank(n) for n in (1, 2, 8, 128, 512)] == [1, 1, 3, 36, 136]
    assert hla_rank(16, rank_ratio=0.5) == 8 and hla_rank(16, rank=40) == 16 and hla_rank(16, rank_ratio=1.0) == 16
    assert hla_rank(197 & -197, rank_ratio=0.5) == 1  # odd L: a block of one, nothing to drop
    low = hla_rows(16, rank=6).tolist()  # priority: L1 distance first, so a sub-triangle
    assert set(low) < set(hla_rows(16).tolist())
    s_rows = sylvester(4)
    pairs = {p * 4 + q: sign_changes(s_rows[p]) + sign_changes(s_rows[q]) for p in range(4) for q in range(4)}
    assert sorted(pairs[r] for r in low) == [0, 1, 1, 2, 2, 2]
    with pytest.raises(ValueError, match="not both"):
        hla_rank(16, rank=4, rank_ratio=0.5)


@pytest.mark.parametrize("length,block,rank", [(64, 16, 10), (48, 16, 3), (7, 1, 1), (16, 16, 16)])
def test_hla_along_any_dim_is_the_last_dims_moved(length, block, rank):
    """A token-major (B, L, C) tensor compressed along L gives the same bits as its (B, C, L) transpose along
    the last dim, transposed back (the two layouts HOT's Linear and conv layers compress in)."""
    x = torch.randn(3, length, 5, generator=torch.Generator().manual_seed(length))
    along_tokens = hla_compress(x, block, rank, dim=-2)
    assert along_tokens.shape == (3, length // block * rank, 5)
    assert torch.equal(along_tokens, hla_compress(x.transpose(1, 2), block, rank).transpose(1, 2))


def test_abc_keeps_levels_token_last_in_16_byte_rows():
    """ABC's levels as int8 (B, C, R), R contiguous: for a Linear over 197 tokens (L' = 1, R = 197) in rows of
    208 bytes, which the GEMM kernel reads in place; over 128 samples of a 2-D input (L' = 128, LP_L1 keeps 36)
    compact, as rows of 48 would cost a third more memory."""
    layer = quantize_model(nn.Linear(24, 32), preset("hot"))
    for x, entries, tokens, row in ((torch.randn(4, 197, 24), 4, 197, 208), (torch.randn(128, 24), 1, 36, 36)):
        saved = []

        def keep(t):
            saved.append(t)
            return t
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            layer(x.requires_grad_())
        (levels,) = [t for t in saved if t.dtype == torch.int8]
        assert levels.shape == (entries, 24, tokens) and levels.stride(-1) == 1 and levels.stride(-2) == row


@pytest.mark.parametrize("length,block,rank", [(64, 16, 10), (48, 16, 3), (32, 32, 10), (16, 16, 16)])
def test_hla_is_an_orthogonal_projection(length, block, rank):
    p = hla_projection(length, block, rank)
    torch.testing.assert_close(p @ p, p, atol=1e-5, rtol=0)
    torch.testing.assert_close(p, p.T, atol=0, rtol=0)
    assert torch.linalg.matrix_rank(p) == length // block * rank
    x = torch.randn(3, 5, length)
    torch.testing.assert_close(hla_reconstruct(hla_compress(x, block, rank), block, rank), x @ p, atol=1e-5, rtol=1e-5)
    if rank == block:
        torch.testing.assert_close(p, torch.eye(length), atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------- the layers

def _pair(make, scheme, seed=0):
    torch.manual_seed(seed)
    plain, layer = make(), make()
    layer.load_state_dict(plain.state_dict())
    return plain, quantize_model(layer, scheme)


LAYERS = {
    "linear 2-D": (lambda: nn.Linear(40, 32), (24, 40)),
    "linear tokens": (lambda: nn.Linear(40, 32), (3, 16, 40)),
    "conv 3x3": (lambda: nn.Conv2d(5, 16, 3, padding=1), (2, 5, 8, 8)),
    "conv 1x1 stride 2": (lambda: nn.Conv2d(5, 16, 1, stride=2, bias=False), (2, 5, 8, 8)),
    "conv 3x3 stride 2 odd": (lambda: nn.Conv2d(5, 24, 3, stride=2, padding=1), (2, 5, 7, 7)),
}


def _gradients(module, x, seed=0):
    torch.manual_seed(seed)
    xi = x.clone().requires_grad_()
    y = module(xi)
    y.backward(torch.randn(y.shape).to(y.device))  # drawn on the CPU: the same upstream gradient on any device
    out = (y.detach(), xi.grad, module.weight.grad, None if module.bias is None else module.bias.grad)
    module.zero_grad()
    return out


@pytest.mark.parametrize("case", LAYERS)
def test_full_precision_full_rank_gives_torch_gradients(case):
    make, shape = LAYERS[case]
    plain, layer = _pair(make, scheme_from_config(FULL_PRECISION))
    assert isinstance(layer, (HotLinear, HotConv2d))
    x = torch.randn(shape)
    (y0, gx0, gw0, gb0), (y1, gx1, gw1, gb1) = _gradients(plain, x), _gradients(layer, x)
    assert torch.equal(y0, y1)  # the forward is torch's own op
    torch.testing.assert_close(gx1, gx0, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(gw1, gw0, atol=1e-5, rtol=1e-4)
    if gb0 is not None:
        torch.testing.assert_close(gb1, gb0, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["linear 2-D", "linear tokens", "conv 3x3"])
def test_quantized_gradients_are_close_and_what_abc_keeps_changes_only_a_kxk_convs_input(case):
    """ABC on or off gives the same gradients bit for bit; abc=true's 8-bit copy of a 3×3 conv's input gives the
    gradients of the float path run on that copy."""
    make, shape = LAYERS[case]
    plain, layer = _pair(make, preset("hot"))
    x = torch.randn(shape)
    exact = _gradients(plain, x)

    def run(abc, inputs):
        quantize_model(layer, dataclasses.replace(preset("hot"), abc=abc))
        layer.step = 0
        return _gradients(layer, inputs)
    results = {abc: run(abc, x) for abc in (True, False, "pointwise", "columns")}
    for abc in ("pointwise", "columns"):
        for a, b in zip(results[False][1:3], results[abc][1:3]):
            assert torch.equal(a, b)
    if case.startswith("conv"):
        levels, scale = store(x, 8, resolve_ops("torch", x.device))
        on_copy = run(False, restore(levels, scale))
        assert torch.equal(results[True][1], results[False][1])  # g_x does not read x
        assert torch.equal(results[True][2], on_copy[2]) and not torch.equal(results[True][2], results[False][2])
    else:
        for a, b in zip(results[False][1:3], results[True][1:3]):
            assert torch.equal(a, b)
    y, gx, gw, _ = results[True]
    assert torch.equal(y, exact[0])
    assert (gx - exact[1]).norm() < 0.5 * exact[1].norm()
    assert (gw - exact[2]).norm() < 0.9 * exact[2].norm()


SLICED_CONVS = {  # (conv, input shape): a 3×3 unfolds 9× its input, a strided 7×7 stem ~12×, a 1×1 not at all
    "3x3": (lambda: nn.Conv2d(4, 8, 3, padding=1), (10, 4, 8, 8)),
    "3x3 stride 2": (lambda: nn.Conv2d(4, 8, 3, stride=2, padding=1, bias=False), (10, 4, 9, 9)),
    "7x7 stride 2": (lambda: nn.Conv2d(3, 8, 7, stride=2, padding=3), (16, 3, 16, 16)),
    "1x1": (lambda: nn.Conv2d(4, 8, 1), (10, 4, 8, 8)),
}


@pytest.mark.parametrize("case", SLICED_CONVS)
@pytest.mark.parametrize("abc", [True, "columns", False])
@pytest.mark.parametrize("per_token", [False, True])
def test_unfolding_a_slice_of_samples_at_a_time_gives_the_same_gradients(case, abc, per_token):
    make, shape = SLICED_CONVS[case]
    x = torch.randn(shape)
    results = []
    for sliced in (True, False):
        _, layer = _pair(make, dataclasses.replace(preset("hot"), abc=abc, sliced_unfold=sliced))
        layer.set_lqs(per_token)
        results.append(_gradients(layer, x))
        if sliced:
            assert (len(layer._sample_slices(shape)) > 1) == (case != "1x1")
    for a, b in zip(*results):
        assert (a is None and b is None) or torch.equal(a, b)


def _largest_unfolded(layer, x) -> int:
    """The most elements any unfolded input (im2col) or g_x column tensor held during one training step."""
    largest = [0]
    unfold, fold = layer._input_columns, layer._grad_input

    def columns(t, ops):
        out = unfold(t, ops)
        largest[0] = max(largest[0], out.numel())
        return out

    def folded(rows, x_shape, ops):
        largest[0] = max(largest[0], rows.numel())
        return fold(rows, x_shape, ops)
    layer._input_columns, layer._grad_input = columns, folded
    _gradients(layer, x)
    return largest[0]


@pytest.mark.parametrize("case", ["3x3", "3x3 stride 2", "7x7 stride 2"])
def test_a_sliced_unfolding_never_holds_more_than_the_layers_input(case):
    make, shape = SLICED_CONVS[case]
    x = torch.randn(shape)
    for abc in (True, "columns"):
        sizes = {}
        for sliced in (True, False):
            _, layer = _pair(make, dataclasses.replace(preset("hot"), abc=abc, sliced_unfold=sliced))
            sizes[sliced] = _largest_unfolded(layer, x)
        assert sizes[True] <= x.numel() < sizes[False]


@pytest.mark.parametrize("seed", range(20))
def test_sample_slices_cover_the_batch_in_order_each_within_the_input_size(seed):
    g = torch.Generator().manual_seed(seed)
    draw = lambda low, high: int(torch.randint(low, high, (), generator=g))  # noqa: E731
    kernel, stride = draw(1, 6), draw(1, 3)
    conv = nn.Conv2d(draw(1, 5), 4, kernel, stride=stride, padding=kernel // 2)
    layer = quantize_model(conv, preset("hot"))
    shape = (draw(1, 40), conv.in_channels, draw(kernel, 20), draw(kernel, 20))
    slices = layer._sample_slices(shape)
    assert [i for s in slices for i in range(s.start, s.stop)] == list(range(shape[0]))
    per_sample = conv.weight[0].numel() * math.prod(layer._output_size(shape))
    input_size = math.prod(shape)
    assert all(s.stop - s.start == 1 or (s.stop - s.start) * per_sample <= input_size for s in slices)
    assert len(slices) == 1 or len(slices) == -(-shape[0] // max(1, input_size // per_sample))
    unsliced = quantize_model(conv, dataclasses.replace(preset("hot"), sliced_unfold=False))
    assert unsliced._sample_slices(shape) == [slice(0, shape[0])]


@pytest.mark.parametrize("per_token", [False, True])
def test_stochastic_rounding_stays_unbiased_through_both_paths(per_token):
    """Over many seeds the mean g_x equals (G·H) · deq(Q(H·W))ᵀ / n, the mean g_W equals (P·G)ᵀ · deq(ABC) / L'."""
    torch.manual_seed(0)
    layer = quantize_model(nn.Linear(24, 32, bias=False), preset("hot"))
    layer.set_lqs(per_token)
    x, g = torch.randn(64, 24), torch.randn(64, 32)
    scheme = preset("hot")
    n = hadamard_block_size(32, 16)
    w_levels, w_scale = quantize(block_hadamard(layer.weight.detach().t(), -1, n), scheme.weight_spec)
    expected_gx = block_hadamard(g, -1, n) @ (w_levels * w_scale).t() / n
    block, rank = 64, hla_rank(64)
    x_levels, x_scale = quantize(hla_compress(x.t().unsqueeze(0), block, rank), scheme.input_spec)
    expected_gw = (hla_compress(g.t().unsqueeze(0), block, rank) @ (x_levels * x_scale).transpose(1, 2))[0] / block
    runs = 256
    sum_gx, sum_gw, single = 0, 0, None
    for seed in range(runs):
        quantize_model(layer, dataclasses.replace(scheme, seed=seed))
        xi = x.clone().requires_grad_()
        layer(xi).backward(g)
        sum_gx, sum_gw = sum_gx + xi.grad, sum_gw + layer.weight.grad
        single = single or ((xi.grad - expected_gx).norm(), (layer.weight.grad - expected_gw).norm())
        layer.weight.grad = None
    assert single[0] > 0.05 * expected_gx.norm()  # one draw is noisy ...
    assert (sum_gx / runs - expected_gx).norm() < 0.2 * single[0]  # ... the mean is not (1/16 expected)
    assert (sum_gw / runs - expected_gw).norm() < 0.2 * single[1]


def _saved_activation_bytes(module, x):
    """Bytes of memory the forward keeps for the backward: each storage a saved tensor lies in, once (padding
    included), the module's parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    storages = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(storages.values())


def test_abc_saves_the_compressed_int8_input():
    x = torch.randn(4, 64, 96, requires_grad=True)  # tokens: L = 64 → LP_L1 keeps 36 of 64, INT8
    plain, layer = _pair(lambda: nn.Linear(96, 128), preset("hot"))
    fp32, hot = _saved_activation_bytes(plain, x), _saved_activation_bytes(layer, x)
    assert fp32 == x.numel() * 4
    assert hot <= 0.30 * fp32
    assert hot == 4 * 96 * 36 + 4 * 4  # int8 levels (B, in, R) and one float32 scale per sample
    odd = torch.randn(2, 197, 96, requires_grad=True)  # ViT's 197 tokens: L' = 1, INT8 alone, rows of 208
    assert _saved_activation_bytes(layer, odd) == 2 * 96 * 208 + 2 * 4
    assert _saved_activation_bytes(layer, odd) <= 0.30 * _saved_activation_bytes(plain, odd)
    conv_plain, conv = _pair(lambda: nn.Conv2d(16, 16, 3, padding=1, bias=False), preset("hot"))
    image = torch.randn(2, 16, 16, 16, requires_grad=True)
    assert _saved_activation_bytes(conv, image) == image.numel() + 2 * 4  # abc=true: the input in int8, a scale a sample
    quantize_model(conv, dataclasses.replace(preset("hot"), abc="columns"))
    im2col = _saved_activation_bytes(conv, image)  # 9 · 136/256 / 4 of the input, rows of 144: more than FP32
    assert im2col == 2 * 16 * 9 * 144 + 2 * 4
    quantize_model(conv, dataclasses.replace(preset("hot"), abc="pointwise"))
    assert _saved_activation_bytes(conv, image) == _saved_activation_bytes(conv_plain, image) == image.numel() * 4


def test_extreme_inputs():
    from hdqt_cil.quant import NonFiniteError

    layer = quantize_model(nn.Linear(8, 16), preset("hot"))
    empty = torch.zeros(0, 8, requires_grad=True)
    layer(empty).sum().backward()  # torch's own layer: an empty output, zero gradients, no step
    assert layer.step == 0 and not layer.weight.grad.any()
    zeros = torch.zeros(3, 8, requires_grad=True)
    layer(zeros).sum().backward()
    assert torch.isfinite(zeros.grad).all() and not layer.weight.grad.any()
    bad = torch.randn(4, 8)
    bad[1, 2] = float("nan")
    with pytest.raises(NonFiniteError, match="nan in the input"):
        layer(bad.requires_grad_())
    y = layer(torch.randn(4, 8, requires_grad=True))
    g = torch.randn_like(y)
    g[0, 0] = float("inf")
    with pytest.raises(NonFiniteError, match="inf in the output gradient"):
        y.backward(g)


# ------------------------------------------------------------------------------------------------- LQS

def test_lqs_errors_pick_per_token_only_for_row_outliers():
    layer = quantize_model(nn.Linear(8, 32), preset("hot"))
    g = torch.randn(1, 64, 32, generator=torch.Generator().manual_seed(0))
    e_tensor, e_token = quantization_errors(layer, g)
    assert not e_token < 0.5 * e_tensor
    outliers = g.clone()
    outliers[0, ::32] *= 10.0  # two outlier tokens of 64
    e_tensor, e_token = quantization_errors(layer, outliers)
    assert e_token < 0.5 * e_tensor


def _lqs_model():
    torch.manual_seed(0)
    return quantize_model(nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 64)), preset("hot"))


def test_calibrate_lqs_chooses_per_layer_and_leaves_the_model_as_it_was():
    model = _lqs_model()
    x = torch.randn(48, 12)
    weights = torch.randn(48, 64)
    weights[::24] *= 10.0  # the last layer's output gradient is `weights`: two outlier rows
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()
    result = calibrate_lqs(model, x, weights, lambda out, w: (out * w).sum())
    assert set(result) == {"0", "2"} and result["2"]["per_token"], result
    assert result["2"]["error_token"] < 0.5 * result["2"]["error_tensor"]
    assert lqs_choices(model)["2"] == "token" and not lqs_pending(model)
    assert not model.training and all(p.grad is None for p in model.parameters())
    assert all(m.step == 0 for m in model.modules() if isinstance(m, QuantLinear))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if not k.endswith("lqs_choice"))

    iid = _lqs_model()
    result = calibrate_lqs(iid, x, torch.randn(48, 64), lambda out, w: (out * w).sum())
    assert not result["2"]["per_token"] and lqs_choices(iid)["2"] == "tensor", result


def test_lqs_choice_survives_state_dict_and_scheme_switches():
    model = _lqs_model()
    model[2].set_lqs(True)
    model[0].set_lqs(False)
    state = model.state_dict()
    assert state["2.lqs_choice"].item() == 2 and state["0.lqs_choice"].item() == 1
    fresh = _lqs_model()
    assert lqs_pending(fresh)
    fresh.load_state_dict(state)
    assert lqs_choices(fresh) == {"0": "tensor", "2": "token"} and not lqs_pending(fresh)
    quantize_model(fresh, preset("hot"))  # idempotent: the choice stays
    assert fresh[2].lqs_per_token
    quantize_model(fresh, preset("hdqt"))  # another scheme: plain quantized layers, torch's state-dict keys
    assert type(fresh[2]) is QuantLinear and "2.lqs_choice" not in fresh.state_dict()
    assert not lqs_pending(quantize_model(fresh, dataclasses.replace(preset("hot"), lqs=False)))


# ------------------------------------------------------------------------------------------------- config

def test_hot_preset_and_hydra_overrides(make_cfg):
    scheme = preset("hot")
    assert isinstance(scheme, HotScheme)
    assert (scheme.gx_bits, scheme.gw_bits, scheme.abc_bits, scheme.hadamard_cap) == (4, 8, 8, 16)
    assert scheme.lqs and scheme.lqs_threshold == 0.5 and scheme.abc is True
    assert scheme.weight_spec.scale == "sawb" and scheme.input_spec.scale == "sawb"
    assert scheme.grad_output_spec(True).granularity == "row" and scheme.grad_weight_spec.bits == 8
    cfg = make_cfg("quant=hot", "quant.hla_rank_ratio=0.5", "quant.abc=pointwise", "quant.gx_bits=null",
                   "quant.lqs_threshold=0.25", "seed=3")
    s = scheme_from_config(cfg.quant)
    assert (s.hla_rank_ratio, s.abc, s.gx_bits, s.lqs_threshold, s.seed) == (0.5, "pointwise", None, 0.25, 3)


@pytest.mark.parametrize("cfg,message", [
    ({"gx_bits": 1}, r"quant.gx_bits=1 must be an integer in 2..16 \(8 and below run on the int8 kernels\), or null"),
    ({"gw_bits": 8.5}, r"quant.gw_bits=8.5"),
    ({"abc_bits": 17}, r"quant.abc_bits=17 must be an integer in 2..16"),
    ({"hla_rank": 0}, r"quant.hla_rank=0 must be a positive integer"),
    ({"hla_rank_ratio": 1.5}, r"quant.hla_rank_ratio=1.5 must be a fraction of the HLA block in \(0, 1\]"),
    ({"hla_rank": 4, "hla_rank_ratio": 0.5}, "quant.hla_rank=4 and quant.hla_rank_ratio=0.5 exclude each other"),
    ({"lqs": "perhaps"}, "quant.lqs='perhaps'"),
    ({"lqs_threshold": 0}, r"quant.lqs_threshold=0.0 must be a number in \(0, 1\]"),
    ({"abc": "im2col"}, "quant.abc='im2col' must be true, false, columns or pointwise"),
    ({"abc": 1}, "quant.abc=1 must be true, false, columns or pointwise"),
    ({"hadamard_cap": 12}, "quant.hadamard_cap=12 must be a power of two"),
    ({"backend": "triton"}, "quant.backend='triton'"),
    ({"bits": 4}, "quant.bits is not a setting of quant=hot; its settings are name, backend, seed, gx_bits"),
])
def test_bad_hot_configs_name_the_value(cfg, message):
    with pytest.raises(ValueError, match=message):
        scheme_from_config({"name": "hot", **cfg})


# ------------------------------------------------------------------------------------------------- training

def _train(model_name, scheme, steps=4, batch=32, shape=None, classes=10, seed=0, device="cpu", mixed_lqs=False):
    from hdqt_cil.models import build_model

    torch.manual_seed(seed)
    shape = shape or ((64,) if model_name == "mlp" else (3, 16, 16))
    model = quantize_model(build_model(model_name, shape, classes).to(device), scheme)
    if mixed_lqs:  # both g_x granularities in one model
        for i, m in enumerate(m for m in model.modules() if isinstance(m, (HotLinear, HotConv2d))):
            m.set_lqs(i % 2 == 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(batch, *shape, generator=g, device=device)
    y = torch.randint(0, classes, (batch,), generator=g, device=device)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, losses


@pytest.mark.parametrize("model_name,batch", [("mlp", 32), ("resnet32", 8)])
def test_training_steps_lower_the_loss(model_name, batch):
    model, losses = _train(model_name, preset("hot"), steps=4 if model_name == "mlp" else 3, batch=batch,
                           mixed_lqs=True)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    layers = [m for m in model.modules() if isinstance(m, (HotLinear, HotConv2d))]
    n_convs = sum(isinstance(m, HotConv2d) for m in layers)
    assert n_convs == (31 if model_name == "resnet32" else 0) and len(layers) == n_convs + (1 if n_convs else 3)
    stats = quant_stats(model)
    assert all(0 <= s["input_clipped"] < 0.2 and 0 <= s["weight_clipped"] < 0.2 for s in stats.values())


def test_run_calibrates_once_and_writes_lqs_json(make_cfg, tmp_path):
    from hdqt_cil.experiment import run

    cfg = make_cfg("strategy=naive", "quant=hot", "trainer.epochs=1", "trainer.device=cpu",
                   "benchmark.n_experiences=2")
    summary = run(cfg, tmp_path / "run")
    assert summary["status"] == "complete"
    lqs = json.loads((tmp_path / "run" / "lqs.json").read_text())
    assert lqs["experience"] == 0 and lqs["threshold"] == 0.5 and lqs["batch_size"] == cfg.trainer.batch_size
    assert set(lqs["layers"]) == {"features.net.1", "features.net.3", "classifier"}
    assert all(set(v) == {"per_token", "error_tensor", "error_token"} for v in lqs["layers"].values())


# ------------------------------------------------------------------------------------------------- GPU

def _kernels_ready():
    if not torch.cuda.is_available():
        return False, "needs CUDA"
    from hdqt_cil import kernels
    return kernels.available(), f"kernels unavailable: {kernels.unavailable_reason()}"


@pytest.mark.gpu
@pytest.mark.parametrize("model_name,shape,batch", [("mlp", (561,), 128), ("resnet32", (3, 32, 32), 128)])
def test_gpu_torch_and_cupy_backends_train_identically(model_name, shape, batch):
    ready, why = _kernels_ready()
    if not ready:
        pytest.skip(why)
    classes = 11 if model_name == "mlp" else 10
    states = []
    deterministic = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True  # the float forward (cuDNN) must not vary between the two runs
    try:
        for backend in ("torch", "cupy"):
            scheme = dataclasses.replace(preset("hot"), backend=backend)
            model, losses = _train(model_name, scheme, steps=3, batch=batch, shape=shape, classes=classes,
                                   device="cuda", mixed_lqs=True)
            states.append((model.state_dict(), losses, quant_stats(model)))
    finally:
        torch.backends.cudnn.deterministic = deterministic
    (ref, ref_losses, ref_stats), (got, losses, stats) = states
    differ = {k: (got[k].float() - ref[k].float()).abs().max().item() for k in ref if not torch.equal(ref[k], got[k])}
    assert not differ, f"{len(differ)} tensors differ (max |diff|): {differ}"
    assert losses == ref_losses and stats == ref_stats


@pytest.mark.gpu
def test_gpu_layer_matches_the_cpu_reference():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    make, shape = LAYERS["conv 3x3"]
    _, cpu = _pair(make, dataclasses.replace(preset("hot"), backend="torch"))
    _, gpu = _pair(make, dataclasses.replace(preset("hot"), backend="torch"))
    gpu.cuda()
    x = torch.randn(shape)
    (y0, gx0, gw0, _), (y1, gx1, gw1, _) = _gradients(cpu, x), _gradients(gpu, x.cuda())
    torch.testing.assert_close(y1.cpu(), y0)
    torch.testing.assert_close(gx1.cpu(), gx0)  # col2im and the per-sample sums: float sums in device order
    torch.testing.assert_close(gw1.cpu(), gw0)
