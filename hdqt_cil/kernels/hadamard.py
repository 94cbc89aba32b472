"""The block Hadamard transform on the GPU: `hdqt_cil.quant.block_hadamard`'s butterflies, bit for bit (quant.cu's
hadamard kernels), alone or keeping some rows of each block (HLA's compression, `hdqt_cil.quant.hla_compress`)."""
import torch

from . import flat
from . import runtime as rt

MAX_HADAMARD_BLOCK = 8192  # the largest block a CTA transforms (quant.cu: the exchange buffer in shared memory)


def block_hadamard(x: torch.Tensor, dim: int, block: int) -> torch.Tensor:
    """x transformed by I ⊗ H_block along `dim`, float32; `block` a power of two dividing x.shape[dim] (the
    caller checks it). Blocks above MAX_HADAMARD_BLOCK and tensors past 32-bit indices are not covered."""
    rt.require_cuda(x)
    if block == 1:
        return x.to(torch.float32, copy=True)
    if block > MAX_HADAMARD_BLOCK or x.numel() > rt.MAX_ELEMENTS:
        raise rt.NotCovered(f"a Hadamard block of {block} over {x.numel()} elements")
    moved = x.movedim(dim, -1)
    with rt.on_device(x):
        src = rt.flat_input(moved)
        out = rt.empty(moved.shape, torch.float32, x.device)
        logn = block.bit_length() - 1
        elements = flat.per_thread(src.numel(), logn)
        fn = rt.function("quant.cu", f"{flat.kernel_name('hadamard', elements)}_{rt.dtype_suffix(src)}")
        ctas, threads, span, smem = flat.grid(src.numel(), logn, elements, fn)
        rt.launch(fn, (ctas,), (threads,),
                  (rt.ptr(src), rt.u32(src.numel()), rt.u32(span), rt.i32(logn), rt.ptr(out)), smem)
    return out.movedim(-1, dim)


def hla_compress(x: torch.Tensor, block: int, rank: int, slots: torch.Tensor) -> torch.Tensor:
    """The rows of x's transform by I ⊗ H_block along its last dim that `slots` keeps, (..., L / block · rank),
    float32 (quant.cu's hla kernels): slots an int32 (block,) tensor on x's device, slots[row] the row's place among
    the `rank` kept rows of its block, -1 for a dropped row. Float32 input; `block` a power of two dividing the last
    dim (the caller checks both). Blocks above MAX_HADAMARD_BLOCK and tensors past 32-bit indices are not covered."""
    rt.require_cuda(x)
    if x.dtype != torch.float32 or block > MAX_HADAMARD_BLOCK or x.numel() > rt.MAX_ELEMENTS:
        raise rt.NotCovered(f"HLA with a block of {block} over {x.numel()} {x.dtype} elements")
    with rt.on_device(x):
        src = rt.flat_input(x)
        out = rt.empty((*x.shape[:-1], x.shape[-1] // block * rank), torch.float32, x.device)
        logn = block.bit_length() - 1
        elements = flat.per_thread(src.numel(), logn)
        fn = rt.function("quant.cu", f"{flat.kernel_name('hla', elements)}_f32")
        ctas, threads, span, smem = flat.grid(src.numel(), logn, elements, fn)
        rt.launch(fn, (ctas,), (threads,), (rt.ptr(src), rt.u32(src.numel()), rt.u32(span), rt.i32(logn),
                                           rt.ptr(slots), rt.u32(rank), rt.ptr(out)), smem)
    return out
