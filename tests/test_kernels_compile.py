"""CPU checks of hdqt_cil.kernels: every .cu source of the repository compiles through NVRTC for sm_90 (no GPU
needed), and the package refuses CPU tensors with a clear error."""
import re
from pathlib import Path

import pytest
import torch

from hdqt_cil import kernels
from hdqt_cil.kernels import compile as rt
from hdqt_cil.quant.backend import KERNEL_OPS

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="the CuPy wheel brings NVRTC")

# The GEMM is a template: compile every mode of the largest tile and the modes the layers use of the others.
GEMM_EXPRESSIONS = [rt.gemm_expression("128x128", sat, count, out) for sat, count in rt.GEMM_MODES
                    for out in rt.GEMM_OUTS]
GEMM_EXPRESSIONS += [rt.gemm_expression(config, sat, count, out) for config in rt.GEMM_CONFIGS if config != "128x128"
                     for sat, count, out in ((2, True, 1), (1, True, 1), (4, False, 1))]
GEMM_EXPRESSIONS += list(rt.BLOCK_SCALED_EXPRESSIONS)


@pytest.mark.parametrize("name", sorted(rt.SOURCES))
def test_every_kernel_of_each_source_compiles(name):
    """NVRTC's front end for sm_90 (PTX): every kernel and GEMM instantiation is there by its lowered name.
    --Ofast-compile=max skips most optimisation of the PTX, which nothing here checks (its entries, their names
    and static shared arrays are the same): 3 s for the three sources instead of 170 s on a CI core."""
    expressions = tuple(GEMM_EXPRESSIONS) if name == "intmm.cu" else rt.SOURCES[name]
    ptx, lowered, _ = rt.nvrtc_compile(name, expressions, "compute_90", "--Ofast-compile=max")
    ptx = ptx.decode().rstrip("\0")
    assert set(lowered) == set(expressions)
    entries = set(re.findall(r"\.entry (\S+)\(", ptx))
    assert entries == set(lowered.values())
    if name == "quant.cu":  # a static tile: 64 rows of 64 bytes plus one of padding
        body = ptx[ptx.index(f".entry {lowered['transpose_i8']}("):]
        assert re.search(r"\.shared \.align \d+ \.b8 \S+\[(\d+)\]", body).group(1) == str(64 * 65)


def test_a_cubin_reports_each_kernels_resources():
    """The machine code for sm_90 of one source: scripts/bench/kernel_resources.py reads each kernel's registers,
    spills and shared memory off the same compile's log."""
    from scripts.bench import kernel_resources as resources  # noqa: PLC0415

    expressions = rt.SOURCES["im2col.cu"]
    cubin, lowered, log = rt.nvrtc_compile("im2col.cu", expressions, "sm_90", resources.PTXAS_VERBOSE)
    assert cubin[:4] == b"\x7fELF"
    assert all(kernel.encode() in cubin for kernel in lowered.values())
    rows = {r["kernel"]: r for r in resources.rows(lowered, log)}
    assert set(rows) == set(expressions)
    assert all(0 < r["registers"] <= 255 for r in rows.values())


def test_the_wgmma_gemms_assemble_for_sm90a_without_spills():
    """The WG products as ptxas makes them for Hopper (the wgmma instructions exist only for sm_90a): every mode the
    dispatcher gives them (no saturation, whole-K clamp, each output) and the packed tile-32 mode, none spilling."""
    from scripts.bench import kernel_resources as resources  # noqa: PLC0415

    modes = ((0, False, 0), (0, False, 2), (1, True, 1), (0, False, 3), (4, True, 2))
    expressions = tuple(rt.gemm_expression("wg128x128", sat, count, out) for sat, count, out in modes)
    cubin, lowered, log = rt.nvrtc_compile("intmm.cu", expressions, "sm_90a", resources.PTXAS_VERBOSE)
    assert cubin[:4] == b"\x7fELF"
    rows = resources.rows(lowered, log)
    assert {r["kernel"] for r in rows} == set(expressions)
    assert all(r["spill stores"] == 0 and r["registers"] <= 255 for r in rows), rows


def test_the_block_scaled_gemms_assemble_without_spills():
    """MXFP4's and NVFP4's products (intmm.cu modes 5, 6) in the large config gemm_config gives them and the batch
    sum's: their float32 sums stay in registers."""
    from scripts.bench import kernel_resources as resources  # noqa: PLC0415

    expressions = tuple(e for e in rt.BLOCK_SCALED_EXPRESSIONS
                        if e.startswith(("intmm_kernel<4, 4, 2, 4,", "intmm_kernel<2, 2, 2, 4,")))
    assert len(expressions) == 6
    _, lowered, log = rt.nvrtc_compile("intmm.cu", expressions, "sm_90", resources.PTXAS_VERBOSE)
    rows = resources.rows(lowered, log)
    assert {r["kernel"] for r in rows} == set(expressions)
    assert all(r["spill stores"] == 0 for r in rows), rows


def test_wgmma_modules_are_compiled_for_sm90a_and_shipped_for_sm90_alone():
    wg = rt.gemm_expression("wg128x128", 0, False, 2)
    plain = rt.gemm_expression("128x128", 0, False, 2)
    assert rt.module_arch((wg,), "sm_90") == "sm_90a"
    assert rt.module_arch((plain,), "sm_90") == "sm_90"
    assert rt.module_arch((wg,), "sm_89") == "sm_89"
    assert ("intmm.cu", (wg,)) in rt.shipped_modules("sm_90")
    assert ("intmm.cu", (wg,)) not in rt.shipped_modules("sm_80")
    assert ("intmm.cu", (plain,)) in rt.shipped_modules("sm_80")


