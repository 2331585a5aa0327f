// Softmax attention of prefill chunks on tensor cores (compute capability
// 8.0 and later; the fast path of SPEC §6), flash-style: a block takes
// FA_BQ query rows of one sequence and one head (16 rows per warp) and
// walks the keys in tiles of KT, with the softmax kept online in
// registers, so that neither the scores nor the probabilities leave the
// SM.
//
// Numerics: q, k, v and the probabilities are each split into two bf16
// parts, x = hi + lo (hi = bf16(x), lo = bf16(x − hi): 16 significant
// bits, f32's range, no scaling), and a product a·b is taken as
// hi·hi + hi·lo + lo·hi through mma.sync m16n8k16 with f32 sums: about
// 2^-16 relative per product, against 2^-8 for one bf16 part. The scores
// are in base 2 (q is multiplied by scale·log2 e before it is split).
//
// Shared memory: rows of D bf16 values in 16-byte chunks, chunk c of row r
// stored at c ^ (r mod 8), so that the 8 rows an ldmatrix reads at one
// chunk fall in 8 different bank groups.

#define FA_BQ 64
#define FA_THREADS 128
#define FA_LOG2E 1.4426950408889634f

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

// (a, b) as two bf16x2 words, a in the low halves: hi = bf16(x), lo =
// bf16(x − hi).
__device__ __forceinline__ void split_bf2(float a, float b, u32& hi, u32& lo) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(hi) : "f"(b), "f"(a));
    const float ra = a - __uint_as_float(hi << 16), rb = b - __uint_as_float(hi & 0xffff0000u);
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(lo) : "f"(rb), "f"(ra));
}

// The shared-window address of chunk c (8 values) of row r of a [*, D]
// array at `base` (32-bit arithmetic: no generic pointer per ldmatrix).
template <int D>
__device__ __forceinline__ u32 fa_at(u32 base, int r, int c) {
    return base + ((r * D + ((c ^ (r & 7)) << 3)) << 1);
}

// Values 4·c4 .. 4·c4 + 3 of row r, times mul, split into hi and lo
// [R][D] at their swizzled place.
template <int D>
__device__ __forceinline__ void fa_put4(float4 v, float mul, int r, int c4, u16* hi, u16* lo) {
    u32 h0, l0, h1, l1;
    split_bf2(v.x * mul, v.y * mul, h0, l0);
    split_bf2(v.z * mul, v.w * mul, h1, l1);
    const int at = r * D + (((c4 >> 1) ^ (r & 7)) << 3) + (c4 & 1) * 4;
    *(uint2*)(hi + at) = make_uint2(h0, h1);
    *(uint2*)(lo + at) = make_uint2(l0, l1);
}

// Rows 0..R−1 of an f32 array (row j at src + j·stride; D columns) times
// mul, split into hi and lo [R][D]; rows from `valid` on are zeros.
template <int D, int R>
__device__ __forceinline__ void fa_stage(const float* src, i64 stride, int valid, float mul, u16* hi, u16* lo) {
#pragma unroll 4
    for (int c = threadIdx.x; c < R * D / 4; c += FA_THREADS) {
        const int r = c / (D / 4), c4 = c % (D / 4);
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < valid) v = __ldg((const float4*)(src + r * stride) + c4);
        fa_put4<D>(v, mul, r, c4, hi, lo);
    }
}

// Rows 0..R−1 of a KV cache of type t (row j at src + j·rb, rows of
// `width` values, the head's D values from value c0), split into hi and
// lo [R][D]; rows from `valid` on are zeros.
template <int D, int R>
__device__ __forceinline__ void fa_stage_kv(const char* src, i64 rb, int t, int width, int c0, int valid, u16* hi,
                                            u16* lo) {
#pragma unroll 4
    for (int c = threadIdx.x; c < R * D / 4; c += FA_THREADS) {
        const int r = c / (D / 4), c4 = c % (D / 4);
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < valid) v = kv_val4(src + r * rb, t, width, c0 + 4 * c4);
        fa_put4<D>(v, 1.0f, r, c4, hi, lo);
    }
}

