// Base-module kernels that prepare the inputs of the tensor-core
// products (tensor.cu, moe.cu): the split of activation rows into f16
// parts (to_half) and the grouping of a resident prefill's (token,
// expert) pairs by expert on the device (moe_count, moe_scatter).

#if FMT_GROUP_ON(FG_BASE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// One row of to_half, its columns in blocks of PB (1: as they are; 4, 8,
// 16: the elements of one packed word of 8-, 4-, 2-bit weights), each
// block stored as e0, e(PB/2), e1, e(PB/2 + 1), ...: the order in which
// tc_store_w unpacks a word's levels two at a time ((w >> bits·j) & mask
// holds levels j and j + PB/2). Weights and activations take the same
// order, so the products' sums are over the same pairs.
template <int PB>
__device__ __forceinline__ void to_half_row(const float* xr, u16* hi, u16* lo, float* sum, int cols, int gs_shift,
                                            float s) {
    const int lane = threadIdx.x & 31;
    const int U = PB < 4 ? 4 : PB;  // elements a lane takes at once
    const int units = cols / U;
    // Units per quantization group (a power of two): with sum, a group of
    // up to 32 units is summed within its segment of lanes, so that one
    // pass of the warp finishes 32/per groups; a longer group over
    // several passes.
    const int per = sum ? (1 << gs_shift) / U : 0;
    float part = 0.0f;
    for (int u0 = 0; u0 < units; u0 += 32) {
        const int u = u0 + lane;
        if (u < units) {
            float f[U];
#pragma unroll
            for (int j = 0; j < U; j += 4) {
                const float4 v = ((const float4*)xr)[(u * U + j) >> 2];
                f[j] = v.x * s;
                f[j + 1] = v.y * s;
                f[j + 2] = v.z * s;
                f[j + 3] = v.w * s;
            }
            u32 h[U / 2], l[U / 2];
#pragma unroll
            for (int j = 0; j < U / 2; j++) {
                // The pair this word of output holds.
                const float a = PB >= 4 ? f[(2 * j) / PB * PB + j % (PB / 2)] : f[2 * j];
                const float b = PB >= 4 ? f[(2 * j) / PB * PB + j % (PB / 2) + PB / 2] : f[2 * j + 1];
                split_f16x2(a, b, h[j], l[j]);
            }
#pragma unroll
            for (int j = 0; j < U / 2; j += 2) {
                uint2 o;
                o.x = h[j];
                o.y = h[j + 1];
                ((uint2*)hi)[(u * U) / 4 + j / 2] = o;
                o.x = l[j];
                o.y = l[j + 1];
                ((uint2*)lo)[(u * U) / 4 + j / 2] = o;
            }
#pragma unroll
            for (int j = 0; j < U; j += 4) part += (f[j] + f[j + 1]) + (f[j + 2] + f[j + 3]);
        }
        if (!sum) continue;
        if (per <= 32) {
            for (int o = per >> 1; o > 0; o >>= 1) part += __shfl_xor_sync(FULL_MASK, part, o);
            if (u < units && (lane & (per - 1)) == 0) sum[(u * U) >> gs_shift] = part;
            part = 0.0f;
        } else if (((u0 + 32) & (per - 1)) == 0) {
            part = warp_sum(part);
            if (lane == 0) sum[(u0 * U) >> gs_shift] = part;
            part = 0.0f;
        }
    }
}
#endif

