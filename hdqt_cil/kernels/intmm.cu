// Integer GEMM on the int8 tensor cores with a saturating tile accumulator (docs/numerics.md, "Tiled integer
// accumulation" and "Epilogue").
//
//   out[b, m, n] = sum over K tiles T of clamp(sum_{k in T} A[b, m, k] * B[b, n, k], -L, L)
//
// Both operands are int8 with K contiguous ("TN": A is (M, K) row-major, B is the right factor transposed,
// (N, K) row-major, i.e. the column-major K x N matrix mma.sync's ".col" operand wants). Row strides lda/ldb and
// the base addresses must be multiples of 16 bytes (cp.async.cg 16-byte copies); K itself is arbitrary: the copy
// of the last 16-byte chunk of a row reads only the bytes inside K and zero-fills the rest, and rows past M or
// N are zero-filled. Batch strides may be 0 (a broadcast operand).
//
// CTA tile BM x BN = (WM * MI * 16) x (WN * NI * 8), K step BK = 128 bytes, STAGES-deep cp.async pipeline, at
// least MINB CTAs per multiprocessor (a register cap). Shared
// memory rows are 128 bytes: 16-byte chunk c of row r is stored at chunk c ^ (r & 7), so the 8 row addresses of
// an ldmatrix phase hit 8 different chunks (all 32 banks) and the cp.async writes of a warp do too.
// Each warp computes (MI * 16) x (NI * 8) with mma.sync.m16n8k32.row.col.s32.s8.s8.s32; fragments by ldmatrix.x4.
// WG (Hopper, sm_90a): two warpgroups of four warps, each wgmma.m64n128k32 reading both operands from shared
// memory, where the rows above already are the 128-byte-swizzled K-major layout wgmma's descriptors name. Its
// accumulators are the m16n8 fragments of a warp's 16 rows (d[4j + e] is fragment j's e), so WG is the warp
// layout WM = 8, WN = 1, MI = 1, NI = 16 and shares everything after the products with the mma.sync path. The
// pipeline loads STAGES - 2 steps ahead, so that one step's wgmma group may still run while the next is issued.
//
// SAT: 0 no saturation (the MMA accumulates in place), 1 one clamp of the whole-K sum at the end (tile=None),
//      2 tile = 32: every k32 MMA starts from C = 0; one DPX op gives its clamped sum plus L,
//        max(min(t + L, 2L), 0) = clamp(t) + L, which is added to the int32 total; the bias L per k32 step
//        (padded steps included) comes off at the end.
//      3 tile = 32 * tile_steps: the MMA chain of a tile accumulates in a per-tile register set, clamped at the
//        tile's end (the last tile may be shorter: K is zero-padded to the 128-byte step, zeros add nothing).
//      4 tile = 32, packed: two k32 sums per 32-bit register (PRMT), clamped plus L by one per-halfword DPX op
//        as in mode 2, and accumulated two at a time with one 32-bit add (the halves never carry: the caller
//        guarantees |t| + L < 2^15 and k32 steps * 2L < 2^16); the bias comes off at the end, as in mode 2.
//      5 block-scaled float tiles of 32 (MXFP4, NVFP4: docs/numerics.md "Float training"): every k32 step's
//        sum t is a tile of `tile_steps` along K; t / 4 (the operands hold E2M1 values doubled) times the
//        tile's scale pair sa[row, tile] * sb[col, tile] is added to a float32 sum that starts at +0, tile by
//        tile in K order, each operation rounded once; sa and sb are (batch, rows, tiles) with the tiles
//        contiguous (sa_row, sb_col: their row strides). OUT 1 writes that sum times block_inv, OUT 3 adds it
//        times block_inv to the batch total. mma.sync configs only.
//      6 as 5 with tiles of 16: each k32 step is two m16n8k16 products, one a tile.
// COUNT: count the clamped (tile) sums, |sum| > L, into *count (mode 4: a halfword the clamp changed). Where
//        `seen` is given, the first CTA adds `sums` (the launch's number of tile sums) to it: a layer's statistics
//        then take no launch of their own.
// OUT: 0 int32 acc, 1 float32(acc), 2 float32(acc) * ((sa * sb) / n) with sa per (batch, row) and sb
//      per (batch, column) through strides (0 for a per-tensor scale), 3 the batch sum of mode 2's products: a
//      CTA runs all `entries` batch entries of its tile in order and adds each scaled product to a float32
//      total that starts at +0 (the order of quant/intmm.py sum_entries); gridDim.z is 1, out is (M, N).
// A batch entry's sums are finished (SAT 1, 3, 4) when its last K step is done, so mode 3 can go on to the next
// entry in the same pipeline: stage t holds K step t % ktiles of entry t / ktiles.

