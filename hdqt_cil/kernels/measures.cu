// The diagnostics' measures of float32 tensors (trainer/diagnostics.py), each in two launches instead of a chain of
// torch ops: a fixed grid of blocks (its size a function of n alone) sums grid-strided elements in float64 into one
// partial a block, then one block combines the partials in block order and derives the measures. The order of
// every sum is fixed by n: the same bits on every run and GPU (not torch's order: agreement is to rounding).
//
// fidelity (q against the reference f): cosine q.f / (|q| |f|) (0 where |q| = 0), relative error |q - f| / |f|,
// sign agreement (the share of f's nonzero values whose sign q has); all NaN where |f| is 0 or NaN.
// moments (t): max, min (a NaN wins), mean, L2 norm.
// zero levels (t, its quantizer's levels): t's nonzero values whose level is 0, and t's nonzero values.

#include "common.cuh"

constexpr int THREADS = 256;
constexpr int FIDELITY_SUMS = 6;  // q.f, q.q, f.f, (q - f)^2, signs agreeing, f's nonzero values
constexpr int MOMENT_SUMS = 4;    // max, min, sum, sum of squares

__device__ __forceinline__ double inf() { return __longlong_as_double(0x7ff0000000000000LL); }
__device__ __forceinline__ double quiet_nan() { return __longlong_as_double(0x7ff8000000000000LL); }
__device__ __forceinline__ double nan_max(double a, double b) { return (b > a || b != b) ? b : a; }
__device__ __forceinline__ double nan_min(double a, double b) { return (b < a || b != b) ? b : a; }

// The block's V values combined into thread 0's, in a fixed order: warp shuffles, then the warps' results in order.
// MOMENTS: values 0 and 1 are a max and a min, the others sums.
template <int V, bool MOMENTS>
__device__ void block_combine(double (&v)[V]) {
    __shared__ double warps[THREADS / 32][V];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int k = 0; k < V; ++k) {
        for (int offset = 16; offset > 0; offset /= 2) {
            const double other = __shfl_down_sync(0xffffffffu, v[k], offset);
            v[k] = MOMENTS && k == 0 ? nan_max(v[k], other) : MOMENTS && k == 1 ? nan_min(v[k], other) : v[k] + other;
        }
        if (lane == 0) warps[warp][k] = v[k];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < THREADS / 32; ++w)
            for (int k = 0; k < V; ++k)
                v[k] = MOMENTS && k == 0 ? nan_max(v[k], warps[w][k])
                     : MOMENTS && k == 1 ? nan_min(v[k], warps[w][k]) : v[k] + warps[w][k];
    }
}

extern "C" __global__ void fidelity_partials(const float* q, const float* f, u64 n, double* partials) {
    double s[FIDELITY_SUMS] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    for (u64 i = (u64)blockIdx.x * THREADS + threadIdx.x; i < n; i += (u64)gridDim.x * THREADS) {
        const double a = q[i], b = f[i], d = a - b;
        s[0] += a * b;
        s[1] += a * a;
        s[2] += b * b;
        s[3] += d * d;
        s[4] += (b > 0.0 && a > 0.0) || (b < 0.0 && a < 0.0);
        s[5] += b != 0.0;
    }
    block_combine<FIDELITY_SUMS, false>(s);
    if (threadIdx.x == 0)
        for (int k = 0; k < FIDELITY_SUMS; ++k) partials[blockIdx.x * FIDELITY_SUMS + k] = s[k];
}

extern "C" __global__ void fidelity_final(const double* partials, u32 blocks, double* out) {
    double s[FIDELITY_SUMS] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    for (u32 b = threadIdx.x; b < blocks; b += THREADS)
        for (int k = 0; k < FIDELITY_SUMS; ++k) s[k] += partials[b * FIDELITY_SUMS + k];
    block_combine<FIDELITY_SUMS, false>(s);
    if (threadIdx.x == 0) {
        const double q_norm = sqrt(s[1]), norm = sqrt(s[2]);
        const bool defined = norm > 0.0;
        out[0] = defined ? (q_norm > 0.0 ? s[0] / (q_norm * norm) : 0.0) : quiet_nan();
        out[1] = defined ? sqrt(s[3]) / norm : quiet_nan();
        out[2] = defined ? s[4] / s[5] : quiet_nan();
    }
}

extern "C" __global__ void moment_partials(const float* t, u64 n, double* partials) {
    double s[MOMENT_SUMS] = {-inf(), inf(), 0.0, 0.0};
    for (u64 i = (u64)blockIdx.x * THREADS + threadIdx.x; i < n; i += (u64)gridDim.x * THREADS) {
        const double v = t[i];
        s[0] = nan_max(s[0], v);
        s[1] = nan_min(s[1], v);
        s[2] += v;
        s[3] += v * v;
    }
    block_combine<MOMENT_SUMS, true>(s);
    if (threadIdx.x == 0)
        for (int k = 0; k < MOMENT_SUMS; ++k) partials[blockIdx.x * MOMENT_SUMS + k] = s[k];
}

extern "C" __global__ void moment_final(const double* partials, u32 blocks, u64 n, double* out) {
    double s[MOMENT_SUMS] = {-inf(), inf(), 0.0, 0.0};
    for (u32 b = threadIdx.x; b < blocks; b += THREADS) {
        s[0] = nan_max(s[0], partials[b * MOMENT_SUMS]);
        s[1] = nan_min(s[1], partials[b * MOMENT_SUMS + 1]);
        s[2] += partials[b * MOMENT_SUMS + 2];
        s[3] += partials[b * MOMENT_SUMS + 3];
    }
    block_combine<MOMENT_SUMS, true>(s);
    if (threadIdx.x == 0) {
        out[0] = s[0];
        out[1] = s[1];
        out[2] = s[2] / (double)n;
        out[3] = sqrt(s[3]);
    }
}

// zero levels: of t's nonzero values, how many the quantizer's levels (int8, or float32 values) hold as 0; the
// final kernel adds (zero levels, nonzero values) to a float64 pair, so that one pair counts a role over many calls.
template <typename L>
__device__ void zero_level_sums(const float* t, const L* levels, u64 n, double* partials) {
    double s[2] = {0.0, 0.0};
    for (u64 i = (u64)blockIdx.x * THREADS + threadIdx.x; i < n; i += (u64)gridDim.x * THREADS) {
        const bool nonzero = t[i] != 0.0f;
        s[0] += nonzero && levels[i] == (L)0;
        s[1] += nonzero;
    }
    block_combine<2, false>(s);
    if (threadIdx.x == 0) {
        partials[blockIdx.x * 2] = s[0];
        partials[blockIdx.x * 2 + 1] = s[1];
    }
}

extern "C" __global__ void zero_level_partials_i8(const float* t, const signed char* levels, u64 n,
                                                  double* partials) {
    zero_level_sums(t, levels, n, partials);
}

extern "C" __global__ void zero_level_partials_f32(const float* t, const float* levels, u64 n, double* partials) {
    zero_level_sums(t, levels, n, partials);
}

extern "C" __global__ void zero_level_final(const double* partials, u32 blocks, double* counts) {
    double s[2] = {0.0, 0.0};
    for (u32 b = threadIdx.x; b < blocks; b += THREADS) {
        s[0] += partials[b * 2];
        s[1] += partials[b * 2 + 1];
    }
    block_combine<2, false>(s);
    if (threadIdx.x == 0) {
        counts[0] += s[0];
        counts[1] += s[1];
    }
}
