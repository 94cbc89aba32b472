"""The block Hadamard transform on the GPU: `hdqt_cil.quant.block_hadamard`'s butterflies, bit for bit (quant.cu's
hadamard kernels)."""
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
