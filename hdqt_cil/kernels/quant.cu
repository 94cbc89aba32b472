// Quantizers and the block Hadamard transform of docs/numerics.md, for flat contiguous tensors.
//
// A tensor of n_el elements is processed in "steps" of E = blockDim.x * 8 consecutive elements; thread t of a
// CTA owns elements [base + 8t, base + 8t + 8) of a step. A Hadamard block (n = 2^logn, n | E) is transformed in
// registers (stages h = 1, 2, 4), across the lanes of a warp (h = 8 .. 128, shuffles) and across the warps of
// the CTA (h >= 256, shared memory): every stage is the reference's (a, b) -> (a + b, a - b), so the float32
// results are the reference's bit for bit. A scale group is a run of G consecutive elements (tensor: G = n_el,
// sample: n_el / dim0, row: the last dim); Hadamard blocks never straddle groups (n | G).
//
// absmax_kernel: max|t| per group (as the bits of |t|: unsigned order = float order for non-negative floats,
//                and a NaN compares above +inf, so a NaN propagates into the scale as in torch.amax), and
//                whether any element is negative (signedness 'auto').
// quantize_kernel: s = (max * clip) / qmax (or a given scale), v = t / s, rounding, clamp, int8 levels; the
//                thread that owns a group's first element writes the group's scale.
// hadamard_kernel: the transform alone, float32 out.
// sum_entries_f32: the batch sum of a GEMM's scaled products in the order of intmm.cu's OUT mode 3.
// transpose_i8: int8 matrices transposed into a row pitch of the caller's choice (the GEMM's operand packing).
// Template T: float or signed char input (levels). HAD: whether to transform first.

typedef unsigned int u32;
typedef unsigned long long u64;

#define NO_GROUP 0xffffffffu

__device__ __forceinline__ u32 mix32(u32 x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

// The per-call key of docs/numerics.md: mix(seed ^ mix(step * 0x9E3779B9 + role)) mod 2^32. The step is read from
// device memory when step_at is given (a layer's step counter: a CUDA-graph replay then draws fresh bits).
__device__ __forceinline__ u32 counter_key(u32 seed, u32 role, const long long* step_at, u32 step) {
    const u32 s = step_at != nullptr ? static_cast<u32>(*step_at) : step;
    return mix32(seed ^ mix32(s * 0x9E3779B9u + role));
}

// u = float32(mix(index ^ key) >> 8) * 2^-24
__device__ __forceinline__ float counter_u(u32 index, u32 key) {
    return __uint2float_rn(mix32(index ^ key) >> 8) * 5.9604644775390625e-08f;
}

template <typename T> struct Loader;

template <> struct Loader<float> {
    // 8 consecutive floats from x[i]; i is a multiple of 8; elements >= n read as 0.
    static __device__ __forceinline__ void load8(const float* __restrict__ x, u32 i, u32 n, bool vec, float v[8]) {
        if (vec && i + 8 <= n) {
            const float4 p = __ldg(reinterpret_cast<const float4*>(x + i));
            const float4 q = __ldg(reinterpret_cast<const float4*>(x + i + 4));
            v[0] = p.x; v[1] = p.y; v[2] = p.z; v[3] = p.w;
            v[4] = q.x; v[5] = q.y; v[6] = q.z; v[7] = q.w;
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = (i + j < n) ? __ldg(x + i + j) : 0.0f;
        }
    }
};

template <> struct Loader<signed char> {
    static __device__ __forceinline__ void load8(const signed char* __restrict__ x, u32 i, u32 n, bool vec,
                                                 float v[8]) {
        if (vec && i + 8 <= n) {
            const uint2 p = __ldg(reinterpret_cast<const uint2*>(x + i));
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                v[j] = (float)(signed char)((p.x >> (8 * j)) & 0xff);
                v[4 + j] = (float)(signed char)((p.y >> (8 * j)) & 0xff);
            }
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = (i + j < n) ? (float)x[i + j] : 0.0f;
        }
    }
};

