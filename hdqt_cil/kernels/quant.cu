// Quantizers and the block Hadamard transform of docs/numerics.md, for flat contiguous tensors.
//
// A tensor of n_el elements is processed in "steps" of E = blockDim.x * 8 * ROUNDS consecutive elements; each
// thread owns ROUNDS runs of 8 consecutive elements of a step (run_offset; ROUNDS = 1: elements [base + 8t,
// base + 8t + 8)). A Hadamard block (n = 2^logn, n | E) is transformed in registers and across the lanes of a warp
// up to 256 ROUNDS elements, across warps beyond (butterfly): every stage is the reference's (a, b) -> (a + b,
// a - b), so the float32 results are the reference's bit for bit. A scale group is a run of G consecutive elements
// (tensor: G = n_el, sample: n_el / dim0, row: the last dim); Hadamard blocks never straddle groups (n | G).
//
// absmax_*: max|t| per group (as the bits of |t|: unsigned order = float order for non-negative floats, and a NaN
//           compares above +inf, so a NaN propagates into the scale as in torch.amax), and whether any element is
//           negative (signedness 'auto').
// quantize_*: s = (max * clip) / qmax, or SAWB's from max|t| and the caller's float sums; v = t / s, rounding,
//           clamp, int8 levels; the thread that owns a group's first element writes the group's scale.
// hadamard_*: the transform alone, float32 out.
// group_*: max, scale and levels of groups of up to 32K elements in one pass (a CTA a group).
// *_stats_*: a forward operand's quantizer, which also counts the values its clamp changes and writes the
//           straight-through estimator's keep mask (Stats), so that training adds no pass of its own.
// Every quantizer raises *worst to its largest scale (as float bits; a NaN sorts above +inf), where given: a step
// replayed from a CUDA graph checks that once instead of a reduction per layer.
// sum_entries_f32: the batch sum of a GEMM's scaled products in the order of intmm.cu's OUT mode 3.
// transpose_i8: int8 matrices transposed into a row pitch of the caller's choice (the GEMM's operand packing).
// advance_step: a layer's step counter read and advanced in one launch.
// Template T: float or signed char input (levels). HAD: 0 no transform, 1 a Hadamard block of any size, 2 one of
// at least 256 * ROUNDS elements (butterfly's WIDE).

#include "common.cuh"
#include "counter.cuh"
#include "divide.cuh"

#define NO_GROUP 0xffffffffu

// The first hash rounds of elements i0 .. i0 + 7: shared when i0 is a multiple of 8 (ALIGNED), else one each.
template <bool ALIGNED>
__device__ __forceinline__ u32 element_hash(u32 shared, u32 i0, int j, u32 key) {
    return ALIGNED ? shared ^ static_cast<u32>(j) : first_round((i0 + j) ^ key);
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

// One output of a butterfly whose partner is in another thread: v + other for the lower element (sign +1), other - v
// for the upper (sign -1). fma(v, +-1, other) rounds the exact sum once: the same float as the add or subtraction.
__device__ __forceinline__ float pair(float v, float sign, float other) { return __fmaf_rn(v, sign, other); }

// In-place butterfly of blocks of n = 2^logn elements, all threads of the CTA calling it. Thread t holds ROUNDS
// runs of 8 consecutive elements: run r of lane l in warp w starts at 8 l + 256 r + 256 ROUNDS w (one run per thread
// is the flat kernels' 8 t). Index bits 0-2 are then in registers (stages h = 1, 2, 4), bits 3-7 across the lanes
// (h = 8 .. 128, shuffles), the next log2(ROUNDS) bits in registers again (h = 256 .. 128 ROUNDS) and the rest across
// warps (shared memory, 8 * blockDim.x floats, one run at a time): a block of up to 256 ROUNDS elements never leaves
// its warp. WIDE: the caller guarantees n >= 256 ROUNDS, so every in-warp stage runs unconditionally (a stage that
// may be skipped costs a register copy an element where its branches join).
template <int ROUNDS, bool WIDE>
__device__ __forceinline__ void butterfly(float (&v)[ROUNDS][8], int logn, float* smem) {
    const int n = 1 << logn;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < ROUNDS; ++r) {
#pragma unroll
        for (int h = 1; h < 8; h <<= 1) {
            if (WIDE || h < n) {
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    if (!(j & h)) {
                        const float a = v[r][j], b = v[r][j + h];
                        v[r][j] = __fadd_rn(a, b);
                        v[r][j + h] = __fsub_rn(a, b);
                    }
                }
            }
        }
#pragma unroll
        for (int h = 8; h < 256; h <<= 1) {
            if (WIDE || h < n) {
                const int mask = h >> 3;
                const float sign = (lane & mask) != 0 ? -1.0f : 1.0f;
#pragma unroll
                for (int j = 0; j < 8; ++j) v[r][j] = pair(v[r][j], sign, __shfl_xor_sync(0xffffffffu, v[r][j], mask));
            }
        }
    }
