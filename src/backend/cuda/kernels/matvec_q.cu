// Quantized dense matrices for 1 to 8 tokens: `matvec_q` (one token, up
// to 4 matrices that read the same x in one launch, any quantized
// format) and `matvec_qt` (tiles of QT_TILE tokens, the matrices of one
// format). x is staged in shared memory; each 16-byte chunk of weights is
// loaded and dequantized once per tile; the scales are applied once per
// chunk. A token's row sums are bit for bit the ones it gets alone,
// whatever the tile.

#define MQ_R 4    // rows per warp
#define MQ_SET 4  // most matrices in one launch
// Tokens of a matvec_qt tile (`QT_TILE` in cuda/matrix.rs). Larger tiles
// need more registers than two blocks of 8 warps an SM can hold (T = 8:
// 254 a thread, one block an SM, 12.5% occupancy on the H100); tiles of 2
// side by side in one grid read the weights once from DRAM and again from
// L2 (BENCHMARKS.md, issue 13).
#define QT_TILE 2

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

// Stages the vectors v_t (t0 .. t0 + T − 1 of [n, cols]; past n, the
// last again) in xs [T, cols/4] (float4 p of a vector at xswz<F4>(p)), v
// = x, or silu(x) ⊙ u when `u` is not null, and each one's sum per
// 16-byte chunk of weights in sxs [T, chunks] (summed in element order,
// as a chunk's loop would). Every thread of the block runs it; it ends
// with a barrier.
template <int BITS, int T>
__device__ __forceinline__ void mq_stage(const float* x, const float* u, float4* xs, float* sxs, int cols, int t0,
                                         int n) {
    const int EPC = 128 / BITS;  // elements per 16-byte chunk
    const int F4 = EPC / 4;      // float4s of x per chunk
    const int n4 = cols >> 2;
    const int chunks = cols / EPC;
    if (!u) {
        // Straight copies, all in flight at once.
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float4* src = (const float4*)x + (i64)min(t0 + t, n - 1) * n4;
            for (int p = threadIdx.x; p < n4; p += blockDim.x) cp_async16(xs + t * n4 + xswz<F4>(p), src + p);
        }
        cp_async_wait();
    } else {
        // MQ_LOADS float4s of x and of u a thread loaded before any is used.
        const int MQ_LOADS = 4;
#pragma unroll
        for (int t = 0; t < T; t++) {
            const i64 row = (i64)min(t0 + t, n - 1) * n4;
            for (int p0 = threadIdx.x; p0 < n4; p0 += MQ_LOADS * blockDim.x) {
                float4 a[MQ_LOADS], b[MQ_LOADS];
#pragma unroll
                for (int k = 0; k < MQ_LOADS; k++) {
                    const int p = p0 + k * blockDim.x;
                    if (p < n4) {
                        a[k] = __ldg((const float4*)x + row + p);
                        b[k] = __ldg((const float4*)u + row + p);
                    }
                }
#pragma unroll
                for (int k = 0; k < MQ_LOADS; k++) {
                    const int p = p0 + k * blockDim.x;
                    if (p < n4) {
                        float4 v;
                        v.x = silu_f(a[k].x) * b[k].x;
                        v.y = silu_f(a[k].y) * b[k].y;
                        v.z = silu_f(a[k].z) * b[k].z;
                        v.w = silu_f(a[k].w) * b[k].w;
                        xs[t * n4 + xswz<F4>(p)] = v;
                    }
                }
            }
        }
    }
    __syncthreads();
    for (int q = threadIdx.x; q < T * chunks; q += blockDim.x) {
        const int t = q / chunks, i = q - t * chunks;
        float s = 0.0f;
#pragma unroll
        for (int f = 0; f < F4; f++) {
            const float4 v = xs[t * n4 + xswz<F4>(i * F4 + f)];
            s += v.x;
            s += v.y;
            s += v.z;
            s += v.w;
        }
        sxs[q] = s;
    }
    __syncthreads();
}

// One lane's 16-byte chunk of each of MQ_R rows with its scales.
struct MqChunk {
    uint4 wv[MQ_R];
    float sc[MQ_R], bi[MQ_R];
};