#if FMT_GROUP_ON(FG_BASE)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800  // cvt.rn.f16x2.f32
// Row r of to_half, by one warp.
__device__ __forceinline__ void to_half_warp(const float* x, int r, u16* hi, u16* lo, float* inv, float* sum,
                                             int cols, int gs_shift, int pb) {
    const int lane = threadIdx.x & 31;
    const float* xr = x + (i64)r * cols;
    const float4* x4 = (const float4*)xr;
    const int c4 = cols >> 2;
    float m = 0.0f;
    for (int c = lane; c < c4; c += 32) {
        const float4 v = x4[c];
        m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    m = warp_max(m);
    int e = 0;
    if (m > 0.0f && m <= 3.0e38f) {
        const int ex = (int)((__float_as_uint(m) >> 23) & 0xffu) - 126;  // m < 2^ex
        e = min(14 - ex, 126);
    }
    // 2^e and 2^-e, exactly.
    const float s = __uint_as_float((u32)(e + 127) << 23);
    if (lane == 0) inv[r] = __uint_as_float((u32)(127 - e) << 23);
    u16* h = hi + (i64)r * cols;
    u16* l = lo + (i64)r * cols;
    float* sr = sum ? sum + (i64)r * (cols >> gs_shift) : (float*)0;
    switch (pb) {
        case 4: to_half_row<4>(xr, h, l, sr, cols, gs_shift, s); break;
        case 8: to_half_row<8>(xr, h, l, sr, cols, gs_shift, s); break;
        case 16: to_half_row<16>(xr, h, l, sr, cols, gs_shift, s); break;
        default: to_half_row<1>(xr, h, l, sr, cols, gs_shift, s); break;
    }
}
#endif

// For the rows r = rows[i] (r = i without a list), i < n: hi[r] + lo[r] =
// x[r]·2^e_r in f16 parts, in blocks of `pb` columns ordered as
// to_half_row says, inv[r] = 2^-e_r, with e_r chosen so that the row's
// largest magnitude becomes less than 2^14 (0 for a row of zeros); with
// sum (gs_shift ≥ 4), sum[r][g] = Σ of group g of x[r]·2^e_r. One warp
// per row, 4 per block; cols a multiple of 16 and of the group, rows
// 16-byte aligned.
extern "C" __global__ void __launch_bounds__(128) to_half(const float* x, const int* rows, u16* hi, u16* lo,
                                                          float* inv, float* sum, int n, int cols, int gs_shift,
                                                          int pb) {
    GRID_DEP();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const int i = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (i >= n) return;
    to_half_warp(x, rows ? rows[i] : i, hi, lo, inv, sum, cols, gs_shift, pb);
#endif
}

// A batched decode step's routing and its input's split in one launch:
// block i's first warp is moe_route_warp's block i (routing logits row i,
// or the hint past n), its second to_half's row i of x (i < n, no row
// list). Grid rows, 64 threads.
extern "C" __global__ void __launch_bounds__(64)
    moe_route_split(const float* logits, u32* ids, float* wts, int E, int k, int norm, const float* hint, int n,
                    const float* x, u16* hi, u16* lo, float* inv, float* sum, int cols, int gs_shift, int pb) {
    GRID_DEP();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (threadIdx.x < 32) {
        route_warp(logits, ids, wts, E, k, norm, hint, n);
    } else if ((int)blockIdx.x < n) {
        to_half_warp(x, blockIdx.x, hi, lo, inv, sum, cols, gs_shift, pb);
    }
#endif
}
#endif

// Grouping the pairs by expert on the device (a resident model's prefill:
// no round trip through the host). moe_count: counts[e] = pairs routed to
// expert e; moe_scatter: starts[e] = Σ counts[e' < e] and pairs[starts[e]
// + r] = the r-th pair (in ascending order) routed to e, as the host's
// grouping makes them. Grid E, 256 threads each.
#if FMT_GROUP_ON(FG_BASE)
__device__ __forceinline__ int block_sum_int(int v, int* sh) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    __syncthreads();
    if (l == 0) sh[w] = v;
    __syncthreads();
    int t = 0;
    for (int i = 0; i < nw; i++) t += sh[i];
    return t;
}

extern "C" __global__ void moe_count(const u32* ids, int np, int* counts) {
    GRID_DEP();
    __shared__ int sh[32];
    const u32 e = blockIdx.x;
    int c = 0;
    for (int i = threadIdx.x; i < np; i += blockDim.x) c += ids[i] == e;
    c = block_sum_int(c, sh);
    if (threadIdx.x == 0) counts[e] = c;
}

extern "C" __global__ void moe_scatter(const u32* ids, int np, const int* counts, int* starts, int* pairs) {
    GRID_DEP();
    __shared__ int sh[32];
    __shared__ int warp_n[32];
    const u32 e = blockIdx.x;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int before = 0;
    for (int i = threadIdx.x; i < (int)e; i += blockDim.x) before += counts[i];
    const int start = block_sum_int(before, sh);
    if (threadIdx.x == 0) starts[e] = start;
    int done = 0;
    for (int base = 0; base < np; base += blockDim.x) {
        const int i = base + threadIdx.x;
        const bool mine = i < np && ids[i] == e;
        const u32 ballot = __ballot_sync(FULL_MASK, mine);
        __syncthreads();
        if (lane == 0) warp_n[w] = __popc(ballot);
        __syncthreads();
        int off = 0, all = 0;
        for (int j = 0; j < nw; j++) {
            off += j < w ? warp_n[j] : 0;
            all += warp_n[j];
        }
        if (mine) pairs[start + done + off + __popc(ballot & ((1u << lane) - 1u))] = i;
        done += all;
    }
}
#endif
