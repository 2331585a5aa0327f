// The routed experts of a batched decode step (5 to 16 tokens) on tensor
// cores: `moe_up_mt` (gate and up, then SwiGLU) and `moe_down_mt`, the
// fast path of SPEC §6 (`--exact` keeps moe_up_routed / moe_down_combine
// and moe_up / moe_down, whose f32 sums were 4.6 ms of a 7.8 ms step of
// 8 sequences on the H100).
//
// A block takes 16-row tiles of one expert (moe_up_mt: MM_UP_RT of gate
// and the same rows of up; moe_down_mt: MM_DOWN_RT of down) for up to 8
// of the expert's pairs at once (an mma's 8 columns), with matvec_tc's
// arithmetic (kernels/matvec_tc.cu: levels straight into the A
// fragments, the scale and bias applied in f32 per group), on vectors
// split into f16 parts hi + lo beforehand (`to_half`, once per token and
// once per pair: the split in every warp took a third of the
// instructions). Its few warps (MM_UP_KS, MM_DOWN_KS) split the rows'
// quantization groups (warp w: groups w, w + KS, ...), holding little at
// a time (mm_rows) so that 24 warps fit on an SM, and warp 0 adds their
// sums in warp order. These kernels are bound by latency: with 8 warps a
// block and 128 registers a thread (16 warps an SM) they took 42–46 and
// 30 µs a layer of 8 tokens on the H200, and a warp over whole rows at
// 12 warps an SM 68 µs for gate and up (BENCHMARKS "Batched decode's
// expert kernels with fewer registers"). Nothing in a sum's order
// depends on the launch (the warps of a block are fixed per kernel), and
// a column's sums depend on that column alone: a pair gets the same bits
// whether its expert's pairs come as one group (the host's groups:
// streamed experts) or one by one (the resident table: each pair its own
// group), so hits, misses and resident experts agree bit for bit.

#define MM_UP_RT 1    // 16-row tiles of gate and of up a warp of moe_up_mt takes (`UP_TILES` in cuda/moe_mt.rs)
#define MM_DOWN_RT 2  // 16-row tiles of down a warp of moe_down_mt takes (`DOWN_TILES`)
#define MM_UP_KS 4    // warps of a moe_up_mt block, sharing its rows' groups (`UP_WARPS` in cuda/moe_mt.rs)
#define MM_DOWN_KS 2  // warps of a moe_down_mt block (`DOWN_WARPS`)
#define MM_KS 4       // the most of the two
#define MM_BLOCKS 6   // blocks of MM_KS warps an SM holds at most (launch bounds)

// Where the pairs' experts are. With `table` (every expert resident),
// group g is pair g, its expert at table[ids[g]]; else the host's groups:
// expert ptr[g], pairs pairs[start[g] .. start[g] + count[g]].
struct MtGroups {
    const u64* ptr;
    const int* start;
    const int* count;
    const int* pairs;
    const u64* table;
    const u32* ids;
};

__device__ __forceinline__ Group mm_group(const MtGroups& G, int g) {
    Group r;
    if (G.table) {
        r.base = (const char*)G.table[G.ids[g]];
        r.start = g;
        r.count = 1;
    } else {
        r = moe_group(g, G.ptr, G.start, G.count);
    }
    return r;
}

