// Routed experts on the device: the router (top-k over the router logits),
// the grouped expert matrix products, and the weighted combine.
//
// A "pair" p = t·k + j is token t's j-th expert. With every expert
// resident and few tokens, moe_up_routed and moe_down_combine
// (moe_routed.cu) find each pair's expert through `table[ids[p]]` (no
// host round trip); otherwise
// moe_up and moe_down take groups of pairs that share an expert, made on
// the host (`grp_*`, `pairs`). Each pair's arithmetic is the same either
// way, so results do not depend on which.

// The index of the largest of v[0..n) over the block (ties: the lower
// index), NaN entries (taken) skipped; sh_v / sh_i hold 32 entries.
__device__ int block_argmax(const float* v, int n, float* sh_v, int* sh_i) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float best = NEG_INF;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float x = v[i];  // NaN: taken already (callers rank their scores with rank_key)
        if (x == x && (x > best || (x == best && i < bi))) {
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
// `scale`. mode 2 (DeepSeek-V2): mode 0's probabilities; groups scored by
// their largest, the best `topk_group` kept (the others' experts count as
// 0), top-k; weights the probabilities times `scale`. ids, wts [n, k]; with `hint` (another layer's logits [E]),
// block n routes those into row n. Dynamic shared memory: 2E + n_group
// floats.
#if FMT_GROUP_ON(FG_BASE)
extern "C" __global__ void moe_route(const float* logits, const float* bias, u32* ids, float* wts, int E, int k,
                                     int mode, int norm, int n_group, int topk_group, float scale,
                                     const float* hint, int n) {
    GRID_DEP();
    extern __shared__ float shm[];
    float* p = shm;       // [E] probabilities / scores
    float* v = shm + E;   // [E] what selection looks at
    float* gsc = v + E;   // [n_group]
    __shared__ float sh[32], sh_v[32];
    __shared__ int sh_i[32], sel[ROUTE_MAXK];
    __shared__ int keep[64];
    const float* l = (int)blockIdx.x < n ? logits + (i64)blockIdx.x * E : hint;
    if (mode == 0 || mode == 2) {
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
            v[i] = rank_key(p[i]);
        }
        __syncthreads();
        if (mode == 2) {
            // Each group scored by its largest probability.
            const int per = E / n_group;
            for (int g = threadIdx.x; g < n_group; g += blockDim.x) {
                float a = NEG_INF;
                for (int i = 0; i < per; i++) a = fmaxf(a, v[g * per + i]);
                gsc[g] = a;
            }
        }
    } else {
        for (int i = threadIdx.x; i < E; i += blockDim.x) {
            const float sc = 1.0f / (1.0f + expf(-l[i]));
            p[i] = sc;
            v[i] = rank_key(sc + (bias ? bias[i] : 0.0f));
        }
        __syncthreads();
        // Each group scored by the sum of its top 2.
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
    }
    __syncthreads();
    // Modes 1 and 2: keep the best `topk_group` groups; the others'
    // experts count as 0.
    if (mode != 0 && n_group > 1) {
        const int per = E / n_group;
        if (threadIdx.x == 0) {
            for (int g = 0; g < n_group; g++) keep[g] = 0;
            for (int r = 0; r < topk_group; r++) {
                int bi = -1;
                float best = NEG_INF;
                for (int g = 0; g < n_group; g++) {
                    const float key = rank_key(gsc[g]);
                    if (!keep[g] && (bi < 0 || key > best)) {
                        best = key;
                        bi = g;
                    }
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
            v[idx] = QNAN;  // taken
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
            if (mode != 0) w *= scale;
            ids[(i64)blockIdx.x * k + j] = (u32)sel[j];
            wts[(i64)blockIdx.x * k + j] = w;
        }
    }
}
#endif

// Softmax routing (mode 0 of moe_route) for E ≤ 32·J and k ≤ 32, one warp
// per token: lane l holds experts l, l + 32, ... in registers, and each of
// the k rounds is a warp argmax (ties to the lower index, as
// block_argmax): no shared memory, no barrier. The weights are summed in
// selection order, as in moe_route. A NaN probability ranks as −∞
// (rank_key) and weighs −∞. Grid rows, 32 threads.
template <int J>
__device__ __forceinline__ void route_warp_t(const float* l, u32* ids, float* wts, int E, int k, int norm) {
    const int lane = threadIdx.x & 31;
    float p[J];
    float mx = NEG_INF;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int i = lane + 32 * j;
        p[j] = i < E ? l[i] : NEG_INF;
        mx = fmaxf(mx, p[j]);
    }
    mx = warp_max(mx);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int i = lane + 32 * j;
        p[j] = i < E ? expf(p[j] - mx) : 0.0f;
        s += p[j];
    }
    s = warp_sum(s);
    // p[j]: the probability as selection ranks it (rank_key), NaN once
    // taken or past E.
#pragma unroll
    for (int j = 0; j < J; j++) p[j] = lane + 32 * j < E ? rank_key(p[j] / s) : QNAN;
    float sum = 0.0f, mine = 0.0f;
    int my_id = 0;
    for (int r = 0; r < k; r++) {
        float best = NEG_INF;
        int bi = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < J; j++)
            if (p[j] == p[j] && (p[j] > best || (p[j] == best && lane + 32 * j < bi))) {
                best = p[j];
                bi = lane + 32 * j;
            }
        warp_argmax(best, bi);
#pragma unroll
        for (int j = 0; j < J; j++)
            if (lane + 32 * j == bi) p[j] = QNAN;
        if (lane == r) {
            mine = best;
            my_id = bi;
        }
        sum += best;
    }
    if (lane < k) {
        ids[(i64)blockIdx.x * k + lane] = (u32)my_id;
        wts[(i64)blockIdx.x * k + lane] = norm ? mine / sum : mine;
    }
}