def test_ieee_single_precision_options():
    """Subnormals kept, no FMA contraction, IEEE division: the contract's single roundings (CuPy's RawModule would
    add -ftz=true, hence the direct NVRTC compile)."""
    assert {"--ftz=false", "--fmad=false", "--prec-div=true"} <= set(rt.NVRTC_OPTIONS)


def test_every_source_in_the_folder_is_listed():
    assert sorted(p.name for p in rt.HERE.glob("*.cu")) == sorted(rt.SOURCES)


# Sources outside the package: the benchmark's tensor-core ceiling and implicit-GEMM loads, the tests' division
# kernel.
OTHER_SOURCES = {"scripts/bench/peak.cu": ("mma_peak_plain", "mma_peak_clamped", "mma_peak_packed"),
                 "scripts/bench/implicit_loads.cu": ("rows_tiles", "gathered_tiles"),
                 "tests/cuda/divide.cu": ("divide_f32",)}


def test_every_other_source_is_listed():
    found = {str(p.relative_to(ROOT)) for folder in ("hdqt_cil", "scripts", "tests", "data_prep")
             for p in (ROOT / folder).rglob("*.cu")} - {f"hdqt_cil/kernels/{n}" for n in rt.SOURCES}
    assert found == set(OTHER_SOURCES)


@pytest.mark.parametrize("path", sorted(OTHER_SOURCES))
def test_other_sources_compile_for_sm90_with_the_package_headers(path):
    name = str(ROOT / path)
    cubin, lowered, _ = rt.nvrtc_compile(name, OTHER_SOURCES[path], "sm_90")
    assert cubin[:4] == b"\x7fELF" and set(lowered) == set(OTHER_SOURCES[path])
    assert set(rt.headers(name)) <= {p.name for p in rt.HERE.glob("*.cuh")}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_without_cuda_the_kernels_are_unavailable_and_say_why():
    assert not kernels.available()
    assert kernels.unavailable_reason()
    from hdqt_cil.quant import QuantSpec

    with pytest.raises(ValueError, match="CUDA tensors"):
        kernels.quantize(torch.ones(4), QuantSpec())
    with pytest.raises(ValueError, match="CUDA tensors"):
        kernels.tiled_int_matmul(torch.ones(2, 32), torch.ones(32, 2))
    with pytest.raises(ValueError, match="CUDA tensors"):
        kernels.col2im(torch.ones(1, 4, 9), (1, 1, 2, 2), (3, 3), (1, 1), (1, 1), (1, 1), (2, 2))
    with pytest.raises(ValueError, match="CUDA tensors"):
        kernels.im2col(torch.ones(1, 1, 2, 2), (3, 3), (1, 1), (1, 1), (1, 1), False, (2, 2))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_backend_cupy_without_gpu_is_a_clear_error():
    from hdqt_cil.quant.backend import resolve_ops

    with pytest.raises(ValueError, match="cupy needs CUDA tensors"):
        resolve_ops("cupy", torch.device("cpu"))
    assert resolve_ops("auto", torch.device("cpu")).name == "torch"


def test_torch_backend_fused_ops_are_the_compositions():
    """The torch versions of the fused ops (what a layer calling them gets on the reference backend)."""
    from hdqt_cil.quant import QuantSpec, block_hadamard, quantize, tiled_int_matmul
    from hdqt_cil.quant.backend import TORCH_OPS
    from hdqt_cil.quant.rounding import Counter

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, 32, generator=g)
    spec = QuantSpec(4, "signed", "max", 1.0, "sample", "stochastic")
    fused = TORCH_OPS.hadamard_quantize(x, spec, Counter(1, 2, 3))
    plain = quantize(block_hadamard(x, -1), spec, Counter(1, 2, 3))
    assert all(torch.equal(f, p) for f, p in zip(fused, plain))
    a = torch.randint(-7, 8, (3, 10, 70), generator=g).float()
    b = torch.randint(-7, 8, (3, 70, 9), generator=g).float()
    sa, sb = torch.rand(3, 10, 1, generator=g), torch.rand(3, 1, 9, generator=g)
    out, count = TORCH_OPS.scaled_int_matmul(a, b, sa, sb, 4, 32, 8, (7, 7), True)
    acc, ref_count = tiled_int_matmul(a, b, 32, 8, (7, 7), True)
    assert torch.equal(out, acc.to(torch.float32) * ((sa * sb) / 4)) and torch.equal(count, ref_count)
    summed, summed_count = TORCH_OPS.scaled_int_matmul(a, b, sa, sb, 4, 32, 8, (7, 7), True, sum_batch=True)
    assert torch.equal(summed, out[0] + out[1] + out[2]) and torch.equal(summed_count, ref_count)
    for block in (0, 3, 12, 2.5):  # the epilogue's n is a Hadamard block: a power of two
        with pytest.raises(ValueError, match="power of two"):
            TORCH_OPS.scaled_int_matmul(a, b, sa, sb, block)
        with pytest.raises(ValueError, match="power of two"):
            KERNEL_OPS.scaled_int_matmul(a, b, sa, sb, block)
