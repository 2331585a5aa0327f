// Norms, element-wise ops, strided copies and RoPE.

#define NORM_PER 16  // values a thread keeps in registers (dim ≤ 16 · block)

// y[r] = x[r] / sqrt(mean(x[r]²) + eps) · w, one block per row (rows of
// more than NORM_ROW_MAX values; `rms_norm_rows` takes the others); with `z`
// (not null) the gated form, times silu(z[r]). With `res` (not null), x is
// the residual stream and first takes x[r] += res[r] (the `add` kernel's
// sum): a block's residual add and the next norm in one launch. Each
// thread loads all of its elements at once and keeps them in registers
// (the pointers never alias: the host passes distinct buffers), so a
// short row costs one memory round trip, not one per element; a thread's
// sum of squares runs over its elements in order either way.
extern "C" __global__ void __launch_bounds__(256)
    rms_norm(float* __restrict__ x, const float* __restrict__ res, const float* __restrict__ w,
             const float* __restrict__ z, float* __restrict__ y, int dim, float eps) {
    __shared__ float sh[32];
    const i64 base = (i64)blockIdx.x * dim;
    const int tid = threadIdx.x, nt = blockDim.x;
    const bool short_row = dim <= NORM_PER * nt;
    // The weights (no kernel writes them) load while the kernel before
    // this one finishes.
    float wv[NORM_PER];
#pragma unroll
    for (int j = 0; j < NORM_PER; j++) {
        const int i = tid + j * nt;
        wv[j] = short_row && i < dim ? w[i] : 0.0f;
    }
    GRID_DEP();
    if (short_row) {
        x += base;
        y += base;
        if (res) res += base;
        if (z) z += base;
        float v[NORM_PER];
#pragma unroll
        for (int j = 0; j < NORM_PER; j++) {
            const int i = tid + j * nt;
            v[j] = i < dim ? x[i] : 0.0f;
        }
        if (res) {
#pragma unroll
            for (int j = 0; j < NORM_PER; j++) {
                const int i = tid + j * nt;
                if (i < dim) {
                    v[j] += res[i];
                    x[i] = v[j];
                }
            }
        }
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < NORM_PER; j++)
            if (tid + j * nt < dim) ss = fmaf(v[j], v[j], ss);
        ss = block_sum(ss, sh);
        const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma unroll
        for (int j = 0; j < NORM_PER; j++) {
            const int i = tid + j * nt;
            if (i < dim) {
                float o = v[j] * inv * wv[j];
                if (z) o *= silu_f(z[i]);
                y[i] = o;
            }
        }
        return;
    }
    float ss = 0.0f;
    for (int i = tid; i < dim; i += nt) {
        float v = x[base + i];
        if (res) {
            v += res[base + i];
            x[base + i] = v;
        }
        ss = fmaf(v, v, ss);
    }
    ss = block_sum(ss, sh);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = tid; i < dim; i += nt) {
        float v = x[base + i] * inv * w[i];
        if (z) v *= silu_f(z[base + i]);
        y[base + i] = v;
    }
}

// rms_norm for rows of at most NORM_ROW_MAX values (the heads of q and k,
// the GatedDeltaNet's gated heads): one warp per row, NORM_ROWS rows per
// block of 32·NORM_ROWS threads; lane l holds values l + 32j, sums its
// squares in order, and the warp adds the lanes' sums. A prefill chunk's
// tens of thousands of such rows take that many fewer blocks.
#define NORM_ROWS 8
#define NORM_ROW_MAX (32 * NORM_PER)
extern "C" __global__ void __launch_bounds__(32 * NORM_ROWS)
    rms_norm_rows(float* __restrict__ x, const float* __restrict__ res, const float* __restrict__ w,
                  const float* __restrict__ z, float* __restrict__ y, int rows, int dim, float eps) {
    const int lane = threadIdx.x & 31;
    const i64 r = (i64)blockIdx.x * NORM_ROWS + (threadIdx.x >> 5);
    float wv[NORM_PER];
#pragma unroll
    for (int j = 0; j < NORM_PER; j++) {
        const int i = lane + 32 * j;
        wv[j] = i < dim ? w[i] : 0.0f;
    }
    GRID_DEP();
    if (r >= rows) return;
    const i64 base = r * dim;
    float v[NORM_PER];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NORM_PER; j++) {
        const int i = lane + 32 * j;
        v[j] = i < dim ? x[base + i] : 0.0f;
        if (res && i < dim) {
            v[j] += res[base + i];
            x[base + i] = v[j];
        }
        ss = fmaf(v[j], v[j], ss);
    }
    const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)dim + eps);
