"""The block-scaled E2M1 quantizers (floats.cu): `hdqt_cil.quant.floats.microscaled` (MXFP4) and `nvfp4` along the
last dimension bit for bit, written as what the block-scaled GEMM reads (intmm.block_scaled_matmul): int8 levels,
the values doubled, and a float32 scale per block."""
import torch

from . import runtime as rt
from .quantize import counter_args

_THREADS = 256
_ROW_ALIGN = 16  # the GEMM's operand rows: multiples of 16 bytes


def e2m1_quantize(t: torch.Tensor, block: int, tensor_scale: torch.Tensor | None = None,
                  counter=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(levels, scales) of float32 `t` (..., K) rounded to E2M1 with a scale per `block` values along K: MXFP4's
    E8M0 scales for block 32 (tensor_scale None), NVFP4's E4M3 ones under `tensor_scale` (a float32 0-dim CUDA
    tensor: floats.nvfp4_tensor_scale) for block 16; stochastic rounding where a `counter` is given. levels: int8
    (..., K), the values doubled, rows 16-byte aligned; scales: float32 (..., ⌈K / block⌉). A block holding a
    non-finite value gets a NaN scale."""
    rt.require_cuda(t)
    nv = tensor_scale is not None
    if (block, nv) not in ((32, False), (16, True)):
        raise rt.NotCovered(f"E2M1 blocks of {block} with {'NVFP4' if nv else 'MX'} scales")
    k = t.shape[-1]
    rows = t.numel() // k if k else 0
    width, blocks = -(-k // _ROW_ALIGN) * _ROW_ALIGN, -(-k // block)
    if rows == 0 or rows * blocks * block >= 2**31:
        raise rt.NotCovered("an empty operand" if rows == 0 else "2^31 elements or more")
    x = t.to(torch.float32).contiguous()
    levels = rt.empty((*t.shape[:-1], width), torch.int8, t.device)
    scales = rt.empty((*t.shape[:-1], blocks), torch.float32, t.device)
    kernel = f"e2m1_blocks<{block}, {str(nv).lower()}, {int(counter is not None)}>"
    with rt.on_device(t):
        rt.launch(rt.function("floats.cu", kernel, template=True), (-(-rows * blocks * block // _THREADS),),
                  (_THREADS,),
                  (rt.ptr(x), rt.u32(rows), rt.u32(k), rt.ptr(tensor_scale), *counter_args(counter, t.device),
                   rt.ptr(levels), rt.u64(width), rt.ptr(scales)))
    return levels[..., :k], scales
