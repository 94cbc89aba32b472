"""Which implementation runs the numeric primitives: the torch reference of this package or the CuPy kernels.

Both namespaces have the reference's signatures and give the same bits (docs/numerics.md, "Backends"):
`block_hadamard`, `quantize`, `tiled_int_matmul`, `im2col`, `col2im`, and the fused `hadamard_quantize` and
`scaled_int_matmul`, whose torch versions are compositions of the reference functions. KERNEL_OPS resolves and
checks the arguments by the reference's rules, calls `hdqt_cil.kernels`, and runs the reference where the kernels do
not cover a call (`kernels.NotCovered`; with a warning where another setting would have run the kernels).
"""
import warnings
from types import SimpleNamespace

import torch

from .. import kernels
from .hadamard import block_hadamard, checked_block
from .im2col import col2im, conv_output_size, im2col
from .intmm import check_product, epilogue_block, sum_entries, tiled_int_matmul
from .quantizers import compute_scale, quantize, require_counter


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


def _covered(launch, reference):
    """launch(), or reference() where the kernels do not cover the call."""
    try:
        return launch()
    except kernels.NotCovered as miss:
        if miss.warn:
            warnings.warn(f"hdqt_cil.kernels: {miss}; using the torch reference", stacklevel=3)
        return reference()


def _as_float(t: torch.Tensor) -> torch.Tensor:
    """int8 levels as the reference holds them (float32; the values are equal)."""
    return t.float() if t.dtype == torch.int8 else t


def _kernel_quantize(t, spec, counter=None):
    require_counter(spec, counter)
    scale = None if spec.scale == "max" else compute_scale(t, spec)  # SAWB: torch's float sums, on t as given
    return _covered(lambda: kernels.quantize(t, spec, counter, scale), lambda: quantize(t, spec, counter))


def _kernel_block_hadamard(x, dim=-1, block=None):
    block = checked_block(x.shape[dim], block)
    return _covered(lambda: kernels.block_hadamard(x, dim, block), lambda: block_hadamard(x, dim, block))


def _kernel_hadamard_quantize(x, spec, counter=None, block=None, dim=-1):
    block = checked_block(x.shape[dim], block)
    require_counter(spec, counter)
    return _covered(lambda: kernels.hadamard_quantize(x, spec, counter, block, dim),
                    lambda: _kernel_quantize(_kernel_block_hadamard(x, dim, block), spec, counter))


def _kernel_tiled_int_matmul(a, b, tile=32, acc_bits=8, bounds=None, count_saturated=False):
    check_product(a, b, tile, acc_bits)
    return _covered(lambda: kernels.tiled_int_matmul(a, b, tile, acc_bits, bounds, count_saturated),
                    lambda: tiled_int_matmul(_as_float(a), _as_float(b), tile, acc_bits, bounds, count_saturated))


def _kernel_scaled_int_matmul(a, b, scale_a, scale_b, block=1, tile=32, acc_bits=8, bounds=None,
                              count_saturated=False, sum_batch=False):
    block = epilogue_block(block)
    scale_a, scale_b = (s if torch.is_tensor(s) else torch.tensor(float(s), device=a.device)
                        for s in (scale_a, scale_b))
    check_product(a, b, tile, acc_bits)
    return _covered(lambda: kernels.scaled_int_matmul(a, b, scale_a, scale_b, block, tile, acc_bits, bounds,
                                                      count_saturated, sum_batch),
                    lambda: scaled_int_matmul(_as_float(a), _as_float(b), scale_a, scale_b, block, tile, acc_bits,
                                              bounds, count_saturated, sum_batch))


def _kernel_im2col(x, kernel_size, padding, dilation, stride, columns=False):
    out_size = conv_output_size(x.shape, kernel_size, padding, dilation, stride)
    return _covered(lambda: kernels.im2col(x, kernel_size, padding, dilation, stride, columns, out_size),
                    lambda: im2col(x, kernel_size, padding, dilation, stride, columns))


def _kernel_col2im(rows, x_shape, kernel_size, padding, dilation, stride):
    out_size = conv_output_size(x_shape, kernel_size, padding, dilation, stride)
    return _covered(lambda: kernels.col2im(rows, x_shape, kernel_size, padding, dilation, stride, out_size),
                    lambda: col2im(rows, x_shape, kernel_size, padding, dilation, stride))


KERNEL_OPS = SimpleNamespace(name="cupy", block_hadamard=_kernel_block_hadamard, quantize=_kernel_quantize,
                             tiled_int_matmul=_kernel_tiled_int_matmul, hadamard_quantize=_kernel_hadamard_quantize,
                             scaled_int_matmul=_kernel_scaled_int_matmul, im2col=_kernel_im2col,
                             col2im=_kernel_col2im)


def resolve_ops(backend: str, device: torch.device) -> SimpleNamespace:
    """torch: the reference everywhere. cupy: the kernels (CUDA tensors only). auto: the kernels where they can run."""
    if backend == "torch":
        return TORCH_OPS
    if device.type != "cuda":
        if backend == "cupy":
            raise ValueError(f"quant.backend=cupy needs CUDA tensors; this layer runs on {device}")
        return TORCH_OPS
    if not kernels.available():
        if backend == "cupy":
            raise RuntimeError(f"quant.backend=cupy, but hdqt_cil.kernels cannot run here "
                               f"({kernels.unavailable_reason()}); use quant.backend=auto or torch")
        return TORCH_OPS
    return KERNEL_OPS
