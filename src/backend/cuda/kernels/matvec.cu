// Matrix products `y[n, rows] = x[n, cols] · Wᵀ` for every weight format,
// and the embedding lookup. One token (decode, routed experts): one warp
// per MV_R rows, 16-byte loads of the packed weights, dequantized in
// registers, a warp-shuffle sum at the end; x is read once per MV_R rows.
// One token through quantized dense matrices: `matvec_q` (x in shared
// memory, the scales applied once per chunk; up to 4 matrices that read
// the same x in one launch).
// Several tokens: 64×64 output tiles through shared memory.

#define MV_R 4  // rows per warp

// Calls CALL with the compile-time format F and scale flag S of `fmt`.
#define FOR_FMT(fmt, CALL)                                                          \
    switch (fmt) {                                                                  \
        case FMT_F32: { const int F = FMT_F32; const bool S = false; CALL; } break; \
        case FMT_BF16: { const int F = FMT_BF16; const bool S = false; CALL; } break; \
        case FMT_F16: { const int F = FMT_F16; const bool S = false; CALL; } break; \
        case FMT_Q2: { const int F = FMT_Q2; const bool S = false; CALL; } break;   \
        case FMT_Q4: { const int F = FMT_Q4; const bool S = false; CALL; } break;   \
        case FMT_Q8: { const int F = FMT_Q8; const bool S = false; CALL; } break;   \
        case FMT_Q2 + FMT_F16_SCALES: { const int F = FMT_Q2; const bool S = true; CALL; } break; \
        case FMT_Q4 + FMT_F16_SCALES: { const int F = FMT_Q4; const bool S = true; CALL; } break; \
        case FMT_Q8 + FMT_F16_SCALES: { const int F = FMT_Q8; const bool S = true; CALL; } break; \
        default: break;                                                             \
    }

__device__ __forceinline__ float4 ldx4(const float* p) { return __ldg((const float4*)p); }

// acc[r] += this lane's share of Σ_c W_r[c]·x[c] for MV_R rows; rows with
// `live[r]` false contribute nothing. Every caller (one token at a time)
// runs this same code, so a token's result never depends on how it was
// batched.
template <int FMT, bool F16S>
__device__ __forceinline__ void rows_dot(const Row (&rows)[MV_R], const bool (&live)[MV_R], int cols,
                                         int gs_shift, int vec, const float* x, float (&acc)[MV_R]) {
    const int lane = threadIdx.x & 31;
    if (!vec) {
        for (int c = lane; c < cols; c += 32) {
            const float xv = x[c];
#pragma unroll
            for (int r = 0; r < MV_R; r++)
                if (live[r]) acc[r] = fmaf(row_get<FMT, F16S>(rows[r], c, gs_shift), xv, acc[r]);
        }
        return;
    }
    const int BITS = Fmt<FMT>::BITS;
    // Elements per 16-byte chunk.
    const int EPC = BITS ? 128 / BITS : (FMT == FMT_F32 ? 4 : 8);
    const int chunks = cols / EPC;
    for (int i = lane; i < chunks; i += 32) {
        uint4 wv[MV_R];
#pragma unroll
        for (int r = 0; r < MV_R; r++) {
            if (live[r]) {
                wv[r] = __ldg((const uint4*)rows[r].w + i);
            } else {
                wv[r].x = wv[r].y = wv[r].z = wv[r].w = 0u;
            }
        }
        if (BITS) {
            const int EPW = BITS ? 32 / BITS : 1;  // elements per word
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c0 = (i * 4 + j) * EPW;
                const int g = c0 >> gs_shift;
                float sc[MV_R], bi[MV_R];
                u32 wd[MV_R];
#pragma unroll
                for (int r = 0; r < MV_R; r++) {
                    sc[r] = live[r] ? scale_of(rows[r].s, g, F16S) : 0.0f;
                    bi[r] = live[r] ? scale_of(rows[r].b, g, F16S) : 0.0f;
                    wd[r] = j == 0 ? wv[r].x : j == 1 ? wv[r].y : j == 2 ? wv[r].z : wv[r].w;
                }
#pragma unroll
                for (int s4 = 0; s4 < EPW / 4; s4++) {
                    const float4 xv = ldx4(x + c0 + 4 * s4);
#pragma unroll
                    for (int r = 0; r < MV_R; r++) {
                        float a = acc[r];
                        a = fmaf(fmaf(level<BITS ? BITS : 4>(wd[r], 4 * s4 + 0), sc[r], bi[r]), xv.x, a);
                        a = fmaf(fmaf(level<BITS ? BITS : 4>(wd[r], 4 * s4 + 1), sc[r], bi[r]), xv.y, a);
                        a = fmaf(fmaf(level<BITS ? BITS : 4>(wd[r], 4 * s4 + 2), sc[r], bi[r]), xv.z, a);
                        a = fmaf(fmaf(level<BITS ? BITS : 4>(wd[r], 4 * s4 + 3), sc[r], bi[r]), xv.w, a);
                        acc[r] = a;
                    }
                }
            }
        } else {
            const int c0 = i * EPC;
#pragma unroll
            for (int s4 = 0; s4 < EPC / 4; s4++) {
                const float4 xv = ldx4(x + c0 + 4 * s4);
#pragma unroll
                for (int r = 0; r < MV_R; r++) {
                    float w0, w1, w2, w3;
                    if (FMT == FMT_F32) {
                        w0 = __uint_as_float(wv[r].x);
                        w1 = __uint_as_float(wv[r].y);
                        w2 = __uint_as_float(wv[r].z);
                        w3 = __uint_as_float(wv[r].w);
                    } else {
                        const u32 lo = s4 == 0 ? wv[r].x : wv[r].z;
                        const u32 hi = s4 == 0 ? wv[r].y : wv[r].w;
                        if (FMT == FMT_BF16) {
                            w0 = __uint_as_float(lo << 16);
                            w1 = __uint_as_float(lo & 0xffff0000u);
                            w2 = __uint_as_float(hi << 16);
                            w3 = __uint_as_float(hi & 0xffff0000u);
                        } else {
                            w0 = f16f((u16)(lo & 0xffffu));
                            w1 = f16f((u16)(lo >> 16));
                            w2 = f16f((u16)(hi & 0xffffu));
                            w3 = f16f((u16)(hi >> 16));
                        }
                    }
                    float a = acc[r];
                    a = fmaf(w0, xv.x, a);
                    a = fmaf(w1, xv.y, a);
                    a = fmaf(w2, xv.z, a);
                    a = fmaf(w3, xv.w, a);
                    acc[r] = a;
                }
            }
        }
    }
}