#pragma unroll
    for (int j = 0; j < NORM_PER; j++) {
        const int i = lane + 32 * j;
        if (i < dim) {
            float o = v[j] * inv * wv[j];
            if (z) o *= silu_f(z[base + i]);
            y[base + i] = o;
        }
    }
}

extern "C" __global__ void add(float* y, const float* x, i64 len) {
    GRID_DEP();
    GRID_LOOP(i, len) y[i] += x[i];
}

// y += the CPU's sum of a hybrid step, read from page-locked host memory
// that the CPU writes (host_cpu.rs): units of 16 bytes, three floats of
// the sum and then the step's number `seq`, each unit's floats stored
// before its number. One thread a unit reads it whole in one load over
// the bus and again until it shows `seq`: a unit read whole that shows
// this step's number holds this step's floats, so the sum arrives in one
// trip over the bus once written (a flag polled first, then the sum
// read, took two, each behind the expert copies on the link).
extern "C" __global__ void add_units(float* y, const uint4* units, i64 len, unsigned seq) {
    GRID_DEP();
    const i64 n = (len + 2) / 3;
    GRID_LOOP(u, n) {
        uint4 v;
        for (;;) {
            asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                         : "l"(units + u));
            if ((int)(v.w - seq) >= 0) break;
#if __CUDA_ARCH__ >= 700
            __nanosleep(500);
#endif
        }
        const float f[3] = {__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z)};
#pragma unroll
        for (int j = 0; j < 3; j++)
            if (3 * u + j < len) y[3 * u + j] += f[j];
    }
}

// Three runs of words into dst (page-locked host memory mapped for the
// device) at word offsets o_i, then dst[0] = seq: the host spins on that
// word instead of a copy and a stream sync (readback.rs, `Published`).
extern "C" __global__ void publish(unsigned* dst, const unsigned* s0, int o0, int n0, const unsigned* s1, int o1,
                                   int n1, const unsigned* s2, int o2, int n2, unsigned seq) {
    GRID_DEP();
    for (int i = threadIdx.x; i < n0; i += blockDim.x) dst[o0 + i] = s0[i];
    for (int i = threadIdx.x; i < n1; i += blockDim.x) dst[o1 + i] = s1[i];
    for (int i = threadIdx.x; i < n2; i += blockDim.x) dst[o2 + i] = s2[i];
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) *(volatile unsigned*)dst = seq;
}

// y[r·dim + i] += s_r · x[r·dim + i], s_r = scale[r] or sigmoid(scale[r]);
// with `assign`, y (known to be zero) is not read: y = s_r · x.
extern "C" __global__ void add_scaled_rows(float* y, const float* x, const float* scale, i64 len, int dim, int sig,
                                           int assign) {
    GRID_DEP();
    GRID_LOOP(i, len) {
        float s = scale[i / dim];
        if (sig) s = sigmoid_f(s);
        y[i] = assign ? s * x[i] : fmaf(s, x[i], y[i]);
    }
}

extern "C" __global__ void swiglu(const float* g, const float* u, float* y, i64 len) {
    GRID_DEP();
    GRID_LOOP(i, len) y[i] = silu_f(g[i]) * u[i];
}

extern "C" __global__ void sigmoid_mul(float* x, const float* g, i64 len) {
    GRID_DEP();
    GRID_LOOP(i, len) x[i] *= sigmoid_f(g[i]);
}

// dst[dst_off + r·dst_stride + i] = src[src_off + r·src_stride + i].
extern "C" __global__ void copy_strided(const float* src, float* dst, int rows, int width, i64 src_off,
                                        i64 src_stride, i64 dst_off, i64 dst_stride) {
    GRID_DEP();
    GRID_LOOP(i, (i64)rows * width) {
        const i64 r = i / width, c = i % width;
        dst[dst_off + r * dst_stride + c] = src[src_off + r * src_stride + c];
    }
}

