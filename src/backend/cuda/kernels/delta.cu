// The GatedDeltaNet step (SPEC.md §5): a causal depthwise conv + SiLU over
// the qkv channels, then the gated delta-rule recurrence per value head.

#define DELTA_MAXK 8  // conv kernel length ≤ 8

#define DELTA_CONV_T 16  // tokens per thread of delta_conv

// Thread (channel c, chunk q) computes tokens q·DELTA_CONV_T .. + DELTA_CONV_T
// of channel c (the conv has no recurrence: each output reads K inputs,
// the state standing for the K−1 before token 0). qkv [n, C] in; x [n, C]
// out (after SiLU); conv_w [C, K]; state [K−1, C] (oldest first): only the
// chunk-0 thread of a channel reads and then rewrites it. Each output's
// sum is formed in the same order as one thread walking the tokens would.
// Sequence z = blockIdx.z of s: rows s.off[z] .. + s.n[z] of qkv and x,
// state s.a[z]. Grid (C/128, max n/DELTA_CONV_T, s.count), 128 threads.
extern "C" __global__ void delta_conv(const float* qkv, const float* conv_w, float* x, Seqs s, int C, int K) {
    GRID_DEP();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int z = blockIdx.z, n = s.n[z];
    const int t0 = blockIdx.y * DELTA_CONV_T;
    if (c >= C || t0 >= n) return;
    qkv += (i64)s.off[z] * C;
    x += (i64)s.off[z] * C;
    float* state = s.a[z];
    // in(t') for t' in [t0 − (K−1), t0): the state's entry t' + K − 1 for
    // t' < 0, else qkv; hist[j] = in(t0 − (K−1) + j).
    float hist[DELTA_MAXK];
#pragma unroll
    for (int j = 0; j < DELTA_MAXK; j++) {
        const int t = t0 - (K - 1) + j;
        hist[j] = j >= K - 1 ? 0.0f : t < 0 ? state[(i64)(t + K - 1) * C + c] : qkv[(i64)t * C + c];
    }
    float w[DELTA_MAXK];
#pragma unroll
    for (int j = 0; j < DELTA_MAXK; j++) w[j] = j < K - 1 ? conv_w[(i64)c * K + j] : 0.0f;
    const float w_cur = conv_w[(i64)c * K + K - 1];
    const int t1 = min(n, t0 + DELTA_CONV_T);
    for (int t = t0; t < t1; t++) {
        const float cur = qkv[(i64)t * C + c];
        float acc = w_cur * cur;
#pragma unroll
        for (int j = 0; j < DELTA_MAXK - 1; j++)
            if (j < K - 1) acc += w[j] * hist[j];
        x[(i64)t * C + c] = silu_f(acc);
#pragma unroll
        for (int j = 0; j < DELTA_MAXK - 1; j++)
            if (j < K - 2) hist[j] = hist[j + 1];
        if (K > 1) {
#pragma unroll
            for (int j = 0; j < DELTA_MAXK - 1; j++)
                if (j == K - 2) hist[j] = cur;
        }
    }
    if (blockIdx.y != 0) return;
    // The new state: in(n − (K−1) + j), from the old state (read above by
    // this thread alone) where that is before token 0.
    float old[DELTA_MAXK];
#pragma unroll
    for (int j = 0; j < DELTA_MAXK; j++) old[j] = j < K - 1 ? state[(i64)j * C + c] : 0.0f;
#pragma unroll
    for (int j = 0; j < DELTA_MAXK - 1; j++) {
        if (j >= K - 1) continue;
        const int t = n - (K - 1) + j;
        float v = 0.0f;
#pragma unroll
        for (int i = 0; i < DELTA_MAXK; i++)
            if (t < 0 && i == t + K - 1) v = old[i];
        state[(i64)j * C + c] = t < 0 ? v : qkv[(i64)t * C + c];
    }
}

#define DELTA_RPW 4   // state rows per warp
#define DELTA_MAXE 8  // key dims per lane: k_dim ≤ 256