// In-place butterfly of the CTA's step: blocks of n = 2^logn elements. All threads of the CTA must call it.
// smem: 8 * blockDim.x floats (used only when n > 256).
__device__ __forceinline__ void butterfly(float v[8], int logn, float* smem) {
    const int n = 1 << logn;
#pragma unroll
    for (int h = 1; h < 8; h <<= 1) {
        if (h < n) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                if (!(j & h)) {
                    const float a = v[j], b = v[j + h];
                    v[j] = __fadd_rn(a, b);
                    v[j + h] = __fsub_rn(a, b);
                }
            }
        }
    }
    const int lane = threadIdx.x & 31;
    for (int h = 8; h < n && h < 256; h <<= 1) {
        const int mask = h >> 3;
        const bool high = (lane & mask) != 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float other = __shfl_xor_sync(0xffffffffu, v[j], mask);
            v[j] = high ? __fsub_rn(other, v[j]) : __fadd_rn(v[j], other);
        }
    }
    const int tid = threadIdx.x;
    for (int h = 256; h < n; h <<= 1) {
        const int mask = h >> 3;
        const bool high = (tid & mask) != 0;
        float4* mine = reinterpret_cast<float4*>(smem + 8 * tid);
        mine[0] = make_float4(v[0], v[1], v[2], v[3]);
        mine[1] = make_float4(v[4], v[5], v[6], v[7]);
        __syncthreads();
        const float4* theirs = reinterpret_cast<const float4*>(smem + 8 * (tid ^ mask));
        const float4 p = theirs[0], q = theirs[1];
        const float o[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
        __syncthreads();
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = high ? __fsub_rn(o[j], v[j]) : __fadd_rn(v[j], o[j]);
    }
}

__device__ __forceinline__ u32 abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

__device__ __forceinline__ u32 warp_max(u32 x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = max(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// Per-thread running maximum of the current group, flushed to peaks[] when the group changes.
struct GroupMax {
    u32 group, peak;
    __device__ __forceinline__ void add(u32 g, u32 m, u32* peaks) {
        if (g != group) {
            if (group != NO_GROUP) atomicMax(peaks + group, peak);
            group = g;
            peak = m;
        } else {
            peak = max(peak, m);
        }
    }
};

template <typename T, bool HAD>
__device__ __forceinline__ void absmax_body(const T* __restrict__ x, u32 n_el, u32 G, u32 range, int logn,
                                            u32* __restrict__ peaks, u32* __restrict__ neg_flag) {
    extern __shared__ float smem[];
    __shared__ u32 s_first;
    __shared__ u32 s_warp[32];
    const u32 E = blockDim.x * 8u;
    const u32 start = blockIdx.x * range;
    const u32 stop = min(start + range, n_el);
    const bool vec = (reinterpret_cast<u64>(x) % 16u) == 0;
    const bool whole = (G % 8u) == 0;
    GroupMax acc = {NO_GROUP, 0u};
    bool negative = false;
    for (u32 base = start; base < stop; base += E) {
        const u32 i0 = base + 8u * threadIdx.x;
        float v[8];
        Loader<T>::load8(x, i0, stop, vec, v);
        if (HAD) butterfly(v, logn, smem);
        if (i0 < stop) {
            if (whole) {
                u32 m = 0u;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    m = max(m, abs_bits(v[j]));  // elements past the end are 0: no effect
                    negative |= v[j] < 0.0f;
                }
                acc.add(i0 / G, m, peaks);
            } else {
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    if (i0 + j < stop) {
                        acc.add((i0 + j) / G, abs_bits(v[j]), peaks);
                        negative |= v[j] < 0.0f;
                    }
                }
            }
        }
    }
    // One atomic per CTA when every thread ended in the same group (large groups), else one per thread.
    if (threadIdx.x == 0) s_first = NO_GROUP;
    __syncthreads();
    if (acc.group != NO_GROUP) atomicMin(&s_first, acc.group);
    __syncthreads();
    const u32 first = s_first;
    const bool same = __syncthreads_and(acc.group == NO_GROUP || acc.group == first);
    if (same) {
        if (first != NO_GROUP) {
            const u32 m = warp_max(acc.group == NO_GROUP ? 0u : acc.peak);
            const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
            if (lane == 0) s_warp[warp] = m;
            __syncthreads();
            if (threadIdx.x == 0) {
                u32 total = 0u;
                for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total = max(total, s_warp[w]);
                atomicMax(peaks + first, total);
            }
        }
    } else if (acc.group != NO_GROUP) {
        atomicMax(peaks + acc.group, acc.peak);
    }
    if (__syncthreads_or(negative) && threadIdx.x == 0) atomicOr(neg_flag, 1u);
}