// Elements in one 16-byte chunk of a row (the `vec` layout).
template <int FMT>
__device__ __forceinline__ int chunk_elems() {
    return Fmt<FMT>::BITS ? 128 / Fmt<FMT>::BITS : (FMT == FMT_F32 ? 4 : 8);
}

// rows_dot for T tokens at once: acc[t][r] += this lane's share of
// Σ_c W_r[c]·xs[t][c]. Each 16-byte chunk is loaded and each weight
// dequantized once, then applied to every token, so acc[t] goes through
// exactly the fmaf sequence rows_dot runs for xs[t] alone (bit for bit).
// `vlane` is the lane's place in the chunk loop, the lane itself in
// rows_dot (see LaneSets in moe.cu). Without `vec`: rows_dot per token,
// and vlane must be the lane.
template <int FMT, bool F16S, int T>
__device__ __forceinline__ void rows_dot_tok(const Row (&rows)[MV_R], const bool (&live)[MV_R], int cols,
                                             int gs_shift, int vec, int vlane, const float* const (&xs)[T],
                                             float (&acc)[T][MV_R]) {
    if (!vec) {
#pragma unroll
        for (int t = 0; t < T; t++) rows_dot<FMT, F16S>(rows, live, cols, gs_shift, 0, xs[t], acc[t]);
        return;
    }
    const int BITS = Fmt<FMT>::BITS;
    const int chunks = cols / chunk_elems<FMT>();
    for (int i = vlane; i < chunks; i += 32) {
        uint4 wv[MV_R];
#pragma unroll
        for (int r = 0; r < MV_R; r++) {
            if (live[r]) {
                wv[r] = __ldg((const uint4*)rows[r].w + i);
            } else {
                wv[r].x = wv[r].y = wv[r].z = wv[r].w = 0u;
            }
        }
        if (BITS) {
            const int EPW = BITS ? 32 / BITS : 1;  // elements per word
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c0 = (i * 4 + j) * EPW;
                const int g = c0 >> gs_shift;
                float sc[MV_R], bi[MV_R];
                u32 wd[MV_R];
#pragma unroll
                for (int r = 0; r < MV_R; r++) {
                    sc[r] = live[r] ? scale_of(rows[r].s, g, F16S) : 0.0f;
                    bi[r] = live[r] ? scale_of(rows[r].b, g, F16S) : 0.0f;
                    wd[r] = j == 0 ? wv[r].x : j == 1 ? wv[r].y : j == 2 ? wv[r].z : wv[r].w;
                }
#pragma unroll
                for (int s4 = 0; s4 < EPW / 4; s4++) {
                    float xe[T][4];
#pragma unroll
                    for (int t = 0; t < T; t++) {
                        const float4 v = ldx4(xs[t] + c0 + 4 * s4);
                        xe[t][0] = v.x;
                        xe[t][1] = v.y;
                        xe[t][2] = v.z;
                        xe[t][3] = v.w;
                    }
#pragma unroll
                    for (int r = 0; r < MV_R; r++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const float w = fmaf(level<BITS ? BITS : 4>(wd[r], 4 * s4 + e), sc[r], bi[r]);
#pragma unroll
                            for (int t = 0; t < T; t++) acc[t][r] = fmaf(w, xe[t][e], acc[t][r]);
                        }
                }
            }
        } else {
            const int c0 = i * chunk_elems<FMT>();
#pragma unroll
            for (int s4 = 0; s4 < chunk_elems<FMT>() / 4; s4++) {
                float xe[T][4];
#pragma unroll
                for (int t = 0; t < T; t++) {
                    const float4 v = ldx4(xs[t] + c0 + 4 * s4);
                    xe[t][0] = v.x;
                    xe[t][1] = v.y;
                    xe[t][2] = v.z;
                    xe[t][3] = v.w;
                }
#pragma unroll
                for (int r = 0; r < MV_R; r++) {
                    float w[4];
                    if (FMT == FMT_F32) {
                        w[0] = __uint_as_float(wv[r].x);
                        w[1] = __uint_as_float(wv[r].y);
                        w[2] = __uint_as_float(wv[r].z);
                        w[3] = __uint_as_float(wv[r].w);
                    } else {
                        const u32 lo = s4 == 0 ? wv[r].x : wv[r].z;
                        const u32 hi = s4 == 0 ? wv[r].y : wv[r].w;
                        if (FMT == FMT_BF16) {
                            w[0] = __uint_as_float(lo << 16);
                            w[1] = __uint_as_float(lo & 0xffff0000u);
                            w[2] = __uint_as_float(hi << 16);
                            w[3] = __uint_as_float(hi & 0xffff0000u);
                        } else {
                            w[0] = f16f((u16)(lo & 0xffffu));
                            w[1] = f16f((u16)(lo >> 16));
                            w[2] = f16f((u16)(hi & 0xffffu));
                            w[3] = f16f((u16)(hi >> 16));
                        }
                    }
#pragma unroll
                    for (int e = 0; e < 4; e++)
#pragma unroll
                        for (int t = 0; t < T; t++) acc[t][r] = fmaf(w[e], xe[t][e], acc[t][r]);
                }
            }
        }
    }
}