#pragma unroll
    for (int d = 1; d < ROUNDS; d <<= 1) {  // h = 256 d
        if (WIDE || 256 * d < n) {
#pragma unroll
            for (int r = 0; r < ROUNDS; ++r) {
                if (!(r & d)) {
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        const float a = v[r][j], b = v[r + d][j];
                        v[r][j] = __fadd_rn(a, b);
                        v[r + d][j] = __fsub_rn(a, b);
                    }
                }
            }
        }
    }
    const int tid = threadIdx.x;
    for (int h = 256 * ROUNDS; h < n; h <<= 1) {
        const int mask = h / (8 * ROUNDS);  // the partner warp's thread
        const float sign = (tid & mask) != 0 ? -1.0f : 1.0f;
#pragma unroll
        for (int r = 0; r < ROUNDS; ++r) {
            float4* mine = reinterpret_cast<float4*>(smem + 8 * tid);
            mine[0] = make_float4(v[r][0], v[r][1], v[r][2], v[r][3]);
            mine[1] = make_float4(v[r][4], v[r][5], v[r][6], v[r][7]);
            __syncthreads();
            const float4* theirs = reinterpret_cast<const float4*>(smem + 8 * (tid ^ mask));
            const float4 p = theirs[0], q = theirs[1];
            const float o[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
            __syncthreads();
#pragma unroll
            for (int j = 0; j < 8; ++j) v[r][j] = pair(v[r][j], sign, o[j]);
        }
    }
}

// Where a thread's first run starts in its CTA's step of blockDim.x * 8 * ROUNDS elements (run r: + 256 r).
template <int ROUNDS>
__device__ __forceinline__ u32 run_offset() {
    return (threadIdx.x >> 5) * (256u * ROUNDS) + 8u * (threadIdx.x & 31);
}

// A thread's runs of a step, from `first` on (elements at or past stop read as 0), transformed when HAD.
template <typename T, int HAD, int ROUNDS>
__device__ __forceinline__ void load_runs(const T* __restrict__ x, u32 first, u32 stop, bool vec, int logn,
                                          float* smem, float (&v)[ROUNDS][8]) {
#pragma unroll
    for (int r = 0; r < ROUNDS; ++r) Loader<T>::load8(x, first + 256u * r, stop, vec, v[r]);
    if (HAD) butterfly<ROUNDS, HAD == 2>(v, logn, smem);
}

// f(r, i0) for each of a thread's runs (index r, first element i0) that starts before stop.
template <int ROUNDS, typename F>
__device__ __forceinline__ void each_run(u32 first, u32 stop, F f) {
#pragma unroll
    for (int r = 0; r < ROUNDS; ++r)
        if (first + 256u * r < stop) f(r, first + 256u * r);
}

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

template <typename T, int HAD, int ROUNDS>
__device__ __forceinline__ void absmax_body(const T* __restrict__ x, u32 n_el, u32 G, u32 range, int logn,
                                            u32* __restrict__ peaks, u32* __restrict__ neg_flag) {
    extern __shared__ float smem[];
    __shared__ u32 s_first;
    __shared__ u32 s_warp[32];
    const u32 E = blockDim.x * 8u * ROUNDS;
    const u32 start = blockIdx.x * range;
    const u32 stop = min(start + range, n_el);
    const bool vec = (reinterpret_cast<u64>(x) % 16u) == 0;
    const bool whole = (G % 8u) == 0;
    GroupMax acc = {NO_GROUP, 0u};
    bool negative = false;
    for (u32 base = start; base < stop; base += E) {
        const u32 first = base + run_offset<ROUNDS>();
        float v[ROUNDS][8];
        load_runs<T, HAD, ROUNDS>(x, first, stop, vec, logn, smem, v);
        each_run<ROUNDS>(first, stop, [&](int r, u32 i0) {
            if (whole) {
                u32 m = 0u;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    m = max(m, abs_bits(v[r][j]));  // elements past the end are 0: no effect
                    negative |= v[r][j] < 0.0f;
                }
                acc.add(i0 / G, m, peaks);
            } else {
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    if (i0 + j < stop) {
                        acc.add((i0 + j) / G, abs_bits(v[r][j]), peaks);
                        negative |= v[r][j] < 0.0f;
                    }
                }
            }
        });
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
// h: the element's first hash round (element_hash). The sign is copied from v: the levels are integers, so a zero's
// sign cannot reach them, and a NaN stays a NaN.
template <int ROUNDING>
__device__ __forceinline__ float round_level(float v, u32 h) {
    if (ROUNDING == 0) return rintf(v);
    const float u = counter_u(h);
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
    return copysignf(__fadd_rn(lower, up), v);
}