// The pair of a group's i-th column.
__device__ __forceinline__ int mm_pair(const MtGroups& G, const Group& g, int i) {
    return G.table ? g.start + i : G.pairs[g.start + i];
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

// PAIRS words of f16 pairs from p (aligned to their size).
template <int PAIRS>
__device__ __forceinline__ void mm_half(const u16* p, u32 (&w)[PAIRS]) {
    if constexpr (PAIRS == 2) {
        const uint2 v = __ldg((const uint2*)p);
        w[0] = v.x;
        w[1] = v.y;
    } else {
#pragma unroll
        for (int i = 0; i < PAIRS; i += 4) {
            const uint4 v = __ldg((const uint4*)p + i / 4);
            w[i] = v.x;
            w[i + 1] = v.y;
            w[i + 2] = v.z;
            w[i + 3] = v.w;
        }
    }
}

// Rows [base, base + 16·tiles) of matrices M0 .. M0 + NM − 1 (0 gate, 1
// up, 2 down) of expert g.base times the vectors of the group's columns
// c0 .. c0 + 8, split in f16 parts (`to_half`, kernels/prep.cu: pair p's
// vector is row p / div of `in`; `cols` a whole number of quantization
// groups), over groups q0, q0 + qs, ...: acc[tile][matrix][j] of lane
// (r, c), j = 2·(row r + 8?) + (column 2c + 1?). The warp holds little
// at a time (a group's levels, one word's pairs and activations: 80
// registers a thread), so that many warps fit on an SM. A lane keeps one address per matrix and part (levels,
// scales, biases), at its row r of the first tile; the other rows are
// whole multiples of the row's length past it. The arithmetic is
// mt_group's (kernels/matvec_tc.cu), word by word.
template <int BITS, bool F16S, int L, int NM, int RT>
__device__ __forceinline__ void mm_rows(const ELayout& EL, const Group& g, const MtGroups& G, int c0, int m0,
                                        const HalfRows& in, int div, int cols, int base, int tiles, int q0,
                                        int qs, float (&acc)[RT][NM][4]) {
    const int EPW = 32 / BITS, HALF = 16 / BITS;
    const int Q = L * EPW, GS = 4 * Q;
    const int lane = threadIdx.x & 31, r = lane >> 2, c = lane & 3;
    const int rb = cols / EPW * 4;       // bytes of a row's levels
    const int ng = cols >> EL.gs_shift;  // groups of a row
    const char* wp[NM];
    const u16* sp[NM];
    const u16* bp[NM];
#pragma unroll
    for (int m = 0; m < NM; m++) {
        const i64 row = base + r;
        wp[m] = g.base + EL.off[3 * (m0 + m)] + row * rb + c * (4 * L);
        sp[m] = (const u16*)(g.base + EL.off[3 * (m0 + m) + 1]) + row * ng;
        bp[m] = (const u16*)(g.base + EL.off[3 * (m0 + m) + 2]) + row * ng;
#pragma unroll
        for (int mt = 0; mt < RT; mt++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[mt][m][k] = 0.0f;
    }
    // This lane's B operand: column r's row of the split vectors; its sums'
    // columns 2c and 2c + 1: their rows' 2^-e and group sums (a column past
    // the group's end multiplies zeros and adds nothing).
    const bool on = c0 + r < g.count;
    const i64 vr = on ? mm_pair(G, g, c0 + r) / div : 0;
    const u16* hi = in.hi + vr * cols + c * Q;
    const u16* lo = in.lo + vr * cols + c * Q;
    float inv[2];
    const float* gsum[2];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int col = c0 + 2 * c + j;
        const i64 row = col < g.count ? mm_pair(G, g, col) / div : -1;
        inv[j] = row < 0 ? 0.0f : in.inv[row];
        gsum[j] = row < 0 ? nullptr : in.sum + row * ng;
    }
    for (int q = q0; q < ng; q += qs) {
        // Group q's weights (levels, scales, biases).
        u32 wv[RT][NM][2][L];
        u16 sv[RT][NM][2], bv[RT][NM][2];
#pragma unroll
        for (int mt = 0; mt < RT; mt++)
            if (mt < tiles) {
#pragma unroll
                for (int m = 0; m < NM; m++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int dr = mt * 16 + 8 * h;  // rows past the lane's first
                        mt_words<L>(wp[m] + dr * rb + q * (GS / 8 * BITS), wv[mt][m][h]);
                        sv[mt][m][h] = __ldg(sp[m] + dr * ng + q);
                        bv[mt][m][h] = __ldg(bp[m] + dr * ng + q);
                    }
            }
        float sx[2];
#pragma unroll
        for (int j = 0; j < 2; j++) sx[j] = gsum[j] ? __ldg(gsum[j] + q) * inv[j] : 0.0f;
        // Σq·(hi + lo) of each tile, word by word: word j's HALF pairs of
        // levels against the same pairs of activations (mt_group's k-steps
        // in its order).
        float d[RT][NM][4];
#pragma unroll
        for (int j = 0; j < L; j++) {
            u32 bh[HALF], bl[HALF];
            if (on) {
                mm_half<HALF>(hi + q * GS + j * 2 * HALF, bh);
                mm_half<HALF>(lo + q * GS + j * 2 * HALF, bl);
            } else {
#pragma unroll
                for (int p = 0; p < HALF; p++) bh[p] = bl[p] = 0u;
            }
#pragma unroll
            for (int mt = 0; mt < RT; mt++)
                if (mt < tiles) {
#pragma unroll
                    for (int m = 0; m < NM; m++) {
                        u32 p0[HALF], p1[HALF];
                        mt_pairs<BITS>(wv[mt][m][0][j], p0);
                        mt_pairs<BITS>(wv[mt][m][1][j], p1);
#pragma unroll
                        for (int i = 0; i < HALF / 2; i++) {
                            const u32 a[4] = {p0[2 * i], p1[2 * i], p0[2 * i + 1], p1[2 * i + 1]};
                            if (j == 0 && i == 0)
                                mma16816z(d[mt][m], a, bh[2 * i], bh[2 * i + 1]);
                            else
                                mma16816(d[mt][m], a, bh[2 * i], bh[2 * i + 1]);
                            mma16816(d[mt][m], a, bl[2 * i], bl[2 * i + 1]);
                        }
                    }
                }
        }
#pragma unroll
        for (int mt = 0; mt < RT; mt++)
            if (mt < tiles) {
#pragma unroll
                for (int m = 0; m < NM; m++) {
                    float sc[2], bi[2];
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        sc[h] = F16S ? f16f(sv[mt][m][h]) : bf16f(sv[mt][m][h]);
                        bi[h] = F16S ? f16f(bv[mt][m][h]) : bf16f(bv[mt][m][h]);
                    }
                    float* a = acc[mt][m];
                    const float* e = d[mt][m];
                    a[0] = fmaf(sc[0], e[0] * inv[0], fmaf(bi[0], sx[0], a[0]));
                    a[1] = fmaf(sc[0], e[1] * inv[1], fmaf(bi[0], sx[1], a[1]));
                    a[2] = fmaf(sc[1], e[2] * inv[0], fmaf(bi[1], sx[0], a[2]));
                    a[3] = fmaf(sc[1], e[3] * inv[1], fmaf(bi[1], sx[1], a[3]));
                }
            }
    }
}

