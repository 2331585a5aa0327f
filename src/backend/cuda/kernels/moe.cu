// Routed experts on the device: the router (top-k over the router logits),
// the grouped expert matrix products, and the weighted combine.
//
// A "pair" p = t·k + j is token t's j-th expert. The expert kernels take
// groups of pairs that share an expert: either one group per pair with the
// expert found through `table[ids[p]]` (all experts resident: no host
// round trip), or groups made on the host (`grp_*`, `pairs`). Each pair's
// arithmetic is the same either way, so results do not depend on which.

// The index of the largest of v[0..n) over the block (ties: the lower
// index); sh_v / sh_i hold 32 entries.
__device__ int block_argmax(const float* v, int n, float* sh_v, int* sh_i) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float best = NEG_INF;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float x = v[i];
        if (x > best || (x == best && i < bi)) {
            best = x;
            bi = i;
        }
    }
    warp_argmax(best, bi);
    __syncthreads();
    if (lane == 0) {
        sh_v[w] = best;
        sh_i[w] = bi;
    }
    __syncthreads();
    best = lane < nw ? sh_v[lane] : NEG_INF;
    bi = lane < nw ? sh_i[lane] : 0x7fffffff;
    warp_argmax(best, bi);
    return bi;
}

#define ROUTE_MAXK 64

// One block per token. mode 0: softmax over all experts → top-k →
// renormalize if `norm`. mode 1 (DeepSeek noaux_tc): sigmoid scores;
// selection on score + bias by groups (group score = sum of its top 2),
// keep `topk_group` groups (the others' experts count as 0), top-k; the
// weights are the unbiased scores, over their sum + 1e-20 if `norm`, times
// `scale`. ids, wts [n, k]. Dynamic shared memory: 2E + n_group floats.
extern "C" __global__ void moe_route(const float* logits, const float* bias, u32* ids, float* wts, int E, int k,
                                     int mode, int norm, int n_group, int topk_group, float scale) {
    extern __shared__ float shm[];
    float* p = shm;       // [E] probabilities / scores
    float* v = shm + E;   // [E] what selection looks at
    float* gsc = v + E;   // [n_group]
    __shared__ float sh[32], sh_v[32];
    __shared__ int sh_i[32], sel[ROUTE_MAXK];
    __shared__ int keep[64];
    const float* l = logits + (i64)blockIdx.x * E;
    if (mode == 0) {
        float mx = NEG_INF;
        for (int i = threadIdx.x; i < E; i += blockDim.x) mx = fmaxf(mx, l[i]);
        mx = block_max(mx, sh);
        float s = 0.0f;
        for (int i = threadIdx.x; i < E; i += blockDim.x) {
            const float e = expf(l[i] - mx);
            p[i] = e;
            s += e;
        }
        s = block_sum(s, sh);
        for (int i = threadIdx.x; i < E; i += blockDim.x) {
            p[i] = p[i] / s;
            v[i] = p[i];
        }
        __syncthreads();
    } else {
        for (int i = threadIdx.x; i < E; i += blockDim.x) {
            const float sc = 1.0f / (1.0f + expf(-l[i]));
            p[i] = sc;
            v[i] = sc + (bias ? bias[i] : 0.0f);
        }
        __syncthreads();
        const int per = E / n_group;
        for (int g = threadIdx.x; g < n_group; g += blockDim.x) {
            float a = NEG_INF, b = NEG_INF;
            for (int i = 0; i < per; i++) {
                const float x = v[g * per + i];
                if (x > a) {
                    b = a;
                    a = x;
                } else if (x > b) {
                    b = x;
                }
            }
            gsc[g] = per > 1 ? a + b : a;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int g = 0; g < n_group; g++) keep[g] = 0;
            for (int r = 0; r < topk_group; r++) {
                int bi = -1;
                float best = NEG_INF;
                for (int g = 0; g < n_group; g++)
                    if (!keep[g] && (bi < 0 || gsc[g] > best)) {
                        best = gsc[g];
                        bi = g;
                    }
                if (bi >= 0) keep[bi] = 1;
            }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < E; i += blockDim.x)
            if (!keep[i / per]) v[i] = 0.0f;
        __syncthreads();
    }
    for (int j = 0; j < k; j++) {
        const int idx = block_argmax(v, E, sh_v, sh_i);
        if (threadIdx.x == 0) {
            sel[j] = idx;
            v[idx] = NEG_INF;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int j = 0; j < k; j++) sum += p[sel[j]];
        const float den = mode == 0 ? sum : sum + 1e-20f;
        for (int j = 0; j < k; j++) {
            float w = p[sel[j]];
            if (norm) w /= den;
            if (mode == 1) w *= scale;
            ids[(i64)blockIdx.x * k + j] = (u32)sel[j];
            wts[(i64)blockIdx.x * k + j] = w;
        }
    }
}

