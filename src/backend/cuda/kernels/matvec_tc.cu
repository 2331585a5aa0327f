// Quantized dense matrices for 2 to 8 tokens (batched decode steps) on
// tensor cores: `matvec_tc` (the fast path, SPEC §6; `--exact` keeps
// matvec_qt).
//
// A warp multiplies up to MT_RT tiles of 16 weight rows by the 8 tokens of
// an mma.sync m16n8k16 (tokens past n are zeros), one quantization group
// at a time; the nw warps of a block share the block's rows, warp w
// taking groups w, w + nw, ..., and their sums are added in warp order (a
// token's result does not depend on the tokens beside it; the launch's
// nw follows from its matrices alone). Each warp's groups strided over
// the row (not a contiguous run: 1026-1028 tok/s against 1044 at 8
// streams, BENCHMARKS.md).
//
// A block first copies its tiles' weights whole into shared memory by
// cp.async (levels, scales, biases; issued before the wait on the kernel
// before), then in a group lane (r = lane/4, c = lane%4) reads the c-th
// quarter of rows r and r + 8 of each tile (L words) from there into the
// A fragments. (Loaded from global memory one group at a time, each warp
// waited on every group: 8 streams 1054-1066 tok/s against 1111-1132
// so, BENCHMARKS.md.) The 16 columns of a
// k-step are two pairs of levels from each of the four quarters: the sum
// over a group's columns takes any order, as long as the activations take
// the same one. Lane (t = lane/4, c) builds the same quarter of token t's
// activations as f16 parts, v·2^e = hi + lo, e per token and group (the
// group's largest magnitude below 2^14, as `to_half` does per row); both
// parts are multiplied, so nothing is rounded further than f32 does. Levels
// are exact in f16. Per row, token and group: y += s·2^-e·Σq·(hi + lo) +
// b·Σv, in f32.

#define MT_RT 4  // most 16-row tiles per warp (the launch's `rt`: 1, 2 or 4)
// Slots of the warps' sums: warps × rows of a block (8 × 64 or 16 × 32).
#define MT_SLOTS 512

// The warps' sums before they are added: [warp · rows of the block + row]
// [token], rows padded to 9 tokens.
typedef float MtRed[MT_SLOTS][9];

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

// L consecutive words of packed weights (L·4 bytes, aligned to that), from
// global memory (read-only path) or, with SH, from shared memory.
template <int L, bool SH = false>
__device__ __forceinline__ void mt_words(const char* p, u32 (&w)[L]) {
    if constexpr (L == 1) {
        w[0] = SH ? *(const u32*)p : __ldg((const u32*)p);
    } else if constexpr (L == 2) {
        const uint2 v = SH ? *(const uint2*)p : __ldg((const uint2*)p);
        w[0] = v.x;
        w[1] = v.y;
    } else {
        const uint4 v = SH ? *(const uint4*)p : __ldg((const uint4*)p);
        w[0] = v.x;
        w[1] = v.y;
        w[2] = v.z;
        w[3] = v.w;
    }
}

// The HALF = 16/BITS pairs of a word: pair i holds levels i (low half)
// and i + HALF (high half) as exact f16, built as 1024 + q (or 1024 + 16q
// for 4-bit levels in the high nibble of a byte) in f16 by one lop3, less
// 1024 (scaled by 1/16).
template <int BITS>
__device__ __forceinline__ void mt_pairs(u32 w, u32 (&p)[16 / BITS]) {
    const u32 MAGIC = 0x64006400u;  // 1024 in each half
    if constexpr (BITS == 4) {
        const u32 MUL = 0x2c002c00u;  // 1/16 in each half
        const u32 SUB = 0xd400d400u;  // −64 in each half
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const u32 v = h ? w >> 8 : w;
            u32 lo, hi;
            asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(lo) : "r"(v), "r"(0x000f000fu), "r"(MAGIC));
            asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(hi) : "r"(v), "r"(0x00f000f0u), "r"(MAGIC));
            asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(p[2 * h]) : "r"(lo), "r"(MAGIC));
            asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(p[2 * h + 1]) : "r"(hi), "r"(MUL), "r"(SUB));
        }
    } else {
        const u32 M = ((1u << BITS) - 1) * 0x10001u;
#pragma unroll
        for (int i = 0; i < 16 / BITS; i++) {
            const u32 v = ((w >> (BITS * i)) & M) | MAGIC;
            asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(p[i]) : "r"(v), "r"(MAGIC));
        }
    }
}