// The row and column (0 .. 7) of sum j of lane (r, c) of a tile.
__device__ __forceinline__ int mm_row(int j) { return ((threadIdx.x & 31) >> 2) + 8 * (j >> 1); }
__device__ __forceinline__ int mm_col(int j) { return 2 * (threadIdx.x & 3) + (j & 1); }

// The warps' sums of a block before they are added: [warp][lane][sum].
typedef float MmRed[MM_KS][32][8];

// Warp 0's acc plus the other warps' (through red), in warp order; every
// warp of the block calls it, warp 0 ends with the block's sums.
template <int RT, int NM>
__device__ __forceinline__ void mm_add_warps(float (&acc)[RT][NM][4], MmRed& red) {
    static_assert(RT * NM * 4 <= 8, "MmRed holds 8 sums a lane");
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, ks = blockDim.x >> 5;
    if (w > 0) {
#pragma unroll
        for (int mt = 0; mt < RT; mt++)
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int j = 0; j < 4; j++) red[w][lane][(mt * NM + m) * 4 + j] = acc[mt][m][j];
    }
    __syncthreads();
    if (w == 0) {
        for (int v = 1; v < ks; v++) {
#pragma unroll
            for (int mt = 0; mt < RT; mt++)
#pragma unroll
                for (int m = 0; m < NM; m++)
#pragma unroll
                    for (int j = 0; j < 4; j++) acc[mt][m][j] += red[v][lane][(mt * NM + m) * 4 + j];
        }
    }
    __syncthreads();
}

// Warp 0 writes a block's sums (after mm_add_warps): value(mt, j) of
// tile mt's accumulator j goes to out[pair of column c0 + mm_col(j)]
// [base + 16·mt + mm_row(j)] (rows of `width`), for the tiles and columns
// that exist.
template <int RT, typename V>
__device__ __forceinline__ void mm_store(const MtGroups& G, const Group& g, int c0, int base, int tiles, float* out,
                                         int width, V value) {
    if (threadIdx.x >= 32) return;
#pragma unroll
    for (int mt = 0; mt < RT; mt++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int row = base + mt * 16 + mm_row(j), col = c0 + mm_col(j);
            if (mt < tiles && col < g.count) out[(i64)mm_pair(G, g, col) * width + row] = value(mt, j);
        }
}