// One warp's routing of block blockIdx.x's row: logits row i for i < n,
// else the hint.
__device__ __forceinline__ void route_warp(const float* logits, u32* ids, float* wts, int E, int k, int norm,
                                           const float* hint, int n) {
    const float* l = (int)blockIdx.x < n ? logits + (i64)blockIdx.x * E : hint;
    if (E <= 256) {
        route_warp_t<8>(l, ids, wts, E, k, norm);
    } else if (E <= 512) {
        route_warp_t<16>(l, ids, wts, E, k, norm);
    } else {
        route_warp_t<32>(l, ids, wts, E, k, norm);
    }
}

#if FMT_GROUP_ON(FG_BASE)
extern "C" __global__ void __launch_bounds__(32)
    moe_route_warp(const float* logits, u32* ids, float* wts, int E, int k, int norm, const float* hint, int n) {
    GRID_DEP();
    route_warp(logits, ids, wts, E, k, norm, hint, n);
}
#endif

// Byte offsets of the nine components inside one expert (gate, up, down ×
// weight, scales, biases), the weight format, log2 of the group size, and
// whether rows are 16-byte aligned. Kept in step with cuda/moe.rs.
struct ELayout {
    i64 off[9];
    int fmt, gs_shift, vec, pad;
};

struct Group {
    const char* base;  // the expert's bytes
    int start, count;  // its pairs: pairs[start .. start + count]
};

__device__ __forceinline__ Group moe_group(int g, const u64* grp_ptr, const int* grp_start, const int* grp_count) {
    Group G;
    G.base = (const char*)grp_ptr[g];
    G.start = grp_start[g];
    G.count = grp_count[g];
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
    return pairs[G.start + i];
}

#define MOE_MT 4  // tokens per tile in moe_up / moe_down (MOE_MT·MV_R accumulators a lane)

// How a warp's lanes share a group's tokens. A row of at most 16 (8)
// 16-byte chunks leaves lanes 16..31 (8..31) idle in rows_dot; 2 (4)
// sets of lanes then take different tokens, each set running the chunks
// as a whole warp does (`vlane` = its lane there).
struct LaneSets {
    int n;      // sets
    int size;   // lanes per set: 32, 16 or 8
    int set;    // this lane's set
    int vlane;  // its place within the set
};