__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// What delta_step computes per token before the recurrence, for all
// tokens at once (prefill): q and k of each key head scaled to unit norm
// (q also by 1/√Dk) in place in x, and gb [n, 2·Hv] = (log g, β) per
// value head, with the arithmetic delta_step uses inline (g = exp(log g)). One warp per (token,
// key head); grid (n·Hk/4), 128 threads.
extern "C" __global__ void __launch_bounds__(128)
    delta_prep(float* x, const float* a_in, const float* b_in, const float* a_log, const float* dt_bias, float* gb,
               int n, int Hk, int Hv, int Dk, int Dv) {
    GRID_DEP();
    const int lane = threadIdx.x & 31;
    const int w = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (w >= n * Hk) return;
    const int t = w / Hk, kh = w % Hk;
    const int C = 2 * Hk * Dk + Hv * Dv;
    float* xt = x + (i64)t * C;
    float q[DELTA_MAXE], k[DELTA_MAXE];
    float qq = 0.0f, kk = 0.0f;
#pragma unroll
    for (int i = 0; i < DELTA_MAXE; i++) {
        const int c = lane + 32 * i;
        q[i] = c < Dk ? xt[kh * Dk + c] : 0.0f;
        k[i] = c < Dk ? xt[Hk * Dk + kh * Dk + c] : 0.0f;
        qq = fmaf(q[i], q[i], qq);
        kk = fmaf(k[i], k[i], kk);
    }
    qq = warp_sum(qq);
    kk = warp_sum(kk);
    const float qf = 1.0f / sqrtf(qq + 1e-6f) * (1.0f / sqrtf((float)Dk));
    const float kf = 1.0f / sqrtf(kk + 1e-6f);
#pragma unroll
    for (int i = 0; i < DELTA_MAXE; i++) {
        const int c = lane + 32 * i;
        if (c < Dk) {
            xt[kh * Dk + c] = q[i] * qf;
            xt[Hk * Dk + kh * Dk + c] = k[i] * kf;
        }
    }
    // The value heads of this key head.
    const int per = Hv / Hk;
    for (int j = lane; j < per; j += 32) {
        const int h = kh * per + j;
        gb[(i64)t * 2 * Hv + h] = -expf(a_log[h]) * softplus_f(a_in[(i64)t * Hv + h] + dt_bias[h]);
        gb[(i64)t * 2 * Hv + Hv + h] = sigmoid_f(b_in[(i64)t * Hv + h]);
    }
}

// Rows row0 .. row0 + DELTA_RPW of head state sh [Dv, Dk] in (load) or
// out of (store) the warp's registers: lane l holds columns l + 32·i.
__device__ __forceinline__ void delta_state(float (&S)[DELTA_RPW][DELTA_MAXE], float* sh, int row0, int Dv, int Dk,
                                            bool store) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < DELTA_RPW; r++)
#pragma unroll
        for (int i = 0; i < DELTA_MAXE; i++) {
            const int c = lane + 32 * i;
            const bool in = row0 + r < Dv && c < Dk;
            if (store) {
                if (in) sh[(i64)(row0 + r) * Dk + c] = S[r][i];
            } else {
                S[r][i] = in ? sh[(i64)(row0 + r) * Dk + c] : 0.0f;
            }
        }
}

// One token of delta_step through the warp's state rows (q, k
// normalized; v its rows' values; g, β the gates): S ← g·S;
// δ = β(v − S k); S ← S + δ kᵀ; o = S q, written to ot[row] by lane 0.
__device__ __forceinline__ void delta_token(float (&S)[DELTA_RPW][DELTA_MAXE], const float (&q)[DELTA_MAXE],
                                            const float (&k)[DELTA_MAXE], const float (&v)[DELTA_RPW], float g,
                                            float beta, int row0, int Dv, float* ot) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < DELTA_RPW; r++) {
        float sk = 0.0f;
#pragma unroll
        for (int i = 0; i < DELTA_MAXE; i++) {
            S[r][i] *= g;
            sk = fmaf(S[r][i], k[i], sk);
        }
        sk = warp_sum(sk);
        const float delta = beta * (v[r] - sk);
        float o = 0.0f;
#pragma unroll
        for (int i = 0; i < DELTA_MAXE; i++) {
            S[r][i] = fmaf(delta, k[i], S[r][i]);
            o = fmaf(S[r][i], q[i], o);
        }
        o = warp_sum(o);
        if (lane == 0 && row0 + r < Dv) ot[row0 + r] = o;
    }
}

