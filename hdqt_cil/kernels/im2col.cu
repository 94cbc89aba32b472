// The convolution's layouts of hdqt_cil/quant/im2col.py: im2col (the patches of the input as the products'
// operands) and col2im (the input gradient from the gradient of the im2col rows). K = C * kh * kw in F.unfold's
// (channel, kh, kw) order; 32-bit indices within a sample or an output (the caller checks the sizes).

#include "common.cuh"

// ------------------------------------------------------------------------------------------------------ im2col
// x (B, C, H, W) contiguous to rows (B, out_h, out_w, C, kh, kw) or columns (B, C, kh, kw, out_h, out_w), zeros
// where a patch reaches into the padding. A CTA makes one contiguous block of the output, from a window of the
// input it first copies into shared memory (coalesced rows, the padding written as zeros):
//   rows: the out_w * K elements of output row (b, oy), from the kh input rows (c, i) of every channel;
//   columns: the kh * kw * out_h * out_w elements of channel (b, c), from its padded plane.
// Then each thread writes VEC consecutive outputs (16 bytes; one vector store where the block is 16-byte aligned):
// it splits the index of the first into coordinates once and steps through the rest with carries, following
// the window offset it reads. (A thread gathering from global memory instead, 16 outputs apart from its
// neighbours', touched a cache line a lane: 2-3x slower, kernel_notes v19.)

struct Geometry {
    u32 channels, height, width, out_h, out_w;
    u32 kh, kw, ph, pw, dh, dw, sh, sw;
};

// The window's rows (of width + 2 pw elements): rows (c, i) of output row blk = (b, oy), or the padded plane
// blk = (b, c). A warp copies WINDOW_ROWS rows at a time, their loads all issued before the first store (one load
// latency for them, not one each).
#define WINDOW_ROWS 8

template <typename T, bool COLUMNS>
__device__ __forceinline__ const T* window_row(const T* __restrict__ x, const Geometry& g, u32 blk, u32 r, int& y) {
    const u32 plane = g.height * g.width;
    if (COLUMNS) {
        y = (int)r - (int)g.ph;
        return x + (u64)blk * plane;
    }
    const u32 b = blk / g.out_h, oy = blk - b * g.out_h, c = r / g.kh, i = r - c * g.kh;
    y = (int)(oy * g.sh + i * g.dh) - (int)g.ph;
    return x + ((u64)b * g.channels + c) * plane;
}

template <typename T, bool COLUMNS>
__device__ __forceinline__ void load_window(const T* __restrict__ x, const Geometry& g, u32 blk, T* window) {
    const u32 wp = g.width + 2 * g.pw;
    const u32 rows = COLUMNS ? g.height + 2 * g.ph : g.channels * g.kh;
    const u32 warps = blockDim.x >> 5;
    for (u32 r0 = threadIdx.x >> 5; r0 < rows; r0 += WINDOW_ROWS * warps) {
        for (u32 xp = threadIdx.x & 31; xp < wp; xp += 32) {
            const int xx = (int)xp - (int)g.pw;
            T v[WINDOW_ROWS];
#pragma unroll
            for (int u = 0; u < WINDOW_ROWS; ++u) {
                const u32 r = r0 + u * warps;
                int y = -1;
                const T* src = r < rows ? window_row<T, COLUMNS>(x, g, blk, r, y) : x;
                v[u] = ((u32)y < g.height && (u32)xx < g.width) ? src[(u32)y * g.width + (u32)xx] : T(0);
            }
#pragma unroll
            for (int u = 0; u < WINDOW_ROWS; ++u)
                if (r0 + u * warps < rows) window[(r0 + u * warps) * wp + xp] = v[u];
        }
    }
}

template <typename T, bool COLUMNS>
__device__ __forceinline__ void im2col_body(const T* __restrict__ x, const Geometry& g, bool vec,
                                            T* __restrict__ out) {
    constexpr int VEC = 16 / sizeof(T);
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    T* window = reinterpret_cast<T*>(smem_bytes);
    load_window<T, COLUMNS>(x, g, blockIdx.x, window);
    __syncthreads();
    const u32 wp = g.width + 2 * g.pw;
    const u32 rows = g.channels * g.kh;  // rows: the window's (c, i) rows
    const u32 block = COLUMNS ? g.kh * g.kw * g.out_h * g.out_w : g.out_w * rows * g.kw;
    T* dst = out + (u64)blockIdx.x * block;
    for (u32 first = threadIdx.x * VEC; first < block; first += blockDim.x * VEC) {
        // Digits, fastest first: rows (j, r = c * kh + i, ox); columns (ox, oy, j, i). idx: the window offset.
        u32 d0, d1, d2, idx;
        if (COLUMNS) {
            u32 q = first / g.out_w;
            d0 = first - q * g.out_w;  // ox
            d1 = q % g.out_h;          // oy
            q /= g.out_h;
            d2 = q % g.kw;             // j
            const u32 i = q / g.kw;
            idx = (d1 * g.sh + i * g.dh) * wp + d0 * g.sw + d2 * g.dw;
        } else {
            const u32 q = first / g.kw;
            d0 = first - q * g.kw;     // j
            d1 = q % rows;             // r
            idx = d1 * wp + (q / rows) * g.sw + d0 * g.dw;
        }
        union { uint4 vector; T lane[VEC]; } values;
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            values.lane[v] = (first + v < block) ? window[idx] : T(0);
            if (COLUMNS) {
                idx += g.sw;
                if (++d0 == g.out_w) {
                    d0 = 0; idx += g.sh * wp - g.out_w * g.sw;
                    if (++d1 == g.out_h) {
                        d1 = 0; idx += g.dw - g.out_h * g.sh * wp;
                        if (++d2 == g.kw) { d2 = 0; idx += g.dh * wp - g.kw * g.dw; }
                    }
                }
            } else {
                idx += g.dw;
                if (++d0 == g.kw) {
                    d0 = 0; idx += wp - g.kw * g.dw;
                    if (++d1 == rows) { d1 = 0; idx += g.sw - rows * wp; }
                }
            }
        }
        if (vec && first + VEC <= block) {
            *reinterpret_cast<uint4*>(dst + first) = values.vector;
        } else {
            for (u32 v = 0; v < VEC && first + v < block; ++v) dst[first + v] = values.lane[v];
        }
    }
}

#define IM2COL(NAME, T, COLUMNS)                                                                               \
    extern "C" __global__ void __launch_bounds__(256)                                                          \
        NAME(const T* x, u32 channels, u32 height, u32 width, u32 out_h, u32 out_w, int kh, int kw, int ph,      \
             int pw, int dh, int dw, int sh, int sw, int vec, T* out) {                                        \
        const Geometry g{channels, height, width, out_h, out_w, (u32)kh, (u32)kw, (u32)ph, (u32)pw, (u32)dh,    \
                         (u32)dw, (u32)sh, (u32)sw};                                                           \
        im2col_body<T, COLUMNS>(x, g, vec != 0, out);                                                          \
    }

IM2COL(im2col_rows_i8, signed char, false)
IM2COL(im2col_columns_i8, signed char, true)
IM2COL(im2col_rows_f32, float, false)
IM2COL(im2col_columns_f32, float, true)

// ------------------------------------------------------------------------------------------------------ col2im

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
