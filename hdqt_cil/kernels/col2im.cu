// col2im of hdqt_cil/quant/col2im.py: the input gradient of a convolution from the gradient of its im2col rows.
//
// rows is (B, out_h, out_w, C, kh, kw) contiguous (the (B, L, K) product, K in F.unfold's order); out is the
// zero-padded (B, C, H + 2ph, W + 2pw) buffer, of which only the interior is written (the caller returns that
// view). One thread per interior element: it starts from +0 and adds the contributions of the kernel offsets
// (i, j) in row-major order, one rounding each, as the reference's sequence of adds into strided views does.
// Consecutive threads take consecutive columns x, so the writes of a warp are consecutive.

typedef unsigned int u32;
typedef unsigned long long u64;

extern "C" __global__ void col2im_f32(const float* __restrict__ rows, u32 channels, u32 height, u32 width,
                                      u32 out_h, u32 out_w, int kh, int kw, int ph, int pw, int dh, int dw,
                                      int sh, int sw, u64 total, float* __restrict__ out) {
    const u32 padded_h = height + 2 * ph, padded_w = width + 2 * pw;
    const u64 k = (u64)channels * kh * kw;
    for (u64 idx = blockIdx.x * (u64)blockDim.x + threadIdx.x; idx < total; idx += (u64)gridDim.x * blockDim.x) {
        const u32 x = idx % width;
        u64 rest = idx / width;
        const u32 y = rest % height;
        rest /= height;
        const u32 c = rest % channels;
        const u64 b = rest / channels;
        const float* sample = rows + b * out_h * out_w * k + (u64)c * kh * kw;
        float acc = 0.0f;
        for (int i = 0; i < kh; ++i) {
            const int yy = (int)y + ph - i * dh;  // = oy * sh for the output row oy this offset reads
            if (yy < 0 || yy % sh != 0 || yy / sh >= (int)out_h) continue;
            const float* row = sample + (u64)(yy / sh) * out_w * k + i * kw;
            for (int j = 0; j < kw; ++j) {
                const int xx = (int)x + pw - j * dw;
                if (xx < 0 || xx % sw != 0 || xx / sw >= (int)out_w) continue;
                acc = __fadd_rn(acc, __ldg(row + (u64)(xx / sw) * k + j));
            }
        }
        out[((b * channels + c) * padded_h + y + ph) * padded_w + x + pw] = acc;
    }
}
