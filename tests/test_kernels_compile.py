"""CPU checks of hdqt_cil.kernels: every .cu source compiles through NVRTC for sm_90 (no GPU needed), and the
package refuses CPU tensors with a clear error."""
import pytest
import torch

from hdqt_cil import kernels
from hdqt_cil.kernels import _runtime as rt

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="the CuPy wheel brings NVRTC")

# The GEMM is a template: compile every variant of the largest tile and the variants the layers use of the others.
GEMM_EXPRESSIONS = [rt.gemm_expression("128x128", sat, count, out) for sat in range(4) for count in (False, True)
                    for out in range(3)]
GEMM_EXPRESSIONS += [rt.gemm_expression(config, sat, True, out) for config in rt.GEMM_CONFIGS if config != "128x128"
                     for sat, out in ((2, 2), (1, 1))]


def compile_sm90(name: str, expressions) -> bytes:
    program = nvrtc.createProgram(rt.source(name), name, [], [])
    for expression in expressions:
        if "<" in expression:
            nvrtc.addNameExpression(program, expression)
    try:
        nvrtc.compileProgram(program, ["--gpu-architecture=sm_90", *rt.NVRTC_OPTIONS])
    except Exception as err:  # noqa: BLE001 (the log says what failed)
        pytest.fail(f"{name} does not compile for sm_90: {err}\n{nvrtc.getProgramLog(program)}")
    for expression in expressions:
        if "<" in expression:
            assert nvrtc.getLoweredName(program, expression)
    return nvrtc.getCUBIN(program)


@pytest.mark.parametrize("name", sorted(rt.SOURCES))
def test_source_compiles_for_sm90(name):
    expressions = GEMM_EXPRESSIONS if name == "intmm.cu" else rt.SOURCES[name]
    cubin = compile_sm90(name, expressions)
    assert cubin[:4] == b"\x7fELF"
    if name != "intmm.cu":  # extern "C" kernels keep their names in the binary
        for kernel in expressions:
            assert kernel.encode() in cubin


def test_every_source_in_the_folder_is_listed():
    assert sorted(p.name for p in rt.HERE.glob("*.cu")) == sorted(rt.SOURCES)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_without_cuda_the_kernels_are_unavailable_and_say_why():
    assert not kernels.available()
    assert kernels.unavailable_reason()
    from hdqt_cil.quant import QuantSpec

    with pytest.raises(ValueError, match="CUDA tensors"):
        kernels.quantize(torch.ones(4), QuantSpec())
    with pytest.raises(ValueError, match="CUDA tensors"):
        kernels.tiled_int_matmul(torch.ones(2, 32), torch.ones(32, 2))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_backend_cupy_without_gpu_is_a_clear_error():
    from hdqt_cil.quant.backend import resolve_ops

    with pytest.raises(ValueError, match="cupy needs CUDA tensors"):
        resolve_ops("cupy", torch.device("cpu"))
    assert resolve_ops("auto", torch.device("cpu")).name == "torch"
