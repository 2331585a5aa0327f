// The KV caches' element types (backend/kv.rs `KvType::code`) and their
// row encoding: f32, f16 or bf16 values, or q8_0 rows of `width` i8 codes
// followed by `width / 32` f16 scales (value i = q[i] · d[i / 32]).

#define KV_F32 0
#define KV_F16 1
#define KV_BF16 2
#define KV_Q8 3

// Bytes of a row of `width` values of type t.
__device__ __forceinline__ i64 kv_row_bytes(int t, int width) {
    return t == KV_F32 ? 4ll * width : t == KV_Q8 ? (i64)width + 2 * (width >> 5) : 2ll * width;
}

// Value d of a row that starts at r (a row of `width` values of type t).
__device__ __forceinline__ float kv_val(const char* r, int t, int width, int d) {
    switch (t) {
        case KV_F32: return ((const float*)r)[d];
        case KV_F16: return f16f(((const u16*)r)[d]);
        case KV_BF16: return bf16f(((const u16*)r)[d]);
        default: return (float)((const signed char*)r)[d] * f16f(((const u16*)(r + width))[d >> 5]);
    }
}

// Values d .. d + 3 of a row at r (d a multiple of 4; f32 and 16-bit rows
// are aligned for a vector load of them).
__device__ __forceinline__ float4 kv_val4(const char* r, int t, int width, int d) {
    switch (t) {
        case KV_F32: return __ldg((const float4*)(r + 4ll * d));
        case KV_F16:
        case KV_BF16: {
            const uint2 u = __ldg((const uint2*)(r + 2ll * d));
            const u16 a = u.x & 0xffff, b = u.x >> 16, c = u.y & 0xffff, e = u.y >> 16;
            if (t == KV_F16) return make_float4(f16f(a), f16f(b), f16f(c), f16f(e));
            return make_float4(bf16f(a), bf16f(b), bf16f(c), bf16f(e));
        }
        default: {
            const signed char* q = (const signed char*)r + d;
            const float s = f16f(((const u16*)(r + width))[d >> 5]);
            return make_float4(q[0] * s, q[1] * s, q[2] * s, q[3] * s);
        }
    }
}

__device__ __forceinline__ u16 f2f16(float x) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

// bf16 rounded to nearest even (NaN kept a NaN).
__device__ __forceinline__ u16 f2bf16(float x) {
    const u32 u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);
    return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// A warp stores values c0 .. c0 + 31 of a row (src, f32) into row `r` of
// a cache of type t: lane i takes value c0 + i; a q8_0 block's scale is
// the warp's max over its 32 values. Every lane of the warp must call it.
__device__ __forceinline__ void kv_put32(const float* src, char* r, int t, int width, int c0, int lane) {
    const int d = c0 + lane;
    const bool ok = d < width;
    const float x = ok ? src[d] : 0.0f;
    switch (t) {
        case KV_F32:
            if (ok) ((float*)r)[d] = x;
            break;
        case KV_F16:
            if (ok) ((u16*)r)[d] = f2f16(x);
            break;
        case KV_BF16:
            if (ok) ((u16*)r)[d] = f2bf16(x);
            break;
        default: {
            const float amax = warp_max(fabsf(x));
            const float s = amax / 127.0f;
            const float id = s != 0.0f ? 1.0f / s : 0.0f;
            if (ok) ((signed char*)r)[d] = (signed char)roundf(x * id);
            if (lane == 0) ((u16*)(r + width))[c0 >> 5] = f2f16(s);
        }
    }
}
