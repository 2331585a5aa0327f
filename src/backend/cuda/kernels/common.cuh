// Types and helpers shared by every kernel. The kernels are compiled by
// NVRTC at run time without any system header, so everything they use
// beyond the CUDA built-ins is defined here.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;
typedef long long i64;

#define FULL_MASK 0xffffffffu

// The first statement of every kernel. With programmatic dependent launch
// (compute capability 9.0+, cuda/driver.rs) a kernel may start while the
// one before it on the stream is finishing: wait here until that one is
// complete and its writes visible, then let the next kernel launch early
// in turn. Nothing may touch global memory before this line, except to
// read weights (written once, at load, before any kernel runs).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GRID_DEP() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define GRID_DEP()
#endif
#define NEG_INF (-__int_as_float(0x7f800000))
#define QNAN __int_as_float(0x7fc00000)

// A router score as selection ranks it: NaN as −∞, as the host router does
// (model/router.rs), so that a row of NaN still picks experts in range.
__device__ __forceinline__ float rank_key(float x) { return x != x ? NEG_INF : x; }

// A grid-stride loop: i over [0, len) across every thread of the grid.
#define GRID_LOOP(i, len) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (len); i += (i64)gridDim.x * blockDim.x)

__device__ __forceinline__ float bf16f(u16 h) { return __uint_as_float(((u32)h) << 16); }

__device__ __forceinline__ float f16f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Warp-wide argmax of (best, bi): the largest value, ties to the lower index.
__device__ __forceinline__ void warp_argmax(float& best, int& bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, best, o);
        const int oi = __shfl_xor_sync(FULL_MASK, bi, o);
        if (ov > best || (ov == best && oi < bi)) {
            best = ov;
            bi = oi;
        }
    }
}
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// The sum of `v` over the block (blockDim.x a multiple of 32, at most
// 1024); `sh` holds 32 floats. Every thread gets the total.
__device__ float block_sum(float v, float* sh) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (l == 0) sh[w] = v;
    __syncthreads();
    return warp_sum(l < nw ? sh[l] : 0.0f);
}

__device__ float block_max(float v, float* sh) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (l == 0) sh[w] = v;
    __syncthreads();
    return warp_max(l < nw ? sh[l] : NEG_INF);
}

// The shared-window address of a generic pointer into shared memory (a
// plain asm, so that the compiler may form it once and reuse it).
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

// *dst = *src, 16 (or 4) bytes from global to shared memory: from sm_80
// an asynchronous copy that holds no registers, complete after
// cp_async_wait; a plain copy before.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const u32 d = smem_addr(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
#else
    *(uint4*)dst = *(const uint4*)src;
#endif
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// cp_async16 to a shared-window address (smem_addr), for callers that form
// their addresses as 32-bit offsets.
__device__ __forceinline__ void cp_async16s(u32 d, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}

// cp.async of 4 bytes to a shared-window address.
__device__ __forceinline__ void cp_async4s(u32 d, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src) : "memory");
}

#endif

__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const u32 d = smem_addr(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src) : "memory");
#else
    *(u32*)dst = *(const u32*)src;
#endif
}

__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// Several sequences' parts of one pass (`Seqs` in cuda/mixers.rs): rows
// off[i] .. off[i] + n[i] of the pass at positions pos0[i] .. of sequence
// i, whose two state buffers are a[i] and b[i] (K and V caches, or the
// GatedDeltaNet conv and recurrent states). Rows in order, no gaps.
#define MAX_SEQS 16
struct Seqs {
    float* a[MAX_SEQS];
    float* b[MAX_SEQS];
    int off[MAX_SEQS];
    int n[MAX_SEQS];
    int pos0[MAX_SEQS];
    int count;
};

// The sequence holding row r, or -1.
__device__ __forceinline__ int seq_of(const Seqs& s, int r) {
    for (int i = 0; i < s.count; i++)
        if (r >= s.off[i] && r < s.off[i] + s.n[i]) return i;
    return -1;
}