// Rotary embedding in place over x viewed as [n_tokens, token_stride] with
// heads at h·head_stride; channels rot_off..rot_off+rot_dim rotate.
// The rotation of rope and rope_seqs; pos(t) is token t's position.
template <class Pos>
__device__ __forceinline__ void rope_rows(float* x, const float* inv_freq, int n_tokens, int n_heads, int head_stride,
                                          int token_stride, int rot_off, int rot_dim, int interleaved, float mscale,
                                          Pos pos) {
    const int half = rot_dim / 2;
    GRID_LOOP(i, (i64)n_tokens * n_heads * half) {
        const int j = (int)(i % half);
        const i64 th = i / half;
        const int h = (int)(th % n_heads), t = (int)(th / n_heads);
        const float ang = (float)pos(t) * inv_freq[j];
        float s, c;
        sincosf(ang, &s, &c);
        c *= mscale;
        s *= mscale;
        const i64 base = (i64)t * token_stride + (i64)h * head_stride + rot_off;
        const int i0 = interleaved ? 2 * j : j, i1 = interleaved ? 2 * j + 1 : j + half;
        const float x0 = x[base + i0], x1 = x[base + i1];
        x[base + i0] = x0 * c - x1 * s;
        x[base + i1] = x1 * c + x0 * s;
    }
}

extern "C" __global__ void rope(float* x, const float* inv_freq, int n_tokens, int n_heads, int head_stride,
                                int token_stride, int rot_off, int rot_dim, int pos0, int interleaved,
                                float mscale) {
    GRID_DEP();
    rope_rows(x, inv_freq, n_tokens, n_heads, head_stride, token_stride, rot_off, rot_dim, interleaved, mscale,
              [=](int t) { return pos0 + t; });
}

// rope over the rows of several sequences, each row at its sequence's
// position.
extern "C" __global__ void rope_seqs(float* x, const float* inv_freq, int n_tokens, int n_heads, int head_stride,
                                     int token_stride, int rot_off, int rot_dim, int interleaved, float mscale,
                                     Seqs s) {
    GRID_DEP();
    rope_rows(x, inv_freq, n_tokens, n_heads, head_stride, token_stride, rot_off, rot_dim, interleaved, mscale,
              [&](int t) {
                  const int z = seq_of(s, t);
                  return z < 0 ? 0 : s.pos0[z] + t - s.off[z];
              });
}

// Warps over (row, group of 32 values) of n rows: the grid-stride loop of
// kv_store and kv_append, the same for every lane of a warp.
#define WARP_LOOP(w, len)                                                                          \
    for (i64 w = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < (len);                      \
         w += ((i64)gridDim.x * blockDim.x) >> 5)

// Rows row0 .. row0 + n − 1 of a cache of type t (rows of `width`) =
// the rows of src [n, width], rounded to the type.
extern "C" __global__ void kv_store(const float* src, char* dst, int n, int width, int t, int row0) {
    GRID_DEP();
    const int groups = (width + 31) >> 5, lane = threadIdx.x & 31;
    WARP_LOOP(w, (i64)n * groups) {
        const int r = (int)(w / groups), g = (int)(w % groups);
        kv_put32(src + (i64)r * width, dst + (row0 + r) * kv_row_bytes(t, width), t, width, g << 5, lane);
    }
}

// dst [n, width] = rows row0 .. row0 + n − 1 of a cache of type t, decoded.
extern "C" __global__ void kv_load(const char* src, float* dst, int n, int width, int t, int row0) {
    GRID_DEP();
    GRID_LOOP(i, (i64)n * width) {
        const int r = (int)(i / width), d = (int)(i % width);
        dst[i] = kv_val(src + (row0 + r) * kv_row_bytes(t, width), t, width, d);
    }
}

// The new rows' k [n, kw] and v [n, vw] into each sequence's caches at
// its positions: s.a[z] K (type kt), s.b[z] V (type vt).
extern "C" __global__ void kv_append(const float* k, const float* v, Seqs s, int n, int kw, int vw, int kt, int vt) {
    GRID_DEP();
    const int kg = (kw + 31) >> 5, groups = kg + ((vw + 31) >> 5), lane = threadIdx.x & 31;
    WARP_LOOP(w, (i64)n * groups) {
        const int r = (int)(w / groups), g = (int)(w % groups);
        const int z = seq_of(s, r);
        if (z < 0) continue;
        const i64 p = s.pos0[z] + r - s.off[z];
        if (g < kg)
            kv_put32(k + (i64)r * kw, (char*)s.a[z] + p * kv_row_bytes(kt, kw), kt, kw, g << 5, lane);
        else
            kv_put32(v + (i64)r * vw, (char*)s.b[z] + p * kv_row_bytes(vt, vw), vt, vw, (g - kg) << 5, lane);
    }
}