template <int FMT>
__device__ __forceinline__ LaneSets lane_sets(int vec, int cols) {
    LaneSets s;
    s.size = 32;
    if (vec) {
        const int chunks = cols / chunk_elems<FMT>();
        while (s.size > 8 && 2 * chunks <= s.size) s.size >>= 1;
    }
    const int lane = threadIdx.x & 31;
    s.n = 32 / s.size;
    s.set = lane / s.size;
    s.vlane = lane % s.size;
    return s;
}

// warp_sum within a set of `size` lanes. A set stands for a warp whose
// lanes past the set hold +0, which warp_sum's first steps add; v + 0 is
// never -0, so one add stands for them all, and then the same tree runs:
// bit for bit warp_sum. Every lane runs every shuffle (no divergent
// collectives); the steps that cross sets are not added.
__device__ __forceinline__ float set_sum(float v, int size) {
    if (size < 32) v += 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(FULL_MASK, v, o);
        if (o < size) v += u;
    }
    return v;
}

// One warp's part of moe_up or moe_down: its rows, and where a pair's
// input and output are.
struct ExpertWarp {
    Row rows[MV_R];
    bool live[MV_R];
    bool active;  // some row inside the matrix (else it only helps stage x)
    int r0;       // first output row
    int cols, gs_shift, vec;
    LaneSets ls;
    const float* in;  // pair p's input: in + (p / div)·cols
    int div;
    float* out;  // pair p's output: out + p·out_cols + r0
    int out_cols;
};

// x of a tile's tokens staged in shared memory by stage_tile: the lane's
// token t at float4 first + t·stride, its float4 p at xswz<F4>(p).
template <int F4>
struct XShared {
    const float4* xs;
    int first, stride;
    __device__ __forceinline__ float4 f4(int t, int p) const { return xs[first + t * stride + xswz<F4>(p)]; }
};

// Issues the copy of the inputs of the group's tokens i0 .. i0 + slots
// into xs [slots, cols/4] (slot q: token i0 + q, zeros past the group),
// float4 p of a slot at xswz<F4>(p): the 8 lanes of a 128-byte phase of
// an XShared read (one offset of 8 consecutive chunks of one token) hit 8
// different bank groups. Starts with a barrier (the tile before has been
// read); every thread of the block runs it, then cp_async_wait and a barrier.
// slots ≤ 32.
template <int F4>
__device__ __forceinline__ void stage_tile(float4* xs, const ExpertWarp& w, const Group& G, const int* pairs, int i0,
                                           int slots) {
    const int lane = threadIdx.x & 31, c4 = w.cols >> 2;
    // Lane q finds slot q's input row (-1: past the group).
    const int mine = lane < slots && i0 + lane < G.count ? group_pair(G, pairs, i0 + lane) / w.div : -1;
    __syncthreads();
    for (int q = 0; q < slots; q++) {
        const int row = __shfl_sync(FULL_MASK, mine, q);
        float4* dst = xs + q * c4;
        if (row < 0) {
            float4 z;
            z.x = z.y = z.z = z.w = 0.0f;
            for (int p = threadIdx.x; p < c4; p += blockDim.x) dst[xswz<F4>(p)] = z;
        } else {
            const float4* src = (const float4*)(w.in + (i64)row * w.cols);
            for (int p = threadIdx.x; p < c4; p += blockDim.x) cp_async16(dst + xswz<F4>(p), src + p);
        }
    }
}

