// The quantizers' division (hdqt_cil/kernels/divide.cuh) as a kernel of its own, so that tests/test_kernels_gpu.py
// can compare every quotient with the IEEE division, not only the levels they round to.

#include "common.cuh"
#include "divide.cuh"

extern "C" __global__ void divide_f32(const float* __restrict__ v, const float* __restrict__ s, u32 eights,
                                      float* __restrict__ out) {
    for (u32 k = blockIdx.x * blockDim.x + threadIdx.x; k < eights; k += gridDim.x * blockDim.x) {
        float x[8], q[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) x[j] = v[8 * k + j];
        Divider(s[k]).divide8(x, q);
#pragma unroll
        for (int j = 0; j < 8; ++j) out[8 * k + j] = q[j];
    }
}
