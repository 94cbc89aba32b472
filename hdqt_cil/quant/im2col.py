"""The convolution's layouts: im2col (the products' operands) and col2im (the input gradient back from them)
(docs/numerics.md, "im2col and col2im"). K = C·kh·kw in `F.unfold`'s (channel, kh, kw) order throughout.

im2col is a copy, so any implementation gives the same bits. col2im's float sums of overlapping patches are part
of the numerics: each padded input position starts at +0 and adds the contributions of the kernel offsets (i, j)
in row-major order, one rounding each. The CUDA kernels (hdqt_cil/kernels/im2col.cu) follow both."""
import torch
import torch.nn.functional as F


def conv_output_size(x_shape, kernel_size, padding, dilation, stride) -> tuple[int, int]:
    """(out_h, out_w) of a convolution of an input of shape (..., H, W)."""
    return tuple((size + 2 * p - d * (k - 1) - 1) // s + 1 for size, k, p, d, s in
                 zip(x_shape[-2:], kernel_size, padding, dilation, stride))


def im2col(x: torch.Tensor, kernel_size, padding, dilation, stride, columns: bool = False) -> torch.Tensor:
    """The patches of x (B, C, H, W), zero-padded, contiguous in x's dtype: (B, L, K) rows (the forward product's
    operand), or with `columns` (B, K, L) (F.unfold's layout, the weight gradient's), L = out_h · out_w."""
    (kh, kw), (ph, pw), (dh, dw), (sh, sw) = kernel_size, padding, dilation, stride
    patches = F.pad(x, (pw, pw, ph, ph)).unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)
    patches = patches[..., ::dh, ::dw]  # (B, C, out_h, out_w, kh, kw), a strided view
    order = (0, 1, 4, 5, 2, 3) if columns else (0, 2, 3, 1, 4, 5)
    batch, k = x.shape[0], x.shape[1] * kh * kw
    shape = (batch, k, -1) if columns else (batch, -1, k)
    return patches.permute(order).reshape(shape)


def col2im(rows: torch.Tensor, x_shape, kernel_size, padding, dilation, stride) -> torch.Tensor:
    """The (B, C, H, W) input gradient of rows (B, L, K), as the (ph:ph+H, pw:pw+W) view of a zero-padded float
    buffer."""
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
