// The routed experts of a batched decode step (5 to 16 tokens) on tensor
// cores: `moe_up_mt` (gate and up, then SwiGLU) and `moe_down_mt`, the
// fast path of SPEC §6 (`--exact` keeps moe_up_routed / moe_down_combine
// and moe_up / moe_down, whose f32 sums were 4.6 ms of a 7.8 ms step of
// 8 sequences on the H100).
//
// A block takes `rt` tiles of 16 rows of one expert (moe_up_mt: the same
// rows of gate and of up) for up to 8 of the expert's pairs at once (an
// mma's 8 columns), with matvec_tc's arithmetic (kernels/matvec_tc.cu:
// levels straight into the A fragments, the scale and bias applied in
// f32 per group), on vectors split into f16 parts hi + lo beforehand
// (`to_half`, once per token and once per pair: the split in every warp
// took a third of the instructions). Its MM_WARPS warps split a row's
// groups (warp w: groups w, w + MM_WARPS, ...), and their sums are added
// in warp order. Nothing in that order depends on the launch, and a
// column's sums depend on that column alone: a pair gets the same bits
// whether its expert's pairs come as one group (the host's groups:
// streamed experts) or one by one (the resident table: each pair its own
// group), so hits, misses and resident experts agree bit for bit.

#define MM_RT 4     // most 16-row tiles of a block (moe_up_mt: 2 of gate and 2 of up)
#define MM_WARPS 8  // warps of a block

// The warps' sums before they are added: [warp][row of the block ·
// matrices + matrix][column], 64 rows of one matrix or 32 of two.
typedef float MmRed[MM_WARPS][MM_RT * 16][9];

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

// Rows [base, base + 16·rt) of matrices M0 .. M0 + NM − 1 (0 gate, 1 up,
// 2 down) of expert g.base times the vectors of the group's columns
// c0 .. c0 + 8, split in f16 parts (`to_half`, kernels/prep.cu: pair p's
// vector is row p / div of `in`; `cols` a whole number of quantization
// groups, `rows` of 16-row tiles), this warp's share of the groups:
// red[warp][(tile row)·NM + matrix][column] (after a __syncthreads). A
// lane keeps one address per matrix and part (levels, scales, biases), at
// its row r of the first tile; the other rows are whole multiples of the
// row's length past it (161 registers a thread with an address per row:
// one block an SM). Loading the next group's weights while a group is
// multiplied took 128 registers and spilled (moe_up_mt 98 µs a layer of
// 8 tokens against 50).
template <int BITS, bool F16S, int L, int NM, int RT>
__device__ __forceinline__ void mm_tiles(const ELayout& EL, const Group& g, const MtGroups& G, int c0, int m0,
                                         const HalfRows& in, int div, int cols, int rows, int base, int rt,
                                         MmRed& red) {
    const int EPW = 32 / BITS, PAIRS = L * EPW / 2;
    const int Q = L * EPW, GS = 4 * Q;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, r = lane >> 2, c = lane & 3;
    const int tiles = min(rt, (rows - base) >> 4);
    const int rb = cols / EPW * 4;       // bytes of a row's levels
    const int ng = cols >> EL.gs_shift;  // groups of a row
    const char* wp[NM];
    const u16* sp[NM];
    const u16* bp[NM];
    float acc[RT][NM][4];
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
    for (int q = wid; q < ng; q += MM_WARPS) {
        u32 bh[PAIRS], bl[PAIRS];
        float sx[2];
        if (on) {
            mm_half<PAIRS>(hi + q * GS, bh);
            mm_half<PAIRS>(lo + q * GS, bl);
        } else {
#pragma unroll
            for (int p = 0; p < PAIRS; p++) bh[p] = bl[p] = 0u;
        }
#pragma unroll
        for (int j = 0; j < 2; j++) sx[j] = gsum[j] ? gsum[j][q] * inv[j] : 0.0f;
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
                    mt_group<BITS, L>(wv[mt][m], sc, bi, bh, bl, inv, sx, acc[mt][m]);
                }
            }
    }
#pragma unroll
    for (int mt = 0; mt < RT; mt++)
        if (mt < tiles) {
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    red[wid][(mt * 16 + r + 8 * (j >> 1)) * NM + m][2 * c + (j & 1)] = acc[mt][m][j];
        }
}

// The sum over the warps, in warp order, of red[·][i][col].
__device__ __forceinline__ float mm_sum(const MmRed& red, int i, int col) {
    float s = red[0][i][col];
#pragma unroll
    for (int w = 1; w < MM_WARPS; w++) s += red[w][i][col];
    return s;
}