#include "common.cuh"

typedef long long i64;

#define BK 128

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// Hopper's warpgroup MMA. Only the WG kernels use it, and only sm_90a has it: elsewhere these compile to a trap.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HAS_WGMMA 1
#endif

// A K-major tile of shared memory as wgmma reads it: 128-byte rows whose 16-byte chunks are swizzled by the
// row's low three bits, 8-row groups 1024 bytes apart (load_tile's layout; p 1024-byte aligned).
__device__ __forceinline__ u64 smem_desc(const void* p) {
    return (((u64)smem_addr(p) & 0x3FFFF) >> 4) | (1ull << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}

// Make this thread's shared-memory writes (cp.async) visible to wgmma, which reads through the async proxy.
__device__ __forceinline__ void fence_proxy_async() {
#ifdef HAS_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_fence() {
#ifdef HAS_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
    __trap();
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#ifdef HAS_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef HAS_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Registers an async wgmma writes: the compiler must not move their reads above the wait that completes them.
template <int N>
__device__ __forceinline__ void hold(int* d) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// d (this warp's 16 x 128 of a 64 x 128 int32 tile) = A * B, plus d where `accumulate`, over one k32 step.
__device__ __forceinline__ void wgmma_s8(int* d, u64 a, u64 b, int accumulate) {
#ifdef HAS_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
          "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
          "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
          "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
          "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
          "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
          "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
          "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
        : "l"(a), "l"(b), "r"(accumulate));
#endif
}

// D = A * B + C over half the K of mma_s8 (common.cuh): m16n8k16, where a0, a1 and b0 are the registers of
// mma_s8's fragments that hold one 16-wide half of K (a[0], a[1], b[0]: k 0-15; a[2], a[3], b[1]: k 16-31).
__device__ __forceinline__ void mma_s8_k16(int d[4], u32 a0, u32 a1, u32 b0, const int c[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %8, %9, %10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
}

// t / 4 as a float32, exactly, for |t| < 2^22: t added to the bits of 1.5 * 2^21, whose binade's quantum is 1/4,
// then 1.5 * 2^21 taken off (an integer add and a float subtraction; int-to-float conversion runs at 1/8 of the
// float32 rate and was the block-scaled modes' busiest instruction).
__device__ __forceinline__ float quarter_of(int t) {
    return __fsub_rn(__int_as_float(0x4A400000 + t), 3145728.0f);
}

template <bool COUNT>
__device__ __forceinline__ void clamp_add(int acc[4], const int t[4], int limit, u32& count) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int c = min(max(t[e], -limit), limit);
        if (COUNT) count += (c != t[e]) ? 1u : 0u;
        acc[e] += c;
    }
}