// The recurrence. x [n, C] (after the conv): q (Hk·Dk) | k (Hk·Dk) | v
// (Hv·Dv) per token; a, b [n, Hv]; a_log, dt_bias [Hv]; ssm [Hv, Dv, Dk]
// (row = value channel), updated; out [n, Hv·Dv]. Sequence z =
// blockIdx.z of s: rows s.off[z] .. + s.n[z] of x, a, b and out, state
// ssm = s.b[z]. Grid (Hv, Dv/16, s.count), 128 threads: each warp keeps
// DELTA_RPW rows of the state in registers.
extern "C" __global__ void __launch_bounds__(128)
    delta_step(const float* x, const float* a_in, const float* b_in, const float* a_log, const float* dt_bias,
               float* out, Seqs s, int Hk, int Hv, int Dk, int Dv) {
    GRID_DEP();
    const int z = blockIdx.z, n = s.n[z];
    float* ssm = s.b[z];
    x += (i64)s.off[z] * (2 * Hk * Dk + Hv * Dv);
    a_in += (i64)s.off[z] * Hv;
    b_in += (i64)s.off[z] * Hv;
    out += (i64)s.off[z] * Hv * Dv;
    const int h = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = (blockIdx.y * 4 + warp) * DELTA_RPW;
    if (row0 >= Dv) return;
    const int C = 2 * Hk * Dk + Hv * Dv;
    const int kh = h / (Hv / Hk);
    const float q_scale = 1.0f / sqrtf((float)Dk);
    float S[DELTA_RPW][DELTA_MAXE];
    float* sh = ssm + (i64)h * Dv * Dk;
    delta_state(S, sh, row0, Dv, Dk, false);
    // Token t's inputs are loaded while token t − 1 is computed (the
    // chain of warp sums per token would otherwise wait on each load).
    float nq[DELTA_MAXE], nk[DELTA_MAXE], nv[DELTA_RPW], na = 0.0f, nb = 0.0f;
    auto load = [&](int t) {
        const float* xt = x + (i64)t * C;
#pragma unroll
        for (int i = 0; i < DELTA_MAXE; i++) {
            const int c = lane + 32 * i;
            nq[i] = c < Dk ? xt[kh * Dk + c] : 0.0f;
            nk[i] = c < Dk ? xt[Hk * Dk + kh * Dk + c] : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < DELTA_RPW; r++) nv[r] = row0 + r < Dv ? xt[2 * Hk * Dk + h * Dv + row0 + r] : 0.0f;
        na = a_in[(i64)t * Hv + h];
        nb = b_in[(i64)t * Hv + h];
    };
    const float A = expf(a_log[h]), dtb = dt_bias[h];
    if (n > 0) load(0);
    for (int t = 0; t < n; t++) {
        float q[DELTA_MAXE], k[DELTA_MAXE], v[DELTA_RPW];
        float qq = 0.0f, kk = 0.0f;
#pragma unroll
        for (int i = 0; i < DELTA_MAXE; i++) {
            q[i] = nq[i];
            k[i] = nk[i];
            qq = fmaf(q[i], q[i], qq);
            kk = fmaf(k[i], k[i], kk);
        }
#pragma unroll
        for (int r = 0; r < DELTA_RPW; r++) v[r] = nv[r];
        const float at = na, bt = nb;
        if (t + 1 < n) load(t + 1);
        qq = warp_sum(qq);
        kk = warp_sum(kk);
        const float qf = 1.0f / sqrtf(qq + 1e-6f) * q_scale;
        const float kf = 1.0f / sqrtf(kk + 1e-6f);
#pragma unroll
        for (int i = 0; i < DELTA_MAXE; i++) {
            q[i] *= qf;
            k[i] *= kf;
        }
        const float g = expf(-A * softplus_f(at + dtb));
        const float beta = sigmoid_f(bt);
        delta_token(S, q, k, v, g, beta, row0, Dv, out + (i64)t * Hv * Dv + h * Dv);
    }
    delta_state(S, sh, row0, Dv, Dk, true);
}