// hi·hi + hi·lo + lo·hi into c.
__device__ __forceinline__ void mma3(float (&c)[4], const u32 (&ah)[4], const u32 (&al)[4], u32 bh0, u32 bh1,
                                     u32 bl0, u32 bl1) {
    mma_bf16(c, ah, bh0, bh1);
    mma_bf16(c, ah, bl0, bl1);
    mma_bf16(c, al, bh0, bh1);
}

// One block: FA_BQ rows of one sequence of `s` (tiles of FA_BQ rows,
// sequence after sequence, by blockIdx.y) and head blockIdx.x. q [rows,
// H, D], out [rows, H, D] (rows of the pass from s's base); caches
// s.a[z] K [cap, Hkv, D] of type kt, s.b[z] V [cap, Hkv, D] of type vt.
template <int D, int KT>
__device__ __forceinline__ void flash_t(const float* q, float* out, const Seqs& s, int H, int Hkv, float scale,
                                        int kt, int vt, char* smem) {
    u16* qh = (u16*)smem;  // [FA_BQ][D] each
    u16* ql = qh + FA_BQ * D;
    u16* kh = ql + FA_BQ * D;  // [KT][D] each
    u16* kl = kh + KT * D;
    u16* vh = kl + KT * D;
    u16* vl = vh + KT * D;
    const int h = blockIdx.x;
    int z = 0, tile = blockIdx.y;
    for (; z < s.count; z++) {
        const int tiles = (s.n[z] + FA_BQ - 1) / FA_BQ;
        if (tile < tiles) break;
        tile -= tiles;
    }
    if (z >= s.count) return;
    const int r0 = tile * FA_BQ, rows = min(FA_BQ, s.n[z] - r0);
    const int t0 = s.off[z] + r0;     // the block's first row of the pass
    const int p0 = s.pos0[z] + r0;    // and its position
    const int kend = p0 + rows;       // keys 0 .. kend − 1
    const int kw = Hkv * D;
    const i64 krb = kv_row_bytes(kt, kw), vrb = kv_row_bytes(vt, kw);
    const int kvh = h / (H / Hkv);
    const char* kc = (const char*)s.a[z];
    const char* vc = (const char*)s.b[z];
    fa_stage<D, FA_BQ>(q + ((i64)t0 * H + h) * D, (i64)H * D, rows, scale * FA_LOG2E, qh, ql);
    const u32 sqh = smem_addr(qh), sql = smem_addr(ql), skh = smem_addr(kh), skl = smem_addr(kl);
    const u32 svh = smem_addr(vh), svl = smem_addr(vl);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int pos = p0 + warp * 16 + (lane >> 2);  // this thread's rows: pos and pos + 8
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    for (int k0 = 0; k0 < kend; k0 += KT) {
        __syncthreads();  // the last tile's keys are read
        fa_stage_kv<D, KT>(kc + k0 * krb, krb, kt, kw, kvh * D, min(KT, kend - k0), kh, kl);
        fa_stage_kv<D, KT>(vc + k0 * vrb, vrb, vt, kw, kvh * D, min(KT, kend - k0), vh, vl);
        __syncthreads();
        if (p0 + warp * 16 + 15 < k0) continue;  // every key after the warp's rows

        // Scores: the warp's 16 rows × KT keys.
        float sc[KT / 8][4];
#pragma unroll
        for (int i = 0; i < KT / 8; i++) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            u32 ah[4], al[4];
            const int ar = warp * 16 + (lane & 15), ac = 2 * kk + (lane >> 4);
            ldsm4(fa_at<D>(sqh, ar, ac), ah[0], ah[1], ah[2], ah[3]);
            ldsm4(fa_at<D>(sql, ar, ac), al[0], al[1], al[2], al[3]);
#pragma unroll
            for (int np = 0; np < KT / 16; np++) {
                const int kr = np * 16 + (lane & 7) + ((lane >> 4) << 3), kc2 = 2 * kk + ((lane >> 3) & 1);
                u32 b0, b1, b2, b3, c0, c1, c2, c3;
                ldsm4(fa_at<D>(skh, kr, kc2), b0, b1, b2, b3);
                ldsm4(fa_at<D>(skl, kr, kc2), c0, c1, c2, c3);
                mma3(sc[2 * np], ah, al, b0, b1, c0, c1);
                mma3(sc[2 * np + 1], ah, al, b2, b3, c2, c3);
            }
        }

        // Causal mask and the online softmax (each row's four threads
        // share its max).
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < KT / 8; nt++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int key = k0 + nt * 8 + (lane & 3) * 2 + (j & 1);
                if (key > pos + (j >> 1) * 8) sc[nt][j] = NEG_INF;
                mx[j >> 1] = fmaxf(mx[j >> 1], sc[nt][j]);
            }
        float corr[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            corr[i] = exp2f(m[i] - mx[i]);  // m = −inf before the first key: 0
            m[i] = mx[i];
            l[i] *= corr[i];
        }
