// The routed experts of a device-routed step (every expert resident, few
// tokens: decode and batched decode): the pairs' experts found through
// `table[ids[p]]` on the device, no host round trip. The same arithmetic
// per pair as moe_up / moe_down and moe_combine (moe.cu), whose helpers
// these use.
//
// A streamed step of few pairs (decode, its experts copied into cache
// slots) takes the same kernels with `table` null: pair p's expert is
// then at `pb.p[p]`, passed with the launch, and a null address is a pair
// the CPU computes (`--hybrid`): it is skipped here (its sum is added
// later) and adds nothing to its token's combine.

// Most pairs whose expert addresses a launch carries (`PAIR_BASES` in
// cuda/moe.rs).
#define PB_MAX 32
struct PairBases {
    u64 p[PB_MAX];
};

// The expert of pair p: through the resident table, or carried.
__device__ __forceinline__ const char* pair_base(const u64* table, const u32* ids, const PairBases& pb, int p) {
    return (const char*)(table ? table[ids[p]] : pb.p[p]);
}

// moe_down and moe_combine in one launch, for device routing: block
// (blockIdx.x, blockIdx.y) takes `rpb` rows of token blockIdx.y (a
// multiple of MV_R, at most DC_ROWS: fewer when there are few tokens, so
// that the blocks fill the GPU). The work items are (pair j, MV_R rows):
// each lane set of each warp (sets of 8 or 16 lanes when a row has few
// 16-byte chunks, see lane_sets) takes one item at a time and runs it
// through down as moe_down does (the lane at place v of its set takes the
// chunks a lane v takes in a whole warp; set_sum is warp_sum bit for
// bit); then one thread per row adds the pairs up in j order, as
// moe_combine does: the same arithmetic as the two kernels. The pairs'
// expert addresses are read once per block.
// Grid (hidden/rpb, n), 256 threads.
#define DC_MAXK 64
#define DC_ROWS 32
template <int FMT, bool F16S>
__device__ __forceinline__ void moe_down_combine_t(const ELayout& L, const float* h, float* out, const float* wts,
                                                   const u32* ids, const u64* table, const PairBases& pb, int k,
                                                   int hidden, int inter, int assign, int rpb) {
    __shared__ float dots[DC_MAXK][DC_ROWS];
    __shared__ const char* bases[DC_MAXK];
    const int t = blockIdx.y;
    const int row0 = blockIdx.x * rpb;
    const int kk = min(k, DC_MAXK);
    if (threadIdx.x < kk) bases[threadIdx.x] = pair_base(table, ids, pb, t * k + threadIdx.x);
    __syncthreads();
    const LaneSets ls = lane_sets<FMT>(L.vec, inter);
    const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int groups = rpb / MV_R;  // row groups of a block
    // Item q: pair q / groups, rows (q % groups)·MV_R ...; the warps' sets
    // take items set-major, every lane runs every round (set_sum's
    // shuffles).
    const int stride = warps * ls.n;
    for (int q0 = 0; q0 < kk * groups; q0 += stride) {
        const int q = q0 + warp * ls.n + ls.set;
        const bool on = q < kk * groups;
        const int j = on ? q / groups : 0;
        const int r0 = row0 + (on ? q % groups : 0) * MV_R;
        Row rows[MV_R];
        bool live[MV_R];
        float acc[1][MV_R];
#pragma unroll
        for (int r = 0; r < MV_R; r++) {
            live[r] = on && r0 + r < hidden;
            rows[r] = expert_row(bases[j], L, 2, live[r] ? r0 + r : row0, inter);
            acc[0][r] = 0.0f;
        }
        const float* xs[1] = {h + (i64)(t * k + j) * inter};
        // A skipped pair (null) reads nothing, not even its row of h (never
        // written): its dots are zeros. (No shuffles inside: a set may skip.)
        if (bases[j]) rows_dot_tok<FMT, F16S, 1>(rows, live, inter, L.gs_shift, L.vec, ls.vlane, xs, acc);
#pragma unroll
        for (int r = 0; r < MV_R; r++) {
            const float v = set_sum(acc[0][r], ls.size);
            if (ls.vlane == 0 && on) dots[j][r0 - row0 + r] = v;
        }
    }
    __syncthreads();
    const int r = threadIdx.x;
    if (r < rpb && row0 + r < hidden) {
        float comb = 0.0f;
        for (int j = 0; j < kk; j++) comb = fmaf(wts[t * k + j], dots[j][r], comb);
        float* o = out + (i64)t * hidden + row0 + r;
        *o = assign ? comb : *o + comb;
    }
}

#if FMT_GROUP_ON(FG_MOE_DOWN_COMBINE)
extern "C" __global__ void __launch_bounds__(256)
    moe_down_combine(ELayout L, const float* h, float* out, const float* wts, const u32* ids, const u64* table,
                     PairBases pb, int k, int hidden, int inter, int assign, int rpb) {
    GRID_DEP();
    FOR_FMT(L.fmt, (moe_down_combine_t<F, S>(L, h, out, wts, ids, table, pb, k, hidden, inter, assign, rpb)));
}
#endif

// moe_up for device routing (decode: one pair per block row, ids and the
// resident table on the device): the arithmetic of moe_up's one-token
// tile (rows_dot), in a kernel that carries none of the multi-token
// paths, so that it needs few enough registers for two blocks per SM.
// Grid (inter/(8·MV_R/2), pairs), 256 threads.
template <int FMT, bool F16S>
__device__ __forceinline__ void moe_up_routed_t(const ELayout& L, const float* x, float* h, const u32* ids,
                                                const u64* table, const PairBases& pb, int k, int hidden, int inter) {
    const int HR = MV_R / 2;
    const int lane = threadIdx.x & 31;
    const int r0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * HR;
    if (r0 >= inter) return;
    const int p = blockIdx.y;
    const char* base = pair_base(table, ids, pb, p);
    if (!base) return;  // the CPU's pair: its row of h is not read
    Row rows[MV_R];
    bool live[MV_R];
#pragma unroll
    for (int r = 0; r < HR; r++) {
        live[r] = live[HR + r] = r0 + r < inter;
        const int rr = live[r] ? r0 + r : r0;
        rows[r] = expert_row(base, L, 0, rr, hidden);
        rows[HR + r] = expert_row(base, L, 1, rr, hidden);
    }
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

#if FMT_GROUP_ON(FG_MOE_UP_ROUTED)
extern "C" __global__ void __launch_bounds__(256, 2)
    moe_up_routed(ELayout L, const float* x, float* h, const u32* ids, const u64* table, PairBases pb, int k,
                  int hidden, int inter) {
    GRID_DEP();
    FOR_FMT(L.fmt, (moe_up_routed_t<F, S>(L, x, h, ids, table, pb, k, hidden, inter)));
}
#endif