// ROUNDING: 0 nearest (half to even), 1 stochastic, 2 stochastic on the radix-2 grid (log2); a template
// parameter, so that each kernel holds one rounding's instructions and no branch between them.
template <int ROUNDING>
__device__ __forceinline__ float round_level(float v, u32 index, u32 key) {
    if (ROUNDING == 0) return rintf(v);
    const float u = counter_u(index, key);
    const float m = fabsf(v);
    float lower, up;
    if (ROUNDING == 1) {
        lower = floorf(m);
        up = (u < __fsub_rn(m, lower)) ? 1.0f : 0.0f;  // the fraction (its quotient by a gap of 1)
    } else {
        int e;
        frexpf(m, &e);
        const float power = ldexpf(1.0f, e - 1);
        const bool below_one = m < 1.0f;
        lower = below_one ? 0.0f : power;
        const float gap = below_one ? 1.0f : power;
        up = (u < __fdiv_rn(__fsub_rn(m, lower), gap)) ? gap : 0.0f;
    }
    const float sign = (v > 0.0f) ? 1.0f : ((v < 0.0f) ? -1.0f : 0.0f);
    return __fmul_rn(sign, __fadd_rn(lower, up));
}

// sign_mode: 0 signed, 1 unsigned, 2 auto (*neg_flag). With scale_in, the scales are given (SAWB); else from peaks.
template <typename T, bool HAD, int ROUNDING>
__device__ __forceinline__ void quantize_body(const T* __restrict__ x, u32 n_el, u32 G, u32 range, int logn,
                                              const u32* __restrict__ peaks, const float* __restrict__ scale_in,
                                              const u32* __restrict__ neg_flag, int sign_mode, float signed_max,
                                              float unsigned_max, float clip, u32 key,
                                              signed char* __restrict__ out, float* __restrict__ scale_out) {
    extern __shared__ float smem[];
    const u32 E = blockDim.x * 8u;
    const u32 start = blockIdx.x * range;
    const u32 stop = min(start + range, n_el);
    const bool vec = (reinterpret_cast<u64>(x) % 16u) == 0 && (reinterpret_cast<u64>(out) % 8u) == 0;
    const bool whole = (G % 8u) == 0;
    const bool is_signed = sign_mode == 0 || (sign_mode == 2 && *neg_flag != 0u);
    const float high = is_signed ? signed_max : unsigned_max;
    const float low = is_signed ? -signed_max : 0.0f;
    u32 group = NO_GROUP;
    float s = 1.0f;
    for (u32 base = start; base < stop; base += E) {
        const u32 i0 = base + 8u * threadIdx.x;
        float v[8];
        Loader<T>::load8(x, i0, stop, vec, v);
        if (HAD) butterfly(v, logn, smem);
        if (i0 >= stop) continue;
        signed char q[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const u32 i = i0 + j;
            if (j == 0 || !whole) {
                const u32 g = (i < stop) ? i / G : group;
                if (g != group) {
                    group = g;
                    if (scale_in != nullptr) {
                        s = scale_in[g];
                    } else {
                        const float c = __fmul_rn(__uint_as_float(peaks[g]), clip);
                        s = __fdiv_rn(c, high);
                        if (s == 0.0f) s = 1.0f;
                    }
                }
                if (scale_out != nullptr && i < stop && i == g * G) scale_out[g] = s;
            }
            const float r = round_level<ROUNDING>(__fdiv_rn(v[j], s), i, key);
            q[j] = (signed char)__float2int_rn(fminf(fmaxf(r, low), high));
        }
        if (vec && i0 + 8 <= stop) {
            uint2 p;
            p.x = (u32)(unsigned char)q[0] | ((u32)(unsigned char)q[1] << 8) | ((u32)(unsigned char)q[2] << 16) |
                  ((u32)(unsigned char)q[3] << 24);
            p.y = (u32)(unsigned char)q[4] | ((u32)(unsigned char)q[5] << 8) | ((u32)(unsigned char)q[6] << 16) |
                  ((u32)(unsigned char)q[7] << 24);
            *reinterpret_cast<uint2*>(out + i0) = p;
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j)
                if (i0 + j < stop) out[i0 + j] = q[j];
        }
    }
}

