// What the .cu sources of this folder share (NVRTC compiles each with this header, hdqt_cil/kernels/_runtime.py).

typedef unsigned int u32;
typedef unsigned long long u64;

// D = A * B + C for one warp: m16n8k32, int8 operands (row-major A, column-major B), int32 accumulators.
__device__ __forceinline__ void mma_s8(int d[4], const u32 a[4], const u32 b[2], const int c[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(c[0]), "r"(c[1]), "r"(c[2]),
          "r"(c[3]));
}