// h[p, inter] = silu(x_t·gateᵀ) ⊙ (x_t·upᵀ) for every pair p = t·k + j
// of the groups. Grid (inter / (16·rt), groups), MM_WARPS warps.
template <int BITS, bool F16S, int L>
__device__ __forceinline__ void moe_up_mt_t(const ELayout& EL, const HalfRows& x, float* h, const MtGroups& G, int k,
                                            int hidden, int inter, int rt, MmRed& red) {
    const int base = blockIdx.x * rt * 16;
    const Group g = mm_group(G, blockIdx.y);
    for (int c0 = 0; c0 < g.count; c0 += 8) {
        mm_tiles<BITS, F16S, L, 2, MM_RT / 2>(EL, g, G, c0, 0, x, k, hidden, inter, base, rt, red);
        __syncthreads();
        for (int o = threadIdx.x; o < rt * 16 * 8; o += blockDim.x) {
            const int i = o >> 3, col = o & 7, row = base + i;
            if (c0 + col < g.count && row < inter)
                h[(i64)mm_pair(G, g, c0 + col) * inter + row] = silu_f(mm_sum(red, 2 * i, col)) * mm_sum(red, 2 * i + 1, col);
        }
        __syncthreads();
    }
}

// d[p, hidden] = h_p·downᵀ for every pair p of the groups. Grid
// (hidden / (16·rt), groups), MM_WARPS warps.
template <int BITS, bool F16S, int L>
__device__ __forceinline__ void moe_down_mt_t(const ELayout& EL, const HalfRows& h, float* d, const MtGroups& G,
                                              int hidden, int inter, int rt, MmRed& red) {
    const int base = blockIdx.x * rt * 16;
    const Group g = mm_group(G, blockIdx.y);
    for (int c0 = 0; c0 < g.count; c0 += 8) {
        mm_tiles<BITS, F16S, L, 1, MM_RT>(EL, g, G, c0, 2, h, 1, inter, hidden, base, rt, red);
        __syncthreads();
        for (int o = threadIdx.x; o < rt * 16 * 8; o += blockDim.x) {
            const int i = o >> 3, col = o & 7, row = base + i;
            if (c0 + col < g.count && row < hidden) d[(i64)mm_pair(G, g, c0 + col) * hidden + row] = mm_sum(red, i, col);
        }
        __syncthreads();
    }
}

#endif

#if FMT_GROUP_ON(FG_MOE_UP_ROUTED)
template <int FMT, bool F16S>
__device__ __forceinline__ void moe_up_mt_fmt(const ELayout& EL, const HalfRows& x, float* h, const MtGroups& G, int k,
                                              int hidden, int inter, int rt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (Fmt<FMT>::BITS != 0) {
        const int BITS = Fmt<FMT>::BITS;
        __shared__ MmRed red;
        MT_WORDS(BITS, EL.gs_shift, (moe_up_mt_t<BITS, F16S, L>(EL, x, h, G, k, hidden, inter, rt, red)));
    }
#endif
}

extern "C" __global__ void __launch_bounds__(256, 2) moe_up_mt(ELayout EL, HalfRows x, float* h, MtGroups G,
                                                            int k, int hidden, int inter, int rt) {
    GRID_DEP();
    FOR_FMT(EL.fmt, (moe_up_mt_fmt<F, S>(EL, x, h, G, k, hidden, inter, rt)));
}
#endif

#if FMT_GROUP_ON(FG_MOE_DOWN_COMBINE)
template <int FMT, bool F16S>
__device__ __forceinline__ void moe_down_mt_fmt(const ELayout& EL, const HalfRows& h, float* d, const MtGroups& G,
                                                int hidden, int inter, int rt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (Fmt<FMT>::BITS != 0) {
        const int BITS = Fmt<FMT>::BITS;
        __shared__ MmRed red;
        MT_WORDS(BITS, EL.gs_shift, (moe_down_mt_t<BITS, F16S, L>(EL, h, d, G, hidden, inter, rt, red)));
    }
#endif
}

extern "C" __global__ void __launch_bounds__(256, 2) moe_down_mt(ELayout EL, HalfRows h, float* d, MtGroups G,
                                                              int hidden, int inter, int rt) {
    GRID_DEP();
    FOR_FMT(EL.fmt, (moe_down_mt_fmt<F, S>(EL, h, d, G, hidden, inter, rt)));
}
#endif
