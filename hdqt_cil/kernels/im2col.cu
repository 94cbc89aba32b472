// The convolution's layouts of hdqt_cil/quant/im2col.py: im2col (the patches of the input as the products'
// operands) and col2im (the input gradient from the gradient of the im2col rows). K = C * kh * kw in F.unfold's
// (channel, kh, kw) order; 32-bit indices within a sample or an output (the caller checks the sizes).

#include "common.cuh"

// ------------------------------------------------------------------------------------------------------ im2col
// x (B, C, H, W), elements at b * sb + c * sc + y * sy + x * sx (any layout: contiguous, or channels-last as the
// levels of a BatchNorm's output are), to rows (B, out_h, out_w, C, kh, kw) or columns (B, C, kh, kw, out_h,
// out_w), zeros where a patch reaches into the padding. A thread writes VEC consecutive outputs (16 bytes, one vector store):
// it splits the index of the first into its six coordinates once, then steps the innermost one with carries,
// tracking the input row and column it reads (y, x) and the offset of the (sample, channel) plane.

struct Geometry {
    u32 channels, height, width, out_h, out_w;
    int kh, kw, ph, pw, dh, dw, sh, sw;
};

struct Strides {  // of the input, in elements
    u32 b, c, y, x;
};

struct Cursor {
    u32 c, i, j, oy, ox;
    int y, x;   // the input position read: oy * sh - ph + i * dh, ox * sw - pw + j * dw
    u64 plane;  // b * sb + c * sc
};

template <bool COLUMNS>
__device__ __forceinline__ Cursor cursor_at(u32 e, const Geometry& g, const Strides& st) {
    Cursor p;
    u32 b;
    if (COLUMNS) {  // (b, c, i, j, oy, ox), ox fastest
        p.ox = e % g.out_w; e /= g.out_w;
        p.oy = e % g.out_h; e /= g.out_h;
        p.j = e % g.kw; e /= g.kw;
        p.i = e % g.kh; e /= g.kh;
        p.c = e % g.channels; b = e / g.channels;
    } else {  // (b, oy, ox, c, i, j), j fastest
        p.j = e % g.kw; e /= g.kw;
        p.i = e % g.kh; e /= g.kh;
        p.c = e % g.channels; e /= g.channels;
        p.ox = e % g.out_w; e /= g.out_w;
        p.oy = e % g.out_h; b = e / g.out_h;
    }
    p.y = (int)(p.oy * g.sh + p.i * g.dh) - g.ph;
    p.x = (int)(p.ox * g.sw + p.j * g.dw) - g.pw;
    p.plane = (u64)b * st.b + (u64)p.c * st.c;
    return p;
}

// The next output's coordinates. A wrap of the channel moves the plane back to the sample's first one; the wrap
// of the outermost output coordinate moves it on to the next sample.
template <bool COLUMNS>
__device__ __forceinline__ void advance(Cursor& p, const Geometry& g, const Strides& st) {
    if (COLUMNS) {
        p.x += g.sw;
        if (++p.ox < g.out_w) return;
        p.ox = 0; p.x -= g.out_w * g.sw; p.y += g.sh;
        if (++p.oy < g.out_h) return;
        p.oy = 0; p.y -= g.out_h * g.sh; p.x += g.dw;
        if (++p.j < (u32)g.kw) return;
        p.j = 0; p.x -= g.kw * g.dw; p.y += g.dh;
        if (++p.i < (u32)g.kh) return;
        p.i = 0; p.y -= g.kh * g.dh; p.plane += st.c;  // the next channel, or the next sample's first
        if (++p.c == g.channels) {
            p.c = 0;
            p.plane += st.b - (u64)g.channels * st.c;
        }
    } else {
        p.x += g.dw;
        if (++p.j < (u32)g.kw) return;
        p.j = 0; p.x -= g.kw * g.dw; p.y += g.dh;
        if (++p.i < (u32)g.kh) return;
        p.i = 0; p.y -= g.kh * g.dh; p.plane += st.c;
        if (++p.c < g.channels) return;
        p.c = 0; p.plane -= (u64)g.channels * st.c; p.x += g.sw;
        if (++p.ox < g.out_w) return;
        p.ox = 0; p.x -= g.out_w * g.sw; p.y += g.sh;
        if (++p.oy < g.out_h) return;
        p.oy = 0; p.y -= g.out_h * g.sh; p.plane += st.b;
    }
}