// Chunk i of the rows (EPC elements a chunk: group of its first element).
template <int BITS, bool F16S>
__device__ __forceinline__ MqChunk mq_load(const Row (&rows)[MQ_R], int i, int gs_shift) {
    const int g = (i * (128 / BITS)) >> gs_shift;
    MqChunk c;
#pragma unroll
    for (int r = 0; r < MQ_R; r++) {
        c.wv[r] = __ldg((const uint4*)rows[r].w + i);
        c.sc[r] = scale_of(rows[r].s, g, F16S);
        c.bi[r] = scale_of(rows[r].b, g, F16S);
    }
    return c;
}

// acc[t][r] += this lane's share of Σ_c W_r[c]·v_t[c] for the MQ_R rows,
// over chunks i0, i0 + step, ... < chunks (the vectors as mq_stage left
// them). Per chunk, row and token: Σ(q·s + b)·v = s·Σq·v + b·Σv; each
// weight is dequantized once and applied to the T tokens in turn, each
// token's Σq·v in element order. With `pre`, `first` holds chunk i0
// already (mq_load).
template <int BITS, bool F16S, int T>
__device__ __forceinline__ void mq_rows(const Row (&rows)[MQ_R], int i0, int step, int chunks, int gs_shift,
                                        const float4* xs, const float* sxs, const MqChunk& first, bool pre,
                                        float (&acc)[T][MQ_R]) {
    const int EPW = 32 / BITS;  // elements per word
    const int EPC = 4 * EPW;    // elements per 16-byte chunk
    const int F4 = EPC / 4;     // float4s of x per chunk
    const int SUB = 8 / BITS;   // elements per byte
    const u32 MASK = BITS == 8 ? 0xffffffffu : BITS == 4 ? 0x0f0f0f0fu : 0x03030303u;
    const int n4 = chunks * F4;
    for (int i = i0; i < chunks; i += step) {
        const MqChunk c = pre && i == i0 ? first : mq_load<BITS, F16S>(rows, i, gs_shift);
        const uint4(&wv)[MQ_R] = c.wv;
        const float(&sc)[MQ_R] = c.sc;
        const float(&bi)[MQ_R] = c.bi;
        float qx[T][MQ_R];
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int r = 0; r < MQ_R; r++) qx[t][r] = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            u32 ms[MQ_R][SUB];
#pragma unroll
            for (int r = 0; r < MQ_R; r++) {
                const u32 w = j == 0 ? wv[r].x : j == 1 ? wv[r].y : j == 2 ? wv[r].z : wv[r].w;
#pragma unroll
                for (int s = 0; s < SUB; s++) ms[r][s] = (w >> (BITS * s)) & MASK;
            }
#pragma unroll
            for (int f = 0; f < EPW / 4; f++) {
                // Elements 4f .. 4f + 3 of word j, dequantized once.
                float wf[MQ_R][4];
#pragma unroll
                for (int r = 0; r < MQ_R; r++)
#pragma unroll
                    for (int e = 0; e < 4; e++) wf[r][e] = byte_f(ms[r][(4 * f + e) % SUB], (4 * f + e) / SUB);
#pragma unroll
                for (int t = 0; t < T; t++) {
                    const float4 v = xs[t * n4 + xswz<F4>(i * F4 + j * (EPW / 4) + f)];
#pragma unroll
                    for (int r = 0; r < MQ_R; r++) {
                        float a = qx[t][r];
                        a = fmaf(wf[r][0], v.x, a);
                        a = fmaf(wf[r][1], v.y, a);
                        a = fmaf(wf[r][2], v.z, a);
                        a = fmaf(wf[r][3], v.w, a);
                        qx[t][r] = a;
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float sx = sxs[t * chunks + i];
#pragma unroll
            for (int r = 0; r < MQ_R; r++) acc[t][r] = fmaf(sc[r], qx[t][r], fmaf(bi[r], sx, acc[t][r]));
        }
    }
}

// y[t0 + t][rows] = W·v_t for the T tokens t0 .. t0 + T − 1 of x [n,
// cols] (tokens past n repeat the last one and store nothing), W
// quantized, every row 16-byte aligned and each lane's 16-byte chunk
// inside one group; v_t = x_t, or silu(x_t) ⊙ u_t when `u` is not null
// (the `swiglu` kernel's values). y is [n, rows]. The vectors are staged
// once per block in shared memory, with the sum of each chunk of each
// token (summed in element order, as a chunk's loop would); this block
// is block `blk` of the `nblk` that share W. The block's warps form row
// groups of `m.split` warps; each group takes MQ_R rows at a time
// (striding over the rows with the other groups), its warps the chunks i
// ≡ part (mod split) of each 32 (`split` > 1 for short wide matrices:
// more warps on fewer rows), each lane one 16-byte chunk of each row per
// step (mq_rows). The lanes' sums are reduced by a fixed
// shuffle tree, and the parts of a row added in part order, so a token's
// result is the same in every run, tile and block. Dynamic shared
// memory (`qt_smem` in cuda/matrix.rs): x [T, cols] as float4s, then the
// sums [T, chunks].
template <int BITS, bool F16S, int T>
__device__ __forceinline__ void matvec_q_t(const Mat& m, const float* x, const float* u, float* y, float4* xs,
                                           int blk, int nblk, int t0, int n) {
    const int chunks = m.cols / (128 / BITS);
    float* sxs = (float*)(xs + T * (m.cols >> 2));  // [T, chunks]
    __shared__ float part_sum[8][T][MQ_R];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int split = m.split;
    const int gpb = (blockDim.x >> 5) / split;  // row groups per block
    const int rg = wid / split, part = wid % split;
    // The first chunk of the warp's first rows (weights: no kernel writes
    // them) loads while the kernel before this one finishes.
    MqChunk first;
    const int r_first = blk * gpb * MQ_R + rg * MQ_R;
    const bool pre = r_first < m.rows && lane + 32 * part < chunks;
    if (pre) {
        Row rows[MQ_R];
#pragma unroll
        for (int r = 0; r < MQ_R; r++) rows[r] = mat_row(m, r_first + r < m.rows ? r_first + r : m.rows - 1);
        first = mq_load<BITS, F16S>(rows, lane + 32 * part, m.gs_shift);
    }
    GRID_DEP();
    mq_stage<BITS, T>(x, u, xs, sxs, m.cols, t0, n);
    // Every warp of the block runs the same iterations (the barriers of the
    // split sums); a row group past the end computes nothing.
    for (int base = blk * gpb * MQ_R; base < m.rows; base += nblk * gpb * MQ_R) {
        const int r0 = base + rg * MQ_R;
        Row rows[MQ_R];
        float acc[T][MQ_R];
#pragma unroll
        for (int r = 0; r < MQ_R; r++) {
            // A row past the end reads the last row again and is not written.
            rows[r] = mat_row(m, r0 + r < m.rows ? r0 + r : m.rows - 1);
#pragma unroll
            for (int t = 0; t < T; t++) acc[t][r] = 0.0f;
        }
        mq_rows<BITS, F16S, T>(rows, r0 < m.rows ? lane + 32 * part : chunks, 32 * split, chunks, m.gs_shift, xs, sxs,
                               first, pre && base == blk * gpb * MQ_R, acc);
        if (split == 1) {
#pragma unroll
            for (int t = 0; t < T; t++)
#pragma unroll
                for (int r = 0; r < MQ_R; r++) {
                    const float v = warp_sum(acc[t][r]);
                    if (lane == 0 && r0 + r < m.rows && t0 + t < n) y[(i64)(t0 + t) * m.rows + r0 + r] = v;
                }
            continue;
        }
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int r = 0; r < MQ_R; r++) {
                const float v = warp_sum(acc[t][r]);
                if (lane == 0) part_sum[wid][t][r] = v;
            }
        __syncthreads();
        if (part == 0 && lane < T * MQ_R) {
            const int t = lane / MQ_R, r = lane % MQ_R;
            if (r0 + r < m.rows && t0 + t < n) {
                float s = part_sum[wid][t][r];
                for (int q = 1; q < split; q++) s += part_sum[wid + q][t][r];
                y[(i64)(t0 + t) * m.rows + r0 + r] = s;
            }
        }
        __syncthreads();
    }
}