template <typename T>
__device__ __forceinline__ void hadamard_body(const T* __restrict__ x, u32 n_el, u32 range, int logn,
                                              float* __restrict__ out) {
    extern __shared__ float smem[];
    const u32 E = blockDim.x * 8u;
    const u32 start = blockIdx.x * range;
    const u32 stop = min(start + range, n_el);
    const bool vec = (reinterpret_cast<u64>(x) % 16u) == 0 && (reinterpret_cast<u64>(out) % 16u) == 0;
    for (u32 base = start; base < stop; base += E) {
        const u32 i0 = base + 8u * threadIdx.x;
        float v[8];
        Loader<T>::load8(x, i0, stop, vec, v);
        butterfly(v, logn, smem);
        if (i0 >= stop) continue;
        if (vec && i0 + 8 <= stop) {
            reinterpret_cast<float4*>(out + i0)[0] = make_float4(v[0], v[1], v[2], v[3]);
            reinterpret_cast<float4*>(out + i0)[1] = make_float4(v[4], v[5], v[6], v[7]);
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j)
                if (i0 + j < stop) out[i0 + j] = v[j];
        }
    }
}

__device__ __forceinline__ u32 block_max(u32 m, u32* s_warp) {
    m = warp_max(m);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) s_warp[warp] = m;
    __syncthreads();
    if (warp == 0) {
        u32 w = (lane < (int)(blockDim.x >> 5)) ? s_warp[lane] : 0u;
        w = warp_max(w);
        if (lane == 0) s_warp[0] = w;
    }
    __syncthreads();
    return s_warp[0];
}