template <typename T, bool COLUMNS>
__device__ __forceinline__ void im2col_body(const T* __restrict__ x, Geometry g, Strides st, u32 total,
                                            T* __restrict__ out) {
    constexpr int VEC = 16 / sizeof(T);
    const u32 first = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (first >= total) return;
    Cursor p = cursor_at<COLUMNS>(first, g, st);
    union { uint4 vector; T lane[VEC]; } values;
    #pragma unroll
    for (int v = 0; v < VEC; ++v) {
        const bool inside = (u32)p.y < g.height && (u32)p.x < g.width;
        values.lane[v] = inside ? __ldg(x + p.plane + (u64)p.y * st.y + (u64)p.x * st.x) : T(0);
        if (v + 1 < VEC) advance<COLUMNS>(p, g, st);
    }
    if (first + VEC <= total) {
        *reinterpret_cast<uint4*>(out + first) = values.vector;
    } else {
        for (u32 v = 0; first + v < total; ++v) out[first + v] = values.lane[v];
    }
}

#define IM2COL(NAME, T, COLUMNS)                                                                               \
    extern "C" __global__ void __launch_bounds__(256)                                                          \
        NAME(const T* x, u32 channels, u32 height, u32 width, u32 out_h, u32 out_w, int kh, int kw, int ph,      \
             int pw, int dh, int dw, int sh, int sw, u32 sb, u32 sc, u32 sy, u32 sx, u32 total, T* out) {      \
        const Geometry g{channels, height, width, out_h, out_w, kh, kw, ph, pw, dh, dw, sh, sw};                \
        im2col_body<T, COLUMNS>(x, g, Strides{sb, sc, sy, sx}, total, out);                                    \
    }

IM2COL(im2col_rows_i8, signed char, false)
IM2COL(im2col_columns_i8, signed char, true)
IM2COL(im2col_rows_f32, float, false)
IM2COL(im2col_columns_f32, float, true)

// ------------------------------------------------------------------------------------------------------ col2im
// rows is (B, out_h, out_w, C, kh, kw) contiguous (the (B, L, K) product); out is (B, C, H + 2 oph, W + 2 opw),
// of which only the interior is written: the reference's zero-padded buffer (oph, opw = the padding; the caller
// returns the interior's view) or, with `keep`, the contiguous (B, C, H, W) (oph = opw = 0). A thread owns one
// interior element (b, c, y, x): it starts from +0 and adds the contributions of the kernel offsets (i, j) in
// row-major order, one rounding each, as the reference's sequence of adds into strided views does; where `keep`
// (bool, (B, C, H, W), any strides) is given, the sum is multiplied by it, as the layers' straight-through
// estimator does (g * keep, written contiguous whatever keep's layout).
// A warp holds `lanes` consecutive channels (lane % lanes) of 32 / lanes consecutive positions (lane / lanes), so
// that its loads of one offset fall on a few lines of the positions' K-rows (one channel a warp, 32 positions,
// touched 32 lines a load: kernel_notes v20). Grid: y = sample, x = CTAs over its (channel block, position block)
// warps. UNIT: stride 1, where the output position of an offset needs no division.

// The straight-through estimator's mask (bool, (B, C, H, W) in any layout: its element (b, c, y, x) at
// b * sb + c * sc + y * sy + x * sx), or none: g * keep as the reference multiplies it.
struct Mask {
    const unsigned char* __restrict__ keep;
    u32 sb, sc, sy, sx;

    __device__ __forceinline__ float apply(float g, u32 b, u32 c, u32 y, u32 x) const {
        if (keep == nullptr) return g;
        return __fmul_rn(g, keep[(u64)b * sb + (u64)c * sc + (u64)y * sy + (u64)x * sx] ? 1.0f : 0.0f);
    }
};
#define MASK_ARGS const unsigned char *keep, u32 keep_b, u32 keep_c, u32 keep_y, u32 keep_x
#define MASK Mask{keep, keep_b, keep_c, keep_y, keep_x}

template <bool UNIT>
__device__ __forceinline__ void col2im_body(const float* __restrict__ rows, u32 channels, u32 height, u32 width,
                                            u32 out_h, u32 out_w, int kh, int kw, int ph, int pw, int dh, int dw,
                                            int sh, int sw, u32 lanes, const Mask mask, int oph, int opw,
                                            float* __restrict__ out) {
    const u32 lane = threadIdx.x & 31, per_warp = 32 / lanes;
    const u32 positions = height * width;
    const u32 cblocks = (channels + lanes - 1) / lanes, pblocks = (positions + per_warp - 1) / per_warp;
    const u32 warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, b = blockIdx.y;
    const u32 pb = warp % pblocks, cb = warp / pblocks;
    const u32 c = cb * lanes + lane % lanes, pos = pb * per_warp + lane / lanes;
    if (cb >= cblocks || c >= channels || pos >= positions) return;
    const u32 y = pos / width, x = pos - y * width;
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
    const u64 at = (((u64)b * channels + c) * (height + 2 * oph) + y + oph) * (width + 2 * opw) + x + opw;
    out[at] = mask.apply(acc, b, c, y, x);
}