// y[rows] = W·x for one token: one warp per MV_R rows, 256 threads a block.
template <int FMT, bool F16S>
__device__ __forceinline__ void matvec_t(const Mat& m, const float* x, float* y) {
    const int lane = threadIdx.x & 31;
    const int r0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * MV_R;
    if (r0 >= m.rows) return;
    Row rows[MV_R];
    bool live[MV_R];
    float acc[MV_R];
#pragma unroll
    for (int r = 0; r < MV_R; r++) {
        live[r] = r0 + r < m.rows;
        rows[r] = mat_row(m, live[r] ? r0 + r : r0);
        acc[r] = 0.0f;
    }
    rows_dot<FMT, F16S>(rows, live, m.cols, m.gs_shift, m.vec, x, acc);
#pragma unroll
    for (int r = 0; r < MV_R; r++) {
        const float v = warp_sum(acc[r]);
        if (lane == 0 && live[r]) y[r0 + r] = v;
    }
}

// y[rows] = W·x (one token); grid rows/(8·MV_R), 256 threads.
extern "C" __global__ void __launch_bounds__(256) matvec(Mat m, const float* x, float* y) {
    GRID_DEP();
    FOR_FMT(m.fmt, (matvec_t<F, S>(m, x, y)));
}

#define MQ_R 4  // rows per warp in matvec_q

