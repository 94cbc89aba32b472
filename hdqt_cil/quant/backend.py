"""Which implementation runs the numeric primitives: the torch reference of this package or the CuPy kernels.

`hdqt_cil.kernels` (optional) provides `available() -> bool` and `OPS`, a namespace with `block_hadamard`,
`quantize`, `tiled_int_matmul`, `im2col` and `col2im` of the same signatures and bit-identical results
(docs/numerics.md, "Backends"), and the fused `hadamard_quantize` and `scaled_int_matmul`, whose torch versions below
are compositions of the reference functions (same results, unfused).
"""
import importlib
from functools import lru_cache
from types import SimpleNamespace

import torch

from .hadamard import block_hadamard
from .im2col import col2im, im2col
from .intmm import epilogue_block, sum_entries, tiled_int_matmul
from .quantizers import quantize


def hadamard_quantize(x, spec, counter=None, block=None, dim=-1):
    """quantize(block_hadamard(x, dim, block), spec, counter): one call, so that a backend can fuse the two."""
    return quantize(block_hadamard(x, dim, block), spec, counter)


def scaled_int_matmul(a, b, scale_a, scale_b, block=1, tile=32, acc_bits=8, bounds=None, count_saturated=False,
                      sum_batch=False):
    """float32(tiled_int_matmul(a, b)) * ((scale_a * scale_b) / block): the layers' product with its epilogue in
    one call (docs/numerics.md "Epilogue"), so that a backend can fuse the scaling into the GEMM; with sum_batch,
    summed over the batch by `sum_entries` (the weight gradient of per-sample products)."""
    block = epilogue_block(block)
    result = tiled_int_matmul(a, b, tile, acc_bits, bounds, count_saturated)
    acc, saturated = result if count_saturated else (result, None)
    out = acc.to(torch.float32) * ((scale_a * scale_b) / block)
    out = sum_entries(out) if sum_batch else out
    return (out, saturated) if count_saturated else out


TORCH_OPS = SimpleNamespace(name="torch", block_hadamard=block_hadamard, quantize=quantize,
                            tiled_int_matmul=tiled_int_matmul, hadamard_quantize=hadamard_quantize,
                            scaled_int_matmul=scaled_int_matmul, im2col=im2col, col2im=col2im)


@lru_cache(maxsize=1)
def _kernel_ops():
    """(ops or None, why not)."""
    try:
        kernels = importlib.import_module("hdqt_cil.kernels")
    except ImportError as err:
        return None, f"hdqt_cil.kernels cannot be imported ({err})"
    if not hasattr(kernels, "OPS") or not kernels.available():
        return None, "hdqt_cil.kernels reports no usable CuPy/CUDA"
    return kernels.OPS, ""


def resolve_ops(backend: str, device: torch.device) -> SimpleNamespace:
    """torch: the reference everywhere. cupy: the kernels (CUDA tensors only). auto: the kernels where they can run."""
    if backend == "torch":
        return TORCH_OPS
    if device.type != "cuda":
        if backend == "cupy":
            raise ValueError(f"quant.backend=cupy needs CUDA tensors; this layer runs on {device}")
        return TORCH_OPS
    ops, why_not = _kernel_ops()
    if ops is None:
        if backend == "cupy":
            raise RuntimeError(f"quant.backend=cupy, but {why_not}; use quant.backend=auto or torch")
        return TORCH_OPS
    return ops
