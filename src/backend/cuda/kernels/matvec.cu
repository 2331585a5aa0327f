// Matrix products `y[n, rows] = x[n, cols] · Wᵀ` for every weight format,
// and the embedding lookup. One token (decode, routed experts): one warp
// per MV_R rows, 16-byte loads of the packed weights, dequantized in
// registers, a warp-shuffle sum at the end; x is read once per MV_R rows.
// Quantized dense matrices, 1 to 8 tokens: `matvec_q` and `matvec_qt`
// in matvec_q.cu.
// A few tokens (batched decode): `matvec_tok4/8`, matvec's warps over
// tiles of 4 or 8 tokens, each weight loaded once per tile.
// Several tokens: 64×64 output tiles through shared memory.

#define MV_R 4  // rows per warp

// Calls CALL with the compile-time format F and scale flag S of `fmt`.
// The kernels are compiled as several modules in parallel
// (cuda/compile.rs): MOEFLUX_FMT, set by the compiler options, is the one
// format code whose instantiations a module holds (F = code % 8, S = code
// ≥ 8), or -1 in the module of the kernels that need no format (FG_BASE);
// without it every format is compiled into one module.
#if !defined(MOEFLUX_FMT)
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
#elif MOEFLUX_FMT < 0
#define FOR_FMT(fmt, CALL)
#else
#define FOR_FMT(fmt, CALL)                                                               \
    if ((fmt) == MOEFLUX_FMT) {                                                          \
        const int F = MOEFLUX_FMT % FMT_F16_SCALES;                                      \
        const bool S = MOEFLUX_FMT >= FMT_F16_SCALES;                                    \
        CALL;                                                                            \
    }
#endif

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
__device__ __forceinline__ constexpr int chunk_elems() {
    return Fmt<FMT>::BITS ? 128 / Fmt<FMT>::BITS : (FMT == FMT_F32 ? 4 : 8);
}

// This lane's 16-byte chunk i of the MV_R rows (zeros for a dead row).
__device__ __forceinline__ void load_chunk(const Row (&rows)[MV_R], const bool (&live)[MV_R], int i,
                                           uint4 (&wv)[MV_R]) {
#pragma unroll
    for (int r = 0; r < MV_R; r++) {
        if (live[r]) {
            wv[r] = __ldg((const uint4*)rows[r].w + i);
        } else {
            wv[r].x = wv[r].y = wv[r].z = wv[r].w = 0u;
        }
    }
}

// x of a tile's T tokens in global memory: token t at xs[t].
template <int T>
struct XGlobal {
    const float* xs[T];
    __device__ __forceinline__ float4 f4(int t, int p) const { return ldx4(xs[t] + 4 * p); }
};