// Byte offsets of the nine components inside one expert (gate, up, down ×
// weight, scales, biases), the weight format, log2 of the group size, and
// whether rows are 16-byte aligned. Kept in step with cuda/moe.rs.
struct ELayout {
    i64 off[9];
    int fmt, gs_shift, vec, pad;
};

struct Group {
    const char* base;  // the expert's bytes
    int start, count;  // its pairs: pairs[start .. start + count] (or `start` alone)
};

__device__ __forceinline__ Group moe_group(int g, const u64* grp_ptr, const int* grp_start, const int* grp_count,
                                           const u32* ids, const u64* table) {
    Group G;
    if (ids) {
        G.base = (const char*)table[ids[g]];
        G.start = g;
        G.count = 1;
    } else {
        G.base = (const char*)grp_ptr[g];
        G.start = grp_start[g];
        G.count = grp_count[g];
    }
    return G;
}

// Row r of matrix `which` (0 gate, 1 up, 2 down) of an expert.
__device__ __forceinline__ Row expert_row(const char* base, const ELayout& L, int which, int r, int cols) {
    Row row;
    const int groups = cols >> L.gs_shift;
    row.w = base + L.off[3 * which] + (i64)r * row_bytes(L.fmt, cols);
    row.s = (const u16*)(base + L.off[3 * which + 1]) + (i64)r * groups;
    row.b = (const u16*)(base + L.off[3 * which + 2]) + (i64)r * groups;
    return row;
}

// The pair of a group's i-th token.
__device__ __forceinline__ int group_pair(const Group& G, const int* pairs, int i) {
    return pairs ? pairs[G.start + i] : G.start + i;
}

