// Tensor-core matrix products for prefill (compute capability 8.0 and
// later): the fast path of SPEC §6. y = x · Wᵀ through mma.sync m16n8k16
// (f16 inputs, f32 sums), with no input rounded further than f32 would:
// - activations: each row scaled by a power of two (its largest magnitude
//   below 2^14) and split into two f16 parts, x·2^e = hi + lo (`to_half`);
//   both go through the tensor cores, and the scale is undone on the f32
//   result;
// - quantized weights (MLX affine, w = q·s + b): the levels q are exact in
//   f16; each group's sums Σ q·x go through the tensor cores, and s and b
//   are applied in f32 once per group, y += s·Σ q·x + b·Σ x (Σ x per row
//   and group from `to_half`);
// - f16 weights as they are, bf16 ones converted to f16 (exact in f16's
//   normal range, 6.1e-5 to 65504 in magnitude).
// A block computes one TC_BM × TC_BN tile (weight rows × tokens) in steps
// of TC_BK columns through two shared buffers: while the warps multiply
// one step, the next step's activations arrive by cp.async and its packed
// weights wait in registers, unpacked into the other buffer after the
// products. Each of the 4 warps takes 16 weight rows × all the tile's
// tokens, so a tile of few tokens (an expert group of a short chunk)
// skips the same products in every warp.
// gemm_tc: dense products (grid rows/TC_BM × tokens/TC_BN); moe_up_tc and
// moe_down_tc: the expert groups of moe_up / moe_down, gate and up rows in
// one tile, SwiGLU applied as the tile is written.

#define TC_BM 64
#define TC_BN 64
#define TC_BK 64
#define TC_THREADS 128
// A shared row in halves: 128 bytes, 8 chunks of 16 bytes stored
// XOR-swizzled (`swz`).
#define TC_LD TC_BK
// A token's row of the f32 result tile.
#define TC_CLD (TC_BM + 4)
// Most quantization groups in one step: groups of at least 16 columns.
#define TC_GPS (TC_BK / 16)

