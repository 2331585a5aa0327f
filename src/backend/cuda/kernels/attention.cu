// Softmax attention over the caches: GQA (decode and prefill alike, one
// sequence or several) and absorbed MLA. One block per (head, token); its
// warps take every ATT_WARPS-th position with an online softmax each,
// then combine.

#define ATT_WARPS 8
#define ATT_MAXD 8  // head dims per lane: head_dim, v_dim ≤ 256

// q [n, H, hd]; out [n, H, vd]; the rows of several sequences (s), each
// attending over its own caches: s.a[i] K [cap, Hkv, hd], s.b[i] V [cap,
// Hkv, vd]. Grid (H, rows): block y takes row row0 + y.
extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
    attention(const float* q, float* out, Seqs s, int row0, int H, int Hkv, int hd, int vd, float scale) {
    GRID_DEP();
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS];
    __shared__ float so[ATT_WARPS][ATT_MAXD * 32];
    const int h = blockIdx.x, t = row0 + blockIdx.y;
    const int z = seq_of(s, t);
    if (z < 0) return;
    const float *k = s.a[z], *v = s.b[z];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kvh = h / (H / Hkv);
    const int len = s.pos0[z] + t - s.off[z] + 1;
    float qr[ATT_MAXD], o[ATT_MAXD];
    const float* qh = q + ((i64)t * H + h) * hd;
#pragma unroll
    for (int i = 0; i < ATT_MAXD; i++) {
        const int d = lane + 32 * i;
        qr[i] = d < hd ? qh[d] : 0.0f;
        o[i] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int j = warp; j < len; j += ATT_WARPS) {
        const float* kj = k + ((i64)j * Hkv + kvh) * hd;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_MAXD; i++) {
            const int d = lane + 32 * i;
            if (d < hd) s = fmaf(qr[i], kj[d], s);
        }
        s = warp_sum(s) * scale;
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
        const float* vj = v + ((i64)j * Hkv + kvh) * vd;
#pragma unroll
        for (int i = 0; i < ATT_MAXD; i++) {
            const int d = lane + 32 * i;
            if (d < vd) o[i] = o[i] * corr + p * vj[d];
        }
        m = mn;
    }
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < ATT_MAXD; i++) so[warp][lane + 32 * i] = o[i];
    __syncthreads();
    float mx = NEG_INF;
    for (int w = 0; w < ATT_WARPS; w++) mx = fmaxf(mx, sm[w]);
    float den = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++)
        if (sm[w] > NEG_INF) den += sl[w] * expf(sm[w] - mx);
    float* oh = out + ((i64)t * H + h) * vd;
    for (int d = threadIdx.x; d < vd; d += blockDim.x) {
        float num = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (sm[w] > NEG_INF) num += so[w][d] * expf(sm[w] - mx);
        oh[d] = num / den;
    }
}

#define MLA_MAXR 16  // latent dims per lane: kv_lora_rank ≤ 512
#define MLA_MAXE 4   // rope dims per lane: rope ≤ 128

// Absorbed MLA: q [n, H, nope + rope] (rope part rotated); latent
// [cap, r]; k_pe [cap, rope]; kv_b [H·(nope + dv), r]; out [n, H, dv].
// Grid (H, n); dynamic shared memory: (ATT_WARPS + 1)·r + rope floats.
extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
    mla_attention(const float* q, const float* latent, const float* kpe, const float* kvb, float* out, int pos0,
                  int H, int dn, int dr, int dv, int r, float scale) {
    GRID_DEP();
    extern __shared__ float shm[];
    float* q_lat = shm;                 // [r]
    float* o_part = shm + r;            // [ATT_WARPS][r]
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS];
    const int h = blockIdx.x, t = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int len = pos0 + t + 1;
    const float* qh = q + ((i64)t * H + h) * (dn + dr);
    const float* wk = kvb + (i64)h * (dn + dv) * r;  // [dn, r]
    // q absorbed into the latent space: q_lat[c] = Σ_i q_nope[i]·Wk[i, c].
    for (int c = threadIdx.x; c < r; c += blockDim.x) {
        float a = 0.0f;
        for (int i = 0; i < dn; i++) a = fmaf(qh[i], wk[(i64)i * r + c], a);
        q_lat[c] = a;
    }
    __syncthreads();
    float ql[MLA_MAXR], qp[MLA_MAXE], o[MLA_MAXR];
#pragma unroll
    for (int i = 0; i < MLA_MAXR; i++) {
        const int c = lane + 32 * i;
        ql[i] = c < r ? q_lat[c] : 0.0f;
        o[i] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < MLA_MAXE; i++) {
        const int d = lane + 32 * i;
        qp[i] = d < dr ? qh[dn + d] : 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int j = warp; j < len; j += ATT_WARPS) {
        const float* lj = latent + (i64)j * r;
        const float* pj = kpe + (i64)j * dr;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < MLA_MAXR; i++) {
            const int c = lane + 32 * i;
            if (c < r) s = fmaf(ql[i], lj[c], s);
        }
#pragma unroll
        for (int i = 0; i < MLA_MAXE; i++) {
            const int d = lane + 32 * i;
            if (d < dr) s = fmaf(qp[i], pj[d], s);
        }
        s = warp_sum(s) * scale;
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < MLA_MAXR; i++) {
            const int c = lane + 32 * i;
            if (c < r) o[i] = o[i] * corr + p * lj[c];
        }
        m = mn;
    }
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < MLA_MAXR; i++) {
        const int c = lane + 32 * i;
        if (c < r) o_part[warp * r + c] = o[i];
    }
    __syncthreads();
    float mx = NEG_INF;
    for (int w = 0; w < ATT_WARPS; w++) mx = fmaxf(mx, sm[w]);
    float den = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++)
        if (sm[w] > NEG_INF) den += sl[w] * expf(sm[w] - mx);
    // o_lat = Σ_w o_part[w]·e^(m_w − mx) / den, into q_lat (no longer needed).
    for (int c = threadIdx.x; c < r; c += blockDim.x) {
        float a = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (sm[w] > NEG_INF) a += o_part[w * r + c] * expf(sm[w] - mx);
        q_lat[c] = a / den;
    }
    __syncthreads();
    const float* wv = kvb + ((i64)h * (dn + dv) + dn) * r;  // [dv, r]
    float* oh = out + ((i64)t * H + h) * dv;
    for (int e = warp; e < dv; e += ATT_WARPS) {
        float a = 0.0f;
        for (int c = lane; c < r; c += 32) a = fmaf(wv[(i64)e * r + c], q_lat[c], a);
        a = warp_sum(a);
        if (lane == 0) oh[e] = a;
    }
}