// Add one k32 step's tile sums t (an m16n8 fragment) to the running sums: mode 2 clamped plus L into acc, mode 4
// two a register into packed (SAT above); the clamped ones counted into saturated (mode 4: into clamped2).
template <int SAT, bool COUNT>
__device__ __forceinline__ void add_tile_sums(int acc[4], u32 packed[2], const int t[4], int limit, u32& saturated,
                                              u32& clamped2) {
    if (SAT == 2) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int c = __viaddmin_s32_relu(t[e], limit, 2 * limit);  // clamp(t) + L
            if (COUNT) saturated += (c != t[e] + limit) ? 1u : 0u;
            acc[e] = (int)((u32)acc[e] + (u32)c);  // biased partial sums may wrap
        }
    } else {
        const u32 bias2 = ((u32)limit << 16) | (u32)limit;
        const u32 span2 = bias2 << 1;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 p = __byte_perm((u32)t[2 * h], (u32)t[2 * h + 1], 0x5410);
            if (COUNT) {
                // t + L per halfword (a max with -2^15 changes nothing), then clamped to [0, 2L];
                // min(shifted ^ clamped, 1) is 1 in a halfword the clamp changed
                const u32 shifted = __viaddmax_s16x2(p, bias2, 0x80008000u);
                const u32 c = __vimin_s16x2_relu(shifted, span2);
                clamped2 += __viaddmin_u16x2(shifted ^ c, 0u, 0x00010001u);
                packed[h] += c;
            } else {
                packed[h] += __viaddmin_s16x2_relu(p, bias2, span2);  // clamp(t) + L
            }
        }
    }
}

// The epilogue's scale of docs/numerics.md, (sa * sb) / n, each operation rounded once. n is a power of two (a
// Hadamard block), so the quotient is the product with block_inv = 1 / n, bit for bit, without an IEEE division.
__device__ __forceinline__ float scale_of(float sa, float sb, float block_inv) {
    return __fmul_rn(__fmul_rn(sa, sb), block_inv);
}

// Two consecutive outputs of a row: one 8-byte store when the row length is even, else as many as lie inside.
template <typename T> struct Pair;
template <> struct Pair<int> { typedef int2 type; };
template <> struct Pair<float> { typedef float2 type; };
template <typename T>
__device__ __forceinline__ void store_pair(T* o, T v0, T v1, bool pairs, bool second) {
    if (pairs) {
        typename Pair<T>::type p;
        p.x = v0;
        p.y = v1;
        *reinterpret_cast<typename Pair<T>::type*>(o) = p;
    } else {
        o[0] = v0;
        if (second) o[1] = v1;
    }
}

// Turn an entry's running sums into its exact (saturated) total in acc, and reset them for the next entry.
template <int MI, int NI, int SAT, bool COUNT>
__device__ __forceinline__ void finish_entry(int acc[MI][NI][4], int tacc[MI][NI][4], u32 packed[MI][NI][2],
                                             int limit, int k32_steps, u32& saturated) {
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) {
            if (SAT == 3) {  // a last tile cut short by the end of K (tacc is 0 when the last tile was complete)
                clamp_add<COUNT>(acc[i][j], tacc[i][j], limit, saturated);
#pragma unroll
                for (int e = 0; e < 4; ++e) tacc[i][j][e] = 0;
            }
            if (SAT == 2) {
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] = (int)((u32)acc[i][j][e] - (u32)limit * (u32)k32_steps);
            }
            if (SAT == 4) {
                const int bias = limit * k32_steps;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    acc[i][j][2 * h] = (int)(packed[i][j][h] & 0xffffu) - bias;
                    acc[i][j][2 * h + 1] = (int)(packed[i][j][h] >> 16) - bias;
                    packed[i][j][h] = 0u;
                }
            }
            if (SAT == 1) {
                int total[4] = {0, 0, 0, 0};
                clamp_add<COUNT>(total, acc[i][j], limit, saturated);
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] = total[e];
            }
        }
}

template <int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(unsigned char* dst, const signed char* src, int row0, int rows, int k0,
                                          int K, i64 ld) {
    constexpr int CHUNKS = ROWS * 8;
    constexpr int ITERS = (CHUNKS + THREADS - 1) / THREADS;
#pragma unroll
    for (int u = 0; u < ITERS; ++u) {
        const int id = threadIdx.x + u * THREADS;
        if (CHUNKS % THREADS == 0 || id < CHUNKS) {
            const int r = id >> 3, c = id & 7;
            const int gr = row0 + r, gk = k0 + 16 * c;
            int bytes = min(max(K - gk, 0), 16);
            bytes = gr < rows ? bytes : 0;
            const signed char* p = src + (bytes > 0 ? (i64)gr * ld + gk : (i64)0);
            cp_async16(smem_addr(dst + r * BK + ((c ^ (r & 7)) << 4)), p, bytes);
        }
    }
}

