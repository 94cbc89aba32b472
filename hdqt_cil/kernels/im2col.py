"""The convolution's layouts on the GPU: `hdqt_cil.quant.im2col`'s im2col and col2im bit for bit (im2col.cu)."""
import torch

from . import runtime as rt

_IM2COL_TYPES = {torch.int8: "i8", torch.float32: "f32"}


def _conv_args(channels, height, width, out_h, out_w, kernel_size, padding, dilation, stride) -> tuple:
    """The geometry parameters that im2col.cu's kernels share, in their order."""
    (kh, kw), (ph, pw), (dh, dw), (sh, sw) = kernel_size, padding, dilation, stride
    return (rt.u32(channels), rt.u32(height), rt.u32(width), rt.u32(out_h), rt.u32(out_w), rt.i32(kh), rt.i32(kw),
            rt.i32(ph), rt.i32(pw), rt.i32(dh), rt.i32(dw), rt.i32(sh), rt.i32(sw))


def im2col(x: torch.Tensor, kernel_size, padding, dilation, stride, columns: bool, out_size) -> torch.Tensor:
    """As `hdqt_cil.quant.im2col.im2col` (a copy: the same bits by construction), in one launch: a thread writes
    16 consecutive bytes of the output, gathering its inputs (im2col.cu). `out_size`: the convolution's
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
        src = x.contiguous()
        out = rt.empty((batch, k, positions) if columns else (batch, positions, k), x.dtype, x.device)
        per_thread = 16 // x.element_size()
        name = f"im2col_{'columns' if columns else 'rows'}_{_IM2COL_TYPES[x.dtype]}"
        rt.launch(rt.function("im2col.cu", name), (-(-total // (256 * per_thread)),), (256,),
                  (rt.ptr(src), *_conv_args(channels, height, width, out_h, out_w, kernel_size, padding, dilation,
                                            stride), rt.u32(total), rt.ptr(out)))
    return out


COL2IM_LANES = 4  # consecutive channels in a col2im warp (of 32 / COL2IM_LANES consecutive positions)


def col2im(rows: torch.Tensor, x_shape, kernel_size, padding, dilation, stride, out_size,
           keep: torch.Tensor | None = None) -> torch.Tensor:
    """As `hdqt_cil.quant.im2col.col2im`, bit for bit and in its layout (a view of a padded buffer): one thread per
    input element adds its patches' contributions in the reference's order (im2col.cu), where the reference adds
    kh·kw strided views one after the other; a warp holds COL2IM_LANES channels of a few positions. `out_size` as
    in im2col. `keep`: a contiguous bool mask of x_shape, multiplied in: col2im(...) * keep, contiguous as that
    product is."""
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
    if keep is not None and (keep.dtype != torch.bool or keep.shape != tuple(x_shape) or not keep.is_contiguous()):
        raise rt.NotCovered(f"a keep mask {keep.dtype} {tuple(keep.shape)} {keep.stride()}")
    with rt.on_device(rows):
        src = rows.to(torch.float32).contiguous()
        oph, opw = (0, 0) if keep is not None else (ph, pw)
        out = rt.empty((batch, channels, height + 2 * oph, width + 2 * opw), torch.float32, rows.device)
        name = "col2im_f32_unit" if (sh, sw) == (1, 1) else "col2im_f32"
        rt.launch(rt.function("im2col.cu", name), (-(-warps // 8), batch), (256,),
                  (rt.ptr(src), *_conv_args(channels, height, width, out_h, out_w, kernel_size, padding, dilation,
                                            stride), rt.u32(lanes), rt.ptr(keep), rt.i32(oph), rt.i32(opw),
                   rt.ptr(out)))
    return out[:, :, oph:oph + height, opw:opw + width]
