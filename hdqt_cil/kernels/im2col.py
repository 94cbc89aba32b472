"""The convolution's layouts on the GPU: `hdqt_cil.quant.im2col`'s im2col and col2im bit for bit, and col2im of
the layers' integer product folded into one launch (im2col.cu)."""
import torch

from . import runtime as rt
from .compile import COL2IM_PRODUCT_WIDTHS
from .intmm import tile_sums

_IM2COL_TYPES = {torch.int8: "i8", torch.float32: "f32"}


def _conv_args(channels, height, width, out_h, out_w, kernel_size, padding, dilation, stride) -> tuple:
    """The geometry parameters that im2col.cu's kernels share, in their order."""
    (kh, kw), (ph, pw), (dh, dw), (sh, sw) = kernel_size, padding, dilation, stride
    return (rt.u32(channels), rt.u32(height), rt.u32(width), rt.u32(out_h), rt.u32(out_w), rt.i32(kh), rt.i32(kw),
            rt.i32(ph), rt.i32(pw), rt.i32(dh), rt.i32(dw), rt.i32(sh), rt.i32(sw))


def _mask_args(keep: torch.Tensor | None) -> tuple:
    """im2col.cu's MASK_ARGS: the estimator's mask and its strides (any layout)."""
    strides = (0,) * 4 if keep is None else keep.stride()
    return (rt.ptr(keep), *(rt.u32(s) for s in strides))