#pragma unroll
        for (int nt = 0; nt < KT / 8; nt++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                sc[nt][j] = exp2f(sc[nt][j] - m[j >> 1]);
                l[j >> 1] += sc[nt][j];
            }
#pragma unroll
        for (int i = 0; i < D / 8; i++) {
            o[i][0] *= corr[0];
            o[i][1] *= corr[0];
            o[i][2] *= corr[1];
            o[i][3] *= corr[1];
        }

        // o += p · v: the score fragments of two key octets are the A
        // fragment of 16 keys.
#pragma unroll
        for (int kk = 0; kk < KT / 16; kk++) {
            u32 ph[4], pl[4];
            split_bf2(sc[2 * kk][0], sc[2 * kk][1], ph[0], pl[0]);
            split_bf2(sc[2 * kk][2], sc[2 * kk][3], ph[1], pl[1]);
            split_bf2(sc[2 * kk + 1][0], sc[2 * kk + 1][1], ph[2], pl[2]);
            split_bf2(sc[2 * kk + 1][2], sc[2 * kk + 1][3], ph[3], pl[3]);
            const int vr = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int np = 0; np < D / 16; np++) {
                const int vc2 = 2 * np + (lane >> 4);
                u32 b0, b1, b2, b3, c0, c1, c2, c3;
                ldsm4t(fa_at<D>(svh, vr, vc2), b0, b1, b2, b3);
                ldsm4t(fa_at<D>(svl, vr, vc2), c0, c1, c2, c3);
                mma3(o[2 * np], ph, pl, b0, b1, c0, c1);
                mma3(o[2 * np + 1], ph, pl, b2, b3, c2, c3);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        l[i] = 1.0f / l[i];
    }
    const int r = warp * 16 + (lane >> 2);
#pragma unroll
    for (int half = 0; half < 2; half++) {
        if (r + 8 * half >= rows) continue;
        float* oh = out + ((i64)(t0 + r + 8 * half) * H + h) * D + (lane & 3) * 2;
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++)
            *(float2*)(oh + nt * 8) = make_float2(o[nt][2 * half] * l[half], o[nt][2 * half + 1] * l[half]);
    }
}

#define FA_CALL(call) call
#else
// Below compute capability 8.0 the kernels exist but do nothing; the host
// never launches them there (cuda/flash.rs).
#define FA_CALL(call)
#endif

// Grid (H, Σ ⌈n_i / FA_BQ⌉ over the sequences of s), FA_THREADS threads,
// dynamic shared memory 2·(FA_BQ + 2·KT)·D·2 bytes (cuda/flash.rs).
#define FLASH_ATTENTION(NAME, D, KT)                                                                      \
    extern "C" __global__ void __launch_bounds__(FA_THREADS)                                             \
        NAME(const float* q, float* out, Seqs s, int H, int Hkv, float scale, int kt, int vt) {          \
        GRID_DEP();                                                                                      \
        extern __shared__ __align__(16) char fa_smem[];                                                  \
        FA_CALL((flash_t<D, KT>(q, out, s, H, Hkv, scale, kt, vt, fa_smem)));                            \
    }
FLASH_ATTENTION(flash_attention64, 64, 64)
FLASH_ATTENTION(flash_attention128, 128, 64)
FLASH_ATTENTION(flash_attention256, 256, 16)
