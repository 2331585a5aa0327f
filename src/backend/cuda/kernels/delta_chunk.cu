// The GatedDeltaNet recurrence of a prefill chunk in the chunked form of
// the delta rule (the form of the Flash Linear Attention kernels, derived
// here from SPEC.md §5's recurrence), for key and value heads of DC_D
// dimensions: matrix products within DC_T tokens, the recurrence only
// from one DC_T tokens to the next. delta_scan does one token at a time.
//
// Per value head, state S [Dv, Dk] (row = value channel), tokens 1 .. T of
// a chunk after state S0, gates g_t = exp(l_t) and β_t, q and k normalized
// (delta_prep), γ_t = Π_{j≤t} g_j = exp(G_t), G_t = Σ_{j≤t} l_j. The
// token recurrence S_t = g_t S_{t−1} + u_t k_tᵀ with
// u_t = β_t (v_t − g_t S_{t−1} k_t) unrolls to
//   S_t = γ_t S0 + Σ_{j≤t} (γ_t/γ_j) u_j k_jᵀ,
//   u_t = β_t v_t − β_t γ_t S0 k_t − Σ_{j<t} A_tj u_j,
//         A_tj = β_t (k_t·k_j) γ_t/γ_j,
// so with the unit lower triangular I + A (rows = tokens):
//   W = (I + A)⁻¹ (β γ K), U0 = (I + A)⁻¹ (β V), U = U0 − W S0ᵀ,
//   o_t = S_t q_t = γ_t S0 q_t + Σ_{j≤t} P_tj u_j, P_tj = (q_t·k_j) γ_t/γ_j,
//   S_T = γ_T S0 + Σ_j (γ_T/γ_j) u_j k_jᵀ.
// Every ratio γ_t/γ_j (j ≤ t) is formed as exp(G_t − G_j) ≤ 1. Tokens past
// the end of the prompt in the last chunk enter as zeros with l = 0 and
// β = 0: their u are zero, and γ stays the last token's.
//
// delta_chunk_prep forms W, U0, P and G for every (head, chunk) at once;
// delta_chunk_scan walks the chunks of each head with DC_RB rows of the
// state per block. All in f32; only the order of the sums differs from
// delta_scan.

#define DC_T 64    // tokens per chunk
#define DC_D 128   // key and value dimensions
#define DC_LD 132  // row stride of [DC_T, DC_D] tiles in shared memory (floats)
#define DC_RB 32   // value rows of the state per block of delta_chunk_scan
#define DC_UL 36   // row stride of delta_chunk_scan's [DC_T, DC_RB] tile of U0
#define DC_AL 68   // row stride of delta_chunk_prep's A (16-byte rows)

// acc + a·b over the four lanes, x first.
__device__ __forceinline__ float dc_dot4(float4 a, float4 b, float acc) {
    return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}

// acc += u·k, lane by lane.
__device__ __forceinline__ void dc_axpy4(float u, float4 k, float4& acc) {
    acc.x = fmaf(u, k.x, acc.x);
    acc.y = fmaf(u, k.y, acc.y);
    acc.z = fmaf(u, k.z, acc.z);
    acc.w = fmaf(u, k.w, acc.w);
}