def im2col(x: torch.Tensor, kernel_size, padding, dilation, stride, columns: bool, out_size) -> torch.Tensor:
    """As `hdqt_cil.quant.im2col.im2col` (a copy: the same bits by construction), in one launch: a thread writes
    16 consecutive bytes of the output, gathering its inputs (im2col.cu). Rows (K = channel, kh, kw fastest)
    read x in its own layout, the channels-last levels of a BatchNorm's output included; columns step along an
    input row (out_w fastest), which only a contiguous x gives consecutive addresses, so they read a contiguous
    copy (of int8 levels, a quarter of the float input's copy it replaces). `out_size`: the convolution's
    (out_h, out_w) (the reference's conv_output_size). int8 and float32; other dtypes and sizes past 32-bit
    indices are not covered."""
    rt.require_cuda(x)
    batch, channels, height, width = x.shape
    out_h, out_w = out_size
    k, positions = channels * kernel_size[0] * kernel_size[1], out_h * out_w
    total = batch * k * positions
    if x.dtype not in _IM2COL_TYPES or total == 0 or total >= rt.MAX_ELEMENTS or x.numel() >= rt.MAX_ELEMENTS:
        raise rt.NotCovered(f"im2col of a {x.dtype} tensor of shape {tuple(x.shape)}")
    with rt.on_device(x):
        x = x.contiguous() if columns else x
        out = rt.empty((batch, k, positions) if columns else (batch, positions, k), x.dtype, x.device)
        per_thread = 16 // x.element_size()
        name = f"im2col_{'columns' if columns else 'rows'}_{_IM2COL_TYPES[x.dtype]}"
        rt.launch(rt.function("im2col.cu", name), (-(-total // (256 * per_thread)),), (256,),
                  (rt.ptr(x), *_conv_args(channels, height, width, out_h, out_w, kernel_size, padding, dilation,
                                          stride), *(rt.u32(s) for s in x.stride()), rt.u32(total), rt.ptr(out)))
    return out


COL2IM_LANES = 4  # consecutive channels in a col2im warp (of 32 / COL2IM_LANES consecutive positions)


def col2im(rows: torch.Tensor, x_shape, kernel_size, padding, dilation, stride, out_size,
           keep: torch.Tensor | None = None) -> torch.Tensor:
    """As `hdqt_cil.quant.im2col.col2im`, bit for bit and in its layout (a view of a padded buffer): one thread per
    input element adds its patches' contributions in the reference's order (im2col.cu), where the reference adds
    kh·kw strided views one after the other; a warp holds COL2IM_LANES channels of a few positions. `out_size` as
    in im2col. `keep`: a bool mask of x_shape (any layout), multiplied in: col2im(...) * keep, contiguous."""
    rt.require_cuda(rows)
    (ph, pw), (sh, sw) = padding, stride
    batch, channels, height, width = x_shape
    out_h, out_w = out_size
    positions = height * width
    lanes = min(COL2IM_LANES, 1 << (channels - 1).bit_length())  # channels a warp holds (a power of two)
    warps = -(-channels // lanes) * -(-positions // (32 // lanes))  # a sample's
    if (batch * channels * positions == 0 or rows.numel() >= rt.MAX_ELEMENTS or batch > 65535  # the grid's y
            or warps * 32 >= rt.MAX_ELEMENTS):
        raise rt.NotCovered(f"col2im into shape {tuple(x_shape)}")
    if keep is not None and (keep.dtype != torch.bool or keep.shape != tuple(x_shape)):
        raise rt.NotCovered(f"a keep mask {keep.dtype} {tuple(keep.shape)}")
    with rt.on_device(rows):
        src = rows.to(torch.float32).contiguous()
        oph, opw = (0, 0) if keep is not None else (ph, pw)
        out = rt.empty((batch, channels, height + 2 * oph, width + 2 * opw), torch.float32, rows.device)
        name = "col2im_f32_unit" if (sh, sw) == (1, 1) else "col2im_f32"
        rt.launch(rt.function("im2col.cu", name), (-(-warps // 8), batch), (256,),
                  (rt.ptr(src), *_conv_args(channels, height, width, out_h, out_w, kernel_size, padding, dilation,
                                            stride), rt.u32(lanes), *_mask_args(keep), rt.i32(oph), rt.i32(opw),
                   rt.ptr(out)))
    return out[:, :, oph:oph + height, opw:opw + width]


def col2im_int_matmul(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, block: int,
                      tile, acc_bits, bounds, x_shape, kernel_size, padding, dilation, stride, out_size,
                      keep: torch.Tensor | None = None, tally: torch.Tensor | None = None) -> torch.Tensor:
    """col2im(scaled_int_matmul(a, b, scale_a, scale_b, block, tile, acc_bits)) (* keep) of quant/backend.py, bit
    for bit and in col2im's layout, in one launch that never writes the (B, L, K) float rows (im2col.cu
    col2im_int_matmul): a (B, L, O) and b (O, K) int8 levels, O contiguous in a (b is packed so where it is not: a
    weight's levels as the forward left them, LUQ's, which its backward takes as they are), scale_a broadcastable to
    (B, L, 1), scale_b to (1, K), `block` a power of two. tally: an int64 (2,) view to which (saturated tile sums,
    tile sums) are added, as the product's. NotCovered for O other than COL2IM_PRODUCT_WIDTHS, a tile that is not
    a multiple of 16, unaligned rows, batched weights, sums beyond int32."""
    rt.require_cuda(a, b)
    if b.dim() == 2 and b.stride(-2) != 1:  # a weight's levels as the forward left them, (O, K) rows: packed with
        b = b.t().contiguous().t()  # O contiguous (K·O bytes, a small copy)
    batch, channels, height, width = x_shape
    (kh, kw), (ph, pw) = kernel_size, padding
    out_h, out_w = out_size
    positions, o, k = out_h * out_w, a.shape[-1], b.shape[-1]
    aligned = (a.dtype == b.dtype == torch.int8 and a.dim() == 3 and b.dim() == 2 and a.stride(-1) == 1
               and b.stride(-2) == 1 and a.stride(-2) % 16 == 0 and a.stride(0) % 16 == 0 and b.stride(-1) % 16 == 0
               and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0)
    plane = (height + 2 * ph) * (width + 2 * pw)
    if (not aligned or o not in COL2IM_PRODUCT_WIDTHS or (tile is not None and tile < o and tile % 16)
            or a.shape != (batch, positions, o) or max(a.stride(0), b.stride(-1) * k) >= 2**32
            or k != channels * kh * kw or batch > 65535 or channels * plane >= rt.MAX_ELEMENTS
            or o * float(bounds[0]) * float(bounds[1]) >= 2**31
            or (keep is not None and (keep.dtype != torch.bool or keep.shape != tuple(x_shape)))):
        raise rt.NotCovered(f"a convolution's input gradient from operands {tuple(a.shape)} {tuple(b.shape)}")
    limit = 0 if acc_bits is None or acc_bits >= 32 else 2 ** (acc_bits - 1) - 1
    sa = scale_a.float().expand(batch, positions, 1)
    sb = scale_b.float().reshape(1, -1).expand(1, k)
    with rt.on_device(a):
        oph, opw = (0, 0) if keep is not None else (ph, pw)
        out = rt.empty((batch, channels, height + 2 * oph, width + 2 * opw), torch.float32, a.device)
        counter, seen = (rt.ZEROS_I64.take(1, a.device), None) if tally is None else (tally[0], tally[1])
        sums = batch * positions * k * tile_sums(tile, acc_bits, o)
        per_thread = 4 if channels % 4 == 0 else 1  # channels a thread: G's row loaded once for them
        unit = "_unit" if tuple(stride) == (1, 1) else ""
        fn = rt.function("im2col.cu", f"col2im_int_matmul_{o}_c{per_thread}{unit}")
        tile_steps = (o if tile is None or tile >= o else tile) // 16
        rt.launch(fn, (-(-(channels // per_thread) * plane // 256), batch), (256,),
                  (rt.ptr(a), rt.u32(a.stride(0)), rt.u32(a.stride(1)), rt.ptr(b), rt.u32(b.stride(-1)),
                   rt.i32(tile_steps), rt.i32(limit), rt.ptr(sa), rt.u32(sa.stride(0)), rt.u32(sa.stride(1)),
                   rt.ptr(sb), rt.u32(sb.stride(-1)), rt.f32(1.0 / block),
                   *_conv_args(channels, height, width, out_h, out_w, kernel_size, padding, dilation, stride),
                   *_mask_args(keep), rt.i32(oph), rt.i32(opw), rt.ptr(out), rt.ptr(counter), rt.ptr(seen),
                   rt.u64(sums)))
    return out[:, :, oph:oph + height, opw:opw + width]