// Float4 `p` of x as matvec_q stores it in shared memory: the low 3 bits
// of the index are flipped by the 128-byte line (F4 ≤ 4) or the chunk
// (F4 ≥ 8), so the 8 lanes of one 128-byte phase, which read the same
// offset of 8 consecutive chunks, hit 8 different bank groups.
template <int F4>
__device__ __forceinline__ int xswz(int p) {
    return F4 >= 8 ? p ^ ((p / F4) & 7) : p ^ ((p >> 3) & 7);
}

// Byte `k` of `w` as an exact float: 2^23 + byte built with one byte
// permute, less 2^23.
__device__ __forceinline__ float byte_f(u32 w, int k) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(w), "r"(0x4B000000u), "r"(0x7440u + k));
    return __uint_as_float(r) - 8388608.0f;
}

// y[rows] = W·x for one token, W quantized, every row 16-byte aligned and
// each lane's 16-byte chunk inside one group; with `u` (not null) the
// vector is silu(x) ⊙ u instead of x (the `swiglu` kernel's values). It
// is staged once per block in shared memory; this block is block `blk` of
// the `nblk` that share W. The block's warps form row groups of
// `m.split` warps; each group takes MQ_R rows at a time (striding over
// the rows with the other groups), its warps the chunks i ≡ part (mod
// split) of each 32 (`split` > 1 for short wide matrices: more warps on
// fewer rows), each lane one 16-byte chunk of each row per step. Per
// chunk and row: Σ(q·s + b)·x = s·Σq·x + b·Σx, with Σx shared by the
// warp's rows; the lanes' sums are reduced by a fixed shuffle tree, and
// the parts of a row added in part order, so the result is the same every
// run, whichever block computes a row.
template <int BITS, bool F16S>
__device__ __forceinline__ void matvec_q_t(const Mat& m, const float* x, const float* u, float* y, float4* xs,
                                           int blk, int nblk) {
    const int EPW = 32 / BITS;  // elements per word
    const int EPC = 4 * EPW;    // elements per 16-byte chunk
    const int F4 = EPC / 4;     // float4s of x per chunk
    const int SUB = 8 / BITS;   // elements per byte
    const u32 MASK = BITS == 8 ? 0xffffffffu : BITS == 4 ? 0x0f0f0f0fu : 0x03030303u;
    const int n4 = m.cols >> 2;
    for (int p = threadIdx.x; p < n4; p += blockDim.x) {
        float4 v = __ldg((const float4*)x + p);
        if (u) {
            const float4 w = __ldg((const float4*)u + p);
            v.x = silu_f(v.x) * w.x;
            v.y = silu_f(v.y) * w.y;
            v.z = silu_f(v.z) * w.z;
            v.w = silu_f(v.w) * w.w;
        }
        xs[xswz<F4>(p)] = v;
    }
    __syncthreads();
    __shared__ float part_sum[8][MQ_R];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int split = m.split;
    const int gpb = (blockDim.x >> 5) / split;  // row groups per block
    const int rg = wid / split, part = wid % split;
    const int chunks = m.cols / EPC;
    // Every warp of the block runs the same iterations (the barriers of the
    // split sums); a row group past the end computes nothing.
    for (int base = blk * gpb * MQ_R; base < m.rows; base += nblk * gpb * MQ_R) {
        const int r0 = base + rg * MQ_R;
        Row rows[MQ_R];
        float acc[MQ_R];
#pragma unroll
        for (int r = 0; r < MQ_R; r++) {
            // A row past the end reads the last row again and is not written.
            rows[r] = mat_row(m, r0 + r < m.rows ? r0 + r : m.rows - 1);
            acc[r] = 0.0f;
        }
        for (int i = r0 < m.rows ? lane + 32 * part : chunks; i < chunks; i += 32 * split) {
            const int g = (i * EPC) >> m.gs_shift;
            uint4 wv[MQ_R];
            float sc[MQ_R], bi[MQ_R];
#pragma unroll
            for (int r = 0; r < MQ_R; r++) {
                wv[r] = __ldg((const uint4*)rows[r].w + i);
                sc[r] = scale_of(rows[r].s, g, F16S);
                bi[r] = scale_of(rows[r].b, g, F16S);
            }
            float sx = 0.0f, qx[MQ_R];
#pragma unroll
            for (int r = 0; r < MQ_R; r++) qx[r] = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float xv[EPW];
#pragma unroll
                for (int f = 0; f < EPW / 4; f++) {
                    const float4 t = xs[xswz<F4>(i * F4 + j * (EPW / 4) + f)];
                    xv[4 * f] = t.x;
                    xv[4 * f + 1] = t.y;
                    xv[4 * f + 2] = t.z;
                    xv[4 * f + 3] = t.w;
                }
#pragma unroll
                for (int e = 0; e < EPW; e++) sx += xv[e];
#pragma unroll
                for (int r = 0; r < MQ_R; r++) {
                    const u32 w = j == 0 ? wv[r].x : j == 1 ? wv[r].y : j == 2 ? wv[r].z : wv[r].w;
                    u32 ms[SUB];
#pragma unroll
                    for (int s = 0; s < SUB; s++) ms[s] = (w >> (BITS * s)) & MASK;
                    float a = qx[r];
#pragma unroll
                    for (int e = 0; e < EPW; e++) a = fmaf(byte_f(ms[e % SUB], e / SUB), xv[e], a);
                    qx[r] = a;
                }
            }
#pragma unroll
            for (int r = 0; r < MQ_R; r++) acc[r] = fmaf(sc[r], qx[r], fmaf(bi[r], sx, acc[r]));
        }
        if (split == 1) {
#pragma unroll
            for (int r = 0; r < MQ_R; r++) {
                const float v = warp_sum(acc[r]);
                if (lane == 0 && r0 + r < m.rows) y[r0 + r] = v;
            }
            continue;
        }
#pragma unroll
        for (int r = 0; r < MQ_R; r++) {
            const float v = warp_sum(acc[r]);
            if (lane == 0) part_sum[wid][r] = v;
        }
        __syncthreads();
        if (part == 0 && lane < MQ_R && r0 + lane < m.rows) {
            float t = part_sum[wid][lane];
            for (int q = 1; q < split; q++) t += part_sum[wid + q][lane];
            y[r0 + lane] = t;
        }
        __syncthreads();
    }
}

