// The random bits of docs/numerics.md ("Counter-based random bits"), shared by the quantizers of quant.cu
// and floats.cu.

// mix(x) of docs/numerics.md, split after its first round (x ^= x >> 16): for the eight consecutive indices i0 + j
// of a thread with i0 a multiple of 8, first_round(i0 ^ key) ^ j is every element's first round (j < 8 touches
// neither the bits the shift moves nor the carry), one instruction an element instead of four.
__device__ __forceinline__ u32 first_round(u32 x) { return x ^ (x >> 16); }

__device__ __forceinline__ u32 mix_rest(u32 x) {
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

__device__ __forceinline__ u32 mix32(u32 x) { return mix_rest(first_round(x)); }

// The per-call key of docs/numerics.md: mix(seed ^ mix(step * 0x9E3779B9 + role)) mod 2^32. The step is read from
// device memory when step_at is given (a layer's step counter: a CUDA-graph replay then draws fresh bits).
__device__ __forceinline__ u32 counter_key(u32 seed, u32 role, const long long* step_at, u32 step) {
    const u32 s = step_at != nullptr ? static_cast<u32>(*step_at) : step;
    return mix32(seed ^ mix32(s * 0x9E3779B9u + role));
}

// u = float32(mix(index ^ key) >> 8) * 2^-24, from h = first_round(index ^ key)
__device__ __forceinline__ float counter_u(u32 h) {
    return __uint2float_rn(mix_rest(h) >> 8) * 5.9604644775390625e-08f;
}