// Tokens i0 .. i0 + n·T of the group through the warp's rows: set s takes
// i0 + s·T .. + T; a token past the group is not written (it reads token
// i0's input, or zeros when staged). UP: rows 0..MV_R/2 are gate and the
// rest the same rows of up, out = silu(gate)·up; else out = each row's
// dot. SH: x read from the block's shared copy of the tile (stage_tile;
// every warp of the block runs every tile), each lane's first weight
// chunk loaded while it is copied; else from global memory.
template <int FMT, bool F16S, int T, bool UP, bool SH>
__device__ __forceinline__ void expert_tile(const ExpertWarp& w, const Group& G, const int* pairs, int i0,
                                            float4* xsh) {
    const float* xs[T];
    int ps[T];
#pragma unroll
    for (int t = 0; t < T; t++) {
        const int i = i0 + w.ls.set * T + t;
        ps[t] = i < G.count ? group_pair(G, pairs, i) : -1;
        xs[t] = w.in;
        if (!SH) {
            const int src = ps[t] >= 0 ? ps[t] : group_pair(G, pairs, i0);
            xs[t] += (i64)(src / w.div) * w.cols;
        }
    }
    float acc[T][MV_R];
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < MV_R; r++) acc[t][r] = 0.0f;
    if (SH) {
        constexpr int F4 = chunk_elems<FMT>() / 4;
        stage_tile<F4>(xsh, w, G, pairs, i0, w.ls.n * T);
        uint4 wv[MV_R];
        if (w.active && w.ls.vlane < w.cols / chunk_elems<FMT>()) load_chunk(w.rows, w.live, w.ls.vlane, wv);
        cp_async_wait();
        __syncthreads();
        if (!w.active) return;
        XShared<F4> x;
        x.xs = xsh;
        x.stride = w.cols >> 2;
        x.first = w.ls.set * T * x.stride;
        rows_chunks_tok<FMT, F16S, T>(w.rows, w.live, w.cols, w.gs_shift, w.ls.vlane, x, true, wv, acc);
    } else {
        rows_dot_tok<FMT, F16S, T>(w.rows, w.live, w.cols, w.gs_shift, w.vec, w.ls.vlane, xs, acc);
    }
    const int HR = UP ? MV_R / 2 : MV_R;
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < HR; r++) {
            float v = set_sum(acc[t][r], w.ls.size);
            if (UP) v = silu_f(v) * set_sum(acc[t][UP ? HR + r : r], w.ls.size);
            if (w.ls.vlane == 0 && w.live[r] && ps[t] >= 0) w.out[(i64)ps[t] * w.out_cols + w.r0 + r] = v;
        }
}

// All of the group's tokens in tiles of MOE_MT per set, the last in 2 or
// 1 (3 left: an MOE_MT tile with a slot to spare dequantizes once, 2 + 1
// twice). The tiles depend on the group alone, the same in every warp.
template <int FMT, bool F16S, bool UP, bool SH>
__device__ __forceinline__ void expert_group(const ExpertWarp& w, const Group& G, const int* pairs, float4* xsh) {
    const int n = w.ls.n;
    for (int i = 0; i < G.count;) {
        const int per = (G.count - i + n - 1) / n;  // tokens left for each set
        if (per >= 3) {
            expert_tile<FMT, F16S, MOE_MT, UP, SH>(w, G, pairs, i, xsh);
            i += n * MOE_MT;
        } else if (per == 2) {
            expert_tile<FMT, F16S, 2, UP, SH>(w, G, pairs, i, xsh);
            i += n * 2;
        } else {
            expert_tile<FMT, F16S, 1, UP, SH>(w, G, pairs, i, xsh);
            i += n;
        }
    }
}

// The group's tokens through the warp's rows, with x staged per tile in
// `xsh` (not null: the block's dynamic shared memory) or read from global
// memory (a warp past the last row then has nothing to do).
template <int FMT, bool F16S, bool UP>
__device__ __forceinline__ void expert_run(const ExpertWarp& w, const Group& G, const int* pairs, float4* xsh) {
    if (xsh) {
        expert_group<FMT, F16S, UP, true>(w, G, pairs, xsh);
    } else if (w.active) {
        expert_group<FMT, F16S, UP, false>(w, G, pairs, xsh);
    }
}

// Where moe_up / moe_down read x: the block's dynamic shared memory when
// the launch provides it (`stage`: MOE_MT·sets·cols floats, vec rows,
// cols a multiple of 32) and the group has tokens to share, else global
// memory (a group of one pair).
__device__ __forceinline__ float4* stage_buf(float4* shm, int stage, const Group& G) {
    return stage && G.count >= 2 ? shm : (float4*)0;
}