// Rows t0 .. t0 + tn of a [·, ld]-strided f32 matrix, columns col0 .. +
// 4·w, into dst (row stride dl) by cp.async; rows tn .. DC_T zero. Every
// thread of the block; complete after cp_async_wait and a barrier.
__device__ __forceinline__ void dc_load(float* dst, int dl, const float* src, i64 ld, int col0, int w, int t0, int tn) {
    for (int i = threadIdx.x; i < DC_T * w; i += blockDim.x) {
        const int t = i / w, c = i % w;
        float* d = dst + t * dl + 4 * c;
        if (t < tn)
            cp_async16(d, src + (i64)(t0 + t) * ld + col0 + 4 * c);
        else
            *(float4*)d = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

// x [n, C] after delta_prep (q | k | v per token, q and k normalized);
// gl [n, 2·Hv] = (log g, β) per token and value head. For value head h =
// blockIdx.x and chunk c = blockIdx.y: W and U0 [nc·DC_T, Hv, DC_D] rows
// c·DC_T .., P [nc, Hv, DC_T, DC_T] (zero above the diagonal), G [nc, Hv,
// DC_T]. 256 threads; dynamic shared memory DC_PREP_SMEM bytes (two
// blocks an SM: v arrives where q was once P is formed).
#define DC_PREP_SMEM ((2 * DC_T * DC_LD + DC_T * DC_AL + 3 * DC_T) * 4)
extern "C" __global__ void __launch_bounds__(256, 2)
    delta_chunk_prep(const float* x, const float* gl, float* W, float* U0, float* P, float* G, int n, int Hk, int Hv) {
    GRID_DEP();
    extern __shared__ __align__(16) float dc[];
    float* ks = dc;                 // k, then β γ k, then W
    float* qs = ks + DC_T * DC_LD;  // q, then v, β v, U0
    float* as = qs + DC_T * DC_LD;  // A [DC_T][DC_AL]
    float* gs = as + DC_T * DC_AL;
    float* bs = gs + DC_T;  // β
    float* fs = bs + DC_T;  // β γ
    const int h = blockIdx.x, c = blockIdx.y, kh = h / (Hv / Hk);
    const int t0 = c * DC_T, tn = min(DC_T, n - t0);
    const i64 C = 2 * Hk * DC_D + Hv * DC_D;
    dc_load(qs, DC_LD, x, C, kh * DC_D, DC_D / 4, t0, tn);
    dc_load(ks, DC_LD, x, C, Hk * DC_D + kh * DC_D, DC_D / 4, t0, tn);
    if (threadIdx.x < 32) {
        // G: the inclusive sum of log g over the chunk, two tokens a lane.
        const int l = threadIdx.x, ta = 2 * l, tb = 2 * l + 1;
        const float va = ta < tn ? gl[(i64)(t0 + ta) * 2 * Hv + h] : 0.0f;
        const float vb = tb < tn ? gl[(i64)(t0 + tb) * 2 * Hv + h] : 0.0f;
        const float p = va + vb;
        float sc = p;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float y = __shfl_up_sync(FULL_MASK, sc, o);
            if (l >= o) sc += y;
        }
        gs[ta] = sc - p + va;
        gs[tb] = sc;
    }
    for (int t = threadIdx.x; t < DC_T; t += blockDim.x) bs[t] = t < tn ? gl[(i64)(t0 + t) * 2 * Hv + Hv + h] : 0.0f;
    cp_async_wait();
    __syncthreads();
    for (int t = threadIdx.x; t < DC_T; t += blockDim.x) fs[t] = bs[t] * expf(gs[t]);
    // A and P: thread (ti, tj) takes rows ti + 16·a and columns tj + 16·b
    // (rows 16 apart fall in different banks).
    {
        const int ti = threadIdx.x >> 4, tj = threadIdx.x & 15;
        float ak[4][4], aq[4][4];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) ak[a][b] = aq[a][b] = 0.0f;
        for (int d = 0; d < DC_D; d += 4) {
            float4 kj[4];
#pragma unroll
            for (int b = 0; b < 4; b++) kj[b] = *(const float4*)(ks + (tj + 16 * b) * DC_LD + d);
#pragma unroll
            for (int a = 0; a < 4; a++) {
                const float4 ki = *(const float4*)(ks + (ti + 16 * a) * DC_LD + d);
                const float4 qi = *(const float4*)(qs + (ti + 16 * a) * DC_LD + d);
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    ak[a][b] = dc_dot4(ki, kj[b], ak[a][b]);
                    aq[a][b] = dc_dot4(qi, kj[b], aq[a][b]);
                }
            }
        }
        float* pc = P + ((i64)c * Hv + h) * DC_T * DC_T;
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int i = ti + 16 * a, j = tj + 16 * b;
                const float r = j <= i ? expf(gs[i] - gs[j]) : 0.0f;
                as[i * DC_AL + j] = j < i ? bs[i] * ak[a][b] * r : 0.0f;
                pc[i * DC_T + j] = aq[a][b] * r;
            }
    }
    __syncthreads();  // every read of q and k is done
    // v where q was; meanwhile the right-hand side β γ k.
    dc_load(qs, DC_LD, x, C, 2 * Hk * DC_D + h * DC_D, DC_D / 4, t0, tn);
    for (int i = threadIdx.x; i < DC_T * DC_D; i += blockDim.x) ks[(i / DC_D) * DC_LD + i % DC_D] *= fs[i / DC_D];
    cp_async_wait();
    __syncthreads();
    for (int i = threadIdx.x; i < DC_T * DC_D; i += blockDim.x) qs[(i / DC_D) * DC_LD + i % DC_D] *= bs[i / DC_D];
    __syncthreads();
    // (I + A) X = B by forward substitution, one column per thread, the
    // column in registers: rows in order, each row's sum over the rows
    // before it in four parts (j mod 4; A is zero from the diagonal on, so
    // a row's last four take the not yet solved rows times zero).
    {
        float* col = (threadIdx.x < DC_D ? ks : qs) + (threadIdx.x & (DC_D - 1));
        float X[DC_T];
#pragma unroll
        for (int i = 0; i < DC_T; i++) X[i] = col[i * DC_LD];
#pragma unroll
        for (int i = 1; i < DC_T; i++) {
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll
            for (int j = 0; j < i; j += 4) {
                const float4 a = *(const float4*)(as + i * DC_AL + j);
                s0 = fmaf(a.x, X[j], s0);
                s1 = fmaf(a.y, X[j + 1], s1);
                s2 = fmaf(a.z, X[j + 2], s2);
                s3 = fmaf(a.w, X[j + 3], s3);
            }
            X[i] -= (s0 + s1) + (s2 + s3);
        }
#pragma unroll
        for (int i = 1; i < DC_T; i++) col[i * DC_LD] = X[i];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < DC_T * DC_D / 4; i += blockDim.x) {
        const int t = i / (DC_D / 4), d = 4 * (i % (DC_D / 4));
        const i64 o = ((i64)(t0 + t) * Hv + h) * DC_D + d;
        *(float4*)(W + o) = *(const float4*)(ks + t * DC_LD + d);
        *(float4*)(U0 + o) = *(const float4*)(qs + t * DC_LD + d);
    }
    for (int t = threadIdx.x; t < DC_T; t += blockDim.x) G[((i64)c * Hv + h) * DC_T + t] = gs[t];
}

