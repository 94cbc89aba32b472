"""The CuPy kernels against the torch reference of hdqt_cil.quant: the same bits on fresh random inputs.

Every output buffer is poisoned (NaN / 0x7f bytes) before each launch, so an element a kernel fails to write
shows. Integer results, scales and stochastic rounding (same counter) must be bit-identical; a whole training step
with either backend must leave bit-identical weights.
"""
import dataclasses
import math
import zlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hdqt_cil import kernels
from hdqt_cil.kernels import flat
from hdqt_cil.kernels import runtime as rt
from hdqt_cil.kernels.compile import BLOCK_SCALED_CONFIGS, GEMM_CONFIGS, WGMMA_CONFIGS, runs_here
from hdqt_cil.quant.backend import KERNEL_OPS as CUPY
from hdqt_cil.quant import (QuantSpec, block_hadamard, hla_compress, hla_rank, preset, quant_stats, quantize,
                             quantize_model)
from hdqt_cil.quant import tiled_int_matmul
from hdqt_cil.quant.rounding import Counter

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(torch.cuda.is_available() and not kernels.available(),
                                 reason=f"kernels unavailable: {kernels.unavailable_reason()}")]


def _poisoned(shape, dtype, device):
    """An output buffer filled with NaN, or 0x7f bytes for integers: every element a kernel fails to write shows."""
    out = torch.empty(shape, dtype=dtype, device=device)
    if dtype.is_floating_point:
        return out.fill_(float("nan"))
    if dtype in (torch.int8, torch.uint8):
        out.view(torch.uint8).fill_(0x7F)
        return out
    return out.fill_(0x7F7F7F7F)


@pytest.fixture(autouse=True)
def _poison_outputs(monkeypatch):
    monkeypatch.setattr(rt, "empty", _poisoned)


def gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


def assert_same(kernel, reference, what=""):
    """Equal values (levels: int8 against the reference's float32), shapes and, for floats, the same bits."""
    assert kernel.shape == reference.shape, what
    assert not torch.isnan(kernel.float()).any(), f"{what}: unwritten (poisoned) elements"
    if kernel.dtype == torch.int8:
        assert torch.equal(kernel.float(), reference.float()), f"{what}: {(kernel.float() != reference).sum()} differ"
    else:
        assert kernel.dtype == reference.dtype, what
        same = torch.equal(kernel, reference)
        assert same, f"{what}: {(kernel != reference).sum().item()} of {kernel.numel()} differ"


# ----------------------------------------------------------------------------------------------------- quantize

SHAPES = [(1,), (7,), (5, 3), (33, 17), (4, 3, 31, 5), (128, 561), (64, 16, 32, 32), (3, 1000003), (2, 4096, 1024)]
SPECS = [
    QuantSpec(4, "auto", "max", 0.975),
    QuantSpec(4, "signed", "max", 0.975, "tensor", "nearest"),
    QuantSpec(4, "unsigned", "max", 1.0, "tensor", "nearest"),
    QuantSpec(4, "signed", "max", 1.0, "sample", "stochastic"),
    QuantSpec(4, "signed", "max", 1.0, "row", "stochastic"),
    QuantSpec(3, "auto", "max", 0.9, "sample", "nearest"),
    QuantSpec(8, "signed", "max", 1.0, "row", "nearest"),
    QuantSpec(7, "auto", "max", 1.0, "tensor", "stochastic"),
    QuantSpec(2, "signed", "max", 1.0, "tensor", "stochastic"),
    QuantSpec(4, "signed", "max", 1.0, "tensor", "stochastic", grid="log2"),
    QuantSpec(3, "signed", "max", 1.0, "sample", "stochastic", grid="log2"),
    QuantSpec(4, "auto", "sawb"),
    QuantSpec(4, "signed", "sawb", 1.0, "sample"),
]


def inputs(shape, seed):
    """Gaussian, non-negative (unsigned under 'auto'), and integer-valued after a transform (ties on .5)."""
    g = gen(seed)
    x = torch.randn(shape, generator=g, device="cuda")
    yield "randn", x
    yield "relu", torch.relu(x) * 3
    ints = torch.randint(-7, 8, shape, generator=g, device="cuda").float()
    yield "hadamard of integers", block_hadamard(ints, -1)


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_quantize_bit_identical(shape, spec):
    for k, (label, t) in enumerate(inputs(shape, zlib.crc32(f'{shape}{spec}'.encode()))):
        counter = Counter(seed=12345 + k, step=987654321, role=8 * 3 + 2)
        ref_levels, ref_scale = quantize(t, spec, counter)
        levels, scale = CUPY.quantize(t, spec, counter)
        assert levels.dtype == torch.int8
        assert_same(levels, ref_levels, f"levels {label}")
        assert_same(scale, ref_scale, f"scale {label}")


def test_quantize_other_inputs():
    spec = QuantSpec(4, "signed", "max", 1.0, "sample", "stochastic")
    counter = Counter(1, 2, 3)
    g = gen(5)
    int8 = torch.randint(-100, 101, (16, 40, 24), generator=g, device="cuda", dtype=torch.int8)
    strided = torch.randn(24, 40, 16, generator=g, device="cuda").transpose(0, 2)  # logical (16, 40, 24)
    zeros = torch.zeros(6, 10, device="cuda")
    partly = torch.randn(6, 10, generator=g, device="cuda")
    partly[2] = 0
    half = torch.randn(8, 64, generator=g, device="cuda").half()
    for label, t in (("int8", int8), ("strided", strided), ("zeros", zeros), ("zero sample", partly), ("half", half)):
        assert_same(CUPY.quantize(t, spec, counter)[0], quantize(t, spec, counter)[0], label)
        assert_same(CUPY.quantize(t, spec, counter)[1], quantize(t, spec, counter)[1], label)


@pytest.mark.parametrize("spec", [SPECS[0], SPECS[3], SPECS[9], SPECS[11]], ids=str)
def test_quantize_extreme_magnitudes(spec):
    """Subnormal inputs, magnitudes spread over 70 decades, exact powers of two (log2 grid boundaries)."""
    g = gen(17)
    counter = Counter(2, 3, 4)
    spread = torch.randn(64, 300, generator=g, device="cuda") * 10.0 ** torch.randint(
        -40, 30, (64, 300), generator=g, device="cuda").float()
    subnormal = torch.randn(64, 300, generator=g, device="cuda") * 1e-39
    powers = torch.ldexp(torch.ones(64, 300, device="cuda"),
                         torch.randint(-8, 8, (64, 300), generator=g, device="cuda")) * torch.sign(
        torch.randn(64, 300, generator=g, device="cuda"))
    for label, t in (("spread", spread), ("subnormal", subnormal), ("powers of two", powers)):
        got, ref = CUPY.quantize(t, spec, counter), quantize(t, spec, counter)
        assert_same(got[0], ref[0], f"levels {label}")
        assert_same(got[1], ref[1], f"scale {label}")


@pytest.mark.parametrize("rule", ["max", "sawb"])
def test_quantize_propagates_nan_into_the_scale(rule):
    t = torch.randn(4, 100, device="cuda")
    t[1, 7] = float("nan")
    for granularity in ("tensor", "sample"):
        spec = QuantSpec(4, "signed", rule, 1.0, granularity)
        scale = CUPY.quantize(t, spec, None)[1]
        assert_same(scale.nan_to_num(7.0), quantize(t, spec)[1].nan_to_num(7.0), f"{rule} {granularity}")
        assert not torch.isfinite(scale).all()
        assert torch.isfinite(scale.flatten()[0]) == (granularity == "sample")


@pytest.mark.parametrize("spec", [QuantSpec(4, "auto", "max", 0.975), QuantSpec(4, "signed", "sawb"),
                                  QuantSpec(4, "signed", "max", 1.0, "sample", "stochastic")], ids=str)
def test_quantize_reads_a_channels_last_tensor_where_it_lies(spec):
    """A BatchNorm's channels-last output is quantized as it lies where the order cannot change a level (one
    scale, nearest rounding): levels and mask come back in its layout, as the reference's elementwise ops leave
    them; otherwise from a contiguous copy. Either way the reference's bits."""
    from hdqt_cil.quant.backend import TORCH_OPS

    t = (torch.randn(16, 24, 9, 7, generator=gen(3), device="cuda") * 5).contiguous(memory_format=torch.channels_last)
    counter = Counter(1, 2, 3)
    tallies = [torch.zeros(2, dtype=torch.int64, device="cuda") for _ in range(2)]
    got = CUPY.forward_quantize(t, spec, counter, "authors", tallies[0])
    ref = TORCH_OPS.forward_quantize(t, spec, counter, "authors", tallies[1])
    for what, kernel, reference in zip(("levels", "scale", "keep"), got, ref):
        assert_same(kernel, reference.to(kernel.dtype) if what == "keep" else reference, what)
    in_place = spec.granularity == "tensor" and spec.rounding == "nearest"
    assert got[0].is_contiguous(memory_format=torch.channels_last) == in_place
    assert got[2].stride() == got[0].stride()
    assert torch.equal(tallies[0], tallies[1])


DIVIDE_SOURCE = str(Path(__file__).resolve().parent / "cuda" / "divide.cu")


def _divide(v, s):
    out = torch.full_like(v, float("nan"))
    rt.launch(rt.function(DIVIDE_SOURCE, "divide_f32"), (264,), (256,),
              (rt.ptr(v), rt.ptr(s), rt.u32(s.numel()), rt.ptr(out)))
    return out