// h[p, inter] = silu(x_t·gateᵀ) ⊙ (x_t·upᵀ) for every pair p = t·k + j
// of the groups. Grid (inter / (16·MM_UP_RT), groups), MM_UP_KS warps:
// block (bx, g) takes MM_UP_RT tiles of 16 rows of gate and of up at rows
// bx·16·MM_UP_RT, warp w the quantization groups w, w + MM_UP_KS, ...
template <int BITS, bool F16S, int L>
__device__ __forceinline__ void moe_up_mt_t(const ELayout& EL, const HalfRows& x, float* h, const MtGroups& G, int k,
                                            int hidden, int inter, MmRed& red) {
    const int base = blockIdx.x * 16 * MM_UP_RT;
    const int tiles = min(MM_UP_RT, (inter - base) >> 4);
    const Group g = mm_group(G, blockIdx.y);
    for (int c0 = 0; c0 < g.count; c0 += 8) {
        float acc[MM_UP_RT][2][4];
        mm_rows<BITS, F16S, L, 2, MM_UP_RT>(EL, g, G, c0, 0, x, k, hidden, base, tiles, threadIdx.x >> 5,
                                            blockDim.x >> 5, acc);
        mm_add_warps(acc, red);
        mm_store<MM_UP_RT>(G, g, c0, base, tiles, h, inter,
                           [&](int mt, int j) { return silu_f(acc[mt][0][j]) * acc[mt][1][j]; });
    }
}

// d[p, hidden] = h_p·downᵀ for every pair p of the groups. Grid
// (hidden / (16·MM_DOWN_RT), groups), MM_DOWN_KS warps sharing the
// groups as moe_up_mt's.
template <int BITS, bool F16S, int L>
__device__ __forceinline__ void moe_down_mt_t(const ELayout& EL, const HalfRows& h, float* d, const MtGroups& G,
                                              int hidden, int inter, MmRed& red) {
    const int base = blockIdx.x * 16 * MM_DOWN_RT;
    const int tiles = min(MM_DOWN_RT, (hidden - base) >> 4);
    const Group g = mm_group(G, blockIdx.y);
    for (int c0 = 0; c0 < g.count; c0 += 8) {
        float acc[MM_DOWN_RT][1][4];
        mm_rows<BITS, F16S, L, 1, MM_DOWN_RT>(EL, g, G, c0, 2, h, 1, inter, base, tiles, threadIdx.x >> 5,
                                              blockDim.x >> 5, acc);
        mm_add_warps(acc, red);
        mm_store<MM_DOWN_RT>(G, g, c0, base, tiles, d, hidden, [&](int mt, int j) { return acc[mt][0][j]; });
    }
}

#endif

#if FMT_GROUP_ON(FG_MOE_UP_ROUTED)
template <int FMT, bool F16S>
__device__ __forceinline__ void moe_up_mt_fmt(const ELayout& EL, const HalfRows& x, float* h, const MtGroups& G, int k,
                                              int hidden, int inter) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (Fmt<FMT>::BITS != 0) {
        const int BITS = Fmt<FMT>::BITS;
        __shared__ MmRed red;
        MT_WORDS(BITS, EL.gs_shift, (moe_up_mt_t<BITS, F16S, L>(EL, x, h, G, k, hidden, inter, red)));
    }
#endif
}

extern "C" __global__ void __launch_bounds__(32 * MM_KS, MM_BLOCKS) moe_up_mt(ELayout EL, HalfRows x, float* h,
                                                                          MtGroups G, int k, int hidden, int inter) {
    GRID_DEP();
    FOR_FMT(EL.fmt, (moe_up_mt_fmt<F, S>(EL, x, h, G, k, hidden, inter)));
}
#endif

#if FMT_GROUP_ON(FG_MOE_DOWN_COMBINE)
template <int FMT, bool F16S>
__device__ __forceinline__ void moe_down_mt_fmt(const ELayout& EL, const HalfRows& h, float* d, const MtGroups& G,
                                                int hidden, int inter) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (Fmt<FMT>::BITS != 0) {
        const int BITS = Fmt<FMT>::BITS;
        __shared__ MmRed red;
        MT_WORDS(BITS, EL.gs_shift, (moe_down_mt_t<BITS, F16S, L>(EL, h, d, G, hidden, inter, red)));
    }
#endif
}

extern "C" __global__ void __launch_bounds__(32 * MM_KS, MM_BLOCKS) moe_down_mt(ELayout EL, HalfRows h, float* d,
                                                                            MtGroups G, int hidden, int inter) {
    GRID_DEP();
    FOR_FMT(EL.fmt, (moe_down_mt_fmt<F, S>(EL, h, d, G, hidden, inter)));
}
#endif