// The recurrence over the chunks of delta_chunk_prep's W, U0, P and G:
// value head h = blockIdx.x, state rows rb = blockIdx.y·DC_RB .. + DC_RB
// of ssm [Hv, Dv, Dk] (updated), out [n, Hv·Dv]. 256 threads; dynamic
// shared memory DC_SCAN_SMEM bytes. Each thread's products take a tile of
// 2 tokens × 4 rows (U, o) or 4 rows × 4 columns (S), laid out so that a
// warp's shared loads touch each bank once: shared memory traffic, not
// arithmetic, bounds this kernel.
#define DC_PL 68  // row stride of P and of U transposed (16-byte rows, banks apart)
#define DC_SCAN_SMEM ((3 * DC_T * DC_LD + DC_T * DC_PL + DC_T * DC_UL + DC_RB * DC_PL + DC_RB * DC_LD + 2 * DC_T) * 4)
extern "C" __global__ void __launch_bounds__(256)
    delta_chunk_scan(const float* x, const float* W, const float* U0, const float* P, const float* G, float* ssm,
                     float* out, int n, int Hk, int Hv) {
    GRID_DEP();
    extern __shared__ __align__(16) float dc[];
    float* ws = dc;                   // W
    float* qs = ws + DC_T * DC_LD;    // q
    float* ks = qs + DC_T * DC_LD;    // k, then (γ_T/γ_j) k_j
    float* ps = ks + DC_T * DC_LD;    // P [DC_T][DC_PL]
    float* us = ps + DC_T * DC_PL;    // U0 [DC_T][DC_UL]
    float* ut = us + DC_T * DC_UL;    // U transposed [DC_RB][DC_PL]
    float* ss = ut + DC_RB * DC_PL;   // S rows [DC_RB][DC_LD]
    float* gs = ss + DC_RB * DC_LD;   // G
    float* es = gs + DC_T;            // γ_T/γ_j
    const int h = blockIdx.x, rb = blockIdx.y * DC_RB, kh = h / (Hv / Hk);
    const i64 C = 2 * Hk * DC_D + Hv * DC_D;
    const int z = threadIdx.x, w = z >> 5, l = z & 31;
    float* sh = ssm + ((i64)h * DC_D + rb) * DC_D;
    for (int i = z; i < DC_RB * DC_D / 4; i += blockDim.x) {
        const int r = i / (DC_D / 4), d = 4 * (i % (DC_D / 4));
        *(float4*)(ss + r * DC_LD + d) = *(const float4*)(sh + r * DC_D + d);
    }
    // U and o: rows rg + 8i, tokens 8w + tq + 4b. S: rows 16·(w >> 2) +
    // rq + 4i, columns d0 .. d0 + 4.
    const int rg = l & 7, tq = l >> 3;
    const int rq = l >> 3, d0 = 4 * (l & 7) + 32 * (w & 3), r16 = 16 * (w >> 2);
    const int nc = (n + DC_T - 1) / DC_T;
    for (int c = 0; c < nc; c++) {
        const int t0 = c * DC_T, tn = min(DC_T, n - t0);
        __syncthreads();  // the state's update of the chunk before is done
        dc_load(ws, DC_LD, W + (i64)h * DC_D, (i64)Hv * DC_D, 0, DC_D / 4, t0, DC_T);
        dc_load(qs, DC_LD, x, C, kh * DC_D, DC_D / 4, t0, tn);
        dc_load(ks, DC_LD, x, C, Hk * DC_D + kh * DC_D, DC_D / 4, t0, tn);
        dc_load(us, DC_UL, U0 + (i64)h * DC_D, (i64)Hv * DC_D, rb, DC_RB / 4, t0, DC_T);
        dc_load(ps, DC_PL, P + ((i64)c * Hv + h) * DC_T * DC_T, DC_T, 0, DC_T / 4, 0, DC_T);
        if (z < DC_T / 4) cp_async16(gs + 4 * z, G + ((i64)c * Hv + h) * DC_T + 4 * z);
        cp_async_wait();
        __syncthreads();
        if (z < DC_T) es[z] = expf(gs[DC_T - 1] - gs[z]);
        // U = U0 − W S0ᵀ (into ut, transposed) and S0 q.
        float wsum[2][4], qsum[2][4];
#pragma unroll
        for (int b = 0; b < 2; b++)
#pragma unroll
            for (int i = 0; i < 4; i++) wsum[b][i] = qsum[b][i] = 0.0f;
#pragma unroll 2
        for (int d = 0; d < DC_D; d += 4) {
            float4 sv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) sv[i] = *(const float4*)(ss + (rg + 8 * i) * DC_LD + d);
#pragma unroll
            for (int b = 0; b < 2; b++) {
                const int t = 8 * w + tq + 4 * b;
                const float4 wv = *(const float4*)(ws + t * DC_LD + d);
                const float4 qv = *(const float4*)(qs + t * DC_LD + d);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    wsum[b][i] = dc_dot4(wv, sv[i], wsum[b][i]);
                    qsum[b][i] = dc_dot4(qv, sv[i], qsum[b][i]);
                }
            }
        }
