"""col2im: a convolution's input gradient from the gradient of its im2col rows (docs/numerics.md, "col2im").

The float sums of overlapping patches are part of the numerics: each padded input position starts at +0 and adds
the contributions of the kernel offsets (i, j) in row-major order, one rounding each. The CUDA kernel
(hdqt_cil.kernels.col2im) adds in the same order, so both give the same bits."""
import torch


def conv_output_size(x_shape, kernel_size, padding, dilation, stride) -> tuple[int, int]:
    """(out_h, out_w) of a convolution of an input of shape (..., H, W)."""
    return tuple((size + 2 * p - d * (k - 1) - 1) // s + 1 for size, k, p, d, s in
                 zip(x_shape[-2:], kernel_size, padding, dilation, stride))


def col2im(rows: torch.Tensor, x_shape, kernel_size, padding, dilation, stride) -> torch.Tensor:
    """The (B, C, H, W) input gradient of rows (B, L, K), L = out_h · out_w positions and K = C · kh · kw in
    (channel, kh, kw) order (F.unfold's), as the (ph:ph+H, pw:pw+W) view of a zero-padded float buffer."""
    (kh, kw), (ph, pw), (dh, dw), (sh, sw) = kernel_size, padding, dilation, stride
    batch, channels, height, width = x_shape
    out_h, out_w = conv_output_size(x_shape, kernel_size, padding, dilation, stride)
    cols = rows.reshape(batch, out_h, out_w, channels, kh, kw).permute(0, 3, 4, 5, 1, 2)
    grad = rows.new_zeros(batch, channels, height + 2 * ph, width + 2 * pw)
    for i in range(kh):
        for j in range(kw):
            grad[:, :, i * dh:i * dh + sh * (out_h - 1) + 1:sh, j * dw:j * dw + sw * (out_w - 1) + 1:sw].add_(
                cols[:, :, i, j])
    return grad[:, :, ph:ph + height, pw:pw + width]