def test_divider_gives_the_ieee_quotient():
    """The quantizers' division by a scale (reciprocal, two remainder corrections, a fallback outside
    [2^-60, 2^60]) against torch's correctly rounded division: every bit pattern of v, scales across the whole
    range and at the edges of the fast path (and mantissas of all ones), so both paths and their border run."""
    g = gen(41)
    n = 1 << 22
    bits = torch.randint(-2**31, 2**31, (n,), generator=g, device="cuda", dtype=torch.int64).to(torch.int32)
    patterns = bits.view(torch.float32)  # every class: subnormal, NaN, inf, both zeros
    decades = torch.randn(n, generator=g, device="cuda") * 10.0 ** torch.randint(
        -20, 20, (n,), generator=g, device="cuda").float()
    edge = torch.ldexp(1 + torch.rand(n, generator=g, device="cuda") * 1e-6,
                       torch.randint(-62, 62, (n,), generator=g, device="cuda")) * -1.0
    v = torch.cat([patterns, decades, edge, torch.zeros(8, device="cuda"), -torch.zeros(8, device="cuda")])
    v = v[: v.numel() // 8 * 8]
    eights = v.numel() // 8
    scale_bits = torch.randint(0x00800000, 0x7f000000, (eights,), generator=g, device="cuda", dtype=torch.int64)
    s = scale_bits.to(torch.int32).view(torch.float32)
    special = torch.tensor([2.0**-60, 2.0**60, 2.0**-60 * (1 - 2**-24), 2.0**60 * (1 + 2**-23), 1.0, 3.0,
                            float.fromhex("0x1.fffffep-1"), float.fromhex("0x1.fffffep+3"), 0.1, 7 / 0.975],
                           device="cuda")
    s[: special.numel() * 1000] = special.repeat(1000)
    s = s[torch.randperm(eights, generator=g, device="cuda")]
    got = _divide(v, s)
    ref = v / s.repeat_interleave(8)
    both_nan = torch.isnan(got) & torch.isnan(ref)
    both_zero = (got == 0) & (ref == 0)  # a zero's sign may differ: no level shows it
    same = (got.view(torch.int32) == ref.view(torch.int32)) | both_nan | both_zero
    assert same.all(), f"{(~same).sum().item()} quotients differ, e.g. {v[~same][:4]} / ... -> {got[~same][:4]}"
    fast = (s >= 2.0**-60) & (s <= 2.0**60)
    fast &= ((v.abs() >= 2.0**-60) & (v.abs() <= 2.0**60) | (v == 0)).view(-1, 8).all(dim=1)
    assert 0.05 < fast.float().mean().item() < 0.95, "the inputs should take both paths"


def test_stochastic_rounding_depends_on_the_counter_only():
    t = torch.randn(1000, 37, generator=gen(9), device="cuda")
    spec = QuantSpec(4, "signed", "max", 1.0, "tensor", "stochastic")
    a = CUPY.quantize(t, spec, Counter(1, 2, 3))[0]
    assert torch.equal(a, CUPY.quantize(t.clone(), spec, Counter(1, 2, 3))[0])
    assert not torch.equal(a, CUPY.quantize(t, spec, Counter(1, 2, 4))[0])
    with pytest.raises(ValueError, match="Counter"):
        CUPY.quantize(t, spec, None)


def test_wide_levels_fall_back_to_the_reference():
    t = torch.randn(10, 10, device="cuda")
    spec = QuantSpec(12, "signed", "max")
    levels, scale = CUPY.quantize(t, spec)
    ref = quantize(t, spec)
    assert torch.equal(levels, ref[0]) and torch.equal(scale, ref[1])


@pytest.mark.parametrize("shape, granularity", [((6, 1024), "sample"), ((3, 2000, 9), "sample"), ((5, 8, 2048), "row"),
                                                ((4, 32768), "sample"), ((2, 16384), "row"), ((1000, 30), "tensor"),
                                                ((7, 5000), "row"), ((33, 33, 30), "tensor")], ids=str)
def test_single_pass_group_quantize(shape, granularity):
    """Groups of 1024..32768 elements (and whole tensors up to 32768) take the one-pass kernel."""
    g = gen(shape[-1])
    for rounding in ("nearest", "stochastic"):
        for signedness in ("signed", "unsigned", "auto"):
            spec = QuantSpec(4, signedness, "max", 0.975, granularity, rounding)
            for x in (torch.randn(shape, generator=g, device="cuda"),
                      torch.randint(-9, 9, shape, generator=g, device="cuda", dtype=torch.int8)):
                counter = Counter(3, 5, 7)
                assert_same(CUPY.quantize(x, spec, counter)[0], quantize(x, spec, counter)[0], str(spec))
                assert_same(CUPY.quantize(x, spec, counter)[1], quantize(x, spec, counter)[1], str(spec))


# ----------------------------------------------------------------------------------------------------- Hadamard

HADAMARD_CASES = [((8, 16), -1, None), ((3, 5, 4), -1, None), ((7, 100), -1, None), ((2, 561), -1, None),
                  ((128, 16, 1024), -1, None), ((5, 2048), -1, None), ((3, 8192), -1, None), ((1, 4096), -1, 512),
                  ((64, 3, 256), -1, 64), ((16, 32, 3), 1, None), ((12, 24, 6), 0, 4), ((9, 1024), -1, 2),
                  ((33, 8), -1, 8), ((1, 3, 2), -1, None), ((4, 16384), -1, None), ((4096, 1024), -1, None)]


def test_cases_reach_both_shapes_of_the_flat_kernels():
    """Hadamard kernels hold one run of 8 a thread below flat.FLAT_RUNS_FROM elements, four from there."""
    sizes = [math.prod(shape) for shape, _, _ in HADAMARD_CASES]
    assert min(sizes) < flat.FLAT_RUNS_FROM <= max(sizes)


@pytest.mark.parametrize("shape, dim, block", HADAMARD_CASES, ids=str)
def test_block_hadamard_bit_identical(shape, dim, block):
    g = gen(len(shape) * 1000 + shape[-1])
    x = torch.randn(shape, generator=g, device="cuda") * 10
    assert_same(CUPY.block_hadamard(x, dim, block), block_hadamard(x, dim, block), "float input")
    levels = torch.randint(-8, 16, shape, generator=g, device="cuda", dtype=torch.int8)
    assert_same(CUPY.block_hadamard(levels, dim, block), block_hadamard(levels, dim, block), "int8 input")
    t = x.transpose(0, -1)
    assert_same(CUPY.block_hadamard(t, dim, None), block_hadamard(t, dim, None), "strided input")


# HLA along a conv's tokens (block L', LP_L1 rank or another), one 4-run case (>= flat.FLAT_RUNS_FROM elements)
HLA_CASES = [((14, 144, 1024), 1024, None), ((9, 288, 256), 256, None), ((3, 5, 64), 64, None), ((2, 7, 96), 32, 5),
             ((1, 3, 8192), 8192, 100), ((8, 576, 1024), 1024, None), ((4, 33, 16), 16, 1), ((6, 2, 512), 128, 127)]


@pytest.mark.parametrize("shape, block, rank", HLA_CASES, ids=str)
def test_hla_compress_bit_identical(shape, block, rank):
    """The transform and its kept rows in one kernel (tokens last), as the reference's transform and gather; other
    dims take the transform kernel and the gather."""
    rank = hla_rank(block, rank)
    g = gen(shape[-1] * 7 + block)
    x = torch.randn(shape, generator=g, device="cuda") * 10
    assert_same(CUPY.hla_compress(x, block, rank), hla_compress(x, block, rank), "tokens last")
    t = x.transpose(-1, -2)
    assert_same(CUPY.hla_compress(t, block, rank, -2), hla_compress(t, block, rank, -2), "tokens along dim -2")


def test_block_hadamard_rejects_bad_blocks():
    with pytest.raises(ValueError, match="power of two"):
        CUPY.block_hadamard(torch.ones(4, 12, device="cuda"), -1, 8)


@pytest.mark.parametrize("spec", [SPECS[3], SPECS[4], SPECS[1], SPECS[9], SPECS[12]], ids=str)
@pytest.mark.parametrize("shape, block", [((128, 16, 1024), None), ((1, 128, 561), None), ((1, 561, 128), None),
                                          ((32, 1024, 64), None), ((2, 3, 8192), None), ((7, 96), 16),
                                          ((4, 40), None), ((3, 4096), 1024), ((4, 1024, 1024), None)], ids=str)
def test_hadamard_quantize_bit_identical(shape, block, spec):
    g = gen(shape[-1] + 7)
    counter = Counter(7, 11, 13)
    for x in (torch.randn(shape, generator=g, device="cuda"),
              torch.randint(-7, 8, shape, generator=g, device="cuda", dtype=torch.int8)):
        levels, scale = CUPY.hadamard_quantize(x, spec, counter, block)
        ref_levels, ref_scale = quantize(block_hadamard(x, -1, block), spec, counter)
        assert_same(levels, ref_levels, f"levels {x.dtype}")
        assert_same(scale, ref_scale, f"scale {x.dtype}")


@pytest.mark.parametrize("spec", [SPECS[0], SPECS[3], SPECS[4], SPECS[11]], ids=str)
@pytest.mark.parametrize("shape, block", [((5, 3), 1), ((64, 16, 32, 32), 1), ((3, 1000003), 1), ((128, 16, 1024), 16),
                                          ((1, 561, 128), 128), ((7, 96), 32)], ids=str)
def test_quantizers_write_their_scale_times_a_factor(shape, block, spec):
    """`times`: the scale returned is the reference's scale times the factor (one float32 product, as torch's),
    the levels unchanged; single-pass, two-pass and transformed quantizers, a SAWB scale through its fallback."""
    from hdqt_cil.quant.backend import TORCH_OPS

    g = gen(len(shape) * 131 + block)
    counter = Counter(3, 5, 8 * 2 + 5)
    transformed = block > 1 and spec.scale == "max"
    for factor in (torch.rand((), generator=g, device="cuda") / 3, torch.tensor(1e-30, device="cuda")):
        t = torch.randn(shape, generator=g, device="cuda")
        for ops in (CUPY, TORCH_OPS):
            if transformed:
                levels, scale = ops.hadamard_quantize(t, spec, counter, block, times=factor)
                plain_levels, plain_scale = ops.hadamard_quantize(t, spec, counter, block)
            else:
                levels, scale = ops.quantize(t, spec, counter, times=factor)
                plain_levels, plain_scale = ops.quantize(t, spec, counter)
            assert torch.equal(levels, plain_levels), f"{ops.name}: the factor changed the levels"
            assert not torch.equal(scale, plain_scale), "a factor of no effect tests nothing"
            if ops is CUPY:
                got = levels, scale
        assert_same(got[0], levels, "levels")
        assert_same(got[1], scale, "scale times the factor")
        assert_same(scale, plain_scale * factor, "the reference: its scale times the factor")


def test_advance_step_reads_and_advances_the_counter():
    counter = torch.tensor(41, dtype=torch.int64, device="cuda")
    step = kernels.advance_step(counter)
    assert (step.item(), counter.item()) == (41, 42)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        captured = kernels.advance_step(counter)
    torch.cuda.current_stream().wait_stream(stream)
    for expected in (43, 44):  # each replay reads the counter where it lies and advances it
        graph.replay()
        torch.cuda.synchronize()
        assert (captured.item(), counter.item()) == (expected - 1, expected)


# ----------------------------------------------------------------------------------------------------- GEMM

GEMM_SHAPES = [(1, 1, 1), (5, 7, 3), (16, 16, 32), (17, 9, 33), (128, 561, 561), (64, 64, 1000), (100, 130, 4096),
               (131, 257, 127), (300, 16, 144), (1000, 32, 288), (16, 144, 1024), (33, 200, 27), (8, 8, 5000)]
ACCUMULATORS = [(32, 8), (64, 8), (96, 10), (None, 8), (None, None), (32, 12), (32, 4), (128, 16), (32, 32)]


def int_operands(shape, batch=(), seed=0, low=-8, high=8, b_low=0, b_high=16):
    m, n, k = shape
    g = gen(seed)
    a = torch.randint(low, high, (*batch, m, k), generator=g, device="cuda", dtype=torch.int8)
    bt = torch.randint(b_low, b_high, (*batch, n, k), generator=g, device="cuda", dtype=torch.int8)
    return a, bt.transpose(-1, -2)  # b (..., K, N) with K contiguous: the layers' layout


def reference_product(a, b, tile, acc_bits, count=True):
    bound = (max(a.max().item(), -a.min().item()), max(b.max().item(), -b.min().item()))
    return tiled_int_matmul(a.float(), b.float(), tile, acc_bits, bounds=bound, count_saturated=count)


@pytest.mark.parametrize("tile, acc_bits", ACCUMULATORS, ids=str)
@pytest.mark.parametrize("shape", GEMM_SHAPES, ids=str)
def test_tiled_int_matmul_bit_identical(shape, tile, acc_bits):
    for seed, (lo, hi, blo, bhi) in enumerate(((-7, 8, 0, 16), (-7, 8, -7, 8), (-128, 128, -128, 128))):
        a, b = int_operands(shape, seed=seed, low=lo, high=hi, b_low=blo, b_high=bhi)
        out, count = CUPY.tiled_int_matmul(a, b, tile, acc_bits, count_saturated=True)
        ref, ref_count = reference_product(a, b, tile, acc_bits)
        assert_same(out, ref, f"values, operands {lo}..{hi - 1}")
        assert count.dtype == torch.int64 and count.item() == ref_count.item()
        # without the count, tile 32 with 4-bit operands takes the packed (16-bit halves) mode
        assert_same(CUPY.tiled_int_matmul(a, b, tile, acc_bits), ref, f"no count, operands {lo}..{hi - 1}")


@pytest.mark.parametrize("batch_a, batch_b", [((4,), (4,)), ((3,), ()), ((), (5,)), ((2, 3), (2, 3)), ((1,), (6,))])
def test_batched_and_broadcast(batch_a, batch_b):
    m, n, k = 37, 50, 300
    g = gen(3)
    a = torch.randint(-7, 8, (*batch_a, m, k), generator=g, device="cuda", dtype=torch.int8)
    bt = torch.randint(-7, 8, (*batch_b, n, k), generator=g, device="cuda", dtype=torch.int8)
    b = bt.transpose(-1, -2)
    for tile, acc_bits in ((32, 8), (None, 8)):
        out, count = CUPY.tiled_int_matmul(a, b, tile, acc_bits, count_saturated=True)
        ref, ref_count = reference_product(a, b, tile, acc_bits)
        assert_same(out, ref)
        assert count.item() == ref_count.item()
    # scaled, per-sample and per-row scales on a (one stacked product when b has no batch), per-column on b
    lead = torch.broadcast_shapes(batch_a, batch_b)
    for sa in (torch.rand((*lead, 1, 1), generator=g, device="cuda"), torch.rand((*lead, m, 1), generator=g,
                                                                                   device="cuda")):
        sb = torch.rand((1, n), generator=g, device="cuda")
        out = CUPY.scaled_int_matmul(a, b, sa, sb, 8, 32, 8)
        assert_same(out, reference_product(a, b, 32, 8, count=False).to(torch.float32) * ((sa * sb) / 8))


def test_layouts_and_dtypes_that_need_a_copy():
    g = gen(4)
    a = torch.randint(-7, 8, (70, 90), generator=g, device="cuda").float()       # float levels
    b = torch.randint(-7, 8, (90, 45), generator=g, device="cuda").float()       # N contiguous, not K
    at = torch.randint(-7, 8, (90, 70), generator=g, device="cuda", dtype=torch.int8).t()  # M contiguous
    for x, y in ((a, b), (at, b), (a[:, 1:], b[1:]), (a.to(torch.int8), b.to(torch.int8))):
        assert_same(CUPY.tiled_int_matmul(x, y, 32, 8), reference_product(x, y, 32, 8, count=False))
        assert_same(CUPY.tiled_int_matmul(x, y, 32, 8, bounds=(7, 7)), reference_product(x, y, 32, 8, False))
    # batches of M-major int8 levels on both sides (the transposing kernel), one of them sliced
    at3 = torch.randint(-7, 8, (3, 130, 200), generator=g, device="cuda", dtype=torch.int8).transpose(-1, -2)
    b3 = torch.randint(-7, 8, (3, 130, 67), generator=g, device="cuda", dtype=torch.int8)
    for x, y in ((at3, b3), (at3[:, 5:150], b3[:, :, 3:])):
        assert_same(CUPY.tiled_int_matmul(x, y, 32, 8), reference_product(x, y, 32, 8, count=False))


def test_wide_sums_come_back_as_float64_like_the_reference():
    a, b = int_operands((20, 30, 2000), low=-128, high=128, b_low=-128, b_high=128)
    out = CUPY.tiled_int_matmul(a, b, None, None)
    ref = reference_product(a, b, None, None, count=False)
    assert out.dtype == ref.dtype == torch.float64
    assert_same(out, ref)


def test_odd_tiles_fall_back_with_a_warning():
    a, b = int_operands((10, 12, 100))
    with pytest.warns(UserWarning, match="multiple of 32"):
        out = CUPY.tiled_int_matmul(a, b, 20, 8)
    assert_same(out, reference_product(a, b, 20, 8, count=False))


@pytest.mark.parametrize("config", sorted(GEMM_CONFIGS))
def test_every_gemm_config(config):
    """Each CTA tile the dispatcher may pick, on shapes with ragged M, N and K, all accumulator modes."""
    if not runs_here(config):
        pytest.skip(f"{config} needs an sm_90 GPU")
    for shape, batch, low in (((300, 260, 1000), (), -128), ((70, 45, 129), (3,), -128), ((260, 300, 2000), (), -7)):
        a, b = int_operands(shape, batch=batch, seed=11, low=low, high=-low, b_low=low, b_high=-low)
        for tile, acc_bits in ((32, 8), (32, 10), (64, 8), (None, 8), (None, None)):
            for count in (False, True):
                got = kernels.tiled_int_matmul(a, b, tile, acc_bits, None, count, config=config)
                ref = reference_product(a, b, tile, acc_bits, count=count)
                if count:
                    assert_same(got[0], ref[0], f"{config} {tile} {acc_bits}")
                    assert got[1].item() == ref[1].item()
                else:
                    assert_same(got, ref, f"{config} {tile} {acc_bits}")
        if low == -7:  # the packed mode must have been eligible here; compare it with the plain one too
            for count in (False, True):
                plain = kernels.tiled_int_matmul(a, b, 32, 8, None, count, config=config, packed=False)
                got = kernels.tiled_int_matmul(a, b, 32, 8, None, count, config=config)
                assert_same(got[0] if count else got, plain[0] if count else plain, f"packed, count={count}")
                if count:
                    assert got[1].item() == plain[1].item()
        sa = torch.rand((*batch, shape[0], 1), device="cuda")
        sb = torch.rand((*batch, 1, shape[1]), device="cuda")
        got = kernels.scaled_int_matmul(a, b, sa, sb, 16, 32, 8, config=config)
        assert_same(got, reference_product(a, b, 32, 8, count=False).to(torch.float32) * ((sa * sb) / 16))


@pytest.mark.parametrize("granularity", ["tensor", "sample", "row"])
def test_scaled_int_matmul_equals_the_layers_epilogue(granularity):
    batch, m, n, k = 6, 70, 90, 200
    a, b = int_operands((m, n, k), batch=(batch,), seed=8)
    g = gen(8)
    shapes = {"tensor": ((), ()), "sample": ((batch, 1, 1), (batch, 1, 1)), "row": ((batch, m, 1), (batch, 1, n))}
    sa = torch.rand(shapes[granularity][0], generator=g, device="cuda") / 7
    sb = torch.rand(shapes[granularity][1], generator=g, device="cuda") / 3
    for block in (1, 64):
        out, count = CUPY.scaled_int_matmul(a, b, sa, sb, block, 32, 8, count_saturated=True)
        acc, ref_count = reference_product(a, b, 32, 8)
        assert_same(out, acc.to(torch.float32) * ((sa * sb) / block))
        assert count.item() == ref_count.item()


# M x N of 1024 x 640 is 160 tiles of 64 x 64, at least one per SM of an H100 / H200: the batch is summed in the
# GEMM's epilogue; 70 x 90 is summed by the separate kernel after the per-entry products.
@pytest.mark.parametrize("shape", [(1024, 640, 197), (70, 90, 300), (1024, 640, 64)], ids=str)
@pytest.mark.parametrize("tile, acc_bits", [(32, 8), (64, 8), (None, 8), (None, None)], ids=str)
@pytest.mark.parametrize("config", [None, *sorted(WGMMA_CONFIGS)])
def test_batch_summed_product_bit_identical(shape, tile, acc_bits, config):
    """sum_batch: the batch added in order from +0 (quant.sum_entries), per-entry and per-row/column scales; by
    the default tile and by each wgmma one."""
    from hdqt_cil.quant.backend import TORCH_OPS

    if config is not None and not runs_here(config):
        pytest.skip(f"{config} needs an sm_90 GPU")
    m, n, _ = shape
    for batch, seed, block in (((5,), 30, 16), ((1,), 31, 1), ((2, 3), 32, 4)):
        a, b = int_operands(shape, batch=batch, seed=seed)
        g = gen(seed)
        scales = (((*batch, 1, 1), (*batch, 1, 1)), ((*batch, m, 1), (*batch, 1, n)), ((), ()))
        for sa_shape, sb_shape in scales:
            sa = torch.rand(sa_shape, generator=g, device="cuda") / 7 - 0.05  # some negative: signed zeros too
            sb = torch.rand(sb_shape, generator=g, device="cuda") / 3
            got, count = kernels.scaled_int_matmul(a, b, sa, sb, block, tile, acc_bits, (8, 15), True,
                                                      sum_batch=True, config=config)
            ref, ref_count = TORCH_OPS.scaled_int_matmul(a.float(), b.float(), sa, sb, block, tile, acc_bits, (8, 15),
                                                         True, sum_batch=True)
            assert_same(got, ref, f"batch {batch}, scales {sa_shape} {sb_shape}")
            assert torch.equal(torch.signbit(got), torch.signbit(ref))
            assert count.item() == ref_count.item()
            plain = kernels.scaled_int_matmul(a, b, sa, sb, block, tile, acc_bits, (8, 15), sum_batch=True,
                                              config=config)
            assert_same(plain, ref, "without the count (packed mode where eligible)")


@pytest.mark.parametrize("shape", [(70, 90, 300), (1024, 640, 64)], ids=str)  # summed after the GEMM, inside it
def test_batch_sum_times_the_estimators_mask(shape):
    """keep: the batch sum times a bool mask (signed zeros kept) in the summing pass, as the reference's product."""
    from hdqt_cil.quant.backend import TORCH_OPS

    m, n, _ = shape
    a, b = int_operands(shape, batch=(6,), seed=40)
    g = gen(41)
    sa = torch.rand((6, 1, 1), generator=g, device="cuda") - 0.5
    sb = torch.rand((), generator=g, device="cuda")
    keep = torch.rand((m, n), generator=g, device="cuda") > 0.3
    got = CUPY.scaled_int_matmul(a, b, sa, sb, 4, 32, 8, (8, 15), sum_batch=True, keep=keep)
    ref = TORCH_OPS.scaled_int_matmul(a.float(), b.float(), sa, sb, 4, 32, 8, (8, 15), sum_batch=True, keep=keep)
    assert_same(got, ref)
    assert torch.equal(torch.signbit(got), torch.signbit(ref))
    assert torch.signbit(ref[~keep]).any(), "no negative sum masked: the sign of zero is untested"
    with pytest.raises(ValueError, match="keep"):
        CUPY.scaled_int_matmul(a, b, sa, sb, 4, 32, 8, (8, 15), keep=keep)


def test_sum_entries_kernel_keeps_the_order():
    from hdqt_cil.quant import sum_entries

    g = gen(33)
    x = torch.randn(64, 33, 70, generator=g, device="cuda") * torch.logspace(-3, 8, 64, device="cuda")[:, None, None]
    x[0, 0, 0] = -0.0
    got = kernels.sum_entries(x)
    ref = sum_entries(x)
    assert_same(got, ref)
    assert torch.equal(torch.signbit(got), torch.signbit(ref))
    assert not torch.equal(ref, x.sum(dim=0)), "inputs too tame: any order would give these bits"


# --------------------------------------------------------------------------------------------- im2col, col2im

CONV_CASES = [  # x shape, kernel, padding, dilation, stride
    ((128, 16, 32, 32), (3, 3), (1, 1), (1, 1), (1, 1)),  # ResNet-32's stages
    ((128, 32, 16, 16), (3, 3), (1, 1), (1, 1), (2, 2)),
    ((3, 5, 7, 9), (1, 1), (0, 0), (1, 1), (1, 1)),
    ((2, 3, 11, 13), (5, 3), (2, 1), (1, 2), (2, 3)),
    ((1, 1, 4, 4), (3, 3), (3, 3), (2, 2), (1, 1)),  # more padding than input
    ((96, 13, 32, 32), (3, 3), (1, 1), (1, 1), (1, 1)),  # col2im: warps of 8 channels, the last with 5 idle lanes
]


@pytest.mark.parametrize("columns", [False, True])
@pytest.mark.parametrize("dtype", [torch.int8, torch.float32])
@pytest.mark.parametrize("x_shape, kernel, padding, dilation, stride", CONV_CASES + [
    ((128, 3, 32, 32), (3, 3), (1, 1), (1, 1), (1, 1)),  # ResNet-32's first conv: K = 27, rows across vectors
    ((5, 7, 3, 2), (2, 2), (0, 1), (1, 1), (1, 1)),  # output sizes no vector divides
])
def test_im2col_bit_identical(x_shape, kernel, padding, dilation, stride, dtype, columns):
    from hdqt_cil.quant.im2col import im2col

    x = (torch.randn(x_shape, generator=gen(43), device="cuda") * 40).clamp(-100, 100).to(dtype)  # < 0x7f poison
    if dtype.is_floating_point:
        x[0, 0, 0, 0] = -0.0
    layouts = {"contiguous": x, "transposed": x.transpose(2, 3).contiguous().transpose(2, 3),
               "channels-last": x.contiguous(memory_format=torch.channels_last),
               "a batch slice": torch.cat([x, x]).contiguous(memory_format=torch.channels_last)[x_shape[0]:]}
    for layout, x in layouts.items():  # read where it lies, without a copy
        got = CUPY.im2col(x, kernel, padding, dilation, stride, columns)
        ref = im2col(x, kernel, padding, dilation, stride, columns)
        assert got.is_contiguous() and got.dtype == dtype
        assert_same(got, ref, f"{x_shape} {kernel} columns={columns} {layout}")
        if dtype.is_floating_point:
            assert torch.equal(torch.signbit(got), torch.signbit(ref))


@pytest.mark.parametrize("x_shape, kernel, padding, dilation, stride", CONV_CASES)
def test_col2im_bit_identical(x_shape, kernel, padding, dilation, stride):
    from hdqt_cil.quant.im2col import col2im, conv_output_size

    out_h, out_w = conv_output_size(x_shape, kernel, padding, dilation, stride)
    k = x_shape[1] * kernel[0] * kernel[1]
    g = gen(41)
    rows = torch.randn(x_shape[0], out_h * out_w, k, generator=g, device="cuda")
    rows *= torch.logspace(-20, 20, k, device="cuda")  # magnitudes far apart: the order of the adds shows
    rows[0, 0, 0] = -0.0
    got = CUPY.col2im(rows, x_shape, kernel, padding, dilation, stride)
    ref = col2im(rows, x_shape, kernel, padding, dilation, stride)
    assert got.stride() == ref.stride()  # the layout too: it decides which kernels the layers before it run
    assert_same(got, ref, f"{x_shape} {kernel}")
    assert torch.equal(torch.signbit(got), torch.signbit(ref))
    keep = torch.rand(x_shape, generator=g, device="cuda") < 0.7
    rows[0, 1, 1] = float("inf")  # inf * 0 is NaN, as in the reference's product
    expected = col2im(rows, x_shape, kernel, padding, dilation, stride) * keep
    for layout in (torch.contiguous_format, torch.channels_last):  # the mask as the forward's quantizer left it
        masked = CUPY.col2im(rows, x_shape, kernel, padding, dilation, stride, keep.contiguous(memory_format=layout))
        assert masked.stride() == expected.stride()
        assert torch.equal(masked.nan_to_num(7.0), expected.nan_to_num(7.0)), f"{x_shape} {kernel} {layout} mask"
        assert torch.equal(torch.signbit(masked), torch.signbit(expected))


@pytest.mark.parametrize("x_shape, out_channels, stride", [((8, 16, 32, 32), 16, 1), ((6, 16, 32, 32), 32, 2),
                                                             ((4, 64, 8, 8), 64, 1), ((3, 5, 7, 9), 64, 1),
                                                             ((2, 3, 11, 6), 16, 2)], ids=str)
@pytest.mark.parametrize("tile, acc_bits", [(None, 8), (32, 8), (16, 6), (None, None)], ids=str)
def test_col2im_of_the_product_bit_identical(x_shape, out_channels, stride, tile, acc_bits):
    """The input gradient folded into one kernel: col2im(scaled_int_matmul(G, Wᵀ)) * keep, its layout, and the
    product's saturation count over every element (those that col2im drops into the padding too)."""
    from hdqt_cil.quant.backend import TORCH_OPS
    from hdqt_cil.quant.im2col import conv_output_size

    batch, channels = x_shape[:2]
    geometry = ((3, 3), (1, 1), (1, 1), (stride, stride))
    out_h, out_w = conv_output_size(x_shape, *geometry)
    g = gen(sum(x_shape) + out_channels + stride)
    a = torch.randint(-7, 8, (batch, out_h * out_w, out_channels), generator=g, device="cuda", dtype=torch.int8)
    w = torch.randint(-7, 8, (channels * 9, out_channels), generator=g, device="cuda", dtype=torch.int8)
    scale_sets = ((torch.rand(batch, 1, 1, generator=g, device="cuda"), torch.rand((), device="cuda")),
                  (torch.rand((), device="cuda"), torch.rand(1, channels * 9, generator=g, device="cuda")),
                  (torch.rand(batch, out_h * out_w, 1, generator=g, device="cuda"), torch.rand((), device="cuda")))
    mask = torch.rand(x_shape, generator=g, device="cuda") < 0.8
    for (sa, sb), keep in zip(scale_sets, (None, mask, mask.contiguous(memory_format=torch.channels_last))):
        tallies = [torch.full((2,), 2, dtype=torch.int64, device="cuda") for _ in range(2)]
        args = (sa, sb, 16, tile, acc_bits, (7, 7), x_shape, *geometry)
        weight = w.t() if keep is None else w.t().contiguous()  # (O, K) rows as the forward's levels: packed first
        got = kernels.col2im_int_matmul(a, weight, *args, conv_output_size(x_shape, *geometry), keep, tallies[0])
        # a mask in any layout; the gradient comes back contiguous, as the product with a contiguous mask is
        ref = TORCH_OPS.col2im_int_matmul(a.float(), w.t().float(), *args, None if keep is None else keep.contiguous(),
                                          tallies[1])
        assert got.stride() == ref.stride()
        assert_same(got, ref, f"scales {tuple(sa.shape)} {tuple(sb.shape)}, mask {keep is not None}")
        assert torch.equal(tallies[0], tallies[1]), f"{tallies[0].tolist()} against {tallies[1].tolist()}"
        assert tallies[1][0] > 2 or acc_bits is None, "nothing saturated: the count is untested"


def test_col2im_of_the_product_leaves_odd_operands_to_the_reference():
    from hdqt_cil.quant.backend import TORCH_OPS

    a = torch.randint(-7, 8, (2, 16, 24), device="cuda", dtype=torch.int8)  # O = 24: not a multiple of 16
    w = torch.randint(-7, 8, (27, 24), device="cuda", dtype=torch.int8)
    args = (torch.rand((), device="cuda"), torch.rand((), device="cuda"), 1, None, 8, (7, 7), (2, 3, 4, 4), (3, 3),
            (1, 1), (1, 1), (1, 1))
    with pytest.raises(rt.NotCovered):
        kernels.col2im_int_matmul(a, w.t(), *args, (4, 4))
    assert_same(CUPY.col2im_int_matmul(a, w.t(), *args), TORCH_OPS.col2im_int_matmul(a.float(), w.t().float(), *args))


# ----------------------------------------------------------------------------------------------------- training


def train_three_steps(model_name, scheme_name, backend, batch=128):
    from hdqt_cil.models import build_model

    torch.manual_seed(0)
    shape, classes = ((561,), 11) if model_name == "mlp" else ((3, 32, 32), 10)
    model = build_model(model_name, shape, classes).cuda()
    scheme = dataclasses.replace(preset(scheme_name), backend=backend)
    model = quantize_model(model, scheme)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator(device="cuda").manual_seed(1)
    torch.backends.cudnn.deterministic = True  # HOT's float forward runs cuDNN's convolutions
    for _ in range(3):
        x = torch.randn(batch, *shape, generator=g, device="cuda")
        y = torch.randint(0, classes, (batch,), generator=g, device="cuda")
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    torch.cuda.synchronize()
    return model


class CheckedOps:
    """Every op of a training step run by both backends on the same inputs; the kernels' result goes on, each
    difference is recorded (op, inputs, how many elements differ)."""
    name = "checked"

    def __init__(self):
        from hdqt_cil.quant.backend import TORCH_OPS

        self.ref, self.differences, self.calls = TORCH_OPS, [], 0

    @staticmethod
    def _describe(t):
        return f"{tuple(t.shape)}/{t.stride()}/{t.dtype}" if torch.is_tensor(t) else repr(t)

    def _compare(self, op, inputs, got, ref):
        self.calls += 1
        got = got if isinstance(got, tuple) else (got,)
        ref = ref if isinstance(ref, tuple) else (ref,)
        for i, (x, y) in enumerate(zip(got, ref)):
            x, y = x.double(), y.double()
            if x.shape != y.shape or not torch.equal(x, y):
                bad = (x != y).sum().item() if x.shape == y.shape else "shape"
                self.differences.append(f"{op} output {i}: {bad} differ; inputs {[self._describe(t) for t in inputs]}")

    def _with_outputs(self, op, inputs, run, *outputs):
        """run(ops, *outputs) by both backends, each on its own copies of the device tensors the op adds to
        (statistics, the largest scale): results and those tensors compared, the kernels' kept."""
        mine = [None if o is None else o.clone() for o in outputs]
        theirs = [None if o is None else o.clone() for o in outputs]
        got, ref = run(CUPY, *mine), run(self.ref, *theirs)
        got_t, ref_t = (got if isinstance(got, tuple) else (got,)), (ref if isinstance(ref, tuple) else (ref,))
        self._compare(op, inputs, tuple(x for x in got_t if x is not None) + tuple(m for m in mine if m is not None),
                      tuple(y for y in ref_t if y is not None) + tuple(t for t in theirs if t is not None))
        for out, value in zip(outputs, mine):
            if out is not None:
                out.copy_(value)
        return got

    def quantize(self, t, spec, counter=None, worst=None, times=None):
        return self._with_outputs("quantize", (t, spec, counter, times),
                                  lambda ops, w: ops.quantize(t, spec, counter, worst=w, times=times), worst)

    def advance_step(self, counter):
        return self._with_outputs("advance_step", (counter,), lambda ops, c: ops.advance_step(c), counter)

    def forward_quantize(self, t, spec, counter=None, ste="none", tally=None, worst=None):
        return self._with_outputs("forward_quantize", (t, spec, counter, ste),
                                  lambda ops, c, w: ops.forward_quantize(t, spec, counter, ste, c, w), tally, worst)

    def block_hadamard(self, x, dim=-1, block=None):
        got, ref = CUPY.block_hadamard(x, dim, block), self.ref.block_hadamard(x, dim, block)
        self._compare("block_hadamard", (x, dim, block), got, ref)
        return got

    def hla_compress(self, t, block, rank, dim=-1):
        got, ref = CUPY.hla_compress(t, block, rank, dim), self.ref.hla_compress(t, block, rank, dim)
        self._compare("hla_compress", (t, block, rank, dim), got, ref)
        return got

    def tiled_int_matmul(self, a, b, tile=32, acc_bits=8, bounds=None, count_saturated=False):
        got = CUPY.tiled_int_matmul(a, b, tile, acc_bits, bounds, count_saturated)
        ref = self.ref.tiled_int_matmul(a, b, tile, acc_bits, bounds, count_saturated)
        self._compare("tiled_int_matmul", (a, b, tile, acc_bits, bounds), got, ref)
        return got

    def hadamard_quantize(self, x, spec, counter=None, block=None, dim=-1, worst=None, times=None):
        return self._with_outputs("hadamard_quantize", (x, spec, counter, block, dim, times),
                                  lambda ops, w: ops.hadamard_quantize(x, spec, counter, block, dim, worst=w,
                                                                       times=times), worst)

    def scaled_int_matmul(self, a, b, scale_a, scale_b, block=1, tile=32, acc_bits=8, bounds=None,
                          count_saturated=False, sum_batch=False, tally=None, keep=None, acc_format=None):
        args = (a, b, scale_a, scale_b, block, tile, acc_bits, bounds, count_saturated, sum_batch)
        return self._with_outputs("scaled_int_matmul", (*args[:8], keep, acc_format),
                                  lambda ops, c: ops.scaled_int_matmul(*args, tally=c, keep=keep,
                                                                       acc_format=acc_format), tally)

    def col2im_int_matmul(self, a, b, scale_a, scale_b, block, tile, acc_bits, bounds, x_shape, kernel_size, padding,
                          dilation, stride, keep=None, tally=None, acc_format=None):
        args = (a, b, scale_a, scale_b, block, tile, acc_bits, bounds, x_shape, kernel_size, padding, dilation, stride,
                keep)
        return self._with_outputs("col2im_int_matmul", (*args, acc_format),
                                  lambda ops, c: ops.col2im_int_matmul(*args, tally=c, acc_format=acc_format), tally)

    def im2col(self, x, kernel_size, padding, dilation, stride, columns=False):
        args = (x, kernel_size, padding, dilation, stride, columns)
        got, ref = CUPY.im2col(*args), self.ref.im2col(*args)
        self._compare("im2col", args, got, ref)
        return got

    def col2im(self, rows, x_shape, kernel_size, padding, dilation, stride, keep=None):
        args = (rows, x_shape, kernel_size, padding, dilation, stride, keep)
        got, ref = CUPY.col2im(*args), self.ref.col2im(*args)
        self._compare("col2im", args, got, ref)
        return got


@pytest.mark.parametrize("scheme", ["hdqt", "int4", "luq", "hot"])
@pytest.mark.parametrize("model_name", ["mlp", "resnet32"])
def test_every_op_of_a_training_step_matches(model_name, scheme, monkeypatch):
    """Per op, on identical inputs (so the check does not depend on the rest of the step being deterministic)."""
    from hdqt_cil.quant import layers

    checked = CheckedOps()
    monkeypatch.setattr(layers, "resolve_ops", lambda backend, device: checked)
    train_three_steps(model_name, scheme, "torch")
    assert checked.calls > 0
    assert not checked.differences, "\n".join(checked.differences[:20])


@pytest.mark.parametrize("scheme", ["luq", "hot"])
@pytest.mark.parametrize("model_name", ["mlp", "resnet32"])
def test_reference_training_is_deterministic(model_name, scheme):
    """What the same-weights test below assumes of everything outside the kernels."""
    first, second = (train_three_steps(model_name, scheme, "torch").state_dict() for _ in range(2))
    differ = [name for name in first if not torch.equal(first[name], second[name])]
    assert not differ, f"the torch backend alone is not reproducible: {differ[:5]}"


@pytest.mark.parametrize("scheme", ["hdqt", "int4", "luq", "hot"])
@pytest.mark.parametrize("model_name", ["mlp", "resnet32"])
def test_training_steps_give_the_same_weights(model_name, scheme):
    reference = train_three_steps(model_name, scheme, "torch")
    fast = train_three_steps(model_name, scheme, "cupy")
    ref_state, state = reference.state_dict(), fast.state_dict()
    differ = [name for name in ref_state if not torch.equal(ref_state[name], state[name])]
    detail = {name: (state[name].float() - ref_state[name].float()).abs().max().item() for name in differ}
    assert not differ, f"{len(differ)} tensors differ (max |diff|): {detail}"
    assert quant_stats(reference) == quant_stats(fast)


@pytest.mark.parametrize("scheme", ["hdqt", "int4", "luq"])
def test_a_resnet_step_runs_the_fused_kernels(scheme, monkeypatch):
    """Every convolution's input gradient of ResNet-32 (16-64 output channels) is one col2im_int_matmul launch and
    every forward operand one quantizer pass: a layout an op does not cover would fall back to the reference's
    composition silently, with the same bits and less speed."""
    launched, missed = [], []

    def watched(name):
        kernel = getattr(kernels, name)

        def call(*args, **kwargs):
            try:
                out = kernel(*args, **kwargs)
            except rt.NotCovered as miss:
                missed.append(f"{name}: {miss}")
                raise
            launched.append(name)
            return out
        monkeypatch.setattr(kernels, name, call)

    for name in ("col2im_int_matmul", "forward_quantize", "scaled_int_matmul"):
        watched(name)
    train_three_steps("resnet32", scheme, "cupy", batch=16)
    assert not missed, missed[:5]
    assert launched.count("col2im_int_matmul") == 3 * 30  # every 3x3 conv but the first (no input gradient)


def test_fused_ops_match_the_torch_backend():
    from hdqt_cil.quant.backend import TORCH_OPS

    g = gen(21)
    x = torch.randn(8, 40, 256, generator=g, device="cuda")
    spec = QuantSpec(4, "signed", "max", 1.0, "sample", "stochastic")
    for got, ref in zip(CUPY.hadamard_quantize(x, spec, Counter(1, 2, 3)),
                        TORCH_OPS.hadamard_quantize(x, spec, Counter(1, 2, 3))):
        assert_same(got, ref)
    a, b = int_operands((50, 70, 300), batch=(4,), seed=22)
    sa, sb = torch.rand(4, 1, 1, device="cuda"), torch.rand(4, 1, 70, device="cuda")
    got = CUPY.scaled_int_matmul(a, b, sa, sb, 8, 32, 8, (7, 15), True)
    ref = TORCH_OPS.scaled_int_matmul(a.float(), b.float(), sa, sb, 8, 32, 8, (7, 15), True)
    assert_same(got[0], ref[0])
    assert got[1].item() == ref[1].item()


FORWARD_SPECS = [QuantSpec(4, "auto", "max", 0.975), QuantSpec(4, "signed", "max", 0.975),
                 QuantSpec(3, "unsigned", "max", 0.9, "tensor", "stochastic"), QuantSpec(4, "auto", "sawb"),
                 QuantSpec(4, "signed", "sawb")]


@pytest.mark.parametrize("spec", FORWARD_SPECS, ids=str)
@pytest.mark.parametrize("shape", [(7,), (5, 3), (33, 17), (128, 561), (64, 16, 32, 32), (3, 100003)], ids=str)
def test_forward_quantize_counts_and_masks_in_its_pass(shape, spec):
    """Levels, scale, keep mask, clipped count and the largest scale as the reference composes them, every STE,
    on the one-pass (small) and two-pass (large) kernels; odd sizes leave a partial run of 8."""
    from hdqt_cil.quant.backend import TORCH_OPS

    for k, (label, t) in enumerate(inputs(shape, zlib.crc32(f"fwd{shape}{spec}".encode()))):
        t = t * 40 if k == 0 else t  # beyond the authors' raw threshold (7) too
        for ste in ("authors", "clip", "none"):
            counter = Counter(seed=7 + k, step=11, role=3)
            tallies = [torch.full((2,), 5, dtype=torch.int64, device="cuda") for _ in range(2)]
            worsts = [torch.full((), 0.5, device="cuda") for _ in range(2)]
            got = CUPY.forward_quantize(t, spec, counter, ste, tallies[0], worsts[0])
            ref = TORCH_OPS.forward_quantize(t, spec, counter, ste, tallies[1], worsts[1])
            what = f"{label}, ste {ste}"
            assert_same(got[0], ref[0], f"levels {what}")
            assert_same(got[1], ref[1], f"scale {what}")
            assert (got[2] is None) == (ste == "none"), what
            if got[2] is not None:
                assert got[2].dtype == torch.bool and torch.equal(got[2], ref[2]), f"keep {what}"
            assert torch.equal(tallies[0], tallies[1]), f"tally {what}: {tallies[0].tolist()} {tallies[1].tolist()}"
            assert_same(worsts[0], worsts[1], f"worst {what}")
        assert tallies[1][0] > 5 or spec.clip == 1.0, "no value clipped: the count is untested"


def test_forward_quantize_counts_a_nan_and_reports_it():
    spec = QuantSpec(4, "signed", "max", 0.975)
    t = torch.randn(64, 300, generator=gen(41), device="cuda")
    t[3, 7] = float("nan")
    tally, worst = torch.zeros(2, dtype=torch.int64, device="cuda"), torch.zeros((), device="cuda")
    levels, scale, keep = CUPY.forward_quantize(t, spec, None, "clip", tally, worst)
    assert torch.isnan(worst) and torch.isnan(scale)
    assert tally[1].item() == t.numel() and tally[0].item() == t.numel()  # every quotient by a NaN scale is NaN
    assert not keep.any()


@pytest.mark.parametrize("tile, acc_bits", [(32, 8), (64, 8), (None, 8), (None, None)], ids=str)
def test_products_add_their_counts_to_the_tally(tile, acc_bits):
    """The GEMM adds (saturated tile sums, tile sums) to the caller's pair: stacked, batched and batch-summed."""
    from hdqt_cil.quant.backend import TORCH_OPS

    for batch, b_batch, sum_batch in (((6,), (6,), False), ((6,), (), False), ((64,), (64,), True), ((2,), (2,), True)):
        a, b = int_operands((1024 if sum_batch else 70, 640 if sum_batch else 90, 200), batch=batch, seed=9)
        b = b[0] if not b_batch else b
        sa, sb = torch.rand(*batch, 1, 1, device="cuda"), torch.rand((), device="cuda")
        tallies = [torch.full((2,), 3, dtype=torch.int64, device="cuda") for _ in range(2)]
        got = CUPY.scaled_int_matmul(a, b, sa, sb, 4, tile, acc_bits, (8, 15), sum_batch=sum_batch, tally=tallies[0])
        ref = TORCH_OPS.scaled_int_matmul(a.float(), b.float(), sa, sb, 4, tile, acc_bits, (8, 15),
                                          sum_batch=sum_batch, tally=tallies[1])
        assert_same(got, ref, f"batch {batch}")
        assert torch.equal(tallies[0], tallies[1]), f"{batch}: {tallies[0].tolist()} against {tallies[1].tolist()}"
        assert tallies[1][0] > 3 or acc_bits is None, "nothing saturated: the count is untested"


def test_quantizers_raise_the_largest_scale():
    spec = QuantSpec(4, "signed", "max", 1.0, "sample", "stochastic")
    x = torch.randn(8, 40, 256, generator=gen(42), device="cuda") * torch.arange(1, 9, device="cuda")[:, None, None]
    for op, args in (("quantize", ()), ("hadamard_quantize", (64,))):
        worst = torch.full((), 0.25, device="cuda")
        _, scale = getattr(CUPY, op)(x, spec, Counter(1, 2, 3), *args, worst=worst)
        assert_same(worst, scale.amax(), op)
        x[5, 3, 9] = float("inf")
        getattr(CUPY, op)(x, spec, Counter(1, 2, 3), *args, worst=worst)
        assert not torch.isfinite(worst), op
        x[5, 3, 9] = 1.0


def test_backend_cupy_resolves_to_the_kernels():
    from hdqt_cil.quant.backend import resolve_ops

    assert resolve_ops("cupy", torch.device("cuda")).name == "cupy"
    assert resolve_ops("auto", torch.device("cuda")).name == "cupy"
    assert resolve_ops("torch", torch.device("cuda")).name == "torch"


# ------------------------------------------------------------------------------------ block-scaled E2M1 products

def _e2m1_operand(shape, scaling, seed):
    """A random operand rounded along its last dim as mxfp4 ('mx') or nvfp4 ('nv') round one, magnitudes spread
    over five decades along K (scales that differ from block to block)."""
    from hdqt_cil.quant.float_product import FloatOperand
    from hdqt_cil.quant.floats import E2M1, SCALINGS, microscaled, nvfp4

    t = torch.randn(shape, generator=gen(seed), device="cuda")
    spread = torch.logspace(-3, 2, shape[-1], device="cuda")
    t = t * spread[torch.randperm(shape[-1], generator=gen(seed), device="cuda")]
    values, scale = microscaled(t) if scaling == "mx" else nvfp4(t)
    return FloatOperand(values, scale, SCALINGS[scaling], E2M1)


def _block_scaled(a, b, hadamard=1, sum_batch=False, config=None):
    """The kernel's product of two FloatOperands (never the reference: a call it does not cover fails)."""
    width = a.block
    return kernels.block_scaled_matmul(a.values * 2, (b.values * 2).mT, a.scale[..., ::width], b.scale[..., ::width],
                                       width, hadamard, sum_batch, config)


def _format_product(scaling):
    from hdqt_cil.quant.float_schemes import FormatProduct
    from hdqt_cil.quant.floats import E2M1, FloatSpec

    return FormatProduct(FloatSpec(E2M1, scaling), FloatSpec(E2M1, scaling))


BLOCK_SCALED_SHAPES = [((70, 45), (33, 45)), ((1, 5), (7, 5)), ((3, 70, 561), (100, 561)), ((300, 1024), (260, 1024)),
                       ((2, 3, 129, 200), (2, 3, 64, 200)), ((4, 40, 48), (1, 24, 48)), ((2048, 576), (64, 576))]


@pytest.mark.parametrize("scaling", ["mx", "nv"])
@pytest.mark.parametrize("left, right", BLOCK_SCALED_SHAPES, ids=str)
@pytest.mark.parametrize("hadamard", [1, 16])
def test_block_scaled_product_bit_identical(left, right, scaling, hadamard):
    """MXFP4's and NVFP4's product on the int8 tensor cores: format_matmul's float32 bits (tile sums scaled by their
    pair and added in K order), with ragged K (a narrower last block), batches and a broadcast right factor."""
    from hdqt_cil.quant.backend import on_int8_tensor_cores
    from hdqt_cil.quant.float_product import format_matmul

    a, b = _e2m1_operand(left, scaling, 11), _e2m1_operand(right, scaling, 12)
    product = _format_product(scaling)
    assert on_int8_tensor_cores(product, "auto", a.values.device)
    assert not on_int8_tensor_cores(product, "torch", a.values.device)
    assert_same(_block_scaled(a, b, hadamard), format_matmul(a, b, product, hadamard), f"{left} {right}")


@pytest.mark.parametrize("scaling", ["mx", "nv"])
@pytest.mark.parametrize("shape", [(70, 90, 300), (1024, 640, 64), (5, 3, 1000)], ids=str)  # summed after, inside
def test_block_scaled_batch_sum_bit_identical(shape, scaling):
    """A weight gradient's per-sample products summed over the batch in sum_entries' order, by the summing kernel
    after the GEMM and inside it (mode 3, where the M x N tiles fill the GPU)."""
    from hdqt_cil.quant.float_product import format_matmul
    from hdqt_cil.quant.intmm import sum_entries

    m, n, k = shape
    a, b = _e2m1_operand((6, m, k), scaling, 13), _e2m1_operand((6, n, k), scaling, 14)
    assert_same(_block_scaled(a, b, 4, sum_batch=True), sum_entries(format_matmul(a, b, _format_product(scaling), 4)))


@pytest.mark.parametrize("config", BLOCK_SCALED_CONFIGS)
@pytest.mark.parametrize("scaling", ["mx", "nv"])
def test_every_block_scaled_config(config, scaling):
    from hdqt_cil.quant.float_product import format_matmul

    a, b = _e2m1_operand((3, 200, 333), scaling, 15), _e2m1_operand((3, 150, 333), scaling, 16)
    assert_same(_block_scaled(a, b, config=config), format_matmul(a, b, _format_product(scaling)), config)


def test_block_scaled_tiles_other_than_16_and_32_are_not_covered():
    a, b = _e2m1_operand((8, 64), "mx", 17), _e2m1_operand((8, 64), "mx", 18)
    with pytest.raises(kernels.NotCovered):
        kernels.block_scaled_matmul(a.values * 2, (b.values * 2).mT, a.scale[..., ::64], b.scale[..., ::64], 64)


E2M1_SHAPES = [(1, 5), (7, 45), (3, 70, 561), (256, 1024), (2, 3, 129, 200), (1000, 27)]


@pytest.mark.parametrize("scaling", ["mx", "nv"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("shape", E2M1_SHAPES, ids=str)
def test_e2m1_quantizer_bit_identical(shape, scaling, rounding):
    """floats.cu against microscaled / nvfp4 on fresh random tensors whose magnitudes span 2^-140 .. 2^20 (subnormal
    and clamped E8M0 scales, E4M3 block scales that round to 0), all-zero and one-value blocks, ragged K: the
    levels are the values doubled, the scales each block's, the stochastic bits the reference's."""
    from hdqt_cil.quant.backend import e2m1_blocks
    from hdqt_cil.quant.floats import E2M1, FloatSpec, quantize_float

    spec = FloatSpec(E2M1, scaling, rounding)
    t = torch.randn(shape, generator=gen(21), device="cuda")
    t = t * torch.exp2(torch.randint(-140, 20, shape, generator=gen(22), device="cuda").float())
    if shape[-1] >= 3 * spec.block:
        t[..., :spec.block] = 0.0  # an all-zero block a row
        t[..., spec.block + 1:2 * spec.block] = 0.0  # a block of one value
    counter = Counter(9, torch.tensor(123456789, device="cuda"), 5) if rounding == "stochastic" else None
    levels, scales = e2m1_blocks(t, spec, counter)
    values, scale = quantize_float(t, spec, counter)
    assert_same(levels, values * 2, f"levels {shape}")
    assert_same(scales, scale[..., ::spec.block].contiguous(), f"scales {shape}")


@pytest.mark.parametrize("scaling", ["mx", "nv"])
def test_e2m1_quantizer_marks_a_non_finite_block(scaling):
    """A block holding NaN or inf gets a NaN scale (the product's sums over it NaN, as the reference's); MX's other
    blocks are rounded as usual (NVFP4's tensor scale spans them all)."""
    from hdqt_cil.quant.backend import e2m1_blocks
    from hdqt_cil.quant.floats import E2M1, FloatSpec

    spec = FloatSpec(E2M1, scaling)
    t = torch.randn(4, 3 * spec.block, generator=gen(23), device="cuda")
    t[0, 1], t[2, spec.block] = float("nan"), float("inf")
    finite = t.clone()
    finite[0, 1] = finite[2, spec.block] = 0.0
    _, scales = e2m1_blocks(t, spec)
    assert torch.isnan(scales[0, 0]) and torch.isnan(scales[2, 1])
    if scaling == "mx":
        keep = ~torch.isnan(scales)
        assert keep.sum() == scales.numel() - 2
        assert torch.equal(scales[keep], e2m1_blocks(finite, spec)[1][keep])


@pytest.mark.parametrize("scheme", ["mxfp4", "nvfp4"])
def test_block_scaled_layers_equal_the_reference(scheme, monkeypatch):
    """quant=mxfp4 and nvfp4 with backend auto against torch on the same GPU: a conv's and a linear layer's outputs
    and every gradient bit for bit, each of their products rounded by floats.cu and multiplied on the int8 tensor
    cores (stochastic rounding from the layers' step counters)."""
    from hdqt_cil.quant import scheme_from_config

    launches = []
    launch = kernels.block_scaled_matmul
    monkeypatch.setattr(kernels, "block_scaled_matmul", lambda *a, **k: launches.append(1) or launch(*a, **k))
    cases = ((lambda: torch.nn.Conv2d(16, 32, 3, padding=1), (8, 16, 16, 16)),
             (lambda: torch.nn.Linear(561, 100), (64, 561)))
    for make, shape in cases:
        outputs = {}
        for backend in ("auto", "torch"):
            torch.manual_seed(3)
            layer = torch.nn.Sequential(make()).cuda()
            quantize_model(layer, scheme_from_config({"name": scheme, "backend": backend}))
            x = torch.randn(shape, device="cuda", generator=gen(4), requires_grad=True)
            y = layer(x)
            (y * torch.randn(y.shape, device="cuda", generator=gen(5))).sum().backward()
            outputs[backend] = [y.detach(), x.grad, *(p.grad for p in layer.parameters())]
        for got, reference in zip(outputs["auto"], outputs["torch"]):
            assert_same(got, reference, f"{scheme} {shape}")
    assert len(launches) == 6  # three products a layer


# ---------------------------------------------------------------------------------- the authors' float quantizer

AUTHORS_FORMATS = [(5, 2), (4, 3), (2, 1), (3, 0), (8, 23)]  # (exp_bits, man_bits): E5M2 first, quant=fp's


def _authors_inputs(shape, seed):
    """Magnitudes over 2^-120 .. 2^120 (past every format's range both ways), a quarter of the values one float32
    step below a power of two (whose float32 log2 can round up to the power: the authors' exponent then is the
    power's), zeros of both signs."""
    t = torch.randn(shape, generator=gen(seed), device="cuda")
    t *= torch.exp2(torch.randint(-120, 120, shape, generator=gen(seed + 1), device="cuda").float())
    flat_t, n = t.view(-1), t.numel()
    powers = torch.exp2(torch.randint(-100, 100, (n // 4,), generator=gen(seed + 2), device="cuda").float())
    flat_t[:n // 4] = torch.nextafter(powers, torch.zeros_like(powers)) * flat_t[:n // 4].sign()
    flat_t[n // 4:n // 4 + n // 16] = 0.0
    flat_t[n // 4 + n // 16:n // 4 + n // 8] = -0.0
    return t


@pytest.mark.parametrize("fmt", AUTHORS_FORMATS, ids=str)
@pytest.mark.parametrize("shape", [(1,), (7, 45), (3, 70, 561), (128, 16, 32, 32), (2, 1000003)], ids=str)
def test_authors_float_bit_identical(shape, fmt):
    """authors.cu's quantizer against floats.authors_float on the same GPU (its float32 log2 included)."""
    from hdqt_cil.quant.floats import authors_float

    t = _authors_inputs(shape, 31)
    assert_same(kernels.authors_float(t, *fmt), authors_float(t, *fmt), f"{shape} e{fmt[0]}m{fmt[1]}")


def test_authors_float_keeps_non_finite_values_as_the_reference():
    """NaN and ±inf come out as the reference's on CUDA (NaN: the exponent of inf is past every power of two)."""
    from hdqt_cil.quant.floats import authors_float

    t = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.5, -3.0e38], device="cuda")
    got, reference = kernels.authors_float(t, 5, 2), authors_float(t, 5, 2)
    assert torch.equal(got.isnan(), reference.isnan()) and torch.equal(got.nan_to_num(), reference.nan_to_num())


def _rounded_tile_sum(partials, start, fmt):
    """The reference's accumulation of one chunk: start + authors_float of each tile, added in tile order."""
    from hdqt_cil.quant.floats import authors_float

    out = start
    for partial in partials.unbind(-3):
        out = out + authors_float(partial, *fmt)
    return out


@pytest.mark.parametrize("fmt", AUTHORS_FORMATS[:2], ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 1), (5, 64, 16), (2, 9, 33, 17), (3, 18, 100, 64), (2, 3, 1, 4096, 144)],
                         ids=str)
def test_authors_tile_sum_bit_identical(shape, fmt):
    """authors.cu's fused rounding and ordered sum of a chunk's tiles against the reference's loop, from zero and
    from a running sum, with the count of tile sums past the accumulator's largest value added to a tally."""
    from hdqt_cil.quant.floats import authors_format, authors_largest

    limit = authors_largest(authors_format(*fmt))
    partials = _authors_inputs(shape, 41).clamp(-4 * limit, 4 * limit)
    over = (partials.abs() > limit).sum().item()
    assert over > 0 or partials.numel() < 10
    tally = torch.tensor([7, 0], dtype=torch.int64, device="cuda")
    got = kernels.authors_tile_sum(partials, None, *fmt, limit, tally[0])
    assert_same(got, _rounded_tile_sum(partials, 0, fmt), f"{shape} from zero")
    assert tally.tolist() == [7 + over, 0]
    start = torch.randn(got.shape, generator=gen(42), device="cuda")
    expected = _rounded_tile_sum(partials, start, fmt)
    running = start.clone()
    assert kernels.authors_tile_sum(partials, running, *fmt, limit) is running
    assert_same(running, expected, f"{shape} from a running sum")


def test_fp_layers_equal_the_reference(monkeypatch):
    """quant=fp with backend auto against torch on the same GPU: a conv's and a linear layer's outputs, every
    gradient and the saturated tile sums' shares bit for bit, each product's tiles rounded and added by
    authors.cu and every operand rounded by it."""
    from hdqt_cil.quant import scheme_from_config

    launches = {"authors_float": 0, "authors_tile_sum": 0}
    for name in launches:
        launch = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, _launch=launch, _name=name, **k:
                            launches.__setitem__(_name, launches[_name] + 1) or _launch(*a, **k))
    cases = ((lambda: torch.nn.Conv2d(16, 32, 3, padding=1), (8, 16, 16, 16), 0.3),
             (lambda: torch.nn.Linear(561, 100), (64, 561), 1e3))  # large inputs: E5M2 weight-gradient sums saturate
    saturated = []
    for make, shape, magnitude in cases:
        outputs, stats = {}, {}
        for backend in ("auto", "torch"):
            torch.manual_seed(3)
            layer = torch.nn.Sequential(make()).cuda()
            quantize_model(layer, scheme_from_config({"name": "fp", "backend": backend}))
            x = (magnitude * torch.randn(shape, device="cuda", generator=gen(4))).requires_grad_()
            y = layer(x)
            (y * torch.randn(y.shape, device="cuda", generator=gen(5))).sum().backward()
            outputs[backend] = [y.detach(), x.grad, *(p.grad for p in layer.parameters())]
            stats[backend] = quant_stats(layer)
        for got, reference in zip(outputs["auto"], outputs["torch"]):
            assert_same(got, reference, f"fp {shape}")
        assert stats["auto"] == stats["torch"]
        saturated += [s["grad_weight_saturated"] for s in stats["auto"].values()]
    assert saturated[0] == 0 < saturated[1]
    assert launches["authors_tile_sum"] >= 6 and launches["authors_float"] >= 8  # three products, two operands each


@pytest.mark.parametrize("n", [1, 255, 4097, 70_001, 2_500_000])
def test_the_diagnostics_measures_agree_with_torchs_float64_ones(n):
    """kernels.fidelity and moments against diagnostics' torch measures (float64 sums in another order: agreement
    to rounding), with zeros in both operands (signs, an all-zero q) and the same bits on a second launch."""
    from hdqt_cil.trainer.diagnostics import _fidelity, _summary_statistics

    g = gen(n)
    f = torch.randn(n, device="cuda", generator=g)
    f[torch.rand(n, device="cuda", generator=g) < 0.2] = 0
    q = f + 0.5 * torch.randn(n, device="cuda", generator=g)
    q[torch.rand(n, device="cuda", generator=g) < 0.1] = 0
    for a, b in ((q, f), (torch.zeros_like(q), f), (q, torch.zeros_like(f))):
        got = kernels.fidelity(a, b)
        assert torch.equal(got.view(torch.int64), kernels.fidelity(a, b).view(torch.int64))  # NaN bits too
        reference = _fidelity(a.cpu(), b.cpu())
        expected = torch.stack([reference[m] for m in ("cosine", "rel_error", "sign")]).to(got)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-15, equal_nan=True)
    got = kernels.moments(q)
    expected = torch.stack(list(_summary_statistics(q.cpu()).values())).to(got)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-15)
    levels = torch.randint(-2, 3, (n,), device="cuda", generator=g, dtype=torch.int8)
    for values in (levels, levels.float()):
        counts = torch.tensor([1.0, 2.0], dtype=torch.float64, device="cuda")
        kernels.count_zero_levels(q, values, counts)
        nonzero = q != 0
        assert counts.tolist() == [1 + (nonzero & (values == 0)).sum().item(), 2 + nonzero.sum().item()]
    q[n // 2] = float("nan")
    assert kernels.moments(q)[:2].isnan().all()  # a NaN wins the max and the min, as torch's
    with pytest.raises(kernels.NotCovered):
        kernels.moments(q.double())
