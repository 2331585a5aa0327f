// Softmax attention over the caches: GQA (decode and prefill alike, one
// sequence or several) and absorbed MLA. One block per (head, token); its
// warps take every ATT_WARPS-th position with an online softmax each,
// then combine. Decode rows deep into their context also split their keys
// over blocks (attention_split, then attention_merge).

#define ATT_WARPS 8
#define ATT_MAXD 8  // head dims per lane: head_dim, v_dim ≤ 256

// One head of one row over keys [j0, j1) of its sequence's caches (k of
// type kt, rows of kw values; v of type vt, rows of vw; the head's values
// from kvh·hd and kvh·vd): the warps' online softmaxes merged into the
// block's max m, sum l and o[vd] = Σ exp(s_j − m)·v_j. Written normalized
// to oh when part is null, else as (m, l, o[vd]) to part (a split of
// attention_split, merged by attention_merge).
__device__ __forceinline__ void att_range(const float* qh, const char* k, const char* v, int kt, int vt, int kw,
                                          int vw, int kvh, int hd, int vd, float scale, int j0, int j1, float* oh,
                                          float* part) {
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS];
    __shared__ float so[ATT_WARPS][ATT_MAXD * 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const i64 krb = kv_row_bytes(kt, kw), vrb = kv_row_bytes(vt, vw);
    float qr[ATT_MAXD], o[ATT_MAXD];
#pragma unroll
    for (int i = 0; i < ATT_MAXD; i++) {
        const int d = lane + 32 * i;
        qr[i] = d < hd ? qh[d] : 0.0f;
        o[i] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int j = j0 + warp; j < j1; j += ATT_WARPS) {
        const char* kj = k + j * krb;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_MAXD; i++) {
            const int d = lane + 32 * i;
            if (d < hd) s = fmaf(qr[i], kv_val(kj, kt, kw, kvh * hd + d), s);
        }
        s = warp_sum(s) * scale;
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
        const char* vj = v + j * vrb;
#pragma unroll
        for (int i = 0; i < ATT_MAXD; i++) {
            const int d = lane + 32 * i;
            if (d < vd) o[i] = o[i] * corr + p * kv_val(vj, vt, vw, kvh * vd + d);
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
    if (part && threadIdx.x == 0) {
        part[0] = mx;
        part[1] = den;
    }
    for (int d = threadIdx.x; d < vd; d += blockDim.x) {
        float num = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (sm[w] > NEG_INF) num += so[w][d] * expf(sm[w] - mx);
        if (part)
            part[2 + d] = num;
        else
            oh[d] = num / den;
    }
}

// q [n, H, hd]; out [n, H, vd]; the rows of several sequences (s), each
// attending over its own caches: s.a[i] K [cap, Hkv, hd] of type kt,
// s.b[i] V [cap, Hkv, vd] of type vt (kv.cuh). Grid (H, rows): block y
// takes row row0 + y.
extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
    attention(const float* q, float* out, Seqs s, int row0, int H, int Hkv, int hd, int vd, float scale, int kt,
              int vt) {
    GRID_DEP();
    const int h = blockIdx.x, t = row0 + blockIdx.y;
    const int z = seq_of(s, t);
    if (z < 0) return;
    const int len = s.pos0[z] + t - s.off[z] + 1;
    att_range(q + ((i64)t * H + h) * hd, (const char*)s.a[z], (const char*)s.b[z], kt, vt, Hkv * hd, Hkv * vd,
              h / (H / Hkv), hd, vd, scale, 0, len, out + ((i64)t * H + h) * vd, nullptr);
}

// Flash-decoding: `attention` with each row's keys cut into `splits`
// ranges, one block each (grid (H, rows, splits)), so that a few rows at
// a great depth fill the device. Block (h, y, c) writes (m, l, o[vd]) of
// its range to part [rows][H][splits][vd + 2]; attention_merge adds them.
extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
    attention_split(const float* q, float* part, Seqs s, int row0, int H, int Hkv, int hd, int vd, float scale,
                    int kt, int vt, int splits) {
    GRID_DEP();
    const int h = blockIdx.x, t = row0 + blockIdx.y, c = blockIdx.z;
    float* pp = part + (((i64)blockIdx.y * H + h) * splits + c) * (vd + 2);
    const int z = seq_of(s, t);
    if (z < 0) return;
    const int len = s.pos0[z] + t - s.off[z] + 1;
    const int chunk = (len + splits - 1) / splits;
    const int j0 = min(len, c * chunk), j1 = min(len, j0 + chunk);
    att_range(q + ((i64)t * H + h) * hd, (const char*)s.a[z], (const char*)s.b[z], kt, vt, Hkv * hd, Hkv * vd,
              h / (H / Hkv), hd, vd, scale, j0, j1, nullptr, pp);
}

#define AD_T 32  // keys per tile of attention_decode

// A tile's rows of an f16 cache, copied as they are: warp g takes rows g
// and g + G (R = AD_T/G ≤ 4 rows), lane i the 8 values 8i .. 8i + 7 of each
// (hd, vd ≤ 256), every load issued before any store; rows from n on are
// zeros. ks [AD_T][hd + 2], vs [AD_T][vd], f16 bits.
__device__ __forceinline__ void ad_load16(const char* k, const char* v, i64 krb, i64 vrb, int koff, int voff,
                                          int n, int hd, int vd, int G, int g, int lane, u16* ks, u16* vs) {
    uint4 kx[4], vx[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = g + i * G;
        const bool ok = r < AD_T && r < n;
        const uint4 zero = make_uint4(0, 0, 0, 0);
        kx[i] = ok && 8 * lane < hd ? __ldg((const uint4*)(k + r * krb + koff) + lane) : zero;
        vx[i] = ok && 8 * lane < vd ? __ldg((const uint4*)(v + r * vrb + voff) + lane) : zero;
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = g + i * G;
        if (r >= AD_T) break;
        if (8 * lane < hd) {
            u32* kw = (u32*)(ks + r * (hd + 2) + 8 * lane);  // rows of hd + 2: 4-byte aligned
            kw[0] = kx[i].x;
            kw[1] = kx[i].y;
            kw[2] = kx[i].z;
            kw[3] = kx[i].w;
        }
        if (8 * lane < vd) *(uint4*)(vs + r * vd + 8 * lane) = vx[i];
    }
}

// A tile's rows of a q8_0 cache: the codes copied as they are (lane i
// takes codes 16i .. 16i + 15 of each of the warp's rows, every load
// before any store), the scales as f32; rows from n on are zeros. ks8
// [AD_T][hd + 4], vs8 [AD_T][vd] codes; kd [AD_T][hd/32], vd8 [AD_T][vd/32]
// scales. Rows of kw (K) and vw (V) values: codes, then f16 scales.
__device__ __forceinline__ void ad_load8(const char* k, const char* v, i64 krb, i64 vrb, int kvh, int kw, int vw,
                                         int n, int hd, int vd, int G, int g, int lane, signed char* ks8,
                                         signed char* vs8, float* kd, float* vsd) {
    uint4 kx[4], vx[4];
    float ksc[4], vsc[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = g + i * G;
        const bool ok = r < AD_T && r < n;
        const uint4 zero = make_uint4(0, 0, 0, 0);
        const char* kr = k + r * krb;
        const char* vr = v + r * vrb;
        kx[i] = ok && 16 * lane < hd ? __ldg((const uint4*)(kr + kvh * hd) + lane) : zero;
        vx[i] = ok && 16 * lane < vd ? __ldg((const uint4*)(vr + kvh * vd) + lane) : zero;
        ksc[i] = ok && lane < hd / 32 ? f16f(((const u16*)(kr + kw))[kvh * hd / 32 + lane]) : 0.0f;
        vsc[i] = ok && lane < vd / 32 ? f16f(((const u16*)(vr + vw))[kvh * vd / 32 + lane]) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = g + i * G;
        if (r >= AD_T) break;
        if (16 * lane < hd) {
            u32* kw4 = (u32*)(ks8 + r * (hd + 4) + 16 * lane);  // rows of hd + 4: 4-byte aligned
            kw4[0] = kx[i].x;
            kw4[1] = kx[i].y;
            kw4[2] = kx[i].z;
            kw4[3] = kx[i].w;
        }
        if (16 * lane < vd) *(uint4*)(vs8 + r * vd + 16 * lane) = vx[i];
        if (lane < hd / 32) kd[r * (hd / 32) + lane] = ksc[i];
        if (lane < vd / 32) vsd[r * (vd / 32) + lane] = vsc[i];
    }
}

// Flash-decoding for a KV head's whole group of query heads at once: block
// (kvh, y, c) takes row row0 + y, the group's G = H/Hkv heads (one warp
// each, blockDim 32·G) and the c-th of `splits` ranges of its keys; the
// keys and values of a tile of AD_T positions are put in shared memory
// once for the group, each lane scores one position of the tile, and each
// lane keeps vd/32 of its head's output. Writes (m, l, o[vd]) as
// attention_split does. MODE AD_F16 (f16 caches, 8 ≤ G ≤ 16): the tile is
// copied as f16; AD_Q8 (q8_0 caches, 8 ≤ G ≤ 16): as codes and scales,
// each value taken as code·scale where it is read; AD_F32: decoded to f32. Dynamic shared memory
// (cuda/mixers.rs `decode_smem`): the tile, then G·hd floats of queries.
#define AD_F32 0
#define AD_F16 1
#define AD_Q8 2

template <int MODE>
__device__ __forceinline__ void attention_decode_t(const float* q, float* part, const Seqs& s, int row0, int H,
                                                   int Hkv, int hd, int vd, float scale, int kt, int vt,
                                                   int splits, char* smem) {
    const int G = H / Hkv, kvh = blockIdx.x, t = row0 + blockIdx.y, c = blockIdx.z;
    const int lane = threadIdx.x & 31, g = threadIdx.x >> 5, h = kvh * G + g;
    const int z = seq_of(s, t);
    if (z < 0) return;
    float* ks = (float*)smem;                       // f32: [AD_T][hd + 1]
    float* vs = ks + AD_T * (hd + 1);               // f32: [AD_T][vd]
    u16* ks16 = (u16*)smem;                         // f16: [AD_T][hd + 2]
    u16* vs16 = ks16 + AD_T * (hd + 2);             // f16: [AD_T][vd]
    signed char* ks8 = (signed char*)smem;            // q8: [AD_T][hd + 4] codes
    signed char* vs8 = ks8 + AD_T * (hd + 4);         // q8: [AD_T][vd] codes
    float* kd8 = (float*)(vs8 + AD_T * vd);           // q8: [AD_T][hd / 32] scales
    float* vd8 = kd8 + AD_T * (hd / 32);              // q8: [AD_T][vd / 32] scales
    float* qs = MODE == AD_F16 ? (float*)(vs16 + AD_T * vd)
                : MODE == AD_Q8 ? vd8 + AD_T * (vd / 32)
                                : vs + AD_T * vd;  // [G][hd], times scale
    const int len = s.pos0[z] + t - s.off[z] + 1;
    const int chunk = (len + splits - 1) / splits;
    const int j0 = min(len, c * chunk), j1 = min(len, j0 + chunk);
    const char *k = (const char*)s.a[z], *v = (const char*)s.b[z];
    const int kw = Hkv * hd, vw = Hkv * vd;
    const i64 krb = kv_row_bytes(kt, kw), vrb = kv_row_bytes(vt, vw);
    const float* qg = q + ((i64)t * H + kvh * G) * hd;  // the group's heads, one after another
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) qs[i] = qg[i] * scale;
    float o[ATT_MAXD];
#pragma unroll
    for (int i = 0; i < ATT_MAXD; i++) o[i] = 0.0f;
    float m = NEG_INF, l = 0.0f;
    for (int p0 = j0; p0 < j1; p0 += AD_T) {
        const int n = min(AD_T, j1 - p0);
        __syncthreads();  // the last tile is read
        if constexpr (MODE == AD_Q8) {
            ad_load8(k + p0 * krb, v + p0 * vrb, krb, vrb, kvh, kw, vw, n, hd, vd, G, g, lane, ks8, vs8, kd8, vd8);
        } else if constexpr (MODE == AD_F16) {
            ad_load16(k + p0 * krb, v + p0 * vrb, krb, vrb, 2 * kvh * hd, 2 * kvh * vd, n, hd, vd, G, g, lane, ks16,
                      vs16);
        } else {
            // Warp g loads rows g, g + G, …: its lanes read a row's values in order.
            for (int r = g; r < AD_T; r += G) {
                const char* kr = k + (p0 + r) * krb;
                const char* vr = v + (p0 + r) * vrb;
                for (int d = lane; d < hd; d += 32)
                    ks[r * (hd + 1) + d] = r < n ? kv_val(kr, kt, kw, kvh * hd + d) : 0.0f;
                for (int d = lane; d < vd; d += 32) vs[r * vd + d] = r < n ? kv_val(vr, vt, vw, kvh * vd + d) : 0.0f;
            }
        }
        __syncthreads();
        // Lane r scores position p0 + r for head g.
        const float* qh = qs + g * hd;
        float s4[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // four chains, not one
        if constexpr (MODE == AD_Q8) {
            const u32* kr = (const u32*)(ks8 + lane * (hd + 4));  // four codes a word
            const float* kds = kd8 + lane * (hd / 32);
            for (int d = 0; d < hd; d += 4) {
                const u32 w = kr[d >> 2];
                const float sd = kds[d >> 5];
#pragma unroll
                for (int u = 0; u < 4; u++)
                    s4[u] = fmaf(qh[d + u], (float)(signed char)(w >> (8 * u)) * sd, s4[u]);
            }
        } else if constexpr (MODE == AD_F16) {
            const u32* kr = (const u32*)(ks16 + lane * (hd + 2));  // pairs of f16
            for (int d = 0; d < hd; d += 4) {
                const u32 a = kr[d >> 1], b = kr[(d >> 1) + 1];
                s4[0] = fmaf(qh[d], f16f((u16)(a & 0xffff)), s4[0]);
                s4[1] = fmaf(qh[d + 1], f16f((u16)(a >> 16)), s4[1]);
                s4[2] = fmaf(qh[d + 2], f16f((u16)(b & 0xffff)), s4[2]);
                s4[3] = fmaf(qh[d + 3], f16f((u16)(b >> 16)), s4[3]);
            }
        } else {
            const float* kr = ks + lane * (hd + 1);
            int d = 0;
            for (; d + 4 <= hd; d += 4) {
#pragma unroll
                for (int u = 0; u < 4; u++) s4[u] = fmaf(qh[d + u], kr[d + u], s4[u]);
            }
            for (; d < hd; d++) s4[0] = fmaf(qh[d], kr[d], s4[0]);
        }
        float sc = (s4[0] + s4[1]) + (s4[2] + s4[3]);
        if (lane >= n) sc = NEG_INF;
        const float mn = fmaxf(m, warp_max(sc));
        const float corr = expf(m - mn);
        const float p = lane < n ? expf(sc - mn) : 0.0f;
        l = l * corr + warp_sum(p);
#pragma unroll
        for (int i = 0; i < ATT_MAXD; i++) o[i] *= corr;
        for (int r = 0; r < n; r++) {
            const float pr = __shfl_sync(FULL_MASK, p, r);
#pragma unroll
            for (int i = 0; i < ATT_MAXD; i++) {
                const int d = lane + 32 * i;
                if (d >= vd) continue;
                float x;
                if constexpr (MODE == AD_Q8)
                    x = (float)vs8[r * vd + d] * vd8[r * (vd / 32) + (d >> 5)];
                else if constexpr (MODE == AD_F16)
                    x = f16f(vs16[r * vd + d]);
                else
                    x = vs[r * vd + d];
                o[i] = fmaf(pr, x, o[i]);
            }
        }
        m = mn;
    }
    float* pp = part + (((i64)blockIdx.y * H + h) * splits + c) * (vd + 2);
    if (lane == 0) {
        pp[0] = m;
        pp[1] = l;
    }
#pragma unroll
    for (int i = 0; i < ATT_MAXD; i++) {
        const int d = lane + 32 * i;
        if (d < vd) pp[2 + d] = o[i];
    }
}

#define ATTENTION_DECODE(NAME, MODE)                                                                             \
    extern "C" __global__ void __launch_bounds__(512)                                                           \
        NAME(const float* q, float* part, Seqs s, int row0, int H, int Hkv, int hd, int vd, float scale, int kt, \
             int vt, int splits) {                                                                              \
        GRID_DEP();                                                                                             \
        extern __shared__ __align__(16) char ad_smem[];                                                         \
        attention_decode_t<MODE>(q, part, s, row0, H, Hkv, hd, vd, scale, kt, vt, splits, ad_smem);             \
    }
ATTENTION_DECODE(attention_decode, AD_F32)
ATTENTION_DECODE(attention_decode16, AD_F16)
ATTENTION_DECODE(attention_decode8, AD_Q8)

// out [n, H, vd] of rows row0 .. row0 + rows − 1 = the splits of part
// merged (grid (H, rows); at most 256 splits): each split's weight
// exp(m − max) once, then each thread sums its values over the splits.
extern "C" __global__ void attention_merge(const float* part, float* out, Seqs s, int row0, int H, int vd,
                                           int splits) {
    GRID_DEP();
    __shared__ float w[256];
    __shared__ float red[32];
    const int h = blockIdx.x, t = row0 + blockIdx.y;
    if (seq_of(s, t) < 0) return;
    const float* pp = part + ((i64)blockIdx.y * H + h) * splits * (vd + 2);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float mx = NEG_INF;
    for (int c = threadIdx.x; c < splits; c += blockDim.x) mx = fmaxf(mx, pp[c * (vd + 2)]);
    mx = warp_max(mx);
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = NEG_INF;
    for (int i = 0; i < warps; i++) mx = fmaxf(mx, red[i]);
    __syncthreads();
    float den = 0.0f;
    for (int c = threadIdx.x; c < splits; c += blockDim.x) {
        const float m = pp[c * (vd + 2)];
        w[c] = m > NEG_INF ? expf(m - mx) : 0.0f;
        den += w[c] * pp[c * (vd + 2) + 1];
    }
    den = warp_sum(den);
    if (lane == 0) red[warp] = den;
    __syncthreads();
    den = 0.0f;
    for (int i = 0; i < warps; i++) den += red[i];
    float* oh = out + ((i64)t * H + h) * vd;
    for (int d = threadIdx.x; d < vd; d += blockDim.x) {
        float num = 0.0f;
        for (int c = 0; c < splits; c++) num = fmaf(pp[c * (vd + 2) + 2 + d], w[c], num);
        oh[d] = num / den;
    }
}

#define MLA_MAXR 16  // latent dims per lane: kv_lora_rank ≤ 512
#define MLA_MAXE 4   // rope dims per lane: rope ≤ 128

// Absorbed MLA: q [n, H, nope + rope] (rope part rotated); latent
// [cap, r]; k_pe [cap, rope], both caches of type ct (kv.cuh); kv_b
// [H·(nope + dv), r]; out [n, H, dv]. Grid (H, n); dynamic shared memory:
// (ATT_WARPS + 1)·r + rope floats.
extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
    mla_attention(const float* q, const char* latent, const char* kpe, const float* kvb, float* out, int pos0,
                  int H, int dn, int dr, int dv, int r, float scale, int ct) {
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
        const char* lj = latent + j * kv_row_bytes(ct, r);
        const char* pj = kpe + j * kv_row_bytes(ct, dr);
        float lv[MLA_MAXR];
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < MLA_MAXR; i++) {
            const int c = lane + 32 * i;
            lv[i] = c < r ? kv_val(lj, ct, r, c) : 0.0f;
            s = fmaf(ql[i], lv[i], s);
        }
#pragma unroll
        for (int i = 0; i < MLA_MAXE; i++) {
            const int d = lane + 32 * i;
            if (d < dr) s = fmaf(qp[i], kv_val(pj, ct, dr, d), s);
        }
        s = warp_sum(s) * scale;
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < MLA_MAXR; i++) {
            const int c = lane + 32 * i;
            if (c < r) o[i] = o[i] * corr + p * lv[i];
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
