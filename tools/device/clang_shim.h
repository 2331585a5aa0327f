// Declarations that let clang (-nocudainc) parse the kernels as NVRTC would: a
// syntax and type check on a machine without the CUDA toolkit. See
// tools/device/check_kernels.sh.
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))
#include <__clang_cuda_builtin_vars.h>
#include <__clang_cuda_libdevice_declares.h>
__device__ inline float expf(float x) { return __nv_expf(x); }
__device__ inline float sqrtf(float x) { return __nv_sqrtf(x); }
__device__ inline float rsqrtf(float x) { return __nv_rsqrtf(x); }
__device__ inline float logf(float x) { return __nv_logf(x); }
__device__ inline float log1pf(float x) { return __nv_log1pf(x); }
__device__ inline float sinf(float x) { return __nv_sinf(x); }
__device__ inline float cosf(float x) { return __nv_cosf(x); }
__device__ inline void sincosf(float x, float* s, float* c) { __nv_sincosf(x, s, c); }
__device__ inline float fmaxf(float a, float b) { return __nv_fmaxf(a, b); }
__device__ inline float fminf(float a, float b) { return __nv_fminf(a, b); }
__device__ inline float fabsf(float a) { return __nv_fabsf(a); }
__device__ inline float fmaf(float a, float b, float c) { return __nv_fmaf(a, b, c); }
__device__ inline float __uint_as_float(unsigned x) { return __nv_uint_as_float(x); }
__device__ inline unsigned __float_as_uint(float x) { return __nv_float_as_uint(x); }
__device__ inline float __shfl_xor_sync(unsigned m, float v, int o) { return __nvvm_shfl_sync_bfly_f32(m, v, o, 0x1f); }
__device__ inline int __shfl_xor_sync(unsigned m, int v, int o) { return __nvvm_shfl_sync_bfly_i32(m, v, o, 0x1f); }
__device__ inline float __shfl_sync(unsigned m, float v, int l) { return __nvvm_shfl_sync_idx_f32(m, v, l, 0x1f); }
__device__ inline int __shfl_sync(unsigned m, int v, int l) { return __nvvm_shfl_sync_idx_i32(m, v, l, 0x1f); }
__device__ inline float __shfl_up_sync(unsigned m, float v, int d) { return __nvvm_shfl_sync_up_f32(m, v, d, 0); }
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) float2 { float x, y; };
struct __attribute__((aligned(8))) uint2 { unsigned x, y; };
__device__ inline void __syncwarp(unsigned m = 0xffffffffu) { __nvvm_bar_warp_sync(m); }
template <typename T> __device__ inline T __ldg(const T* p) { return *p; }
#define __align__(n) __attribute__((aligned(n)))
__device__ inline int min(int a, int b) { return a < b ? a : b; }
__device__ inline int max(int a, int b) { return a > b ? a : b; }
__device__ inline float __int_as_float(int x) { return __nv_int_as_float(x); }
__device__ inline unsigned __ballot_sync(unsigned m, bool p) { return __nvvm_vote_ballot_sync(m, p); }
__device__ inline int __popc(unsigned x) { return __nv_popc(x); }
__device__ inline int __clz(int x) { return __nv_clz(x); }
__device__ inline void __threadfence_system() { __nvvm_membar_sys(); }
__device__ inline void __nanosleep(unsigned ns) { asm volatile("nanosleep.u32 %0;" ::"r"(ns)); }
__device__ inline float exp2f(float x) { return __nv_exp2f(x); }
__device__ inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
__device__ inline float2 make_float2(float x, float y) { return float2{x, y}; }
__device__ inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