// The `vec` part of rows_dot for T tokens at once: acc[t][r] += this
// lane's share of Σ_c W_r[c]·x_t[c], x_t's float4 p read as x.f4(t, p)
// (XGlobal, or XShared in moe.cu). Each 16-byte chunk is loaded and each
// weight dequantized once, then applied to every token, so acc[t] goes
// through exactly the fmaf sequence rows_dot runs for x_t alone (bit for
// bit). `vlane` is the lane's place in the chunk loop, the lane itself in
// rows_dot (see LaneSets in moe.cu). With `first`, wv already holds chunk
// vlane (load_chunk) when vlane < the row's chunks.
template <int FMT, bool F16S, int T, class X>
__device__ __forceinline__ void rows_chunks_tok(const Row (&rows)[MV_R], const bool (&live)[MV_R], int cols,
                                                int gs_shift, int vlane, const X& x, bool first, uint4 (&wv)[MV_R],
                                                float (&acc)[T][MV_R]) {
    const int BITS = Fmt<FMT>::BITS;
    const int chunks = cols / chunk_elems<FMT>();
    for (int i = vlane; i < chunks; i += 32) {
        if (!first || i != vlane) load_chunk(rows, live, i, wv);
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
                        const float4 v = x.f4(t, (c0 >> 2) + s4);
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
                    const float4 v = x.f4(t, (c0 >> 2) + s4);
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

// rows_dot for T tokens at once, x_t at xs[t] in global memory:
// rows_chunks_tok for `vec` rows, else rows_dot per token (vlane must then
// be the lane).
template <int FMT, bool F16S, int T>
__device__ __forceinline__ void rows_dot_tok(const Row (&rows)[MV_R], const bool (&live)[MV_R], int cols,
                                             int gs_shift, int vec, int vlane, const float* const (&xs)[T],
                                             float (&acc)[T][MV_R]) {
    if (!vec) {
#pragma unroll
        for (int t = 0; t < T; t++) rows_dot<FMT, F16S>(rows, live, cols, gs_shift, 0, xs[t], acc[t]);
        return;
    }
    XGlobal<T> x;
#pragma unroll
    for (int t = 0; t < T; t++) x.xs[t] = xs[t];
    uint4 wv[MV_R];
    rows_chunks_tok<FMT, F16S, T>(rows, live, cols, gs_shift, vlane, x, false, wv, acc);
}

// The MV_R rows of a warp from r0 (rows past the end dead, pointing at r0).
__device__ __forceinline__ void warp_rows(const Mat& m, int r0, Row (&rows)[MV_R], bool (&live)[MV_R]) {
#pragma unroll
    for (int r = 0; r < MV_R; r++) {
        live[r] = r0 + r < m.rows;
        rows[r] = mat_row(m, live[r] ? r0 + r : r0);
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
    warp_rows(m, r0, rows, live);
    float acc[MV_R] = {};
    rows_dot<FMT, F16S>(rows, live, m.cols, m.gs_shift, m.vec, x, acc);
#pragma unroll
    for (int r = 0; r < MV_R; r++) {
        const float v = warp_sum(acc[r]);
        if (lane == 0 && live[r]) y[r0 + r] = v;
    }
}

// y[rows] = W·x (one token); grid rows/(8·MV_R), 256 threads.
#if FMT_GROUP_ON(FG_MATVEC)
extern "C" __global__ void __launch_bounds__(256) matvec(Mat m, const float* x, float* y) {
    GRID_DEP();
    FOR_FMT(m.fmt, (matvec_t<F, S>(m, x, y)));
}
#endif

// y[n, rows] = x[n, cols]·Wᵀ for a few tokens (batched decode): as
// matvec_t, one warp per MV_R rows, but each weight is loaded and
// dequantized once for the T tokens of the block's tile (grid y: tiles
// t0 = blockIdx.y·T), each token's sum the fmaf sequence matvec runs for
// it alone. Tokens past n repeat the last one's x and store nothing.
template <int FMT, bool F16S, int T>
__device__ __forceinline__ void matvec_tok_t(const Mat& m, const float* x, float* y, int n) {
    const int lane = threadIdx.x & 31;
    const int r0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * MV_R;
    const int t0 = blockIdx.y * T;
    if (r0 >= m.rows) return;
    Row rows[MV_R];
    bool live[MV_R];
    warp_rows(m, r0, rows, live);
    const float* xs[T];
    float acc[T][MV_R];
#pragma unroll
    for (int t = 0; t < T; t++) {
        xs[t] = x + (i64)min(t0 + t, n - 1) * m.cols;
#pragma unroll
        for (int r = 0; r < MV_R; r++) acc[t][r] = 0.0f;
    }
    rows_dot_tok<FMT, F16S, T>(rows, live, m.cols, m.gs_shift, m.vec, lane, xs, acc);
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < MV_R; r++) {
            const float v = warp_sum(acc[t][r]);
            if (lane == 0 && live[r] && t0 + t < n) y[(i64)(t0 + t) * m.rows + r0 + r] = v;
        }
}

// y[n, rows] = x[n, cols]·Wᵀ, tiles of 4 or 8 tokens; grid
// (rows/(2·MV_R), ceil(n/T)), 64 threads (2 warps), as matvec's launch.
#if FMT_GROUP_ON(FG_MATVEC)
extern "C" __global__ void __launch_bounds__(256) matvec_tok4(Mat m, const float* x, float* y, int n) {
    GRID_DEP();
    FOR_FMT(m.fmt, (matvec_tok_t<F, S, 4>(m, x, y, n)));
}
extern "C" __global__ void __launch_bounds__(256) matvec_tok8(Mat m, const float* x, float* y, int n) {
    GRID_DEP();
    FOR_FMT(m.fmt, (matvec_tok_t<F, S, 8>(m, x, y, n)));
}
#endif

#define GM_BM 128  // weight rows per block
#define GM_BN 64   // tokens per block
#define GM_BK 32   // columns per step

// Raw bits of 8 consecutive weights of a row from column c (c a multiple
// of 8), as the global loads return them; `decode8` makes them floats.
// Float formats: the elements' bits in order (f32 one a word, bf16/f16
// two a word, low half first). Quantized: the word(s) holding them,
// shifted so that the first is lowest, and the group's scale and bias
// bits in v[6], v[7] (the 8 are inside one group: groups are powers of
// two ≥ 8). All zero past the end of the row or for a dead row, which
// decodes to +0.
template <int FMT, bool F16S>
__device__ __forceinline__ void fetch8(const Row& row, bool live, int c, int cols, int gs_shift, int vec,
                                       u32 (&v)[8]) {
    const int BITS = Fmt<FMT>::BITS;
#pragma unroll
    for (int e = 0; e < 8; e++) v[e] = 0u;
    if (!live || c >= cols) return;
    if (BITS) {
        // Quantized rows are whole groups: c + 8 ≤ cols.
        const u32* words = (const u32*)row.w;
        const int g = c >> gs_shift;
        v[6] = row.s[g];
        v[7] = row.b[g];
        if (BITS == 4) {
            v[0] = words[c >> 3];
        } else if (BITS == 8) {
            v[0] = words[c >> 2];
            v[1] = words[(c >> 2) + 1];
        } else {
            v[0] = words[c >> 4] >> (2 * (c & 15));
        }
        return;
    }
    if (vec && c + 8 <= cols) {
        // 16-byte aligned: the row starts aligned and c is a multiple of 8.
        const uint4* p = (const uint4*)row.w + (FMT == FMT_F32 ? c >> 2 : c >> 3);
        const uint4 a = __ldg(p);
        v[0] = a.x;
        v[1] = a.y;
        v[2] = a.z;
        v[3] = a.w;
        if (FMT == FMT_F32) {
            const uint4 b = __ldg(p + 1);
            v[4] = b.x;
            v[5] = b.y;
            v[6] = b.z;
            v[7] = b.w;
        }
        return;
    }
#pragma unroll
    for (int e = 0; e < 8; e++) {
        if (c + e < cols) {
            if (FMT == FMT_F32) {
                v[e] = ((const u32*)row.w)[c + e];
            } else {
                v[e >> 1] |= (u32)((const u16*)row.w)[c + e] << (16 * (e & 1));
            }
        }
    }
}

// The 8 weights of `fetch8`'s bits as floats (row_get's values).
template <int FMT, bool F16S>
__device__ __forceinline__ void decode8(const u32 (&v)[8], float (&w)[8]) {
    const int BITS = Fmt<FMT>::BITS;
    if (BITS) {
        const float sc = F16S ? f16f((u16)v[6]) : bf16f((u16)v[6]);
        const float bi = F16S ? f16f((u16)v[7]) : bf16f((u16)v[7]);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float q = BITS == 8 ? level<8>(v[e >> 2], e & 3) : level<BITS == 2 ? 2 : 4>(v[0], e);
            w[e] = fmaf(q, sc, bi);
        }
    } else if (FMT == FMT_F32) {
#pragma unroll
        for (int e = 0; e < 8; e++) w[e] = __uint_as_float(v[e]);
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const u16 h = (u16)(v[e >> 1] >> (16 * (e & 1)));
            w[e] = FMT == FMT_BF16 ? bf16f(h) : f16f(h);
        }
    }
}

