"""Which implementation runs the numeric primitives: the torch reference of this package or the CuPy kernels.

`hdqt_cil.kernels` (optional) provides `available() -> bool` and `OPS`, a namespace with `block_hadamard`,
`quantize` and `tiled_int_matmul` of the same signatures and bit-identical results (docs/numerics.md, "Backends").
"""
import importlib
from functools import lru_cache
from types import SimpleNamespace

import torch

from .hadamard import block_hadamard
from .intmm import tiled_int_matmul
from .quantizers import quantize

TORCH_OPS = SimpleNamespace(name="torch", block_hadamard=block_hadamard, quantize=quantize,
                            tiled_int_matmul=tiled_int_matmul)


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
