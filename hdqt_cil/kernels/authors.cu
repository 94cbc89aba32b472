// The HDQT authors' float quantizer (quant/floats.py `authors_float`) on the GPU, bit for bit as torch computes it
// on CUDA: alone (quant=fp's operands) and fused with the K tiles' sums it rounds (float_product.format_matmul with
// an accumulator format), where the reference spends some twenty elementwise passes over every tile's sums.

#include "common.cuh"

// authors_float's constants for exp_bits and man_bits: bias 2^(exp_bits - 1) - 1, the top exponent code
// 2^exp_bits - 1, steps 2^man_bits, top 1 - 2^-man_bits (the largest mantissa a value keeps before rounding).
struct AuthorsFormat {
    int bias, top_code;
    float steps, top;
};

__device__ __forceinline__ AuthorsFormat authors_format(int exp_bits, int man_bits) {
    return {(1 << (exp_bits - 1)) - 1, (1 << exp_bits) - 1, ldexpf(1.0f, man_bits), 1.0f - ldexpf(1.0f, -man_bits)};
}

// authors_float of one value, op for op as the reference: the exponent from float32 log2 of |x| + 1e-32 (which a
// value just below a power of two can round up to it), its power of two exact (ldexpf, as torch's pow(2, e) for
// these exponents), the clamp keeping a NaN as torch's does, nearest-even rounding of the scaled mantissa.
__device__ __forceinline__ float authors_of(float x, AuthorsFormat f) {
    const float m = fabsf(x);
    const int e = (int)floorf(log2f(__fadd_rn(m, 1e-32f)));
    const float q = __fsub_rn(__fdiv_rn(m, ldexpf(1.0f, e)), 1.0f);
    const float clamped = isnan(q) ? q : fminf(fmaxf(q, 0.0f), f.top);
    const float mantissa = __fdiv_rn(rintf(__fmul_rn(clamped, f.steps)), f.steps);
    const int kept = min(max(e + f.bias, 0), f.top_code) - f.bias;
    const float r = copysignf(__fmul_rn(__fadd_rn(1.0f, mantissa), ldexpf(1.0f, kept)), x);
    return x == 0.0f ? 0.0f : r;
}

// out[i] = authors_float(x[i]) over n float32 values.
extern "C" __global__ void authors_float(const float* __restrict__ x, u64 n, int exp_bits, int man_bits,
                                         float* __restrict__ out) {
    const AuthorsFormat f = authors_format(exp_bits, man_bits);
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        out[i] = authors_of(x[i], f);
}

// One chunk of format_matmul's K tiles under an accumulator format. partials: (batch, tiles, mn) float32, each
// tile's sum of value products; out: (batch, mn). out[b, p] = (accumulate ? out[b, p] : 0) + authors_float of
// partials[b, 0, p], + that of partials[b, 1, p], ...: float32 additions in tile order, as the reference adds its
// rounded tiles; *saturated += the partials with |partial| > limit (the accumulator's largest value; a NaN is not).
// A thread an output element at a time (its tiles mn apart: a warp's reads coalesced), one atomic add a warp.
extern "C" __global__ void authors_tile_sum(const float* __restrict__ partials, u64 batch, u32 tiles, u64 mn,
                                            int exp_bits, int man_bits, float limit, int accumulate,
                                            float* __restrict__ out, unsigned long long* __restrict__ saturated) {
    const AuthorsFormat f = authors_format(exp_bits, man_bits);
    u32 over = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < batch * mn; i += (u64)gridDim.x * blockDim.x) {
        const u64 b = i / mn;
        const float* tile = partials + b * tiles * mn + (i - b * mn);
        float sum = accumulate ? out[i] : 0.0f;
        for (u32 t = 0; t < tiles; ++t) {
            const float v = tile[(u64)t * mn];
            over += fabsf(v) > limit ? 1u : 0u;
            sum = __fadd_rn(sum, authors_of(v, f));
        }
        out[i] = sum;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) over += __shfl_xor_sync(0xffffffffu, over, o);
    if ((threadIdx.x & 31) == 0 && over) atomicAdd(saturated, (unsigned long long)over);
}