// Eight floats of a token's x from column c; zeros past the end or for a
// dead token. `al`: the row starts 16-byte aligned.
__device__ __forceinline__ void fetch_x8(const float* xrow, bool live, bool al, int c, int cols, float (&v)[8]) {
    if (live && al && c + 8 <= cols) {
        const float4 a = ldx4(xrow + c), b = ldx4(xrow + c + 4);
        v[0] = a.x;
        v[1] = a.y;
        v[2] = a.z;
        v[3] = a.w;
        v[4] = b.x;
        v[5] = b.y;
        v[6] = b.z;
        v[7] = b.w;
        return;
    }
#pragma unroll
    for (int e = 0; e < 8; e++) v[e] = live && c + e < cols ? xrow[c + e] : 0.0f;
}

// One GM_BM×GM_BN output tile (rows × tokens) in GM_BK-column steps. Each
// step's weights are dequantized once into shared memory (`ws[k][row]`)
// beside x (`xs[k][token]`); the next step's global loads are issued
// before this step's products, so they arrive while the FMAs run. Each
// thread holds 8 rows × 4 tokens; a warp's threads are 4 row groups × 8
// token groups, so its shared reads are broadcasts (weights) and one
// 128-byte line (x), both without bank conflicts. A step's 32 products
// go into a partial sum, added to the total once per step: the order is
// a function of cols alone, not of n or of the tile a token falls in.
template <int FMT, bool F16S>
__device__ __forceinline__ void gemm_t(const Mat& m, const float* x, float* y, int n, float (*ws)[GM_BM],
                                       float (*xs)[GM_BN]) {
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    const int row0 = blockIdx.x * GM_BM, tok0 = blockIdx.y * GM_BN;
    const int tr = (wid >> 1) * 4 + (lane >> 3);  // rows tr·8 .. tr·8+7 of the tile
    const int tc = (wid & 1) * 8 + (lane & 7);    // tokens tc·4 .. tc·4+3
    // Loaders: weight row `lr`, columns lc..lc+16 of the step; token `lt`,
    // columns lx..lx+8. A warp's 32 lanes store 32 consecutive rows (tokens).
    const int lr = tid & (GM_BM - 1), lc = (tid >> 7) * 16;
    const int lt = tid & (GM_BN - 1), lx = (tid >> 6) * 8;
    const bool rlive = row0 + lr < m.rows;
    const Row row = mat_row(m, rlive ? row0 + lr : 0);
    const bool tlive = tok0 + lt < n;
    const float* xrow = x + (i64)(tlive ? tok0 + lt : 0) * m.cols;
    const bool xal = ((u64)xrow & 15) == 0;
    u32 wr[2][8];
    float xr[8];
    fetch8<FMT, F16S>(row, rlive, lc, m.cols, m.gs_shift, m.vec, wr[0]);
    fetch8<FMT, F16S>(row, rlive, lc + 8, m.cols, m.gs_shift, m.vec, wr[1]);
    fetch_x8(xrow, tlive, xal, lx, m.cols, xr);
    float acc[8][4];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < m.cols; k0 += GM_BK) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float w8[8];
            decode8<FMT, F16S>(wr[h], w8);