// Register sets of k32 tile sums a WG kernel holds: two for modes 2 and 4, one computed while the other's sums are
// added (with one set, reading it and issuing the next wgmma into it gave wrong sums on an H100).
__host__ __device__ constexpr int wg_tile_sets(int sat) { return sat == 2 || sat == 4 ? 2 : 1; }

// One K step (BK / 32 k32 steps) of a WG kernel's products, for this thread's warpgroup (da, db: its A rows and
// the CTA's B rows). Modes 0, 1, 3 chain the wgmma of the step into acc (3: into tacc, clamped at each tile's
// end) and leave the step's group running unless `entry_end` (its sums are read next); modes 2 and 4 compute
// each k32 step's sums into one of two register sets in turn and add one set's sums (add_tile_sums) while the
// next product runs.
template <int SAT, bool COUNT>
__device__ __forceinline__ void wg_step(int acc[1][16][4], int tacc[1][16][4], u32 packed[1][16][2],
                                        int wtile[][64], u64 da, u64 db, int kt, int tile_steps, int limit,
                                        u32& saturated, u32& clamped2, bool entry_end) {
    constexpr int KS = BK / 32;  // k32 steps of a K step; a descriptor advances 32 bytes as 2
    if (SAT == 0 || SAT == 1) {
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) wgmma_s8(&acc[0][0][0], da + 2 * ks, db + 2 * ks, 1);
        wgmma_commit();
    } else if (SAT == 3) {
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            const int step = kt * KS + ks;
            wgmma_fence();
            wgmma_s8(&tacc[0][0][0], da + 2 * ks, db + 2 * ks, (step % tile_steps) != 0);
            wgmma_commit();
            if ((step + 1) % tile_steps == 0) {
                wgmma_wait<0>();
                hold<64>(&tacc[0][0][0]);
#pragma unroll
                for (int j = 0; j < 16; ++j) {
                    clamp_add<COUNT>(acc[0][j], tacc[0][j], limit, saturated);
#pragma unroll
                    for (int e = 0; e < 4; ++e) tacc[0][j][e] = 0;
                }
            }
        }
    } else {
        constexpr int SETS = wg_tile_sets(SAT);
#pragma unroll
        for (int ks = 0; ks < KS + SETS - 1; ++ks) {
            if (ks < KS) {
                wgmma_fence();
                wgmma_s8(wtile[ks % SETS], da + 2 * ks, db + 2 * ks, 0);
                wgmma_commit();
            }
            const int done = ks - (SETS - 1);  // the k32 step whose sums are added now
            if (done < 0) continue;
            if (SETS == 2 && ks < KS) {
                wgmma_wait<1>();
            } else {
                wgmma_wait<0>();
            }
            int* t = wtile[done % SETS];
            hold<64>(t);
#pragma unroll
            for (int j = 0; j < 16; ++j) add_tile_sums<SAT, COUNT>(acc[0][j], packed[0][j], t + 4 * j, limit,
                                                                   saturated, clamped2);
        }
        return;
    }
    if (entry_end) {
        wgmma_wait<0>();
        hold<64>(&acc[0][0][0]);
        hold<64>(&tacc[0][0][0]);
    } else {
        wgmma_wait<1>();
    }
}

