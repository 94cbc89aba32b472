// col2im of hdqt_cil/quant/col2im.py: the input gradient of a convolution from the gradient of its im2col rows.
//
// rows is (B, out_h, out_w, C, kh, kw) contiguous (the (B, L, K) product, K in F.unfold's order); out is the
// zero-padded (B, C, H + 2ph, W + 2pw) buffer, of which only the interior is written (the caller returns that
// view). One thread per interior element: it starts from +0 and adds the contributions of the kernel offsets
// (i, j) in row-major order, one rounding each, as the reference's sequence of adds into strided views does.
// Grid: x = sample * C + channel, y = blocks of the H * W positions, consecutive threads on consecutive columns
// (consecutive writes). 32-bit indices within a sample (the caller checks the sizes); UNIT: stride 1, where the
// output position of an offset needs no division.

typedef unsigned int u32;
typedef unsigned long long u64;

template <bool UNIT>
__device__ __forceinline__ void col2im_body(const float* __restrict__ rows, u32 channels, u32 height, u32 width,
                                            u32 out_h, u32 out_w, int kh, int kw, int ph, int pw, int dh, int dw,
                                            int sh, int sw, float* __restrict__ out) {
    const u32 pos = blockIdx.y * blockDim.x + threadIdx.x;
    if (pos >= height * width) return;
    const u32 y = pos / width, x = pos - y * width;
    const u32 b = blockIdx.x / channels, c = blockIdx.x - b * channels;
    const u32 k = channels * kh * kw;
    const float* sample = rows + (u64)b * out_h * out_w * k + c * kh * kw;
    float acc = 0.0f;
    for (int i = 0; i < kh; ++i) {
        int oy = (int)y + ph - i * dh;  // = output row * sh
        if (!UNIT) {
            if (oy < 0 || oy % sh != 0) continue;
            oy /= sh;
        }
        if (oy < 0 || oy >= (int)out_h) continue;
        const float* row = sample + (u64)oy * out_w * k + i * kw;
        for (int j = 0; j < kw; ++j) {
            int ox = (int)x + pw - j * dw;
            if (!UNIT) {
                if (ox < 0 || ox % sw != 0) continue;
                ox /= sw;
            }
            if (ox < 0 || ox >= (int)out_w) continue;
            acc = __fadd_rn(acc, __ldg(row + (u64)ox * k + j));
        }
    }
    out[((u64)blockIdx.x * (height + 2 * ph) + y + ph) * (width + 2 * pw) + x + pw] = acc;
}

#define COL2IM(NAME, UNIT)                                                                                    \
    extern "C" __global__ void NAME(const float* rows, u32 channels, u32 height, u32 width, u32 out_h,       \
                                    u32 out_w, int kh, int kw, int ph, int pw, int dh, int dw, int sh,        \
                                    int sw, float* out) {                                                     \
        col2im_body<UNIT>(rows, channels, height, width, out_h, out_w, kh, kw, ph, pw, dh, dw, sh, sw, out);  \
    }

COL2IM(col2im_f32, false)
COL2IM(col2im_f32_unit, true)