#define DS_T 16  // tokens per staged chunk of delta_scan

// The sums over the warp of four values per lane, in 10 shuffles instead
// of 4 × 5: halves of the values cross at offsets 16 and 8 (lane l keeps
// row (l >> 3) & 3's), the rest is a plain butterfly; then each row's sum
// is fetched from lanes 0, 8, 16 and 24. Every lane gets all four sums
// (SHARE), or only the one of row (lane >> 3) & 3, returned.
template <bool SHARE>
__device__ __forceinline__ float warp_sum4(float (&v)[4]) {
    const int lane = threadIdx.x & 31;
    const bool h16 = lane & 16, h8 = lane & 8;
    const float a0 = (h16 ? v[2] : v[0]) + __shfl_xor_sync(FULL_MASK, h16 ? v[0] : v[2], 16);
    const float a1 = (h16 ? v[3] : v[1]) + __shfl_xor_sync(FULL_MASK, h16 ? v[1] : v[3], 16);
    float b = (h8 ? a1 : a0) + __shfl_xor_sync(FULL_MASK, h8 ? a0 : a1, 8);
    b += __shfl_xor_sync(FULL_MASK, b, 4);
    b += __shfl_xor_sync(FULL_MASK, b, 2);
    b += __shfl_xor_sync(FULL_MASK, b, 1);
    if (SHARE) {
#pragma unroll
        for (int r = 0; r < 4; r++) v[r] = __shfl_sync(FULL_MASK, b, 8 * r);
    }
    return b;
}