// Up to MQ_SET quantized matrices of the same cols that read the same
// vectors, each with its output: matrix i takes the blocks
// [first[i], first[i + 1]) of the grid's x. Kept in step with `MatSet` in
// cuda/format.rs.
struct MatSet {
    Mat m[MQ_SET];
    u64 y[MQ_SET];
    int first[MQ_SET + 1];
    int count;
};

// The matrix of `s` whose block range holds block b, its output, and
// b's place in the range.
__device__ __forceinline__ void set_pick(const MatSet& s, int b, Mat& m, float*& y, int& blk, int& nblk) {
    m = s.m[0];
    u64 yy = s.y[0];
    int b0 = s.first[0], b1 = s.first[1];
#pragma unroll
    for (int i = 1; i < MQ_SET; i++) {
        if (i < s.count && b >= s.first[i]) {
            m = s.m[i];
            yy = s.y[i];
            b0 = s.first[i];
            b1 = s.first[i + 1];
        }
    }
    y = (float*)yy;
    blk = b - b0;
    nblk = b1 - b0;
}

// y_i[rows_i] = W_i·x (one token, see matvec_q_t) for the matrices of
// `s`, or W_i·(silu(x) ⊙ u) when `u` is not null. Each block works on the
// matrix whose range holds it (the format may differ from one matrix to
// the next). Dynamic shared memory qt_smem(1, cols), blocks of 64 or 256
// threads, grid first[count] blocks.
#if FMT_GROUP_ON(FG_BASE)
extern "C" __global__ void __launch_bounds__(256) matvec_q(MatSet s, const float* x, const float* u) {
    extern __shared__ float4 xs[];
    Mat m;
    float* y;
    int blk, nblk;
    set_pick(s, blockIdx.x, m, y, blk, nblk);
    switch (m.fmt) {
        case FMT_Q2: matvec_q_t<2, false, 1>(m, x, u, y, xs, blk, nblk, 0, 1); break;
        case FMT_Q4: matvec_q_t<4, false, 1>(m, x, u, y, xs, blk, nblk, 0, 1); break;
        case FMT_Q8: matvec_q_t<8, false, 1>(m, x, u, y, xs, blk, nblk, 0, 1); break;
        case FMT_Q2 + FMT_F16_SCALES: matvec_q_t<2, true, 1>(m, x, u, y, xs, blk, nblk, 0, 1); break;
        case FMT_Q4 + FMT_F16_SCALES: matvec_q_t<4, true, 1>(m, x, u, y, xs, blk, nblk, 0, 1); break;
        case FMT_Q8 + FMT_F16_SCALES: matvec_q_t<8, true, 1>(m, x, u, y, xs, blk, nblk, 0, 1); break;
        default: break;
    }
}
#endif