#define MQ_SET 4  // most matrices in one matvec_q launch

// Up to MQ_SET quantized matrices of the same cols that read the same
// vector, each with its output: matrix i takes the blocks
// [first[i], first[i + 1]) of the grid. Kept in step with `MatSet` in
// cuda/matrix.rs.
struct MatSet {
    Mat m[MQ_SET];
    u64 y[MQ_SET];
    int first[MQ_SET + 1];
    int count;
};

// y_i[rows_i] = W_i·x (one token, quantized, see matvec_q_t) for the
// matrices of `s`, or W_i·(silu(x) ⊙ u) when `u` is not null. Each block
// works on the matrix whose range holds it (the format may differ from
// one matrix to the next). Dynamic shared memory cols·4 bytes, blocks of
// 64 or 256 threads, grid first[count] blocks.
extern "C" __global__ void __launch_bounds__(256) matvec_q(MatSet s, const float* x, const float* u) {
    GRID_DEP();
    extern __shared__ float4 xs[];
    const int b = blockIdx.x;
    Mat m = s.m[0];
    u64 y = s.y[0];
    int b0 = s.first[0], b1 = s.first[1];
#pragma unroll
    for (int i = 1; i < MQ_SET; i++) {
        if (i < s.count && b >= s.first[i]) {
            m = s.m[i];
            y = s.y[i];
            b0 = s.first[i];
            b1 = s.first[i + 1];
        }
    }
    float* yp = (float*)y;
    switch (m.fmt) {
        case FMT_Q2: matvec_q_t<2, false>(m, x, u, yp, xs, b - b0, b1 - b0); break;
        case FMT_Q4: matvec_q_t<4, false>(m, x, u, yp, xs, b - b0, b1 - b0); break;
        case FMT_Q8: matvec_q_t<8, false>(m, x, u, yp, xs, b - b0, b1 - b0); break;
        case FMT_Q2 + FMT_F16_SCALES: matvec_q_t<2, true>(m, x, u, yp, xs, b - b0, b1 - b0); break;
        case FMT_Q4 + FMT_F16_SCALES: matvec_q_t<4, true>(m, x, u, yp, xs, b - b0, b1 - b0); break;
        case FMT_Q8 + FMT_F16_SCALES: matvec_q_t<8, true>(m, x, u, yp, xs, b - b0, b1 - b0); break;
        default: break;
    }
}

#define GM_BM 64
#define GM_BN 64
#define GM_BK 32