// One CTA per scale group at a time, the group held in registers (ROUNDS steps of blockDim.x * 8 elements): max,
// scale and levels in a single pass over the input (no second read, no zeroed work buffer). Persistent CTAs
// stride over the groups and load the next group while the current one is reduced and quantized. For groups of up
// to 8 * 1024 * ROUNDS elements; 'auto' signedness only when the group is the whole tensor.
template <typename T, bool HAD, int ROUNDS, int ROUNDING>
__device__ __forceinline__ void group_body(const T* __restrict__ x, u32 G, u32 groups, int logn, int sign_mode,
                                           float signed_max, float unsigned_max, float clip, u32 key,
                                           signed char* __restrict__ out, float* __restrict__ scale_out) {
    extern __shared__ float smem[];
    __shared__ u32 s_warp[32];
    const u32 E = blockDim.x * 8u;
    const bool vec = (G % 8u) == 0 && (reinterpret_cast<u64>(x) % 16u) == 0 &&
                     (reinterpret_cast<u64>(out) % 8u) == 0;
    float v[ROUNDS][8], next[ROUNDS][8];
    u32 g = blockIdx.x;
    if (g < groups) {
#pragma unroll
        for (int r = 0; r < ROUNDS; ++r)
            Loader<T>::load8(x, g * G + r * E + 8u * threadIdx.x, g * G + G, vec, v[r]);  // past the group: 0
    }
    for (; g < groups; g += gridDim.x) {
        const u32 base = g * G, stop = base + G;
        const u32 following = g + gridDim.x;
        if (following < groups) {
#pragma unroll
            for (int r = 0; r < ROUNDS; ++r)
                Loader<T>::load8(x, following * G + r * E + 8u * threadIdx.x, following * G + G, vec, next[r]);
        }
        u32 m = 0u;
        bool negative = false;
#pragma unroll
        for (int r = 0; r < ROUNDS; ++r) {
            if (HAD) butterfly(v[r], logn, smem);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                m = max(m, abs_bits(v[r][j]));
                negative |= v[r][j] < 0.0f;
            }
        }
        const float peak = __uint_as_float(block_max(m, s_warp));
        const bool any_negative = __syncthreads_or(negative);
        const bool is_signed = sign_mode == 0 || (sign_mode == 2 && any_negative);
        const float high = is_signed ? signed_max : unsigned_max;
        const float low = is_signed ? -signed_max : 0.0f;
        float s = __fdiv_rn(__fmul_rn(peak, clip), high);
        if (s == 0.0f) s = 1.0f;
        if (threadIdx.x == 0) scale_out[g] = s;
#pragma unroll
        for (int r = 0; r < ROUNDS; ++r) {
            const u32 i0 = base + r * E + 8u * threadIdx.x;
            if (i0 < stop) {
                signed char q[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const float level = round_level<ROUNDING>(__fdiv_rn(v[r][j], s), i0 + j, key);
                    q[j] = (signed char)__float2int_rn(fminf(fmaxf(level, low), high));
                }
                if (vec && i0 + 8 <= stop) {
                    uint2 p;
                    p.x = (u32)(unsigned char)q[0] | ((u32)(unsigned char)q[1] << 8) |
                          ((u32)(unsigned char)q[2] << 16) | ((u32)(unsigned char)q[3] << 24);
                    p.y = (u32)(unsigned char)q[4] | ((u32)(unsigned char)q[5] << 8) |
                          ((u32)(unsigned char)q[6] << 16) | ((u32)(unsigned char)q[7] << 24);
                    *reinterpret_cast<uint2*>(out + i0) = p;
                } else {
#pragma unroll
                    for (int j = 0; j < 8; ++j)
                        if (i0 + j < stop) out[i0 + j] = q[j];
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ROUNDS; ++r)
#pragma unroll
            for (int j = 0; j < 8; ++j) v[r][j] = next[r][j];
        __syncthreads();  // s_warp is reused by the next group's reduction
    }
}

// Entry points (extern "C": fixed names for CuPy). Suffix: 'had' = transform first, the input type (f32 / i8),
// the group kernels' rounds, and the rounding of the quantizers (nearest / stochastic / log2).
#define ABSMAX(NAME, T, HAD)                                                                                  \
    extern "C" __global__ void NAME(const T* x, u32 n_el, u32 G, u32 range, int logn, u32* peaks,            \
                                    u32* neg_flag) {                                                         \
        absmax_body<T, HAD>(x, n_el, G, range, logn, peaks, neg_flag);                                        \
    }
#define QUANTIZE(NAME, T, HAD, ROUNDING)                                                                      \
    extern "C" __global__ void NAME(const T* x, u32 n_el, u32 G, u32 range, int logn, const u32* peaks,      \
                                    const float* scale_in, const u32* neg_flag, int sign_mode,                \
                                    float signed_max, float unsigned_max, float clip, u32 seed, u32 role,     \
                                    const long long* step_at, u32 step, signed char* out, float* scale_out) { \
        quantize_body<T, HAD, ROUNDING>(x, n_el, G, range, logn, peaks, scale_in, neg_flag, sign_mode,        \
                                        signed_max, unsigned_max, clip, counter_key(seed, role, step_at, step), \
                                        out, scale_out);                                                     \
    }
#define QUANTIZE_ROUNDINGS(NAME, T, HAD)                                                                      \
    QUANTIZE(NAME##_nearest, T, HAD, 0)                                                                       \
    QUANTIZE(NAME##_stochastic, T, HAD, 1)                                                                    \
    QUANTIZE(NAME##_log2, T, HAD, 2)
#define HADAMARD(NAME, T)                                                                                     \
    extern "C" __global__ void NAME(const T* x, u32 n_el, u32 range, int logn, float* out) {                 \
        hadamard_body<T>(x, n_el, range, logn, out);                                                          \
    }

ABSMAX(absmax_f32, float, false)
ABSMAX(absmax_i8, signed char, false)
ABSMAX(absmax_had_f32, float, true)
ABSMAX(absmax_had_i8, signed char, true)
QUANTIZE_ROUNDINGS(quantize_f32, float, false)
QUANTIZE_ROUNDINGS(quantize_i8, signed char, false)
QUANTIZE_ROUNDINGS(quantize_had_f32, float, true)
QUANTIZE_ROUNDINGS(quantize_had_i8, signed char, true)
HADAMARD(hadamard_f32, float)
HADAMARD(hadamard_i8, signed char)

#define GROUP(NAME, T, HAD, ROUNDS, ROUNDING)                                                                 \
    extern "C" __global__ void __launch_bounds__(1024)                                                        \
        NAME(const T* x, u32 G, u32 groups, int logn, int sign_mode, float signed_max, float unsigned_max,    \
             float clip, u32 seed, u32 role, const long long* step_at, u32 step, signed char* out,            \
             float* scale_out) {                                                                              \
        group_body<T, HAD, ROUNDS, ROUNDING>(x, G, groups, logn, sign_mode, signed_max, unsigned_max, clip,   \
                                             counter_key(seed, role, step_at, step), out, scale_out);         \
    }
#define GROUP_ROUNDINGS(NAME, T, HAD, ROUNDS)                                                                 \
    GROUP(NAME##_nearest, T, HAD, ROUNDS, 0)                                                                  \
    GROUP(NAME##_stochastic, T, HAD, ROUNDS, 1)                                                               \
    GROUP(NAME##_log2, T, HAD, ROUNDS, 2)

#define GROUP_ALL(NAME, T, HAD)                                                                               \
    GROUP_ROUNDINGS(NAME##_r1, T, HAD, 1)                                                                     \
    GROUP_ROUNDINGS(NAME##_r2, T, HAD, 2)                                                                     \
    GROUP_ROUNDINGS(NAME##_r4, T, HAD, 4)

GROUP_ALL(group_f32, float, false)
GROUP_ALL(group_i8, signed char, false)
GROUP_ALL(group_had_f32, float, true)
GROUP_ALL(group_had_i8, signed char, true)

// out[i] = (((+0 + x[0][i]) + x[1][i]) + ...) + x[entries - 1][i], float32, entries in order (quant/intmm.py
// sum_entries): for batched products too small in M x N to loop over the batch inside the GEMM.
extern "C" __global__ void sum_entries_f32(const float* __restrict__ x, u32 entries, u64 size,
                                           float* __restrict__ out) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < size; i += (u64)gridDim.x * blockDim.x) {
        float total = 0.0f;
        for (u32 e = 0; e < entries; ++e) total = __fadd_rn(total, __ldg(x + e * size + i));
        out[i] = total;
    }
}

// out[b][c][r] = in[b][r][c] for a batch (grid z) of rows x cols int8 matrices with row strides in_ld and out_ld,
// through a 64 x 64 tile in shared memory, so that both the reads and the writes of a warp are consecutive bytes.
extern "C" __global__ void __launch_bounds__(256) transpose_i8(const signed char* __restrict__ in, u32 rows, u32 cols,
                                                              u64 in_batch, u64 in_ld, signed char* __restrict__ out,
                                                              u64 out_batch, u64 out_ld) {
    __shared__ signed char tile[64][65];
    const u32 r0 = blockIdx.y * 64, c0 = blockIdx.x * 64;
    const signed char* src = in + blockIdx.z * in_batch;
    signed char* dst = out + blockIdx.z * out_batch;
    for (u32 y = threadIdx.y; y < 64; y += blockDim.y) {
        const u32 r = r0 + y, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[y][threadIdx.x] = src[r * in_ld + c];
    }
    __syncthreads();
    for (u32 y = threadIdx.y; y < 64; y += blockDim.y) {
        const u32 c = c0 + y, r = r0 + threadIdx.x;
        if (c < cols && r < rows) dst[c * out_ld + r] = tile[threadIdx.x][y];
    }
}