// The int8 level of the quotient v: rounded, then clamped to [low, high] (a NaN to low, as fmaxf drops it).
template <int ROUNDING>
__device__ __forceinline__ signed char level_of(float v, u32 h, float low, float high) {
    return (signed char)__float2int_rn(fminf(fmaxf(round_level<ROUNDING>(v, h), low), high));
}

// The levels of elements i0 .. i0 + 7 (those below stop) to out: one 8-byte store when vec and all are in range.
__device__ __forceinline__ void store8(const signed char q[8], u32 i0, u32 stop, bool vec, signed char* out) {
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

// What a forward operand's quantizer reports beside its levels (the *_stats_* kernels, docs/quant.md "Statistics"):
// how many quotients lie outside [low, high] (a NaN included: the values the clamp changes, as
// quant/quantizers.py within_levels), and the straight-through estimator's keep mask: ste 1 ('clip') the quotient
// inside, 2 ('authors') |t| <= threshold in raw units, 0 none (keep unused).
struct Stats {
    unsigned char* keep;
    int ste;
    float threshold;
    u32 clipped;

    __device__ __forceinline__ void add8(const float t[8], const float q[8], float low, float high, u32 i0, u32 stop,
                                         bool vec) {
        signed char k[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const bool inside = q[j] >= low && q[j] <= high;
            if (i0 + j < stop) clipped += inside ? 0u : 1u;
            k[j] = (signed char)(ste == 1 ? inside : fabsf(t[j]) <= threshold);
        }
        if (ste != 0) store8(k, i0, stop, vec && (reinterpret_cast<u64>(keep) % 8u) == 0, (signed char*)keep);
    }

    // The CTA's count into *clipped_at, and the tensor's size into *seen_at once (by the first CTA).
    __device__ __forceinline__ void flush(u64* clipped_at, u64* seen_at, u64 n_el) {
        u32 c = clipped;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
        if ((threadIdx.x & 31) == 0 && c != 0u) atomicAdd(clipped_at, (u64)c);
        if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(seen_at, n_el);
    }
};

// A group's scale s, where its owner writes it: to scale_out (when given; times *times where that is given: a
// re-quantized operand's product of both scales, one rounding as torch's multiplication) and into *worst (when
// given).
__device__ __forceinline__ void report_scale(float s, u32 g, float* scale_out, u32* worst, const float* times) {
    if (scale_out != nullptr) scale_out[g] = times != nullptr ? __fmul_rn(s, *times) : s;
    if (worst != nullptr) atomicMax(worst, __float_as_uint(s));
}

// Levels of eight elements that share the scale s. ALIGNED: i0 is a multiple of 8 (the hash's first round shared).
// STATS: st counts and masks them (v holds the untransformed input).
template <int ROUNDING, bool ALIGNED, bool STATS>
__device__ __forceinline__ void quantize8(const float v[8], const Divider& divider, float low, float high, u32 i0,
                                          u32 stop, u32 key, bool vec, signed char* out, Stats& st) {
    float quotient[8];
    divider.divide8(v, quotient);
    const u32 shared = first_round(i0 ^ key);
    signed char q[8];
#pragma unroll
    for (int j = 0; j < 8; ++j)
        q[j] = level_of<ROUNDING>(quotient[j], element_hash<ALIGNED>(shared, i0, j, key), low, high);
    store8(q, i0, stop, vec, out);
    if (STATS) st.add8(v, quotient, low, high, i0, stop, vec);
}

// A group's scale from its clip value: clip / high (the largest level), 1 where that is 0 (an all-zero group).
__device__ __forceinline__ float scale_of_clip(float clip_value, float high) {
    const float s = __fdiv_rn(clip_value, high);
    return s == 0.0f ? 1.0f : s;
}

// SAWB's clip value (quantizers._scale) from max|t| and the caller's float sums E[t²], E|t|: alpha = 12.1 rms -
// 12.2 E|t|, doubled on an unsigned grid, min(alpha, peak) where alpha > 0 (a NaN peak kept, as torch.minimum
// keeps it), else the peak. One rounding an operation, as torch's separate ops.
__device__ __forceinline__ float sawb_clip(float peak, float mean_square, float mean_abs, bool is_signed) {
    float alpha = __fsub_rn(__fmul_rn(12.1f, __fsqrt_rn(mean_square)), __fmul_rn(12.2f, mean_abs));
    alpha = __fmul_rn(alpha, is_signed ? 1.0f : 2.0f);
    if (!(alpha > 0.0f) || isnan(peak)) return peak;
    return fminf(alpha, peak);
}

// sign_mode: 0 signed, 1 unsigned, 2 auto (*neg_flag). With moments (SAWB: E[t²] of the G groups, then E|t|), the
// scales are SAWB's; else (max * clip) / high.
template <typename T, int HAD, int ROUNDS, int ROUNDING, bool STATS>
__device__ __forceinline__ void quantize_body(const T* __restrict__ x, u32 n_el, u32 G, u32 range, int logn,
                                              const u32* __restrict__ peaks, const float* __restrict__ moments,
                                              const u32* __restrict__ neg_flag, int sign_mode, float signed_max,
                                              float unsigned_max, float clip, u32 key,
                                              signed char* __restrict__ out, float* __restrict__ scale_out,
                                              u32* __restrict__ worst, const float* times, Stats& st,
                                              u64* clipped, u64* seen) {
    extern __shared__ float smem[];
    const u32 E = blockDim.x * 8u * ROUNDS;
    const u32 start = blockIdx.x * range;
    const u32 stop = min(start + range, n_el);
    const bool vec = (reinterpret_cast<u64>(x) % 16u) == 0 && (reinterpret_cast<u64>(out) % 8u) == 0;
    const bool whole = (G % 8u) == 0;
    const bool is_signed = sign_mode == 0 || (sign_mode == 2 && *neg_flag != 0u);
    const float high = is_signed ? signed_max : unsigned_max;
    const float low = is_signed ? -signed_max : 0.0f;
    const auto scale_of = [&](u32 g) {
        const float peak = __uint_as_float(peaks[g]);
        if (moments != nullptr)
            return scale_of_clip(sawb_clip(peak, moments[g], moments[n_el / G + g], is_signed), high);
        return scale_of_clip(__fmul_rn(peak, clip), high);
    };
    u32 group = NO_GROUP;
    Divider divider(1.0f);
    // Backwards through the range: the absmax pass read it forwards, so its last steps are still in L2.
    for (u32 step = stop > start ? (stop - start + E - 1) / E : 0u; step-- > 0;) {
        const u32 first = start + step * E + run_offset<ROUNDS>();  // a multiple of 8: range and E are
        float v[ROUNDS][8];
        load_runs<T, HAD, ROUNDS>(x, first, stop, vec, logn, smem, v);
        each_run<ROUNDS>(first, stop, [&](int r, u32 i0) {
            if (whole) {  // the eight share a group
                const u32 g = i0 / G;
                if (g != group) {
                    group = g;
                    divider = Divider(scale_of(g));
                }
                if (i0 == g * G) report_scale(divider.s, g, scale_out, worst, times);
                quantize8<ROUNDING, true, STATS>(v[r], divider, low, high, i0, stop, key, vec, out, st);
                return;
            }
            const u32 shared = first_round(i0 ^ key);  // groups not a multiple of 8 (small tensors): a scale each
            signed char q[8];
            float quotient[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const u32 i = i0 + j;
                const u32 g = (i < stop) ? i / G : group;
                if (g != group) {
                    group = g;
                    divider = Divider(scale_of(g));
                }
                if (i < stop && i == g * G) report_scale(divider.s, g, scale_out, worst, times);
                quotient[j] = __fdiv_rn(v[r][j], divider.s);
                q[j] = level_of<ROUNDING>(quotient[j], element_hash<true>(shared, i0, j, key), low, high);
            }
            store8(q, i0, stop, vec, out);
            if (STATS) st.add8(v[r], quotient, low, high, i0, stop, vec);
        });
    }
    if (STATS) st.flush(clipped, seen, n_el);
}

// SELECT (HLA): of each block only the rows with a slot are written, slots[row] the row's place among the block's
// `rank` kept rows (-1: dropped), so that the transformed tensor is never written whole.
template <typename T, int ROUNDS, bool SELECT>
__device__ __forceinline__ void hadamard_body(const T* __restrict__ x, u32 n_el, u32 range, int logn,
                                              float* __restrict__ out, const int* __restrict__ slots, u32 rank) {
    extern __shared__ float smem[];
    const u32 E = blockDim.x * 8u * ROUNDS;
    const u32 start = blockIdx.x * range;
    const u32 stop = min(start + range, n_el);
    const bool vec = (reinterpret_cast<u64>(x) % 16u) == 0 && (reinterpret_cast<u64>(out) % 16u) == 0;
    for (u32 base = start; base < stop; base += E) {
        const u32 first = base + run_offset<ROUNDS>();
        float v[ROUNDS][8];
        load_runs<T, 1, ROUNDS>(x, first, stop, vec, logn, smem, v);
        each_run<ROUNDS>(first, stop, [&](int r, u32 i0) {
            if (SELECT) {
                const u32 row_mask = (1u << logn) - 1u;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const u32 i = i0 + j;
                    const int slot = (i < stop) ? slots[i & row_mask] : -1;
                    if (slot >= 0) out[(i >> logn) * rank + (u32)slot] = v[r][j];
                }
            } else if (vec && i0 + 8 <= stop) {
                reinterpret_cast<float4*>(out + i0)[0] = make_float4(v[r][0], v[r][1], v[r][2], v[r][3]);
                reinterpret_cast<float4*>(out + i0)[1] = make_float4(v[r][4], v[r][5], v[r][6], v[r][7]);
            } else {
#pragma unroll
                for (int j = 0; j < 8; ++j)
                    if (i0 + j < stop) out[i0 + j] = v[r][j];
            }
        });
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

// One CTA per scale group, the group held in registers as butterfly<ROUNDS>'s runs (blockDim.x * 8 * ROUNDS >= G):
// max, scale and levels in a single pass over the input (no second read, no zeroed work buffer), Hadamard blocks
// of up to 256 * ROUNDS elements transformed within a warp. Several CTAs a multiprocessor hide each other's loads
// and barriers. For groups of up to 8 * 1024 * ROUNDS elements; 'auto' signedness only when the group is the
// whole tensor.
template <typename T, int HAD, int ROUNDS, int ROUNDING, bool STATS>
__device__ __forceinline__ void group_body(const T* __restrict__ x, u32 G, int logn, int sign_mode, float signed_max,
                                           float unsigned_max, float clip, u32 key, signed char* __restrict__ out,
                                           float* __restrict__ scale_out, u32* __restrict__ worst,
                                           const float* times, Stats& st, u64* clipped, u64* seen) {
    extern __shared__ float smem[];
    __shared__ u32 s_warp[32];
    const bool vec = (G % 8u) == 0 && (reinterpret_cast<u64>(x) % 16u) == 0 &&
                     (reinterpret_cast<u64>(out) % 8u) == 0;
    const u32 g = blockIdx.x, base = g * G, stop = base + G;
    const u32 first = base + run_offset<ROUNDS>();  // run r: + 256 r
    float v[ROUNDS][8];
    load_runs<T, HAD, ROUNDS>(x, first, stop, vec, logn, smem, v);  // past the group: 0
    u32 m = 0u;
    bool negative = false;
#pragma unroll
    for (int r = 0; r < ROUNDS; ++r)
#pragma unroll
        for (int j = 0; j < 8; ++j) m = max(m, abs_bits(v[r][j]));
    if (sign_mode == 2) {  // 'auto' only: the other modes skip the sign test
#pragma unroll
        for (int r = 0; r < ROUNDS; ++r)
#pragma unroll
            for (int j = 0; j < 8; ++j) negative |= v[r][j] < 0.0f;
    }
    const float peak = __uint_as_float(block_max(m, s_warp));
    const bool any_negative = __syncthreads_or(negative);
    const bool is_signed = sign_mode == 0 || (sign_mode == 2 && any_negative);
    const float high = is_signed ? signed_max : unsigned_max;
    const float low = is_signed ? -signed_max : 0.0f;
    const float s = scale_of_clip(__fmul_rn(peak, clip), high);
    if (threadIdx.x == 0) report_scale(s, g, scale_out, worst, times);
    const Divider divider(s);
    each_run<ROUNDS>(first, stop, [&](int r, u32 i0) {
        if (vec)  // G % 8 == 0: every i0 a multiple of 8
            quantize8<ROUNDING, true, STATS>(v[r], divider, low, high, i0, stop, key, true, out, st);
        else
            quantize8<ROUNDING, false, STATS>(v[r], divider, low, high, i0, stop, key, false, out, st);
    });
    if (STATS) st.flush(clipped, seen, (u64)G * gridDim.x);
}

// Entry points (extern "C": fixed names for CuPy). Prefix 'had' = transform first ('hadw': blocks that fill a warp's
// elements, 256 * ROUNDS), the input type (f32 / i8), the rounding of the quantizers (nearest / stochastic / log2).
#define ABSMAX(NAME, T, HAD, ROUNDS)                                                                          \
    extern "C" __global__ void NAME(const T* x, u32 n_el, u32 G, u32 range, int logn, u32* peaks,            \
                                    u32* neg_flag) {                                                         \
        absmax_body<T, HAD, ROUNDS>(x, n_el, G, range, logn, peaks, neg_flag);                                \
    }
// The quantizers' last arguments: the largest scale's slot (worst), then the STATS kernels' counters (values
// clipped, values seen), keep mask and estimator (the others ignore them), then the factor the written scales are
// multiplied by (times; none: nullptr).
#define REPORT_ARGS u32 *worst, u64 *clipped, u64 *seen, unsigned char *keep, int ste, float threshold, \
                    const float *times
#define QUANTIZE(NAME, T, HAD, ROUNDS, ROUNDING, STATS)                                                       \
    extern "C" __global__ void NAME(const T* x, u32 n_el, u32 G, u32 range, int logn, const u32* peaks,      \
                                    const float* moments, const u32* neg_flag, int sign_mode,                \
                                    float signed_max, float unsigned_max, float clip, u32 seed, u32 role,     \
                                    const long long* step_at, u32 step, signed char* out, float* scale_out,   \
                                    REPORT_ARGS) {                                                            \
        Stats st = {keep, ste, threshold, 0u};                                                                \
        quantize_body<T, HAD, ROUNDS, ROUNDING, STATS>(x, n_el, G, range, logn, peaks, moments, neg_flag,    \
                                        sign_mode, signed_max, unsigned_max, clip,                            \
                                        counter_key(seed, role, step_at, step), out, scale_out, worst,       \
                                        times, st, clipped, seen);                                            \
    }
#define QUANTIZE_ROUNDINGS(NAME, T, HAD, ROUNDS)                                                              \
    QUANTIZE(NAME##_nearest, T, HAD, ROUNDS, 0, false)                                                        \
    QUANTIZE(NAME##_stochastic, T, HAD, ROUNDS, 1, false)                                                     \
    QUANTIZE(NAME##_log2, T, HAD, ROUNDS, 2, false)
#define HADAMARD(NAME, T, ROUNDS)                                                                             \
    extern "C" __global__ void NAME(const T* x, u32 n_el, u32 range, int logn, float* out) {                 \
        hadamard_body<T, ROUNDS, false>(x, n_el, range, logn, out, nullptr, 0u);                              \
    }
// HLA's compression: the transform and its kept rows (float32 input, the blocks along the contiguous dim).
#define HLA(NAME, ROUNDS)                                                                                     \
    extern "C" __global__ void NAME(const float* x, u32 n_el, u32 range, int logn, const int* slots, u32 rank,\
                                    float* out) {                                                             \
        hadamard_body<float, ROUNDS, true>(x, n_el, range, logn, out, slots, rank);                            \
    }
// The flat kernels in two shapes: one run of 8 a thread, and four (names ending in 4) for large tensors with a
// Hadamard transform, where more work per butterfly barrier pays (on small tensors a quarter of the warps is
// slower, and without a transform there is no barrier to amortise).
#define ABSMAX1(NAME, T, HAD) ABSMAX(NAME, T, HAD, 1)
#define ABSMAX4(NAME, T, HAD) ABSMAX(NAME, T, HAD, 4)
#define QUANTIZE1(NAME, T, HAD) QUANTIZE_ROUNDINGS(NAME, T, HAD, 1)
#define QUANTIZE4(NAME, T, HAD) QUANTIZE_ROUNDINGS(NAME, T, HAD, 4)

// Each kernel for both input types and the three transforms (none, 'had', 'hadw').
#define INPUTS(MACRO, NAME, HAD) MACRO(NAME##_f32, float, HAD) MACRO(NAME##_i8, signed char, HAD)
#define HADAMARDS(MACRO, NAME) INPUTS(MACRO, NAME##_had, 1) INPUTS(MACRO, NAME##_hadw, 2)
#define TRANSFORMS(MACRO, NAME) INPUTS(MACRO, NAME, 0) HADAMARDS(MACRO, NAME)

TRANSFORMS(ABSMAX1, absmax)
HADAMARDS(ABSMAX4, absmax4)
TRANSFORMS(QUANTIZE1, quantize)
HADAMARDS(QUANTIZE4, quantize4)
// Forward operands (float32, no transform), with their statistics and mask: nearest and stochastic rounding.
QUANTIZE(quantize_stats_f32_nearest, float, 0, 1, 0, true)
QUANTIZE(quantize_stats_f32_stochastic, float, 0, 1, 1, true)
HADAMARD(hadamard_f32, float, 1)
HADAMARD(hadamard_i8, signed char, 1)
HADAMARD(hadamard4_f32, float, 4)
HADAMARD(hadamard4_i8, signed char, 4)
HLA(hla_f32, 1)
HLA(hla4_f32, 4)

#define GROUP(NAME, T, HAD, ROUNDS, ROUNDING, STATS)                                                          \
    extern "C" __global__ void __launch_bounds__(1024)                                                        \
        NAME(const T* x, u32 G, int logn, int sign_mode, float signed_max, float unsigned_max, float clip,    \
             u32 seed, u32 role, const long long* step_at, u32 step, signed char* out, float* scale_out,        \
             REPORT_ARGS) {                                                                                   \
        Stats st = {keep, ste, threshold, 0u};                                                                \
        group_body<T, HAD, ROUNDS, ROUNDING, STATS>(x, G, logn, sign_mode, signed_max, unsigned_max, clip,    \
                                                    counter_key(seed, role, step_at, step), out, scale_out,   \
                                                    worst, times, st, clipped, seen);                         \
    }
// Group kernels hold 4 runs of 8 a thread: 32 elements, Hadamard blocks of up to 1024 within a warp.
#define GROUP_ROUNDINGS(NAME, T, HAD)                                                                         \
    GROUP(NAME##_nearest, T, HAD, 4, 0, false)                                                                \
    GROUP(NAME##_stochastic, T, HAD, 4, 1, false)                                                             \
    GROUP(NAME##_log2, T, HAD, 4, 2, false)

TRANSFORMS(GROUP_ROUNDINGS, group)
GROUP(group_stats_f32_nearest, float, 0, 4, 0, true)
GROUP(group_stats_f32_stochastic, float, 0, 4, 1, true)

// out[i] = (((+0 + x[0][i]) + x[1][i]) + ...) + x[entries - 1][i], float32, entries in order (quant/intmm.py
// sum_entries): for batched products too small in M x N to loop over the batch inside the GEMM. Where keep is
// given, times keep[i] (0 or 1, a multiplication as torch's by a bool mask: a negative total times 0 is -0).
extern "C" __global__ void sum_entries_f32(const float* __restrict__ x, u32 entries, u64 size,
                                           const unsigned char* __restrict__ keep, float* __restrict__ out) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < size; i += (u64)gridDim.x * blockDim.x) {
        float total = 0.0f;
        for (u32 e = 0; e < entries; ++e) total = __fadd_rn(total, __ldg(x + e * size + i));
        out[i] = keep != nullptr ? __fmul_rn(total, keep[i] ? 1.0f : 0.0f) : total;
    }
}

// *out = *counter, then *counter + 1: a layer's step counter read for this call and advanced, one launch.
extern "C" __global__ void advance_step(long long* counter, long long* out) {
    *out = *counter;
    *counter += 1;
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