#pragma unroll
        for (int b = 0; b < 2; b++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int t = 8 * w + tq + 4 * b, r = rg + 8 * i;
                ut[r * DC_PL + t] = us[t * DC_UL + r] - wsum[b][i];
            }
        __syncthreads();
        // o_t = γ_t S0 q_t + Σ_{j≤t} P_tj u_j (P is zero past the diagonal).
        {
            float o[2][4];
#pragma unroll
            for (int b = 0; b < 2; b++)
#pragma unroll
                for (int i = 0; i < 4; i++) o[b][i] = 0.0f;
#pragma unroll 2
            for (int j = 0; j < DC_T; j += 4) {
                float4 pv[2], uv[4];
#pragma unroll
                for (int b = 0; b < 2; b++) pv[b] = *(const float4*)(ps + (8 * w + tq + 4 * b) * DC_PL + j);
#pragma unroll
                for (int i = 0; i < 4; i++) uv[i] = *(const float4*)(ut + (rg + 8 * i) * DC_PL + j);
#pragma unroll
                for (int b = 0; b < 2; b++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        o[b][i] = dc_dot4(pv[b], uv[i], o[b][i]);
            }
#pragma unroll
            for (int b = 0; b < 2; b++) {
                const int t = 8 * w + tq + 4 * b;
                if (t < tn) {
                    const float gt = expf(gs[t]);
                    float* ot = out + (i64)(t0 + t) * Hv * DC_D + h * DC_D + rb;
#pragma unroll
                    for (int i = 0; i < 4; i++) ot[rg + 8 * i] = fmaf(gt, qsum[b][i], o[b][i]);
                }
            }
        }
        // S_T = γ_T S0 + Σ_j (γ_T/γ_j) u_j k_jᵀ.
        for (int i = z; i < DC_T * DC_D; i += blockDim.x) ks[(i / DC_D) * DC_LD + i % DC_D] *= es[i / DC_D];
        __syncthreads();
        {
            const float gT = expf(gs[DC_T - 1]);
            float4 acc[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float4 sv = *(const float4*)(ss + (r16 + rq + 4 * i) * DC_LD + d0);
                acc[i] = make_float4(gT * sv.x, gT * sv.y, gT * sv.z, gT * sv.w);
            }
#pragma unroll 2
            for (int j = 0; j < DC_T; j += 4) {
                float4 kv[4], uv[4];
#pragma unroll
                for (int jj = 0; jj < 4; jj++) kv[jj] = *(const float4*)(ks + (j + jj) * DC_LD + d0);
#pragma unroll
                for (int i = 0; i < 4; i++) uv[i] = *(const float4*)(ut + (r16 + rq + 4 * i) * DC_PL + j);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float u[4] = {uv[i].x, uv[i].y, uv[i].z, uv[i].w};
#pragma unroll
                    for (int jj = 0; jj < 4; jj++) dc_axpy4(u[jj], kv[jj], acc[i]);
                }
            }
            __syncthreads();  // every thread's reads of S0 are done
#pragma unroll
            for (int i = 0; i < 4; i++) *(float4*)(ss + (r16 + rq + 4 * i) * DC_LD + d0) = acc[i];
        }
    }
    __syncthreads();
    for (int i = z; i < DC_RB * DC_D / 4; i += blockDim.x) {
        const int rr = i / (DC_D / 4), d = 4 * (i % (DC_D / 4));
        *(float4*)(sh + rr * DC_D + d) = *(const float4*)(ss + rr * DC_LD + d);
    }
}