// delta_step's recurrence for a prefill chunk after delta_prep (q, k
// normalized in x; gb = (log g, β) per token and value head), with each
// block's inputs staged in shared memory DS_T tokens at a time (two
// buffers: the next tokens arrive while these are computed), so that the
// chain per token never waits on global memory. The arithmetic of
// delta_step, except that the sums over the key dimension of a warp's
// four rows are reduced together (warp_sum4). E: key dimensions per lane
// (Dk ≤ 32·E; delta_scan: 8, delta_scan128: 4). Grid (Hv, Dv/16), 128
// threads, dynamic shared memory 2·(2·DS_T·Dk + DS_T·16 + 2·DS_T) floats;
// Dk, Dv and C multiples of 4.
template <int E>
__device__ __forceinline__ void delta_scan_t(const float* x, const float* gb, float* ssm, float* out, int n, int Hk,
                                             int Hv, int Dk, int Dv) {
    extern __shared__ __align__(16) float ds[];
    const int h = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rb = blockIdx.y * 16;  // the block's first row
    const int row0 = rb + warp * DELTA_RPW;
    const bool active = row0 < Dv;
    const int C = 2 * Hk * Dk + Hv * Dv;
    const int kh = h / (Hv / Hk);
    const int per = 2 * DS_T * Dk + DS_T * 16 + 2 * DS_T;  // floats per buffer
    float S[DELTA_RPW][E];
    float* sh = ssm + (i64)h * Dv * Dk;
#pragma unroll
    for (int r = 0; r < DELTA_RPW; r++)
#pragma unroll
        for (int i = 0; i < E; i++) {
            const int c = lane + 32 * i;
            S[r][i] = row0 + r < Dv && c < Dk ? sh[(i64)(row0 + r) * Dk + c] : 0.0f;
        }
    // Tokens t0 .. t0 + DS_T into buffer `buf`: q, k [DS_T][Dk], v [DS_T][16]
    // (the block's rows), g and β [DS_T][2].
    auto stage = [&](int t0, int buf) {
        float* sq = ds + buf * per;
        float* sk = sq + DS_T * Dk;
        float* sv = sk + DS_T * Dk;
        float* sg = sv + DS_T * 16;
        const int tn = min(DS_T, n - t0), d4 = Dk >> 2;
        for (int i = threadIdx.x; i < 2 * tn * d4; i += blockDim.x) {
            const int which = i / (tn * d4), r = i % (tn * d4), t = r / d4, c = r % d4;
            const float* src = x + (i64)(t0 + t) * C + which * Hk * Dk + kh * Dk + 4 * c;
            cp_async16((which ? sk : sq) + t * Dk + 4 * c, src);
        }
        for (int i = threadIdx.x; i < 4 * tn; i += blockDim.x) {
            const int t = i >> 2, c = i & 3;
            if (rb + 4 * c < Dv) cp_async16(sv + t * 16 + 4 * c, x + (i64)(t0 + t) * C + 2 * Hk * Dk + h * Dv + rb + 4 * c);
        }
        for (int i = threadIdx.x; i < 2 * tn; i += blockDim.x) {
            const int t = i >> 1, j = i & 1;
            cp_async4(sg + 2 * t + j, gb + (i64)(t0 + t) * 2 * Hv + j * Hv + h);
        }
    };
    if (n > 0) stage(0, 0);
    int buf = 0;
    // The row whose output this lane writes (lanes 0, 8, 16, 24).
    const int orow = row0 + ((lane >> 3) & 3);
    for (int t0 = 0; t0 < n; t0 += DS_T, buf ^= 1) {
        cp_async_wait();
        __syncthreads();
        if (t0 + DS_T < n) stage(t0 + DS_T, buf ^ 1);
        if (!active) continue;
        const float* sq = ds + buf * per;
        const float* sk = sq + DS_T * Dk;
        const float* sv = sk + DS_T * Dk;
        const float* sg = sv + DS_T * 16;
        const int tn = min(DS_T, n - t0);
        for (int t = 0; t < tn; t++) {
            float q[E], k[E];
#pragma unroll
            for (int i = 0; i < E; i++) {
                const int c = lane + 32 * i;
                q[i] = c < Dk ? sq[t * Dk + c] : 0.0f;
                k[i] = c < Dk ? sk[t * Dk + c] : 0.0f;
            }
            const float g = expf(sg[2 * t]), beta = sg[2 * t + 1];
            // S ← g·S; δ = β(v − S k); S ← S + δ kᵀ; o = S q.
            float d[DELTA_RPW];
#pragma unroll
            for (int r = 0; r < DELTA_RPW; r++) {
                float a = 0.0f;
#pragma unroll
                for (int i = 0; i < E; i++) {
                    S[r][i] *= g;
                    a = fmaf(S[r][i], k[i], a);
                }
                d[r] = a;
            }
            warp_sum4<true>(d);
            float o[DELTA_RPW];
#pragma unroll
            for (int r = 0; r < DELTA_RPW; r++) {
                const float vr = row0 + r < Dv ? sv[t * 16 + warp * DELTA_RPW + r] : 0.0f;
                const float delta = beta * (vr - d[r]);
                float a = 0.0f;
#pragma unroll
                for (int i = 0; i < E; i++) {
                    S[r][i] = fmaf(delta, k[i], S[r][i]);
                    a = fmaf(S[r][i], q[i], a);
                }
                o[r] = a;
            }
            const float ov = warp_sum4<false>(o);
            if ((lane & 7) == 0 && orow < Dv) out[(i64)(t0 + t) * Hv * Dv + h * Dv + orow] = ov;
        }
    }
    if (!active) return;
#pragma unroll
    for (int r = 0; r < DELTA_RPW; r++)
#pragma unroll
        for (int i = 0; i < E; i++) {
            const int c = lane + 32 * i;
            if (row0 + r < Dv && c < Dk) sh[(i64)(row0 + r) * Dk + c] = S[r][i];
        }
}

extern "C" __global__ void __launch_bounds__(128)
    delta_scan(const float* x, const float* gb, float* ssm, float* out, int n, int Hk, int Hv, int Dk, int Dv) {
    GRID_DEP();
    delta_scan_t<DELTA_MAXE>(x, gb, ssm, out, n, Hk, Hv, Dk, Dv);
}

// delta_scan for key heads of up to 128 dimensions.
extern "C" __global__ void __launch_bounds__(128)
    delta_scan128(const float* x, const float* gb, float* ssm, float* out, int n, int Hk, int Hv, int Dk, int Dv) {
    GRID_DEP();
    delta_scan_t<4>(x, gb, ssm, out, n, Hk, Hv, Dk, Dv);
}