template <int WM, int WN, int MI, int NI, int STAGES, int MINB, int SAT, bool COUNT, int OUT, bool WG>
__global__ void __launch_bounds__(WM * WN * 32, MINB)
    intmm_kernel(const signed char* __restrict__ A, const signed char* __restrict__ B, void* __restrict__ out,
                 int M, int N, int K, i64 lda, i64 ldb, i64 batch_a, i64 batch_b, int limit, int tile_steps,
                 const float* __restrict__ sa, i64 sa_batch, i64 sa_row, const float* __restrict__ sb,
                 i64 sb_batch, i64 sb_col, float block_inv, u64* __restrict__ count, u64* __restrict__ seen,
                 u64 sums, int entries) {
    constexpr int THREADS = WM * WN * 32;
    constexpr int BM = WM * MI * 16;
    constexpr int BN = WN * NI * 8;
    constexpr int STAGE_BYTES = (BM + BN) * BK;
    static_assert(NI % 2 == 0, "B fragments are loaded two n8 blocks at a time");
    static_assert(!WG || (WM == 8 && WN == 1 && MI == 1 && NI == 16 && STAGES >= 3), "WG: two m64n128 warpgroups");
    static_assert(SAT < 5 || (!WG && !COUNT && (OUT == 1 || OUT == 3)), "block-scaled tiles: mma.sync, float out");
    constexpr int AHEAD = WG ? STAGES - 2 : STAGES - 1;  // K steps loaded ahead of the one computed
    extern __shared__ __align__(128) unsigned char smem_raw[];
    // wgmma's swizzle is a function of the address: stages start on 1024-byte boundaries (1 KB more is asked for)
    unsigned char* smem = WG ? smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u) : smem_raw;

    const int batch = OUT == 3 ? 0 : blockIdx.z;  // mode 3: the first of `entries`; else the one entry
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp / WN, wn = warp % WN;
    const int ktiles = (K + BK - 1) / BK;
    const int steps = (OUT == 3 ? entries : 1) * ktiles;  // pipeline stages over all entries of this CTA
    // Where this lane's accumulator acc[i][j][2 * half + c] lies in the output (the m16n8 fragment layout):
    // row out_row(i, half), column out_col(j) + c.
    auto out_row = [&](int i, int half) { return m0 + wm * MI * 16 + i * 16 + (lane >> 2) + half * 8; };
    auto out_col = [&](int j) { return n0 + wn * NI * 8 + j * 8 + (lane & 3) * 2; };

    int acc[MI][NI][4];
    int tacc[MI][NI][4];
    u32 packed[MI][NI][2];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) packed[i][j][0] = packed[i][j][1] = 0u;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = tacc[i][j][e] = 0;
    float facc[MI][NI][4];  // mode 3's float32 total
    float fsum[MI][NI][4];  // modes 5 and 6: an entry's sum of scaled tile sums
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) facc[i][j][e] = fsum[i][j][e] = 0.0f;
    const int zero[4] = {0, 0, 0, 0};
    u32 saturated = 0u;
    u32 clamped2 = 0u;  // mode 4's count, per halfword; moved into `saturated` every K step, before it can wrap
    constexpr int SETS = WG ? wg_tile_sets(SAT) : 1;
    int wtile[SETS][64];  // WG modes 2 and 4: k32 steps' tile sums
#pragma unroll
    for (int u = 0; u < SETS; ++u)
#pragma unroll
        for (int e = 0; e < 64; ++e) wtile[u][e] = 0;

    auto load_stage = [&](int stage) {  // K step stage % ktiles of entry batch + stage / ktiles, into its slot
        const int e = OUT == 3 ? stage / ktiles : 0, k0 = (stage - e * ktiles) * BK;
        unsigned char* st = smem + (stage % STAGES) * STAGE_BYTES;
        load_tile<BM, THREADS>(st, A + (i64)(batch + e) * batch_a, m0, M, k0, K, lda);
        load_tile<BN, THREADS>(st + BM * BK, B + (i64)(batch + e) * batch_b, n0, N, k0, K, ldb);
    };