// Q floats of a vector from p (16-byte aligned): v = x, or silu(x) ⊙ u
// with u at the same offset when `u` is not null; zeros for a null p.
template <int Q>
__device__ __forceinline__ void mt_load(const float* p, const float* u, float (&f)[Q]) {
    if (!p) {
#pragma unroll
        for (int j = 0; j < Q; j++) f[j] = 0.0f;
        return;
    }
#pragma unroll
    for (int j = 0; j < Q; j += 4) {
        const float4 v = __ldg((const float4*)(p + j));
        f[j] = v.x;
        f[j + 1] = v.y;
        f[j + 2] = v.z;
        f[j + 3] = v.w;
    }
    if (u) {
#pragma unroll
        for (int j = 0; j < Q; j += 4) {
            const float4 v = __ldg((const float4*)(u + j));
            f[j] = silu_f(f[j]) * v.x;
            f[j + 1] = silu_f(f[j + 1]) * v.y;
            f[j + 2] = silu_f(f[j + 2]) * v.z;
            f[j + 3] = silu_f(f[j + 3]) * v.w;
        }
    }
}

// Token r's group, of which lane (r, c) holds quarter c (f: words of HALF
// pairs of levels, EPW = 2·HALF columns each), as the f16 parts of
// v·2^e = hi + lo in the order the mma B fragments take them (e: the
// group's largest magnitude below 2^14); and for this lane's columns
// (tokens 2c and 2c + 1, from lanes 8c and 8c + 4), 2^-e and Σv (the four
// quarters added by the same butterfly in every lane).
template <int Q, int HALF>
__device__ __forceinline__ void mt_split(const float (&f)[Q], u32 (&bh)[Q / 2], u32 (&bl)[Q / 2], float (&inv)[2],
                                         float (&sx)[2]) {
    const int EPW = 2 * HALF;
    const int c = threadIdx.x & 3;
    float mx = 0.0f, sum = 0.0f;
#pragma unroll
    for (int j = 0; j < Q; j++) {
        mx = fmaxf(mx, fabsf(f[j]));
        sum += f[j];
    }
    mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
    sum += __shfl_xor_sync(FULL_MASK, sum, 1);
    sum += __shfl_xor_sync(FULL_MASK, sum, 2);
    int e = 0;
    if (mx > 0.0f && mx <= 3.0e38f) {
        const int ex = (int)((__float_as_uint(mx) >> 23) & 0xffu) - 126;  // mx < 2^ex
        e = min(14 - ex, 126);
    }
    const float sc_e = __uint_as_float((u32)(e + 127) << 23);
    const float ie = __uint_as_float((u32)(127 - e) << 23);
#pragma unroll
    for (int p = 0; p < Q / 2; p++) {
        const float a = f[(p / HALF) * EPW + p % HALF] * sc_e;
        const float b = f[(p / HALF) * EPW + p % HALF + HALF] * sc_e;
        split_f16x2(a, b, bh[p], bl[p]);
    }
    inv[0] = __shfl_sync(FULL_MASK, ie, 8 * c);
    inv[1] = __shfl_sync(FULL_MASK, ie, 8 * c + 4);
    sx[0] = __shfl_sync(FULL_MASK, sum, 8 * c);
    sx[1] = __shfl_sync(FULL_MASK, sum, 8 * c + 4);
}

// One tile's group: acc += s·2^-e·Σq·(hi + lo) + b·Σv for this lane's
// rows (r, r + 8: weight words w[0], w[1]; scales sc, biases bi) and
// columns (2c, 2c + 1), the tile's levels through the tensor cores.
template <int BITS, int L>
__device__ __forceinline__ void mt_group(const u32 (&w)[2][L], const float (&sc)[2], const float (&bi)[2],
                                         const u32 (&bh)[2 * L * (8 / BITS)], const u32 (&bl)[2 * L * (8 / BITS)],
                                         const float (&inv)[2], const float (&sx)[2], float (&acc)[4]) {
    const int HALF = 16 / BITS;
    const int PAIRS = L * HALF;
    u32 pr[2][PAIRS];
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int j = 0; j < L; j++) {
            u32 pj[HALF];
            mt_pairs<BITS>(w[h][j], pj);
#pragma unroll
            for (int i = 0; i < HALF; i++) pr[h][j * HALF + i] = pj[i];
        }
    float d[4];