// Kernel groups, for compiling the kernels as several modules
// (cuda/compile.rs): a module made with MOEFLUX_GROUP = g holds the
// kernels of group g alone; without it, every group. The format-dependent
// groups are compiled once per weight format (MOEFLUX_FMT, see FOR_FMT in
// matvec.cu); FG_BASE holds the kernels that need no format.
#define FG_MATVEC 0            // matvec, gemm, embed
#define FG_MOE_UP 1            // moe_up
#define FG_MOE_DOWN 2          // moe_down
#define FG_MOE_UP_ROUTED 3     // moe_up_routed, moe_up_mt
#define FG_MOE_DOWN_COMBINE 4  // moe_down_combine, moe_down_mt
#define FG_TC 5                // gemm_tc, moe_up_tc, moe_down_tc
#define FG_MATVEC_Q 6          // matvec_qt, matvec_tc
#define FG_BASE 7              // everything else
#define FG_ATTENTION 8         // the attention module (flash.cu; cuda/compile.rs)
#define FG_DELTA 9             // the chunked GatedDeltaNet module (delta_chunk.cu; cuda/compile.rs)
#ifndef MOEFLUX_GROUP
#define MOEFLUX_GROUP -1
#endif
#define FMT_GROUP_ON(g) (MOEFLUX_GROUP < 0 || MOEFLUX_GROUP == (g))

// Weight formats; kept in step with `Format` in cuda/matrix.rs.
#define FMT_F32 0
#define FMT_BF16 1
#define FMT_F16 2
#define FMT_Q2 3
#define FMT_Q4 4
#define FMT_Q8 5
// Added to a quantized format whose scales and biases are f16 (else bf16).
#define FMT_F16_SCALES 8

// A weight matrix `[rows, cols]` (one row per output). Quantized (MLX
// affine): `w` holds packed u32 words `[rows, cols·bits/32]`, lowest bits
// first, `s` and `b` the scales and biases `[rows, cols/group]`. Float:
// `w` holds `[rows, cols]` of the format's type. `vec`: every row starts
// 16-byte aligned and is a multiple of 16 bytes long.
struct Mat {
    u64 w, s, b;
    int rows, cols, fmt, gs_shift, vec;
    int split;  // matvec_q: warps that share each row group's columns (1, 2, 4, 8)
};

// One weight row, as the dot-product loops see it.
struct Row {
    const char* w;   // the row's weights
    const u16* s;    // its scales (quantized)
    const u16* b;    // its biases (quantized)
};

__device__ __forceinline__ int row_bytes(int fmt, int cols) {
    switch (fmt & 7) {
        case FMT_F32: return cols * 4;
        case FMT_BF16:
        case FMT_F16: return cols * 2;
        case FMT_Q2: return cols / 4;
        case FMT_Q4: return cols / 2;
        default: return cols;
    }
}

__device__ __forceinline__ Row mat_row(const Mat& m, int r) {
    Row row;
    const int groups = m.cols >> m.gs_shift;
    row.w = (const char*)m.w + (i64)r * row_bytes(m.fmt, m.cols);
    row.s = (const u16*)m.s + (i64)r * groups;
    row.b = (const u16*)m.b + (i64)r * groups;
    return row;
}

template <int FMT>
struct Fmt {
    // Bits of a quantized element (0: float).
    static const int BITS = FMT == FMT_Q2 ? 2 : FMT == FMT_Q4 ? 4 : FMT == FMT_Q8 ? 8 : 0;
};

__device__ __forceinline__ float scale_of(const u16* p, int g, bool f16s) {
    return f16s ? f16f(p[g]) : bf16f(p[g]);
}

// Quantized level `k` of a word as an exact float (0 ≤ q < 2^BITS).
template <int BITS>
__device__ __forceinline__ float level(u32 word, int k) {
    return __uint_as_float(0x4B000000u | ((word >> (BITS * k)) & ((1u << BITS) - 1))) - 8388608.0f;
}

// Element `c` of a row (any format, any alignment).
template <int FMT, bool F16S>
__device__ __forceinline__ float row_get(const Row& row, int c, int gs_shift) {
    if (FMT == FMT_F32) return ((const float*)row.w)[c];
    if (FMT == FMT_BF16) return bf16f(((const u16*)row.w)[c]);
    if (FMT == FMT_F16) return f16f(((const u16*)row.w)[c]);
    const int BITS = Fmt<FMT>::BITS;
    const int epw = 32 / BITS;
    const u32 word = ((const u32*)row.w)[c / epw];
    const u32 q = (word >> (BITS * (c % epw))) & ((1u << BITS) - 1);
    const int g = c >> gs_shift;
    return fmaf((float)q, scale_of(row.s, g, F16S), scale_of(row.b, g, F16S));
}