#pragma unroll
    for (int s = 0; s < AHEAD; ++s) {
        if (s < steps) load_stage(s);
        cp_async_commit();
    }

    // Row (within the CTA tile) and 16-byte chunk offset of this lane's ldmatrix address.
    const int a_row = wm * MI * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
    const int a_chunk = lane >> 4;
    const int b_row = wn * NI * 8 + (lane & 7) + (lane >> 4) * 8;
    const int b_chunk = (lane >> 3) & 1;

    int kt = 0, entry = batch;  // K step within the current entry
    for (int stage = 0; stage < steps; ++stage) {
        cp_async_wait<AHEAD - 1>();
        if (WG) fence_proxy_async();
        __syncthreads();
        if (stage + AHEAD < steps) load_stage(stage + AHEAD);
        cp_async_commit();
        const unsigned char* sA = smem + (stage % STAGES) * STAGE_BYTES;
        const unsigned char* sB = sA + BM * BK;
        if constexpr (WG) {
            wg_step<SAT, COUNT>(acc, tacc, packed, wtile, smem_desc(sA + (warp >> 2) * 64 * BK), smem_desc(sB), kt,
                                tile_steps, limit, saturated, clamped2, kt + 1 == ktiles);
        } else
#pragma unroll
        for (int ks = 0; ks < BK / 32; ++ks) {
            u32 af[MI][4], bf[NI][2];
#pragma unroll
            for (int i = 0; i < MI; ++i) {
                const int r = a_row + i * 16;
                const int c = 2 * ks + a_chunk;
                ldmatrix_x4(smem_addr(sA + r * BK + ((c ^ (r & 7)) << 4)), af[i][0], af[i][1], af[i][2], af[i][3]);
            }
#pragma unroll
            for (int p = 0; p < NI / 2; ++p) {
                const int r = b_row + p * 16;
                const int c = 2 * ks + b_chunk;
                ldmatrix_x4(smem_addr(sB + r * BK + ((c ^ (r & 7)) << 4)), bf[2 * p][0], bf[2 * p][1],
                            bf[2 * p + 1][0], bf[2 * p + 1][1]);
            }
            if (SAT == 2 || SAT == 4) {
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int j = 0; j < NI; ++j) {
                        int t[4];
                        mma_s8(t, af[i], bf[j], zero);
                        add_tile_sums<SAT, COUNT>(acc[i][j], packed[i][j], t, limit, saturated, clamped2);
                    }
            } else if (SAT == 3) {
                const int step = kt * (BK / 32) + ks;
                const bool first = (step % tile_steps) == 0;
                const bool last = ((step + 1) % tile_steps) == 0;
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int j = 0; j < NI; ++j) {
                        int c[4];
#pragma unroll
                        for (int e = 0; e < 4; ++e) c[e] = first ? 0 : tacc[i][j][e];
                        mma_s8(tacc[i][j], af[i], bf[j], c);
                        if (last) {
                            clamp_add<COUNT>(acc[i][j], tacc[i][j], limit, saturated);
#pragma unroll
                            for (int e = 0; e < 4; ++e) tacc[i][j][e] = 0;
                        }
                    }
            } else if (SAT >= 5) {
                constexpr int HALVES = SAT == 6 ? 2 : 1;  // tiles a k32 step holds
                const float* sae = sa + (i64)entry * sa_batch;
                const float* sbe = sb + (i64)entry * sb_batch;
#pragma unroll
                for (int h = 0; h < HALVES; ++h) {
                    const int tile = (kt * (BK / 32) + ks) * HALVES + h;
                    if (tile >= tile_steps) break;  // K's zero padding
                    float row_scale[MI][2], col_scale[NI][2];
#pragma unroll
                    for (int i = 0; i < MI; ++i)
#pragma unroll
                        for (int half = 0; half < 2; ++half) {
                            const int r = out_row(i, half);
                            row_scale[i][half] = r < M ? sae[(i64)r * sa_row + tile] : 0.0f;
                        }
#pragma unroll
                    for (int j = 0; j < NI; ++j)
#pragma unroll
                        for (int c = 0; c < 2; ++c) {
                            const int col = out_col(j) + c;
                            col_scale[j][c] = col < N ? sbe[(i64)col * sb_col + tile] : 0.0f;
                        }
#pragma unroll
                    for (int i = 0; i < MI; ++i)
#pragma unroll
                        for (int j = 0; j < NI; ++j) {
                            int t[4];
                            if (SAT == 5) {
                                mma_s8(t, af[i], bf[j], zero);
                            } else {
                                mma_s8_k16(t, af[i][2 * h], af[i][2 * h + 1], bf[j][h], zero);
                            }
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                const float values = quarter_of(t[e]);
                                const float pair = __fmul_rn(row_scale[i][e >> 1], col_scale[j][e & 1]);
                                fsum[i][j][e] = __fadd_rn(fsum[i][j][e], __fmul_rn(values, pair));
                            }
                        }
                }
            } else {
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int j = 0; j < NI; ++j) mma_s8(acc[i][j], af[i], bf[j], acc[i][j]);
            }
        }
        if (SAT == 4 && COUNT) {
            saturated += (clamped2 & 0xffffu) + (clamped2 >> 16);
            clamped2 = 0u;
        }
        if (OUT != 3 || kt + 1 < ktiles) {
            ++kt;
            continue;
        }
        // mode 3, the entry's last K step: add its scaled product to the total, start the next entry from 0
        if (SAT >= 5) {
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        facc[i][j][e] = __fadd_rn(facc[i][j][e], __fmul_rn(fsum[i][j][e], block_inv));
                        fsum[i][j][e] = 0.0f;
                    }
            kt = 0;
            ++entry;
            continue;
        }
        finish_entry<MI, NI, SAT, COUNT>(acc, tacc, packed, limit, ktiles * (BK / 32), saturated);
        const float* sae = sa + (i64)entry * sa_batch;
        const float* sbe = sb + (i64)entry * sb_batch;
        const bool uniform = sa_row == 0 && sb_col == 0;  // one scale for the entry (per sample or tensor)
        const float entry_scale = uniform ? scale_of(sae[0], sbe[0], block_inv) : 0.0f;
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = out_row(i, half);
                const float row_scale = !uniform && r < M ? sae[(i64)r * sa_row] : 0.0f;