#define COL2IM(NAME, UNIT)                                                                                    \
    extern "C" __global__ void NAME(const float* rows, u32 channels, u32 height, u32 width, u32 out_h,       \
                                    u32 out_w, int kh, int kw, int ph, int pw, int dh, int dw, int sh,        \
                                    int sw, u32 lanes, MASK_ARGS, int oph, int opw, float* out) {             \
        col2im_body<UNIT>(rows, channels, height, width, out_h, out_w, kh, kw, ph, pw, dh, dw, sh, sw, lanes,   \
                          MASK, oph, opw, out);                                                               \
    }

COL2IM(col2im_f32, false)
COL2IM(col2im_f32_unit, true)

// ------------------------------------------------------------------------------------- col2im of a product
// The input gradient of a convolution straight from its integer operands: col2im(scaled_int_matmul(G, Wᵀ)) of
// quant/backend.py, bit for bit, without the (B, L, K) float rows. G (B, L, O) and W (K, O) are int8 levels with O
// contiguous (16-byte rows, O = 16 STEPS); a thread owns CPT consecutive channels of one position (b, y, x) of the
// zero-padded input and, for each kernel offset (i, j) in row-major order that reaches it from an output position
// l, loads G's row l once and forms the product's elements (l, k = (c, i, j)) of its channels as the GEMM does
// (Σ_o per K tile with dp4a, each tile sum clamped to ±limit where limit > 0, then float(sum) * ((sa * sb) *
// block_inv)), adding each to its channel's float total from +0, as col2im does. Positions in the padding ring write
// nothing but count their products' clamped tile sums, so the count covers every element of the product, as the
// GEMM's does. `keep` and the output's padding (oph, opw) as in col2im. UNIT: stride 1 (no division by it).

__device__ __forceinline__ int dot16(int4 a, int4 b, int s) {
    s = __dp4a(a.x, b.x, s);
    s = __dp4a(a.y, b.y, s);
    s = __dp4a(a.z, b.z, s);
    return __dp4a(a.w, b.w, s);
}

// The output coordinate of input coordinate p (padded) through offset o (already times dilation): -1 if none.
template <bool UNIT>
__device__ __forceinline__ int source_of(int p, int o, int stride, int size) {
    int q = p - o;
    if (q < 0) return -1;
    if (!UNIT) {
        if (q % stride != 0) return -1;
        q /= stride;
    }
    return q < size ? q : -1;
}