#pragma unroll
    for (int ks = 0; ks < PAIRS / 2; ks++) {
        u32 a[4];
        a[0] = pr[0][2 * ks];
        a[1] = pr[1][2 * ks];
        a[2] = pr[0][2 * ks + 1];
        a[3] = pr[1][2 * ks + 1];
        if (ks == 0)
            mma16816z(d, a, bh[0], bh[1]);
        else
            mma16816(d, a, bh[2 * ks], bh[2 * ks + 1]);
        mma16816(d, a, bl[2 * ks], bl[2 * ks + 1]);
    }
    acc[0] = fmaf(sc[0], d[0] * inv[0], fmaf(bi[0], sx[0], acc[0]));
    acc[1] = fmaf(sc[0], d[1] * inv[1], fmaf(bi[0], sx[1], acc[1]));
    acc[2] = fmaf(sc[1], d[2] * inv[0], fmaf(bi[1], sx[0], acc[2]));
    acc[3] = fmaf(sc[1], d[3] * inv[1], fmaf(bi[1], sx[1], acc[3]));
}

// Shared-memory bytes a staged row's levels take: the row's bytes rounded
// up to 128, plus 16·L, so that the 8 rows a fragment's lanes read at once
// fall on distinct banks (`smem` in cuda/matvec_tc.rs).
__device__ __forceinline__ int mt_stride(int rb, int L) { return ((rb + 127) & ~127) + 16 * L; }

// Copies rows [base, base + R) of m (levels, scales, biases) into shared
// memory by cp.async, without waiting: levels at sm + row·RB (rows past
// the end repeat the last row), then the valid rows' scales and biases as
// [R][groups] u16 each (one flat range of the matrix each: 16-byte copies,
// the last few bytes by plain loads).
template <int L>
__device__ __forceinline__ void mt_stage(const Mat& m, int base, int R, int rb, int RB, int groups, char* sm) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const u32 s0 = smem_addr(sm);
    for (int rr = wid; rr < R; rr += nw) {
        const int ri = min(base + rr, m.rows - 1);
        const char* src = (const char*)m.w + (i64)ri * rb;
        const u32 dst = s0 + rr * RB;
        for (int ch = lane; ch < (rb >> 4); ch += 32) cp_async16s(dst + ch * 16, src + ch * 16);
    }
    const int bytes = min(R, m.rows - base) * groups * 2;
    const i64 off = (i64)base * groups * 2;
    const char* sg = (const char*)m.s + off;
    const char* bg = (const char*)m.b + off;
    const u32 ss = s0 + R * RB, sb = ss + R * groups * 2;
    for (int i = threadIdx.x; i < (bytes >> 4); i += blockDim.x) {
        cp_async16s(ss + i * 16, sg + i * 16);
        cp_async16s(sb + i * 16, bg + i * 16);
    }
    u16* sh = (u16*)(sm + R * RB);
    for (int i = (bytes & ~15) / 2 + threadIdx.x; i < bytes / 2; i += blockDim.x) {
        sh[i] = ((const u16*)sg)[i];
        sh[R * groups + i] = ((const u16*)bg)[i];
    }
}