#pragma unroll
                for (int j = 0; j < NI; ++j)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int col = out_col(j) + c;
                        int& v = acc[i][j][2 * half + c];
                        if (r < M && col < N) {
                            const float s =
                                uniform ? entry_scale : scale_of(row_scale, sbe[(i64)col * sb_col], block_inv);
                            float& f = facc[i][j][2 * half + c];
                            f = __fadd_rn(f, __fmul_rn(__int2float_rn(v), s));
                        }
                        v = 0;
                    }
            }
        kt = 0;
        ++entry;
    }
    cp_async_wait<0>();
    if (OUT != 3) finish_entry<MI, NI, SAT, COUNT>(acc, tacc, packed, limit, ktiles * (BK / 32), saturated);

    // Elements outside M x N hold 0 (zero-filled operands): they are never saturated, so the count is exact.
    if (COUNT) {
        u32 s = saturated;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0 && s != 0u) atomicAdd(count, (u64)s);
    }
    if (seen != nullptr && threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0)
        atomicAdd(seen, sums);

    const bool pairs = (N % 2) == 0;
#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = out_row(i, half);
            if (r >= M) continue;
            const float row_scale = OUT == 2 ? sa[(i64)batch * sa_batch + (i64)r * sa_row] : 1.0f;
            const i64 row_off = ((i64)batch * M + r) * N;
#pragma unroll
            for (int j = 0; j < NI; ++j) {
                const int col = out_col(j);
                if (col >= N) continue;
                const int v0 = acc[i][j][2 * half], v1 = acc[i][j][2 * half + 1];
                if (OUT == 0) {
                    store_pair(reinterpret_cast<int*>(out) + row_off + col, v0, v1, pairs, col + 1 < N);
                    continue;
                }
                float f0 = __int2float_rn(v0), f1 = __int2float_rn(v1);
                if (OUT == 2) {
                    const float* sbp = sb + (i64)batch * sb_batch;
                    f0 = __fmul_rn(f0, scale_of(row_scale, sbp[(i64)col * sb_col], block_inv));
                    if (col + 1 < N)
                        f1 = __fmul_rn(f1, scale_of(row_scale, sbp[(i64)(col + 1) * sb_col], block_inv));
                } else if (OUT == 3) {
                    f0 = facc[i][j][2 * half];
                    f1 = facc[i][j][2 * half + 1];
                } else if (SAT >= 5) {
                    f0 = __fmul_rn(fsum[i][j][2 * half], block_inv);
                    f1 = __fmul_rn(fsum[i][j][2 * half + 1], block_inv);
                }
                store_pair(reinterpret_cast<float*>(out) + row_off + col, f0, f1, pairs, col + 1 < N);
            }
        }
    }
}