template <int STEPS, int CPT, bool UNIT>
__device__ __forceinline__ void col2im_int_matmul_body(
    const signed char* __restrict__ G, u32 g_batch, u32 g_row, const signed char* __restrict__ W, u32 w_row,
    int tile_steps, int limit, const float* __restrict__ sa, u32 sa_batch, u32 sa_row, const float* __restrict__ sb,
    u32 sb_col, float block_inv, u32 channels, u32 height, u32 width, u32 out_h, u32 out_w, int kh, int kw, int ph,
    int pw, int dh, int dw, int sh, int sw, const Mask mask, int oph, int opw,
    float* __restrict__ out, u64* __restrict__ count, u64* __restrict__ seen, u64 sums) {
    const u32 padded_w = width + 2 * pw, plane = (height + 2 * ph) * padded_w;
    const u32 index = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
    const bool active = index < (channels / CPT) * plane;
    const u32 c0 = (index / plane) * CPT, pos = index % plane;
    const int py = (int)(pos / padded_w), px = (int)(pos % padded_w);  // padded coordinates
    const signed char* g_sample = G + (u64)b * g_batch;
    const float* sa_sample = sa + (u64)b * sa_batch;
    const u32 taps = (u32)(kh * kw);
    float acc[CPT];
#pragma unroll
    for (int cc = 0; cc < CPT; ++cc) acc[cc] = 0.0f;
    u32 clamped = 0u;
    for (int i = 0; active && i < kh; ++i) {
        const int oy = source_of<UNIT>(py, i * dh, sh, (int)out_h);
        if (oy < 0) continue;
        for (int j = 0; j < kw; ++j) {
            const int ox = source_of<UNIT>(px, j * dw, sw, (int)out_w);
            if (ox < 0) continue;
            const u32 l = (u32)oy * out_w + (u32)ox;
            const int4* g = reinterpret_cast<const int4*>(g_sample + (u64)l * g_row);
            int4 gv[STEPS];
#pragma unroll
            for (int q = 0; q < STEPS; ++q) gv[q] = __ldg(g + q);
            const float row_scale = sa_sample[(u64)l * sa_row];
#pragma unroll
            for (int cc = 0; cc < CPT; ++cc) {
                const u32 k = (c0 + cc) * taps + (u32)(i * kw + j);
                const int4* w = reinterpret_cast<const int4*>(W + (u64)k * w_row);
                int total = 0, s = 0;
#pragma unroll
                for (int q = 0; q < STEPS; ++q) {
                    s = dot16(gv[q], __ldg(w + q), s);
                    if ((q + 1) % tile_steps == 0 || q == STEPS - 1) {  // the end of a K tile
                        if (limit > 0) {
                            const int clamp = min(max(s, -limit), limit);
                            clamped += clamp != s ? 1u : 0u;
                            s = clamp;
                        }
                        total += s;
                        s = 0;
                    }
                }
                const float scale = __fmul_rn(__fmul_rn(row_scale, sb[(u64)k * sb_col]), block_inv);
                acc[cc] = __fadd_rn(acc[cc], __fmul_rn(__int2float_rn(total), scale));
            }
        }
    }
    const int y = py - ph, x = px - pw;
    if (active && y >= 0 && y < (int)height && x >= 0 && x < (int)width) {
#pragma unroll
        for (int cc = 0; cc < CPT; ++cc) {
            const u64 plane_at = (u64)b * channels + c0 + cc;
            const u64 o = (plane_at * (height + 2 * oph) + y + oph) * (width + 2 * opw) + x + opw;
            const float v = acc[cc];
            out[o] = mask.apply(v, b, c0 + cc, (u32)y, (u32)x);
        }
    }
    if (limit > 0) {
#pragma unroll
        for (int d = 16; d > 0; d >>= 1) clamped += __shfl_xor_sync(0xffffffffu, clamped, d);
        if ((threadIdx.x & 31) == 0 && clamped != 0u) atomicAdd(count, (u64)clamped);
    }
    if (seen != nullptr && index == 0 && b == 0) atomicAdd(seen, sums);
}

#define COL2IM_INT_MATMUL(NAME, STEPS, CPT, UNIT)                                                             \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                                  \
        const signed char* G, u32 g_batch, u32 g_row, const signed char* W, u32 w_row, int tile_steps,        \
        int limit, const float* sa, u32 sa_batch, u32 sa_row, const float* sb, u32 sb_col, float block_inv,   \
        u32 channels, u32 height, u32 width, u32 out_h, u32 out_w, int kh, int kw, int ph, int pw, int dh,    \
        int dw, int sh, int sw, MASK_ARGS, int oph, int opw, float* out, u64* count, u64* seen, u64 sums) {   \
        col2im_int_matmul_body<STEPS, CPT, UNIT>(G, g_batch, g_row, W, w_row, tile_steps, limit, sa, sa_batch,  \
                                                 sa_row, sb, sb_col, block_inv, channels, height, width, out_h, \
                                                 out_w, kh, kw, ph, pw, dh, dw, sh, sw, MASK, oph, opw, out,    \
                                                 count, seen, sums);                                          \
    }
// Named col2im_int_matmul_<O>_c<CPT>[_unit]: O = 16 STEPS, CPT channels a thread, stride 1.
#define COL2IM_INT_MATMUL_O(O, STEPS)                                                                         \
    COL2IM_INT_MATMUL(col2im_int_matmul_##O##_c1, STEPS, 1, false)                                            \
    COL2IM_INT_MATMUL(col2im_int_matmul_##O##_c1_unit, STEPS, 1, true)                                        \
    COL2IM_INT_MATMUL(col2im_int_matmul_##O##_c4, STEPS, 4, false)                                            \
    COL2IM_INT_MATMUL(col2im_int_matmul_##O##_c4_unit, STEPS, 4, true)
COL2IM_INT_MATMUL_O(16, 1)
COL2IM_INT_MATMUL_O(32, 2)
COL2IM_INT_MATMUL_O(64, 4)