// h[p] = silu(gate·x[t(p)]) ⊙ up·x[t(p)] for the group's pairs, one at a
// time: each warp takes MV_R/2 rows of gate and the same rows of up.
// Grid (inter/(8·MV_R/2), groups), 256 threads.
template <int FMT, bool F16S>
__device__ __forceinline__ void moe_up_t(const ELayout& L, const float* x, float* h, const Group& G,
                                         const int* pairs, int k, int hidden, int inter) {
    const int HR = MV_R / 2;
    const int lane = threadIdx.x & 31;
    const int r0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * HR;
    if (r0 >= inter) return;
    Row rows[MV_R];
    bool live[MV_R];
#pragma unroll
    for (int r = 0; r < HR; r++) {
        live[r] = live[HR + r] = r0 + r < inter;
        const int rr = live[r] ? r0 + r : r0;
        rows[r] = expert_row(G.base, L, 0, rr, hidden);
        rows[HR + r] = expert_row(G.base, L, 1, rr, hidden);
    }
    for (int i = 0; i < G.count; i++) {
        const int p = group_pair(G, pairs, i);
        float acc[MV_R];
#pragma unroll
        for (int r = 0; r < MV_R; r++) acc[r] = 0.0f;
        rows_dot<FMT, F16S>(rows, live, hidden, L.gs_shift, L.vec, x + (i64)(p / k) * hidden, acc);
#pragma unroll
        for (int r = 0; r < HR; r++) {
            const float gv = warp_sum(acc[r]);
            const float uv = warp_sum(acc[HR + r]);
            if (lane == 0 && live[r]) h[(i64)p * inter + r0 + r] = silu_f(gv) * uv;
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
    moe_up(ELayout L, const float* x, float* h, const u64* grp_ptr, const int* grp_start, const int* grp_count,
           const int* pairs, const u32* ids, const u64* table, int k, int hidden, int inter) {
    const Group G = moe_group(blockIdx.y, grp_ptr, grp_start, grp_count, ids, table);
    FOR_FMT(L.fmt, (moe_up_t<F, S>(L, x, h, G, ids ? (const int*)0 : pairs, k, hidden, inter)));
}

// d[p] = down·h[p] for the group's pairs: each warp takes MV_R rows of
// down. Grid (hidden/(8·MV_R), groups), 256 threads.
template <int FMT, bool F16S>
__device__ __forceinline__ void moe_down_t(const ELayout& L, const float* h, float* d, const Group& G,
                                           const int* pairs, int hidden, int inter) {
    const int lane = threadIdx.x & 31;
    const int r0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * MV_R;
    if (r0 >= hidden) return;
    Row rows[MV_R];
    bool live[MV_R];
#pragma unroll
    for (int r = 0; r < MV_R; r++) {
        live[r] = r0 + r < hidden;
        rows[r] = expert_row(G.base, L, 2, live[r] ? r0 + r : r0, inter);
    }
    for (int i = 0; i < G.count; i++) {
        const int p = group_pair(G, pairs, i);
        float acc[MV_R];
#pragma unroll
        for (int r = 0; r < MV_R; r++) acc[r] = 0.0f;
        rows_dot<FMT, F16S>(rows, live, inter, L.gs_shift, L.vec, h + (i64)p * inter, acc);
#pragma unroll
        for (int r = 0; r < MV_R; r++) {
            const float v = warp_sum(acc[r]);
            if (lane == 0 && live[r]) d[(i64)p * hidden + r0 + r] = v;
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
    moe_down(ELayout L, const float* h, float* d, const u64* grp_ptr, const int* grp_start, const int* grp_count,
             const int* pairs, const u32* ids, const u64* table, int hidden, int inter) {
    const Group G = moe_group(blockIdx.y, grp_ptr, grp_start, grp_count, ids, table);
    FOR_FMT(L.fmt, (moe_down_t<F, S>(L, h, d, G, ids ? (const int*)0 : pairs, hidden, inter)));
}

// out[t] += Σ_j wts[t, j]·d[t·k + j], j in order (with `assign`, out is
// known to be zero and is not read).
extern "C" __global__ void moe_combine(float* out, const float* d, const float* wts, int n, int k, int hidden,
                                       int assign) {
    GRID_LOOP(i, (i64)n * hidden) {
        const i64 t = i / hidden, c = i % hidden;
        float a = 0.0f;
        for (int j = 0; j < k; j++) a = fmaf(wts[t * k + j], d[(t * k + j) * hidden + c], a);
        out[i] = assign ? a : out[i] + a;
    }
}

// moe_down and moe_combine in one launch, for device routing: block
// (blockIdx.x, blockIdx.y) takes MV_R rows of token blockIdx.y; warp w runs
// pairs j = w, w + 8, ... through down (as moe_down does), and one thread
// per row adds them up in j order (as moe_combine does): the same
// arithmetic as the two kernels. Grid (hidden/MV_R, n), 256 threads.
#define DC_MAXK 64
template <int FMT, bool F16S>
__device__ __forceinline__ void moe_down_combine_t(const ELayout& L, const float* h, float* out, const float* wts,
                                                   const u32* ids, const u64* table, int k, int hidden, int inter,
                                                   int assign) {
    __shared__ float dots[DC_MAXK][MV_R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int t = blockIdx.y;
    const int r0 = blockIdx.x * MV_R;
    bool live[MV_R];
#pragma unroll
    for (int r = 0; r < MV_R; r++) live[r] = r0 + r < hidden;
    for (int j = warp; j < k && j < DC_MAXK; j += warps) {
        const int p = t * k + j;
        const char* base = (const char*)table[ids[p]];
        Row rows[MV_R];
        float acc[MV_R];
#pragma unroll
        for (int r = 0; r < MV_R; r++) {
            rows[r] = expert_row(base, L, 2, live[r] ? r0 + r : r0, inter);
            acc[r] = 0.0f;
        }
        rows_dot<FMT, F16S>(rows, live, inter, L.gs_shift, L.vec, h + (i64)p * inter, acc);
#pragma unroll
        for (int r = 0; r < MV_R; r++) {
            const float v = warp_sum(acc[r]);
            if (lane == 0) dots[j][r] = v;
        }
    }
    __syncthreads();
    const int r = threadIdx.x;
    if (r < MV_R && r0 + r < hidden) {
        float comb = 0.0f;
        for (int j = 0; j < k && j < DC_MAXK; j++) comb = fmaf(wts[t * k + j], dots[j][r], comb);
        float* o = out + (i64)t * hidden + r0 + r;
        *o = assign ? comb : *o + comb;
    }
}

extern "C" __global__ void __launch_bounds__(256)
    moe_down_combine(ELayout L, const float* h, float* out, const float* wts, const u32* ids, const u64* table, int k,
                     int hidden, int inter, int assign) {
    FOR_FMT(L.fmt, (moe_down_combine_t<F, S>(L, h, out, wts, ids, table, k, hidden, inter, assign)));
}