// Eight consecutive weights of a row from column c (c a multiple of 8;
// zeros past the end or for a dead row).
template <int FMT, bool F16S>
__device__ __forceinline__ void load8(const Row& row, bool live, int c, int cols, int gs_shift, float (&w)[8]) {
    const int BITS = Fmt<FMT>::BITS;
    if (live && BITS && c + 8 <= cols) {
        const int g = c >> gs_shift;
        const float sc = scale_of(row.s, g, F16S), bi = scale_of(row.b, g, F16S);
        const u32* words = (const u32*)row.w;
        if (BITS == 4) {
            const u32 word = words[c >> 3];
#pragma unroll
            for (int e = 0; e < 8; e++) w[e] = fmaf(level<4>(word, e), sc, bi);
        } else if (BITS == 8) {
            const u32 a = words[c >> 2], b = words[(c >> 2) + 1];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                w[e] = fmaf(level<8>(a, e), sc, bi);
                w[4 + e] = fmaf(level<8>(b, e), sc, bi);
            }
        } else {
            const u32 word = words[c >> 4];
            const int k0 = c & 15;
#pragma unroll
            for (int e = 0; e < 8; e++) w[e] = fmaf(level<2>(word, k0 + e), sc, bi);
        }
        return;
    }
#pragma unroll
    for (int e = 0; e < 8; e++) w[e] = live && c + e < cols ? row_get<FMT, F16S>(row, c + e, gs_shift) : 0.0f;
}

// The tiles live in the kernel (one copy, whichever format runs).
template <int FMT, bool F16S>
__device__ __forceinline__ void gemm_t(const Mat& m, const float* x, float* y, int n, float (*ws)[GM_BM + 4],
                                       float (*xs)[GM_BN + 4]) {
    const int tid = threadIdx.x;
    const int row0 = blockIdx.x * GM_BM, tok0 = blockIdx.y * GM_BN;
    const int tr = tid >> 4, tc = tid & 15;
    // Loader: row (and token) `lr` of the tile, columns lc..lc+8.
    const int lr = tid >> 2, lc = (tid & 3) * 8;
    const bool rlive = row0 + lr < m.rows;
    const Row row = mat_row(m, rlive ? row0 + lr : 0);
    const bool tlive = tok0 + lr < n;
    const float* xrow = x + (i64)(tlive ? tok0 + lr : 0) * m.cols;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < m.cols; k0 += GM_BK) {
        float w8[8];
        load8<FMT, F16S>(row, rlive, k0 + lc, m.cols, m.gs_shift, w8);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            ws[lc + e][lr] = w8[e];
            const int c = k0 + lc + e;
            xs[lc + e][lr] = tlive && c < m.cols ? xrow[c] : 0.0f;
        }
        __syncthreads();
        float part[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) part[i][j] = 0.0f;
#pragma unroll 8
        for (int k = 0; k < GM_BK; k++) {
            const float4 a = *(const float4*)&ws[k][tr * 4];
            const float4 b = *(const float4*)&xs[k][tc * 4];
            const float av[4] = {a.x, a.y, a.z, a.w};
            const float bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) part[i][j] = fmaf(av[i], bv[j], part[i][j]);
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[i][j] += part[i][j];
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int r = row0 + tr * 4 + i, t = tok0 + tc * 4 + j;
            if (r < m.rows && t < n) y[(i64)t * m.rows + r] = acc[i][j];
        }
}

// y[n, rows] = x[n, cols] · Wᵀ for any n: grid (rows/64, n/64), 256 threads.
extern "C" __global__ void __launch_bounds__(256) gemm(Mat m, const float* x, float* y, int n) {
    GRID_DEP();
    __shared__ __align__(16) float ws[GM_BK][GM_BM + 4];
    __shared__ __align__(16) float xs[GM_BK][GM_BN + 4];
    FOR_FMT(m.fmt, (gemm_t<F, S>(m, x, y, n, ws, xs)));
}

// y[t] = row tokens[t] of the table, dequantized: grid (cols/256, n).
extern "C" __global__ void embed(Mat m, const u32* tokens, float* y) {
    GRID_DEP();
    const int t = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= m.cols) return;
    const Row row = mat_row(m, (int)tokens[t]);
    float v = 0.0f;
    FOR_FMT(m.fmt, (v = row_get<F, S>(row, c, m.gs_shift)));
    y[(i64)t * m.cols + c] = v;
}
