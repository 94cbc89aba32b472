// The quantizers' division by a scale (quant.cu), in a header of its own so that a test can launch it alone
// (tests/cuda/divide.cu). Include common.cuh first.

__device__ __forceinline__ u32 abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

// Quotients v / s for many v and one s, each the correctly rounded float32 of __fdiv_rn, without its per-element
// range check and branch (which keep the compiler from overlapping the elements' dependency chains): from
// r = RN(1/s), q0 = v * r, then two corrections by the remainder (the first gives a faithful quotient, from which
// Markstein's correction with the exact remainder v - q1 * s rounds correctly). Valid while nothing nears
// overflow or underflow: s and |v| in [2^-60, 2^60], or v = 0 (whose quotient's sign may come out flipped; no level
// shows a zero's sign). Eights of elements outside that range divide with __fdiv_rn.
#define SAFE_LO 0x21800000u  // 2^-60
#define SAFE_HI 0x5d800000u  // 2^60

struct Divider {
    float s, r;
    bool usable;
    __device__ __forceinline__ explicit Divider(float scale)
        : s(scale), r(__frcp_rn(scale)), usable(abs_bits(scale) - SAFE_LO <= SAFE_HI - SAFE_LO) {}

    __device__ __forceinline__ void divide8(const float v[8], float q[8]) const {
        u32 lo = 0xffffffffu, hi = 0u;  // min of |v| - 1 as bits (a zero wraps to the top), max of |v|
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const u32 b = abs_bits(v[j]);
            lo = min(lo, b - 1u);
            hi = max(hi, b);
        }
        if (usable && lo >= SAFE_LO - 1u && hi <= SAFE_HI) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float q0 = __fmul_rn(v[j], r);
                const float q1 = __fmaf_rn(__fmaf_rn(-q0, s, v[j]), r, q0);
                q[j] = __fmaf_rn(__fmaf_rn(-q1, s, v[j]), r, q1);
            }
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) q[j] = __fdiv_rn(v[j], s);
        }
    }
};