#pragma unroll
            for (int e = 0; e < 8; e++) ws[lc + 8 * h + e][lr] = w8[e];
        }
#pragma unroll
        for (int e = 0; e < 8; e++) xs[lx + e][lt] = xr[e];
        __syncthreads();
        const int k1 = k0 + GM_BK;
        if (k1 < m.cols) {
            fetch8<FMT, F16S>(row, rlive, k1 + lc, m.cols, m.gs_shift, m.vec, wr[0]);
            fetch8<FMT, F16S>(row, rlive, k1 + lc + 8, m.cols, m.gs_shift, m.vec, wr[1]);
            fetch_x8(xrow, tlive, xal, k1 + lx, m.cols, xr);
        }
        float part[8][4];
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) part[i][j] = 0.0f;
#pragma unroll
        for (int k = 0; k < GM_BK; k++) {
            const float4 a0 = *(const float4*)&ws[k][tr * 8];
            const float4 a1 = *(const float4*)&ws[k][tr * 8 + 4];
            const float4 b = *(const float4*)&xs[k][tc * 4];
            const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) part[i][j] = fmaf(av[i], bv[j], part[i][j]);
        }
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[i][j] += part[i][j];
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int t = tok0 + tc * 4 + j;
        if (t >= n) continue;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int r = row0 + tr * 8 + i;
            if (r < m.rows) y[(i64)t * m.rows + r] = acc[i][j];
        }
    }
}

// y[n, rows] = x[n, cols] · Wᵀ for any n and cols > 0: grid (rows/GM_BM,
// n/GM_BN), 256 threads, two blocks an SM (≤ 128 registers).
#if FMT_GROUP_ON(FG_MATVEC)
extern "C" __global__ void __launch_bounds__(256, 2) gemm(Mat m, const float* x, float* y, int n) {
    GRID_DEP();
    __shared__ __align__(16) float ws[GM_BK][GM_BM];
    __shared__ __align__(16) float xs[GM_BK][GM_BN];
    FOR_FMT(m.fmt, (gemm_t<F, S>(m, x, y, n, ws, xs)));
}
#endif

// y[t] = row tokens[t] of the table, dequantized: grid (cols/256, n).
#if FMT_GROUP_ON(FG_MATVEC)
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
#endif