// A product's input rows, split (to_half).
struct HalfRows {
    const u16* hi;     // [rows, cols] f16 bit patterns
    const u16* lo;     // [rows, cols]: x·2^e − hi, in f16
    const float* inv;  // [rows]: 2^-e
    const float* sum;  // [rows, cols/group]: Σ x·2^e per group (quantized weights), else null
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

__device__ __forceinline__ uint4 u4(u32 x, u32 y, u32 z, u32 w) {
    uint4 v;
    v.x = x;
    v.y = y;
    v.z = z;
    v.w = w;
    return v;
}

// A tile's shared memory (dynamic: more than the 48 KiB a block gets
// without asking, see cuda/tensor.rs): two buffers of the step's inputs,
// and the f32 result tile, which reuses their memory once the products are
// done.
// BN: tokens per tile (64, or 16 for expert groups of few tokens).
template <int BN>
struct TcSmem {
    union {
        struct {
            u16 a[2][TC_BM][TC_LD];  // weights (levels of quantized ones), f16: [row][column of the step]
            u16 bh[2][BN][TC_LD];    // activations, hi parts: [token][column of the step]
            u16 bl[2][BN][TC_LD];    // lo parts
            float s[2][TC_BM][TC_GPS];  // scale of each row's groups in the step
            float b[2][TC_BM][TC_GPS];  // bias
            float xs[2][BN][TC_GPS];    // Σ x of each token's groups in the step
        } in;
        float c[BN][TC_CLD];  // [token][row]
    };
};

// Where logical 16-byte chunk c (0..7) of shared row r is stored: c ^ (r
// mod 8), so that the 8 rows an ldmatrix reads at one logical chunk hit 8
// different bank groups (no padding, so 4 blocks of 64 × 64 fit an SM).
__device__ __forceinline__ int swz(int r, int c) { return c ^ (r & 7); }

// Two floats as one f16x2 word (lo in the low half), rounded to nearest.
__device__ __forceinline__ u32 half2_of(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Levels q (< 1024) in the low 10 bits of each half of `w & M2` (M2: a
// format's level mask in both halves), as f16x2: (1024 + q) − 1024,
// exact; the mask and the exponent bits in one lop3 ((a & b) | c).
template <u32 M2>
__device__ __forceinline__ u32 levels_h2(u32 w) {
    u32 m, r;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(m) : "r"(w), "n"(M2), "n"(0x64006400u));
    asm("sub.f16x2 %0, %1, %2;" : "=r"(r) : "r"(m), "r"(0x64006400u));
    return r;
}

// Byte strides of TcSmem<BN>'s parts: one buffer of weights, one of an
// activation part, the lo parts after the hi ones, one buffer of group
// sums; and the bytes of 16 shared rows.
#define TC_ABUF (TC_BM * TC_LD * 2)
#define TC_XBUF(BN) ((BN) * TC_LD * 2)
#define TC_LOFF(BN) (2 * TC_XBUF(BN))
#define TC_SBUF(BN) ((BN) * TC_GPS * 4)
#define TC_ROWS16 (16 * TC_LD * 2)

// How a format's weights are loaded: 16-byte chunks of EPC elements, CPR
// of them per row per step, PER per thread (thread t takes chunks t,
// t + 128, ...: rows t/CPR + i·128/CPR, column part t % CPR).
template <int FMT>
struct TcFmt {
    static const int BITS = Fmt<FMT>::BITS;
    static const int EPC = BITS ? 128 / BITS : 8;
    static const int CPR = TC_BK / EPC;
    static const int CHUNKS = TC_BM * CPR;
    static const int PER = (CHUNKS + TC_THREADS - 1) / TC_THREADS;
};

// One thread's weight chunks: their rows, and the packed words of the
// next step with the scale and bias of each chunk's group (a chunk lies in
// one group: the kernels take groups no shorter than a chunk).
template <int FMT>
struct TcW {
    Row row[TcFmt<FMT>::PER];
    bool live[TcFmt<FMT>::PER];
    uint4 v[TcFmt<FMT>::PER];
    u16 s[TcFmt<FMT>::PER], b[TcFmt<FMT>::PER];
};

template <int FMT>
__device__ __forceinline__ void tc_load_w(TcW<FMT>& w, int k0, int gs_shift) {
    typedef TcFmt<FMT> F;
    const int part = threadIdx.x % F::CPR;
#pragma unroll
    for (int i = 0; i < F::PER; i++) {
        const int c = threadIdx.x + TC_THREADS * i;
        if (c < F::CHUNKS && w.live[i]) {
            const int e0 = k0 + part * F::EPC;  // first element of the chunk
            w.v[i] = __ldg((const uint4*)w.row[i].w + e0 / F::EPC);
            if (F::BITS) {
                w.s[i] = __ldg(w.row[i].s + (e0 >> gs_shift));
                w.b[i] = __ldg(w.row[i].b + (e0 >> gs_shift));
            }
        } else {
            w.v[i] = u4(0u, 0u, 0u, 0u);
            w.s[i] = w.b[i] = 0;
        }
    }
}

// The loaded chunks into buffer `buf`: levels (or f16 weights) into a,
// each quantized chunk's scale and bias into s and b at its group's place
// in the step (group ≥ step: place 0, the group of the step's columns).
template <int FMT, bool F16S, int BN>
__device__ __forceinline__ void tc_store_w(const TcW<FMT>& w, TcSmem<BN>& sm, int buf, int gs_shift) {
    typedef TcFmt<FMT> F;
    const int part = threadIdx.x % F::CPR;
#pragma unroll
    for (int i = 0; i < F::PER; i++) {
        const int c = threadIdx.x + TC_THREADS * i;
        if (c >= F::CHUNKS) continue;
        const int row = c / F::CPR;
        uint4* rowp = (uint4*)sm.in.a[buf][row];
        const int c0 = part * F::EPC / 8;  // the chunk's first 16-byte piece
        const u32 wd[4] = {w.v[i].x, w.v[i].y, w.v[i].z, w.v[i].w};
        if constexpr (F::BITS != 0) {
            // EPC/2 f16x2 words, written 4 to a uint4. Word q of a chunk
            // holds EPW levels, lowest bits first; (w >> bits·j) & mask
            // gives levels j and j + EPW/2 (bits·EPW/2 = 16) as the low
            // bits of each half: the order to_half gives the activations.
            const int EPW = 32 / F::BITS;
            const u32 M2 = ((1u << F::BITS) - 1) * 0x10001u;
            u32 h[F::EPC / 2];
#pragma unroll
            for (int e = 0; e < F::EPC / 2; e++) {
                const int q = e / (EPW / 2), j = e % (EPW / 2);
                h[e] = levels_h2<M2>(wd[q] >> (F::BITS * j));
            }
#pragma unroll
            for (int j = 0; j < F::EPC / 8; j++)
                rowp[swz(row, c0 + j)] = u4(h[4 * j], h[4 * j + 1], h[4 * j + 2], h[4 * j + 3]);
            const int gi = (part * F::EPC) >> gs_shift;
            sm.in.s[buf][row][gi] = F16S ? f16f(w.s[i]) : bf16f(w.s[i]);
            sm.in.b[buf][row][gi] = F16S ? f16f(w.b[i]) : bf16f(w.b[i]);
        } else if (FMT == FMT_F16) {
            rowp[swz(row, c0)] = w.v[i];
        } else {
            // bf16 → f32 → f16.
            u32 h[4];
#pragma unroll
            for (int j = 0; j < 4; j++) h[j] = half2_of(__uint_as_float(wd[j] << 16), __uint_as_float(wd[j] & 0xffff0000u));
            rowp[swz(row, c0)] = u4(h[0], h[1], h[2], h[3]);
        }
    }
}

// A thread's addresses in a tile, formed once: the element offsets in hx
// of its activation chunks (tokens t/8 + 16·i, column part t % 8, at
// column 0; a token past the tile's end reads a live token's row: its
// products land in columns nobody reads), the offset of its token's group
// sums (threads t < BN: token t), and shared-window addresses in buffer 0:
// where its chunks and sums go (cp.async), and the rows its lane gives
// ldmatrix (A: weight row warp·16 + lane % 16; B: token (lane % 8) +
// 8·(lane / 16), hi part), each at its 16-byte chunk of step column 0 as
// swz places it. Shared rows are 128 bytes on a 128-byte boundary, so
// logical chunk c of a row is that address XOR 16·c (c even, as the
// lane's own chunk is 0 or 1).
template <int BN>
struct TcAddr {
    u32 xo[BN / 16];
    u32 so;
    u32 xd, sd, a, b;
};

// This thread's TcAddr for a tile whose token j reads row src(j) of the
// input (j < live), over `cols` columns in groups of 1 << gs_shift.
template <int BN, class Src>
__device__ __forceinline__ void tc_addr(const TcSmem<BN>& sm, int live, Src src, int cols, int gs_shift,
                                        TcAddr<BN>& ad) {
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
#pragma unroll
    for (int i = 0; i < BN / 16; i++) {
        const int j = (t >> 3) + 16 * i;
        ad.xo[i] = (u32)src(j < live ? j : 0) * (u32)cols + (t & 7) * 8;
    }
    ad.so = (u32)src(t < live ? t : 0) * (u32)(cols >> gs_shift);
    const int j0 = t >> 3;
    ad.xd = smem_addr(sm.in.bh[0][j0]) + (swz(j0, t & 7) << 4);
    ad.sd = smem_addr(&sm.in.xs[0][t < BN ? t : 0][0]);
    const int ar = warp * 16 + (lane & 15), bt = (lane & 7) + ((lane >> 4) << 3);
    ad.a = smem_addr(sm.in.a[0][ar]) + (swz(ar, lane >> 4) << 4);
    ad.b = smem_addr(sm.in.bh[0][bt]) + (swz(bt, (lane >> 3) & 1) << 4);
}

// This thread's activation chunks of a step into buffer `buf` by
// cp.async: hi and lo parts of its tokens in the tile's first `live`
// (rounded up to 16); threads 0..BN−1 copy their token's group sums
// (quantized weights).
template <int BN>
__device__ __forceinline__ void tc_load_x(const HalfRows& hx, const TcAddr<BN>& ad, int live, int k0, int gs_shift,
                                          bool quant, int buf) {
    const u32 d = ad.xd + buf * TC_XBUF(BN);
#pragma unroll
    for (int i = 0; i < BN / 16; i++) {
        if (i * 16 < live) {
            const u32 e = ad.xo[i] + k0;
            cp_async16s(d + i * TC_ROWS16, hx.hi + e);
            cp_async16s(d + TC_LOFF(BN) + i * TC_ROWS16, hx.lo + e);
        }
    }
    if (quant && threadIdx.x < BN) {
        const int groups = max(1, TC_BK >> gs_shift);
        const u32 g0 = ad.so + (k0 >> gs_shift), sd = ad.sd + buf * TC_SBUF(BN);
#pragma unroll
        for (int gi = 0; gi < TC_GPS; gi++)
            if (gi < groups) cp_async4s(sd + gi * 4, hx.sum + g0 + gi);
    }
}

// One 16-column slice kk of a step's products: the warp's 16 rows × the
// first NB 16-token blocks, hi and lo parts, into g[n8 tile][4]; FRESH:
// the slice opens a quantization group, and its first products start from
// zero instead of adding to g.
template <bool FRESH, int BN, int NB>
__device__ __forceinline__ void tc_slice(u32 ak, u32 bk, float (&g)[BN / 8][4]) {
    u32 af[4];
    ldsm4(ak, af[0], af[1], af[2], af[3]);
#pragma unroll
    for (int np = 0; np < NB; np++) {
        u32 b0, b1, b2, b3;
        ldsm4(bk + np * TC_ROWS16, b0, b1, b2, b3);
        if (FRESH) {
            mma16816z(g[2 * np], af, b0, b1);
            mma16816z(g[2 * np + 1], af, b2, b3);
        } else {
            mma16816(g[2 * np], af, b0, b1);
            mma16816(g[2 * np + 1], af, b2, b3);
        }
        ldsm4(bk + TC_LOFF(BN) + np * TC_ROWS16, b0, b1, b2, b3);
        mma16816(g[2 * np], af, b0, b1);
        mma16816(g[2 * np + 1], af, b2, b3);
    }
}

// The products of one step's buffers: the warp's 16 rows × the tile's
// first NB 16-token blocks (its live tokens rounded up; the columns of
// tokens past the end are computed and never read), hi and lo parts, into
// g[n8 tile][4]; for quantized weights, at the end of each group, tot =
// (tot + b·Σx) + s·g in two fused multiply-adds, and the next group's
// first slice overwrites g (else tot is taken from g at the end).
template <bool QUANT, int BN, int NB>
__device__ __forceinline__ void tc_mma(const TcSmem<BN>& sm, const TcAddr<BN>& ad, int buf, int k0, int gs_shift,
                                       float (&g)[BN / 8][4], float (&tot)[BN / 8][4]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 a = ad.a + buf * TC_ABUF, b = ad.b + buf * TC_XBUF(BN);
    const int gmask = (1 << gs_shift) - 1;
#pragma unroll
    for (int kk = 0; kk < TC_BK; kk += 16) {
        // Logical chunk kk/8 (even): the address XOR 16·kk/8.
        const u32 ak = a ^ (kk << 1), bk = b ^ (kk << 1);
        if (QUANT && ((k0 + kk) & gmask) == 0) {
            tc_slice<true, BN, NB>(ak, bk, g);
        } else {
            tc_slice<false, BN, NB>(ak, bk, g);
        }
        if (QUANT && ((k0 + kk + 16) & gmask) == 0) {
            const int gi = kk >> gs_shift;  // 0 when the group spans steps
            const int r = warp * 16 + (lane >> 2);
            const float s0 = sm.in.s[buf][r][gi], b0 = sm.in.b[buf][r][gi];
            const float s1 = sm.in.s[buf][r + 8][gi], b1 = sm.in.b[buf][r + 8][gi];
#pragma unroll
            for (int nt = 0; nt < 2 * NB; nt++) {
                const int t = nt * 8 + (lane & 3) * 2;
                const float x0 = sm.in.xs[buf][t][gi], x1 = sm.in.xs[buf][t + 1][gi];
                tot[nt][0] = fmaf(s0, g[nt][0], fmaf(b0, x0, tot[nt][0]));
                tot[nt][1] = fmaf(s0, g[nt][1], fmaf(b0, x1, tot[nt][1]));
                tot[nt][2] = fmaf(s1, g[nt][2], fmaf(b1, x0, tot[nt][2]));
                tot[nt][3] = fmaf(s1, g[nt][3], fmaf(b1, x1, tot[nt][3]));
            }
        }
    }
}

// tc_mma for nb (1 .. BN/16) live 16-token blocks: one instance per count,
// so that the products carry no per-block conditions.
template <bool QUANT, int BN, int NB = BN / 16>
__device__ __forceinline__ void tc_mma_n(int nb, const TcSmem<BN>& sm, const TcAddr<BN>& ad, int buf, int k0,
                                         int gs_shift, float (&g)[BN / 8][4], float (&tot)[BN / 8][4]) {
    if (NB > 1 && nb < NB) {
        tc_mma_n<QUANT, BN, (NB > 1 ? NB - 1 : 1)>(nb, sm, ad, buf, k0, gs_shift, g, tot);
        return;
    }
    tc_mma<QUANT, BN, NB>(sm, ad, buf, k0, gs_shift, g, tot);
}

// One tile: the block's TC_BM weight rows (w.row, loaded per thread) times
// its first `live` tokens (token j: row src(j) of hx) over `cols`
// columns, left in sm.c[token][row] (still scaled by each token's 2^e;
// columns of tokens past `live` hold products nobody may read), with a
// barrier before and after.
template <int FMT, bool F16S, int BN, class Src>
__device__ __forceinline__ void tc_tile(TcW<FMT>& w, const HalfRows& hx, Src src, int live, int cols, int gs_shift,
                                        TcSmem<BN>& sm, int kb = 0, int ke = -1) {
    const bool QUANT = Fmt<FMT>::BITS != 0;
    float g[BN / 8][4], tot[BN / 8][4];
#pragma unroll
    for (int i = 0; i < BN / 8; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) g[i][j] = tot[i][j] = 0.0f;
    // Columns kb .. ke (a whole number of steps; all of them by default).
    const int steps = ((ke < 0 ? cols : ke) - kb) / TC_BK;
    TcAddr<BN> ad;
    tc_addr<BN>(sm, live, src, cols, gs_shift, ad);
    tc_load_w<FMT>(w, kb, gs_shift);
    tc_load_x<BN>(hx, ad, live, kb, gs_shift, QUANT, 0);
    tc_store_w<FMT, F16S, BN>(w, sm, 0, gs_shift);
    cp_async_wait();
    __syncthreads();
    for (int s = 0; s < steps; s++) {
        const int cur = s & 1;
        const bool more = s + 1 < steps;
        if (more) {
            tc_load_x<BN>(hx, ad, live, kb + (s + 1) * TC_BK, gs_shift, QUANT, cur ^ 1);
            tc_load_w<FMT>(w, kb + (s + 1) * TC_BK, gs_shift);
        }
        tc_mma_n<QUANT, BN>((live + 15) >> 4, sm, ad, cur, kb + s * TC_BK, gs_shift, g, tot);
        if (more) tc_store_w<FMT, F16S, BN>(w, sm, cur ^ 1, gs_shift);
        cp_async_wait();
        __syncthreads();
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = warp * 16 + (lane >> 2);
#pragma unroll
    for (int nt = 0; nt < BN / 8; nt++) {
        const int t = nt * 8 + (lane & 3) * 2;
        const float(&v)[4] = QUANT ? tot[nt] : g[nt];
        sm.c[t][row] = v[0];
        sm.c[t + 1][row] = v[1];
        sm.c[t][row + 8] = v[2];
        sm.c[t + 1][row + 8] = v[3];
    }
    __syncthreads();
}

// Block (bx, by, bz) of a gemm_tc launch: matrix i of the set whose range
// of blocks [first[i], first[i + 1]) holds bx, its rows from (bx −
// first[i]) · TC_BM, tokens from by · BN (TC_BN, or 16 for a batched
// decode step), columns part bz of gridDim.z (`per` steps each, whole
// quantization groups: the host chooses it). With one part the tile goes
// to y; with several, to the part's slice of ws [parts][n][rows of the
// set] (matrix i's rows after those of the matrices before it), which
// tc_parts_sum adds up in part order.
template <int FMT, bool F16S, int BN>
__device__ __forceinline__ void gemm_tc_t(const MatSet& set, const HalfRows& hx, int n, float* ws, int per,
                                          TcSmem<BN>& sm) {
    if (FMT == FMT_F32) return;  // not taken (cuda/tensor.rs)
    typedef TcFmt<FMT> F;
    int mi = 0, roff = 0, rall = 0;
    while (mi + 1 < set.count && (int)blockIdx.x >= set.first[mi + 1]) roff += set.m[mi++].rows;
    for (int i = 0; i < set.count; i++) rall += set.m[i].rows;
    const Mat& m = set.m[mi];
    float* y = (float*)set.y[mi];
    const int row0 = ((int)blockIdx.x - set.first[mi]) * TC_BM, tok0 = blockIdx.y * BN;
    TcW<FMT> w;
#pragma unroll
    for (int i = 0; i < F::PER; i++) {
        const int r = row0 + (threadIdx.x + TC_THREADS * i) / F::CPR;
        w.live[i] = r < m.rows;
        w.row[i] = mat_row(m, w.live[i] ? r : 0);
    }
    const int live = min(BN, n - tok0);
    const int steps = m.cols / TC_BK;
    const int kb = min(steps, (int)blockIdx.z * per) * TC_BK, ke = min(steps, ((int)blockIdx.z + 1) * per) * TC_BK;
    float* out = gridDim.z == 1 ? y : ws + ((i64)blockIdx.z * n) * rall + roff;
    const i64 stride = gridDim.z == 1 ? m.rows : rall;
    // A part past the last column (the host gives none) adds zeros.
    if (kb < ke) tc_tile<FMT, F16S, BN>(w, hx, [&](int j) { return tok0 + j; }, live, m.cols, m.gs_shift, sm, kb, ke);
    // Each token's TC_BM rows are contiguous: a warp writes 32 of them.
    for (int i = threadIdx.x; i < BN * TC_BM; i += TC_THREADS) {
        const int j = i / TC_BM, r = i % TC_BM;
        if (j < live && row0 + r < m.rows)
            out[(i64)(tok0 + j) * stride + row0 + r] = kb < ke ? sm.c[j][r] * hx.inv[tok0 + j] : 0.0f;
    }
}

// moe_up_tc: rows r0 .. r0 + TC_BM/2 of gate (tile rows 0..31) and of up
// (32..63) for every token of the group, in tiles of TC_BN; h[p] =
// silu(gate·x) ⊙ up·x.
template <int FMT, bool F16S, int BN>
__device__ __forceinline__ void moe_up_tc_t(const ELayout& L, const HalfRows& hx, float* h, const Group& G,
                                            const int* pairs, int k, int hidden, int inter, TcSmem<BN>& sm) {
    if (FMT == FMT_F32) return;  // not taken (cuda/tensor.rs)
    typedef TcFmt<FMT> F;
    const int HB = TC_BM / 2;
    const int r0 = blockIdx.x * HB;
    TcW<FMT> w;
#pragma unroll
    for (int i = 0; i < F::PER; i++) {
        const int tr = (threadIdx.x + TC_THREADS * i) / F::CPR;  // tile row
        const int r = r0 + tr % HB;
        w.live[i] = r < inter;
        w.row[i] = expert_row(G.base, L, tr / HB, w.live[i] ? r : 0, hidden);
    }
    for (int i0 = 0; i0 < G.count; i0 += BN) {
        const int live = min(BN, G.count - i0);
        tc_tile<FMT, F16S, BN>(w, hx, [&](int j) { return group_pair(G, pairs, i0 + j) / k; }, live, hidden,
                               L.gs_shift, sm);
        for (int i = threadIdx.x; i < BN * HB; i += TC_THREADS) {
            const int j = i / HB, r = i % HB;
            if (j < live && r0 + r < inter) {
                const int p = group_pair(G, pairs, i0 + j);
                const float iv = hx.inv[p / k];
                h[(i64)p * inter + r0 + r] = silu_f(sm.c[j][r] * iv) * (sm.c[j][HB + r] * iv);
            }
        }
        __syncthreads();
    }
}

// moe_down_tc: rows r0 .. r0 + TC_BM of down for every token of the
// group; d[p] = down·h[p] (hx: h's rows split, one per pair).
template <int FMT, bool F16S, int BN>
__device__ __forceinline__ void moe_down_tc_t(const ELayout& L, const HalfRows& hx, float* d, const Group& G,
                                              const int* pairs, int hidden, int inter, TcSmem<BN>& sm) {
    if (FMT == FMT_F32) return;  // not taken (cuda/tensor.rs)
    typedef TcFmt<FMT> F;
    const int r0 = blockIdx.x * TC_BM;
    TcW<FMT> w;
#pragma unroll
    for (int i = 0; i < F::PER; i++) {
        const int r = r0 + (threadIdx.x + TC_THREADS * i) / F::CPR;
        w.live[i] = r < hidden;
        w.row[i] = expert_row(G.base, L, 2, w.live[i] ? r : 0, inter);
    }
    for (int i0 = 0; i0 < G.count; i0 += BN) {
        const int live = min(BN, G.count - i0);
        tc_tile<FMT, F16S, BN>(w, hx, [&](int j) { return group_pair(G, pairs, i0 + j); }, live, inter, L.gs_shift,
                               sm);
        for (int i = threadIdx.x; i < BN * TC_BM; i += TC_THREADS) {
            const int j = i / TC_BM, r = i % TC_BM;
            if (j < live && r0 + r < hidden) {
                const int p = group_pair(G, pairs, i0 + j);
                d[(i64)p * hidden + r0 + r] = sm.c[j][r] * hx.inv[p];
            }
        }
        __syncthreads();
    }
}

#define TC_CALL(call) call
#define TC_SMEM(BN) extern __shared__ __align__(128) char tc_smem[]; TcSmem<BN>& sm = *(TcSmem<BN>*)tc_smem
#else
// Below compute capability 8.0 the kernels exist but do nothing; the host
// never launches them there (cuda/tensor.rs).
#define TC_CALL(call)
#define TC_SMEM(BN)
#endif

#if FMT_GROUP_ON(FG_TC)
// y_i[n, rows_i] = x · W_iᵀ for the (1 to MQ_SET) matrices of `set`, of
// one format and the same cols (a multiple of TC_BK), from x split
// (to_half): grid (Σ rows_i/TC_BM, n/TC_BN), 128 threads,
// sizeof(TcSmem<TC_BN>) bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(TC_THREADS) gemm_tc(MatSet set, HalfRows hx, int n) {
    GRID_DEP();
    TC_SMEM(TC_BN);
    FOR_FMT(set.m[0].fmt, TC_CALL((gemm_tc_t<F, S, TC_BN>(set, hx, n, nullptr, set.m[0].cols / TC_BK, sm))));
}

// gemm_tc in tiles of 16 tokens with the columns split in gridDim.z parts
// (partial tiles in ws): the products of a batched decode step, whose
// matrices would give too few 64-row tiles to fill the GPU.
extern "C" __global__ void __launch_bounds__(TC_THREADS) gemm_tc16(MatSet set, HalfRows hx, int n, float* ws,
                                                                  int per) {
    GRID_DEP();
    TC_SMEM(16);
    FOR_FMT(set.m[0].fmt, TC_CALL((gemm_tc_t<F, S, 16>(set, hx, n, ws, per, sm))));
}

// y_i[t, r] = Σ_p ws[p][t][roff_i + r] over the `parts` column parts of a
// gemm_tc16 launch, added in part order. Grid-stride over n · (rows of
// the set).
extern "C" __global__ void tc_parts_sum(MatSet set, const float* ws, int n, int parts) {
    GRID_DEP();
    int rall = 0;
    for (int i = 0; i < set.count; i++) rall += set.m[i].rows;
    GRID_LOOP(e, (i64)n * rall) {
        const int t = (int)(e / rall);
        int r = (int)(e % rall), mi = 0;
        while (mi + 1 < set.count && r >= set.m[mi].rows) r -= set.m[mi++].rows;
        float v = 0.0f;
        for (int p = 0; p < parts; p++) v += ws[((i64)p * n + t) * rall + e % rall];
        ((float*)set.y[mi])[(i64)t * set.m[mi].rows + r] = v;
    }
}

// moe_up on tensor cores: grid (inter/(TC_BM/2), groups), 128 threads;
// hx: x's rows split, one per token; tiles of BN tokens (moe_up_tc: 64,
// moe_up_tc32 and moe_up_tc16 for groups of fewer tokens: expert_tile in
// cuda/tensor.rs).
#define MOE_UP_TC(NAME, BN)                                                                                   \
    extern "C" __global__ void __launch_bounds__(TC_THREADS)                                                 \
        NAME(ELayout L, HalfRows hx, float* h, const u64* grp_ptr, const int* grp_start, const int* grp_count, \
             const int* pairs, int k, int hidden, int inter) {                                               \
        GRID_DEP();                                                                                          \
        TC_SMEM(BN);                                                                                         \
        const Group G = moe_group(blockIdx.y, grp_ptr, grp_start, grp_count);                                \
        FOR_FMT(L.fmt, TC_CALL((moe_up_tc_t<F, S, BN>(L, hx, h, G, pairs, k, hidden, inter, sm))));          \
    }
MOE_UP_TC(moe_up_tc, 64)
MOE_UP_TC(moe_up_tc16, 16)
MOE_UP_TC(moe_up_tc32, 32)

// moe_down on tensor cores: grid (hidden/TC_BM, groups), 128 threads;
// hx: h's rows split, one per pair; tiles of BN tokens as moe_up_tc.
#define MOE_DOWN_TC(NAME, BN)                                                                                  \
    extern "C" __global__ void __launch_bounds__(TC_THREADS)                                                  \
        NAME(ELayout L, HalfRows hx, float* d, const u64* grp_ptr, const int* grp_start, const int* grp_count, \
             const int* pairs, int hidden, int inter) {                                                       \
        GRID_DEP();                                                                                           \
        TC_SMEM(BN);                                                                                          \
        const Group G = moe_group(blockIdx.y, grp_ptr, grp_start, grp_count);                                 \
        FOR_FMT(L.fmt, TC_CALL((moe_down_tc_t<F, S, BN>(L, hx, d, G, pairs, hidden, inter, sm))));            \
    }
MOE_DOWN_TC(moe_down_tc, 64)
MOE_DOWN_TC(moe_down_tc16, 16)
MOE_DOWN_TC(moe_down_tc32, 32)
#endif