// y[t0 .. t0 + n)[rows of m] for the block `blk` of the `nblk` that share
// m: see the top of this file. Each tile of rt·16 rows is first copied
// whole into shared memory (sm, mt_stage; the first before the wait on
// the kernel before, weights being written only at load), then read from
// there: every load of the block in flight at once, and with programmatic
// launches while the kernel before ends, instead of one group of a warp at
// a time. v_t = x_t, or silu(x_t) ⊙ u_t when `u` is not null. L: words of
// a row's quarter group (gs·BITS/128).
template <int BITS, bool F16S, int L>
__device__ __forceinline__ void matvec_tc_t(const Mat& m, const float* x, const float* u, float* y, int blk,
                                            int nblk, int rt, int n, MtRed& red, char* sm) {
    const int EPW = 32 / BITS;     // levels per word
    const int HALF = EPW / 2;      // pairs per word
    const int PAIRS = L * HALF;    // pairs of a quarter
    const int Q = L * EPW;         // columns of a quarter
    const int GS = 4 * Q;          // columns of a group
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int r = lane >> 2, c = lane & 3;
    const int groups = m.cols / GS;
    const int rb = m.cols / EPW * 4;  // bytes of a row's levels
    const int RB = mt_stride(rb, L);
    const int R = rt * 16;
    const u16* ss = (const u16*)(sm + R * RB);  // [R][groups] scales, then biases
    const u16* sb = ss + R * groups;
    for (int base = blk * R; base < m.rows; base += nblk * R) {
        const bool first = base == blk * R;
        if (!first) __syncthreads();  // every warp is done with the tile before
        mt_stage<L>(m, base, R, rb, RB, groups, sm);
        asm volatile("cp.async.commit_group;" ::: "memory");
        if (first) GRID_DEP();
        float acc[MT_RT][4];
#pragma unroll
        for (int mt = 0; mt < MT_RT; mt++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[mt][k] = 0.0f;
        cp_async_wait();
        __syncthreads();
        for (int g = wid; g < groups; g += nw) {
            // This lane's quarter of token r's vector in this group.
            float f[Q];
            const i64 off = (i64)r * m.cols + g * GS + c * Q;
            mt_load<Q>(r < n ? x + off : nullptr, u ? u + off : nullptr, f);
            u32 bh[PAIRS], bl[PAIRS];
            float inv[2], sx[2];
            mt_split<Q, HALF>(f, bh, bl, inv, sx);
#pragma unroll
            for (int mt = 0; mt < MT_RT; mt++) {
                if (mt < rt) {
                    u32 wv[2][L];
                    float sc[2], bi[2];
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int row = mt * 16 + r + 8 * h;
                        mt_words<L, true>(sm + row * RB + g * (GS / 8 * BITS) + c * (4 * L), wv[h]);
                        sc[h] = scale_of(ss + row * groups, g, F16S);
                        bi[h] = scale_of(sb + row * groups, g, F16S);
                    }
                    mt_group<BITS, L>(wv, sc, bi, bh, bl, inv, sx, acc[mt]);
                }
            }
        }
        // The warps' sums of each (row, token), added in warp order.
#pragma unroll
        for (int mt = 0; mt < MT_RT; mt++) {
            if (mt < rt) {
                const int q = (wid * rt + mt) * 16 + r;
                red[q][2 * c] = acc[mt][0];
                red[q][2 * c + 1] = acc[mt][1];
                red[q + 8][2 * c] = acc[mt][2];
                red[q + 8][2 * c + 1] = acc[mt][3];
            }
        }
        __syncthreads();
        for (int o = threadIdx.x; o < n * R; o += blockDim.x) {
            const int t = o / R, row = o - t * R;
            if (base + row < m.rows) {
                float s = red[row][t];
                for (int w = 1; w < nw; w++) s += red[w * R + row][t];
                y[(i64)t * m.rows + base + row] = s;
            }
        }
    }
}

#endif

// Runs CALL with L, the words of a quarter of a quantization group
// (gs·BITS/128), where that is 1, 2 or 4; else nothing.
#define MT_WORDS(BITS, gs_shift, CALL)                                  \
    switch ((gs_shift) + ((BITS) == 2 ? 1 : (BITS) == 4 ? 2 : 3) - 7) { \
        case 0: { const int L = 1; CALL; } break;                       \
        case 1: { const int L = 2; CALL; } break;                       \
        case 2: { const int L = 4; CALL; } break;                       \
        default: break;                                                 \
    }

#if FMT_GROUP_ON(FG_MATVEC_Q)
// ys[i][n, rows_i] = v[n, cols]·W_iᵀ for the matrices of `s` (all of this
// module's format, each row's quarter group a whole 1, 2 or 4 words), v =
// x or silu(x) ⊙ u, 2 ≤ n ≤ 8: grid first[count] blocks of nw warps
// (nw·rt·16 ≤ MT_SLOTS), each block `rt` tiles of 16 rows at a time (rows
// stride over the matrix's blocks), with their weights in the dynamic
// shared memory `smem` of cuda/matvec_tc.rs sets.
template <int FMT, bool F16S>
__device__ __forceinline__ void matvec_tc_fmt(const MatSet& s, const float* x, const float* u, int n, int rt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (Fmt<FMT>::BITS != 0) {
        const int BITS = Fmt<FMT>::BITS;
        __shared__ MtRed red;
        extern __shared__ __align__(16) char mt_sm[];
        Mat m;
        float* y;
        int blk, nblk;
        set_pick(s, blockIdx.x, m, y, blk, nblk);
        MT_WORDS(BITS, m.gs_shift, (matvec_tc_t<BITS, F16S, L>(m, x, u, y, blk, nblk, rt, n, red, mt_sm)));
    }
#endif
}

extern "C" __global__ void __launch_bounds__(512) matvec_tc(MatSet s, const float* x, const float* u,
                                                                        int n, int rt) {
    FOR_FMT(s.m[0].fmt, (matvec_tc_fmt<F, S>(s, x, u, n, rt)));
}
#endif
