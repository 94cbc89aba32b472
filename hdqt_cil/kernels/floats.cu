// The block-scaled E2M1 quantizers of quant/floats.py on the GPU, bit for bit as torch computes them on CUDA:
// `microscaled` (MXFP4: an E8M0 scale per block of 32) and `nvfp4` (an E4M3 scale per block of 16 under the
// float32 tensor scale the caller computed), along the contiguous last dimension of a float32 (rows, K) tensor.
//
// Out: each block's values doubled, as the int8 levels the block-scaled GEMM reads (intmm.cu modes 5, 6; rows ld
// bytes apart, the bytes past K not written), and its scale, (rows, blocks) float32. The last block of a row is
// narrower where BLOCK does not divide K (the reference's zero padding: zeros raise no maximum).
// Stochastic rounding draws element (row, block, j)'s bits at index (row * blocks + block) * BLOCK + j, the
// reference's padded layout. A block holding a non-finite value gets a NaN scale (and levels 0), so the product's
// sums over it are NaN as the reference's are (a NaN value there; finite inputs are the contract's).

#include "common.cuh"
#include "counter.cuh"

// round_to_format of floats.py for the E2M1 grid, |v| finite: the quantum 2^(e - 1) of v's binade e (at least 0,
// E2M1's smallest normal exponent; below it the subnormal quantum 0.5), |v| / quantum (exact) rounded to an
// integer, times the quantum, saturated to 6. ROUNDING 0: nearest, ties to even; 1: stochastic (round_stochastic).
template <int ROUNDING>
__device__ __forceinline__ float e2m1_of(float v, u32 h) {
    const float m = fabsf(v);
    if (m == 0.0f) return v;
    int e;
    frexpf(m, &e);
    const float quantum = ldexpf(1.0f, max(e - 1, 0) - 1);
    const float q = __fdiv_rn(m, quantum);
    float n;
    if (ROUNDING == 0) {
        n = rintf(q);
    } else {
        const float lower = floorf(q);
        n = __fadd_rn(lower, counter_u(h) < __fsub_rn(q, lower) ? 1.0f : 0.0f);
    }
    return copysignf(fminf(__fmul_rn(n, quantum), 6.0f), v);
}

// round_to_format to E4M3 (nearest) of a finite non-negative block scale, saturated to 448.
__device__ __forceinline__ float e4m3_of(float b) {
    if (b == 0.0f) return b;
    int e;
    frexpf(b, &e);
    const float quantum = ldexpf(1.0f, max(e - 1, -6) - 3);
    return fminf(__fmul_rn(rintf(__fdiv_rn(b, quantum)), quantum), 448.0f);
}

// BLOCK: 32 (MX) or 16 (NV); NV: nvfp4's scales (tensor_scale read from device memory), else MX's; ROUNDING as
// e2m1_of. seed, role, step_at, step: the counter of stochastic rounding (quant.cu's arguments). One thread an
// element of the padded layout (rows, blocks * BLOCK): a block's BLOCK threads are an aligned group of a warp's
// lanes (BLOCK divides 32), which find its largest magnitude by shuffles; loads and stores are coalesced.
template <int BLOCK, bool NV, int ROUNDING>
__global__ void e2m1_blocks(const float* __restrict__ x, u32 rows, u32 K, const float* __restrict__ tensor_scale,
                            u32 seed, u32 role, const long long* step_at, u32 step, signed char* __restrict__ levels,
                            u64 ld, float* __restrict__ scales) {
    const u32 padded = (K + BLOCK - 1) / BLOCK * BLOCK;
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;  // rows * padded < 2^31 (the caller checks)
    const u32 row = i / padded, k = i - row * padded;
    const bool inside = row < rows && k < K;
    const float v = inside ? x[(u64)row * K + k] : 0.0f;
    float amax = fabsf(v);
    u32 bad = amax <= 3.402823466e38f ? 0u : 1u;  // inf or NaN
#pragma unroll
    for (int o = BLOCK / 2; o > 0; o >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        bad |= __shfl_xor_sync(0xffffffffu, bad, o);
    }
    float scale;
    if (NV) {
        // (amax / 6) / t as torch divides on CUDA: by a Python number through its float32 reciprocal
        const float b = e4m3_of(__fdiv_rn(__fmul_rn(amax, 1.0f / 6.0f), *tensor_scale));
        scale = b > 0.0f ? __fmul_rn(b, *tensor_scale) : 1.0f;
    } else {
        int e;
        frexpf(amax, &e);
        scale = amax > 0.0f ? ldexpf(1.0f, min(max(e - 1 - 2, -127), 127)) : 1.0f;  // 2^(floor(log2 amax) - emax)
    }
    if (row >= rows) return;
    if (k % BLOCK == 0) scales[i / BLOCK] = bad ? __int_as_float(0x7fffffff) : scale;
    if (k >= K) return;
    const u32 h = ROUNDING ? first_round(i ^ counter_key(seed, role, step_at, step)) : 0u;
    const float value = bad ? 0.0f : e2m1_of<ROUNDING>(__fdiv_rn(v, scale), h);
    levels[(u64)row * ld + k] = (signed char)__float2int_rn(__fmul_rn(value, 2.0f));
}