// y_i[n, rows_i] = x[n, cols]·W_iᵀ (or (silu(x) ⊙ u)·W_iᵀ) for the
// matrices of `s`, all of this module's format, T tokens a tile: grid
// (first[count], ceil(n / T)), dynamic shared memory qt_smem(T, cols).
// 256 threads or fewer.
template <int FMT, bool F16S, int T>
__device__ __forceinline__ void matvec_qt_fmt(const MatSet& s, const float* x, const float* u, int n) {
    if constexpr (Fmt<FMT>::BITS != 0) {
        extern __shared__ float4 xs[];
        Mat m;
        float* y;
        int blk, nblk;
        set_pick(s, blockIdx.x, m, y, blk, nblk);
        matvec_q_t<Fmt<FMT>::BITS, F16S, T>(m, x, u, y, xs, blk, nblk, blockIdx.y * T, n);
    }
}

template <int T>
__device__ __forceinline__ void matvec_qt_any(const MatSet& s, const float* x, const float* u, int n) {
    FOR_FMT(s.m[0].fmt, (matvec_qt_fmt<F, S, T>(s, x, u, n)));
}

#if FMT_GROUP_ON(FG_MATVEC_Q)
extern "C" __global__ void __launch_bounds__(256) matvec_qt(MatSet s, const float* x, const float* u, int n) {
    matvec_qt_any<QT_TILE>(s, x, u, n);
}
#endif
