"""CuPy RawKernels for the numerics of `hdqt_cil.quant`, bit-identical to that torch reference (docs/kernels.md).

One module a primitive, as in `hdqt_cil.quant`, over a small runtime:

    quantize.py   quantize(t, spec, counter, scale, worst, times) -> (int8 levels, float32 scale)
                  forward_quantize(t, spec, counter, scale, stats, worst)
                                                         -> the same and a forward operand's statistics, keep mask
                  hadamard_quantize(x, spec, counter, block, dim, scale, times)
                                                         -> quantize(block_hadamard(x)) fused (dim last)
                  advance_step(counter)                  -> the counter's value; the counter + 1
    floats.py     e2m1_quantize(t, block, tensor_scale, counter) -> MXFP4/NVFP4 rounding: int8 doubled values, scales
    authors.py    authors_float(t, exp_bits, man_bits)  -> the HDQT authors' float quantizer, float32
                  authors_tile_sum(partials, out, exp_bits, man_bits, limit, saturated)
                                                         -> out + each K tile's sum rounded by it, in tile order
    hadamard.py   block_hadamard(x, dim, block)          -> float32
                  hla_compress(x, block, rank, slots)    -> the kept rows of its transform (HLA), float32
    intmm.py      tiled_int_matmul(a, b, tile, acc_bits, bounds, count_saturated, config, packed)
                  scaled_int_matmul(a, b, scale_a, scale_b, block, ..., sum_batch, config, packed, tally, keep)
                                                         -> the layers' product, its scaling in the GEMM's epilogue
                  block_scaled_matmul(a, b, scale_a, scale_b, tile, block, sum_batch, config)
                                                         -> MXFP4/NVFP4's product: float32 sums of scaled tiles
                  sum_entries(t, keep)                   -> the batch of (..., M, N) summed in order from +0
    im2col.py     im2col(x, ..., columns, out_size), col2im(rows, x_shape, ..., out_size, keep)
                  col2im_int_matmul(a, b, scales, ..., x_shape, ...) -> col2im of the scaled product, fused
    measures.py   fidelity(q, f), moments(t)             -> the diagnostics' measures, float64 (3,) and (4,)
                  count_zero_levels(t, levels, counts)   -> counts += (nonzero values at level 0, nonzero values)
    runtime.py    available(), loading and launching, buffers; NotCovered
    compile.py    the sources, NVRTC, the prebuilt bundles and the machine's kernel cache (build.py makes them)

Everything takes and returns torch CUDA tensors on torch's current stream. The launchers take their arguments
resolved and checked (a Hadamard block, a convolution's output size, a SAWB scale): the rules are the reference's,
and `hdqt_cil.quant.backend` applies them, calls these functions and runs the reference where a call raises
`NotCovered` (levels beyond int8, tiles that are not multiples of 32, Hadamard blocks above 8192, tensors of 2^31
elements or more). This package never imports `hdqt_cil.quant`.
"""
from .authors import authors_float, authors_tile_sum
from .floats import e2m1_quantize
from .hadamard import MAX_HADAMARD_BLOCK, block_hadamard, hla_compress
from .compile import BLOCK_SCALED_SAT, COL2IM_PRODUCT_WIDTHS
from .im2col import col2im, col2im_int_matmul, im2col
from .intmm import block_scaled_matmul, scaled_int_matmul, sum_entries, tiled_int_matmul
from .measures import count_zero_levels, fidelity, moments
from .quantize import Stats, advance_step, forward_quantize, hadamard_quantize, quantize
from .runtime import NotCovered, available, unavailable_reason

__all__ = ["available", "unavailable_reason", "NotCovered", "quantize", "forward_quantize", "Stats", "advance_step",
           "hadamard_quantize", "block_hadamard", "hla_compress", "tiled_int_matmul", "scaled_int_matmul",
           "sum_entries", "block_scaled_matmul", "BLOCK_SCALED_SAT", "e2m1_quantize", "authors_float",
           "authors_tile_sum", "im2col", "col2im",
           "col2im_int_matmul", "COL2IM_PRODUCT_WIDTHS", "MAX_HADAMARD_BLOCK", "fidelity", "moments",
           "count_zero_levels"]
