// What an implicit-GEMM convolution would change in the int8 GEMM's A-operand loads (scripts/bench/implicit_loads.py):
// the tiles of BM rows x BK bytes a K step taken with cp.async from the im2col rows that im2col.cu materialises
// (rows_tiles, the GEMM's load_tile layout, three stages in flight), or gathered byte by byte from the int8
// activation itself (gathered_tiles: consecutive threads take consecutive rows, so that a warp's byte loads of one
// k are consecutive input columns). Each tile lands in shared memory in the GEMM's swizzled layout and is read
// back chunk by chunk, as ldmatrix would, into an XOR checksum (atomicXor: the same value whatever the order), so
// that neither load is optimised away; gathered_tiles with `copy` also writes its tiles back as rows (the check
// against im2col.cu). x is (B, C, H, W) contiguous int8; K = C * kh * kw is a multiple of 16.

#include "common.cuh"

constexpr int BM = 128, BK = 128, THREADS = 256, STAGES = 3;
constexpr int CHUNKS = BM * BK / 16;  // 16-byte chunks a tile

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ int chunk_offset(int r, int c) { return r * BK + ((c ^ (r & 7)) << 4); }

// XOR of the tile's words, each thread the chunks load_tile would give it.
__device__ __forceinline__ u32 tile_xor(const unsigned char* tile) {
    u32 s = 0u;
    for (int q = threadIdx.x; q < CHUNKS; q += THREADS) {
        const uint4 v = *reinterpret_cast<const uint4*>(tile + chunk_offset(q >> 3, q & 7));
        s ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    return s;
}

extern "C" __global__ void rows_tiles(const signed char* __restrict__ rows, int M, int K, u32* __restrict__ out) {
    __shared__ __align__(128) unsigned char smem[STAGES][BM * BK];
    const int m0 = blockIdx.x * BM, steps = (K + BK - 1) / BK;
    auto load = [&](int step) {
        for (int q = threadIdx.x; q < CHUNKS; q += THREADS) {
            const int r = q >> 3, c = q & 7, gk = step * BK + 16 * c;
            const int bytes = (m0 + r < M && gk < K) ? 16 : 0;
            const signed char* p = rows + (bytes ? (long long)(m0 + r) * K + gk : 0);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                             smem_addr(smem[step % STAGES] + chunk_offset(r, c))),
                         "l"(p), "r"(bytes));
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    u32 s = 0u;
    for (int step = 0; step < STAGES - 1; ++step) {
        if (step < steps) load(step);
        else asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int step = 0; step < steps; ++step) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
        __syncthreads();
        if (step + STAGES - 1 < steps) load(step + STAGES - 1);
        else asm volatile("cp.async.commit_group;\n" ::);
        s ^= tile_xor(smem[step % STAGES]);
    }
    atomicXor(out, s);
}

extern "C" __global__ void gathered_tiles(const signed char* __restrict__ x, u32 channels, u32 height, u32 width,
                                          u32 out_h, u32 out_w, int kh, int kw, int ph, int pw, int sh, int sw, int M,
                                          int K, u32* __restrict__ out, signed char* __restrict__ copy) {
    __shared__ __align__(128) unsigned char smem[BM * BK];
    const int m0 = blockIdx.x * BM, steps = (K + BK - 1) / BK;
    u32 s = 0u;
    for (int step = 0; step < steps; ++step) {
        for (int q = threadIdx.x; q < CHUNKS; q += THREADS) {
            const int r = q % BM, c = q / BM, m = m0 + r, k0 = step * BK + 16 * c;
            u32 word[4] = {0u, 0u, 0u, 0u};
            if (m < M && k0 < K) {
                const int ox = m % out_w, oy = (m / out_w) % out_h, b = m / (out_w * out_h);
                int j = k0 % kw, i = (k0 / kw) % kh, ch = k0 / (kw * kh);
                const signed char* plane = x + ((long long)b * channels + ch) * height * width;
#pragma unroll
                for (int t = 0; t < 16; ++t) {
                    const int y = oy * sh - ph + i, xx = ox * sw - pw + j;
                    const u32 v = (y >= 0 && y < (int)height && xx >= 0 && xx < (int)width)
                                      ? (unsigned char)plane[y * (int)width + xx] : 0u;
                    word[t >> 2] |= v << (8 * (t & 3));
                    if (++j == kw) {
                        j = 0;
                        if (++i == kh) { i = 0; plane += height * width; }
                    }
                }
            }
            *reinterpret_cast<uint4*>(smem + chunk_offset(r, c)) = make_uint4(word[0], word[1], word[2], word[3]);
        }
        __syncthreads();
        s ^= tile_xor(smem);
        if (copy != nullptr) {
            for (int q = threadIdx.x; q < CHUNKS; q += THREADS) {
                const int r = q >> 3, c = q & 7, gk = step * BK + 16 * c;
                if (m0 + r < M && gk < K)
                    *reinterpret_cast<uint4*>(copy + (long long)(m0 + r) * K + gk) =
                        *reinterpret_cast<const uint4*>(smem + chunk_offset(r, c));
            }
        }
        __syncthreads();
    }
    atomicXor(out, s);
}