// h[p] = silu(gate·x[t(p)]) ⊙ up·x[t(p)] for the group's pairs, in tiles
// (expert_group): each warp takes MV_R/2 rows of gate and the same rows
// of up. Grid (inter/(8·MV_R/2), groups), 256 threads.
template <int FMT, bool F16S>
__device__ __forceinline__ void moe_up_t(const ELayout& L, const float* x, float* h, const Group& G,
                                         const int* pairs, int k, int hidden, int inter, float4* xsh) {
    const int HR = MV_R / 2;
    ExpertWarp w;
    w.r0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * HR;
    w.active = w.r0 < inter;
#pragma unroll
    for (int r = 0; r < HR; r++) {
        w.live[r] = w.live[HR + r] = w.r0 + r < inter;
        const int rr = w.live[r] ? w.r0 + r : w.r0;
        w.rows[r] = expert_row(G.base, L, 0, rr, hidden);
        w.rows[HR + r] = expert_row(G.base, L, 1, rr, hidden);
    }
    w.cols = hidden;
    w.gs_shift = L.gs_shift;
    w.vec = L.vec;
    w.ls = lane_sets<FMT>(L.vec, hidden);
    w.in = x;
    w.div = k;
    w.out = h;
    w.out_cols = inter;
    expert_run<FMT, F16S, true>(w, G, pairs, xsh);
}

#if FMT_GROUP_ON(FG_MOE_UP)
extern "C" __global__ void __launch_bounds__(256)
    moe_up(ELayout L, const float* x, float* h, const u64* grp_ptr, const int* grp_start, const int* grp_count,
           const int* pairs, int k, int hidden, int inter, int stage) {
    GRID_DEP();
    extern __shared__ float4 moe_xs[];
    const Group G = moe_group(blockIdx.y, grp_ptr, grp_start, grp_count);
    float4* xsh = stage_buf(moe_xs, stage, G);
    FOR_FMT(L.fmt, (moe_up_t<F, S>(L, x, h, G, pairs, k, hidden, inter, xsh)));
}
#endif

// d[p] = down·h[p] for the group's pairs, in tiles (expert_group): each
// warp takes MV_R rows of down. Grid (hidden/(8·MV_R), groups), 256
// threads.
template <int FMT, bool F16S>
__device__ __forceinline__ void moe_down_t(const ELayout& L, const float* h, float* d, const Group& G,
                                           const int* pairs, int hidden, int inter, float4* xsh) {
    ExpertWarp w;
    w.r0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * MV_R;
    w.active = w.r0 < hidden;
#pragma unroll
    for (int r = 0; r < MV_R; r++) {
        w.live[r] = w.r0 + r < hidden;
        w.rows[r] = expert_row(G.base, L, 2, w.live[r] ? w.r0 + r : w.r0, inter);
    }
    w.cols = inter;
    w.gs_shift = L.gs_shift;
    w.vec = L.vec;
    w.ls = lane_sets<FMT>(L.vec, inter);
    w.in = h;
    w.div = 1;
    w.out = d;
    w.out_cols = hidden;
    expert_run<FMT, F16S, false>(w, G, pairs, xsh);
}

#if FMT_GROUP_ON(FG_MOE_DOWN)
extern "C" __global__ void __launch_bounds__(256)
    moe_down(ELayout L, const float* h, float* d, const u64* grp_ptr, const int* grp_start, const int* grp_count,
             const int* pairs, int hidden, int inter, int stage) {
    GRID_DEP();
    extern __shared__ float4 moe_xs[];
    const Group G = moe_group(blockIdx.y, grp_ptr, grp_start, grp_count);
    float4* xsh = stage_buf(moe_xs, stage, G);
    FOR_FMT(L.fmt, (moe_down_t<F, S>(L, h, d, G, pairs, hidden, inter, xsh)));
}
#endif

// out[t] += Σ_j wts[t, j]·d[t·k + j], j in order (with `assign`, out is
// known to be zero and is not read).
#if FMT_GROUP_ON(FG_BASE)
extern "C" __global__ void moe_combine(float* out, const float* d, const float* wts, int n, int k, int hidden,
                                       int assign) {
    GRID_DEP();
    GRID_LOOP(i, (i64)n * hidden) {
        const i64 t = i / hidden, c = i % hidden;
        float a = 0.0f;
        for (int j = 0; j < k; j++) a = fmaf(wts[t * k + j], d[(t * k + j) * hidden + c], a);
        out[i] = assign ? a : out[i] + a;
    }
}
#endif
