//! 16 floats in registers (`Lanes`): the vector operations of the
//! GatedDeltaNet recurrence (`delta.rs`) and of attention (`attn.rs`),
//! one generic body compiled for
//! AVX-512, for AVX2 and without either. The x86 types may only be used
//! in functions compiled for their instructions (`#[target_feature]`),
//! into which their methods are inlined.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Rows of the state per recurrence task in a prefill call: one AVX-512
/// register (two AVX2 ones) holds one column of them.
pub(super) const LANES: usize = 16;

/// LANES floats in registers: the operations `block_step` needs.
pub(super) trait Lanes: Copy {
    /// # Safety
    /// `p` points to LANES floats; the CPU runs the type's instructions.
    unsafe fn load(p: *const f32) -> Self;
    /// # Safety
    /// As `load`.
    unsafe fn store(self, p: *mut f32);
    /// # Safety
    /// The CPU runs the type's instructions (values of the type exist
    /// only where it does: `load` and `splat` make them, so the other
    /// operations are safe).
    unsafe fn splat(v: f32) -> Self;
    /// `a·b + c`, fused where the instructions have it.
    fn madd(a: Self, b: Self, c: Self) -> Self;
    fn mul(a: Self, b: Self) -> Self;
    fn add(a: Self, b: Self) -> Self;
    fn sub(a: Self, b: Self) -> Self;
    /// The sum of the lanes.
    fn sum(self) -> f32;
}

/// Plain arrays (the compiler's vectors, unfused).
#[derive(Clone, Copy)]
pub(super) struct Plain([f32; LANES]);

impl Plain {
    #[inline(always)]
    fn map(a: Self, b: Self, f: impl Fn(f32, f32) -> f32) -> Self {
        Plain(std::array::from_fn(|l| f(a.0[l], b.0[l])))
    }
}

impl Lanes for Plain {
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller's.
        Plain(unsafe { p.cast::<[f32; LANES]>().read_unaligned() })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the caller's.
        unsafe { p.cast::<[f32; LANES]>().write_unaligned(self.0) }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        Plain([v; LANES])
    }
    #[inline(always)]
    fn madd(a: Self, b: Self, c: Self) -> Self {
        Plain::add(Plain::mul(a, b), c)
    }
    #[inline(always)]
    fn mul(a: Self, b: Self) -> Self {
        Plain::map(a, b, |x, y| x * y)
    }
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        Plain::map(a, b, |x, y| x + y)
    }
    #[inline(always)]
    fn sub(a: Self, b: Self) -> Self {
        Plain::map(a, b, |x, y| x - y)
    }
    #[inline(always)]
    fn sum(self) -> f32 {
        self.0.iter().sum()
    }
}

/// One AVX-512 register.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Avx512(__m512);

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx512 {
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller's (the CPU has AVX-512 F).
        Avx512(unsafe { _mm512_loadu_ps(p) })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the caller's (the CPU has AVX-512 F).
        unsafe { _mm512_storeu_ps(p, self.0) }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        // SAFETY: the caller's (the CPU has AVX-512 F).
        Avx512(unsafe { _mm512_set1_ps(v) })
    }
    #[inline(always)]
    fn madd(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: a value exists, so the CPU has AVX-512 F.
        Avx512(unsafe { _mm512_fmadd_ps(a.0, b.0, c.0) })
    }
    #[inline(always)]
    fn mul(a: Self, b: Self) -> Self {
        // SAFETY: a value exists, so the CPU has AVX-512 F.
        Avx512(unsafe { _mm512_mul_ps(a.0, b.0) })
    }
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        // SAFETY: a value exists, so the CPU has AVX-512 F.
        Avx512(unsafe { _mm512_add_ps(a.0, b.0) })
    }
    #[inline(always)]
    fn sub(a: Self, b: Self) -> Self {
        // SAFETY: a value exists, so the CPU has AVX-512 F.
        Avx512(unsafe { _mm512_sub_ps(a.0, b.0) })
    }
    #[inline(always)]
    fn sum(self) -> f32 {
        // SAFETY: a value exists, so the CPU has AVX-512 F.
        unsafe { _mm512_reduce_add_ps(self.0) }
    }
}

/// Two AVX2 registers.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Avx2(__m256, __m256);

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx2 {
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller's (the CPU has AVX2 and FMA).
        unsafe { Avx2(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the caller's (the CPU has AVX2 and FMA).
        unsafe {
            _mm256_storeu_ps(p, self.0);
            _mm256_storeu_ps(p.add(8), self.1);
        }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        // SAFETY: the caller's (the CPU has AVX2 and FMA).
        let s = unsafe { _mm256_set1_ps(v) };
        Avx2(s, s)
    }
    #[inline(always)]
    fn madd(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: a value exists, so the CPU has AVX2 and FMA.
        unsafe { Avx2(_mm256_fmadd_ps(a.0, b.0, c.0), _mm256_fmadd_ps(a.1, b.1, c.1)) }
    }
    #[inline(always)]
    fn mul(a: Self, b: Self) -> Self {
        // SAFETY: a value exists, so the CPU has AVX2 and FMA.
        unsafe { Avx2(_mm256_mul_ps(a.0, b.0), _mm256_mul_ps(a.1, b.1)) }
    }
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        // SAFETY: a value exists, so the CPU has AVX2 and FMA.
        unsafe { Avx2(_mm256_add_ps(a.0, b.0), _mm256_add_ps(a.1, b.1)) }
    }
    #[inline(always)]
    fn sub(a: Self, b: Self) -> Self {
        // SAFETY: a value exists, so the CPU has AVX2 and FMA.
        unsafe { Avx2(_mm256_sub_ps(a.0, b.0), _mm256_sub_ps(a.1, b.1)) }
    }
    #[inline(always)]
    fn sum(self) -> f32 {
        // SAFETY: a value exists, so the CPU has AVX2 and FMA.
        unsafe {
            let v = _mm256_add_ps(self.0, self.1);
            let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps::<1>(h, h)))
        }
    }
}
