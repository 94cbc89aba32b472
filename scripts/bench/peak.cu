// Register-only loops of mma.sync.m16n8k32 s8 (no memory traffic): the int8 tensor-core ceiling that
// scripts/bench_kernels.py measures the GEMM against. CHAINS independent accumulators per warp hide the MMA
// latency. mma_peak_plain accumulates in place; mma_peak_clamped starts each MMA from C = 0 and clamps and adds
// its result to a running total (what the tile-32 GEMM must do per k32 step).

#include "common.cuh"

#define CHAINS 8

extern "C" __global__ void mma_peak_plain(const u32* __restrict__ seed, int iters, int* __restrict__ out) {
    const int lane = threadIdx.x & 31;
    u32 a[4], b[2];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = seed[(lane + i) & 31] & 0x03030303u;
    b[0] = seed[(lane + 7) & 31] & 0x03030303u;
    b[1] = seed[(lane + 11) & 31] & 0x03030303u;
    int acc[CHAINS][4];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[c][e] = 0;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) mma_s8(acc[c], a, b, acc[c]);
    }
    int s = 0;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) s += acc[c][e];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

extern "C" __global__ void mma_peak_clamped(const u32* __restrict__ seed, int iters, int limit,
                                            int* __restrict__ out) {
    const int lane = threadIdx.x & 31;
    // Every chain gets its own B fragment: with identical operands and C = 0 the compiler would issue one MMA for
    // all chains (seen in the SASS of an earlier version).
    u32 a[4], b[CHAINS][2];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = seed[(lane + i) & 31] & 0x03030303u;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) {
        b[c][0] = seed[(lane + 7 + c) & 31] & 0x03030303u;
        b[c][1] = seed[(lane + 11 + 3 * c) & 31] & 0x03030303u;
    }
    const int zero[4] = {0, 0, 0, 0};
    int acc[CHAINS][4];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[c][e] = 0;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) {
            int t[4];
            mma_s8(t, a, b[c], zero);
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[c][e] += min(max(t[e], -limit), limit);
        }
    }
    int s = 0;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) s += acc[c][e];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// The packed clamp of the GEMM's mode 4: two sums per register, clamp + bias with two DPX halfword ops, one add.
extern "C" __global__ void mma_peak_packed(const u32* __restrict__ seed, int iters, int limit, int* __restrict__ out) {
    const int lane = threadIdx.x & 31;
    u32 a[4], b[CHAINS][2];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = seed[(lane + i) & 31] & 0x03030303u;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) {
        b[c][0] = seed[(lane + 7 + c) & 31] & 0x03030303u;
        b[c][1] = seed[(lane + 11 + 3 * c) & 31] & 0x03030303u;
    }
    const int zero[4] = {0, 0, 0, 0};
    const u32 bias2 = ((u32)limit << 16) | (u32)limit, span2 = bias2 << 1;
    u32 acc[CHAINS][2];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) acc[c][0] = acc[c][1] = 0u;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) {
            int t[4];
            mma_s8(t, a, b[c], zero);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                u32 p = __byte_perm((u32)t[2 * h], (u32)t[2 * h + 1], 0x5410);
                p = __viaddmax_s16x2(p, bias2, 0u);
                acc[c][h] += __vimin_s16x2_relu(p, span2);
            }
        }
    }
    int s = 0;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) s += (int)(acc[c][0] + acc[c][1]);
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
