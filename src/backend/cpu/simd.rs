//! AVX2 + FMA kernels for `linear` (x86_64, chosen at run time when the
//! CPU has AVX2, FMA and F16C).
//!
//! Quantized weights: 8 bytes of packed weights are widened to eight
//! 32-bit lanes (`vpmovzxbd`) and value k of every byte is taken out with
//! a shift and a mask, so one register holds columns `PB·i + k` (i = 0..8,
//! PB values per byte). x is permuted once per call into that order
//! (`permute_x`).
//!
//! One token (`*_matvec`, decode): each group accumulates `Σ q·x` in
//! registers and is scaled once; its bias multiplies the precomputed group
//! sum of x. Several tokens (`*_gemm`, prefill): four rows at a time are
//! decoded once into f32 (`q·s + b`, in x's column order) and a 4-row ×
//! 3-token register tile runs over the whole row.

use super::qmatvec::{bf16_bits_to_f32, Acts, FloatMat, QuantMat};
use super::vector::dot;
use crate::format::Dtype;
use std::arch::x86_64::*;

/// Whether this CPU runs these kernels.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// Whether the quantized kernels take this layout: groups of whole
/// 32-column units.
pub(crate) fn quant_supported(m: &QuantMat) -> bool {
    m.group_size.is_multiple_of(32)
}

/// x `[n, cols]` with its columns in unpacking order: in each block of
/// `8·PB` columns (8 bytes of weights), column `PB·i + k` moves to `8k + i`.
pub(crate) fn permute_x(x: &[f32], bits: usize) -> Vec<f32> {
    let pb = 8 / bits;
    let mut out = vec![0.0f32; x.len()];
    for (o, xb) in out.chunks_exact_mut(8 * pb).zip(x.chunks_exact(8 * pb)) {
        for i in 0..8 {
            for k in 0..pb {
                o[8 * k + i] = xb[pb * i + k];
            }
        }
    }
    out
}

/// Rows `r0..r0 + out.len()/n` of a quantized matrix into `out` `[rows, n]`.
/// `a.xp` must hold `permute_x(x, bits)`.
///
/// # Safety
/// `available()` and `quant_supported(m)` must hold, `m` must come from
/// `Mat::new` (sizes checked), and `a` must be built for it.
pub(crate) unsafe fn quant_rows(m: &QuantMat, a: &Acts, r0: usize, out: &mut [f32]) {
    match (m.bits, a.n) {
        (2, 1) => quant_matvec::<2>(m, a, r0, out),
        (4, 1) => quant_matvec::<4>(m, a, r0, out),
        (_, 1) => quant_matvec::<8>(m, a, r0, out),
        (2, _) => quant_gemm::<2>(m, a, r0, out),
        (4, _) => quant_gemm::<4>(m, a, r0, out),
        (_, _) => quant_gemm::<8>(m, a, r0, out),
    }
}

/// Rows `r0..r0 + out.len()/n` of a float matrix into `out` `[rows, n]`.
///
/// # Safety
/// `available()` must hold and `m` must come from `Mat::new`.
pub(crate) unsafe fn float_rows(m: &FloatMat, a: &Acts, r0: usize, out: &mut [f32]) {
    match m.dtype {
        Dtype::Bf16 => float_kernel::<1>(m, a, r0, out),
        Dtype::F16 => float_kernel::<2>(m, a, r0, out),
        _ => float_kernel::<0>(m, a, r0, out),
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
}

/// bf16 (or f16) values at `p` as f32 into `out`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn halves_to_f32(p: *const u8, f16: bool, out: &mut [f32]) {
    let mut i = 0;
    while i + 8 <= out.len() {
        let h = _mm_loadu_si128(p.add(2 * i) as *const __m128i);
        let v = if f16 {
            _mm256_cvtph_ps(h)
        } else {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        };
        _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
        i += 8;
    }
    for (j, o) in out.iter_mut().enumerate().skip(i) {
        let h = (p.add(2 * j) as *const u16).read_unaligned();
        *o = if f16 {
            half::f16::from_bits(h).to_f32()
        } else {
            bf16_bits_to_f32(h)
        };
    }
}

/// Row `r`'s scales and biases as f32 into `sb` `[scales | biases]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn row_scales(m: &QuantMat, r: usize, sb: &mut [f32]) {
    let off = 2 * r * m.groups();
    let (s, b) = sb.split_at_mut(m.groups());
    halves_to_f32(m.scales.as_ptr().add(off), m.f16_scales, s);
    halves_to_f32(m.biases.as_ptr().add(off), m.f16_scales, b);
}

/// The 8-byte blocks of one 32-column unit, widened to 32-bit lanes, and
/// the levels of register `vi` (0..4) in x's permuted column order.
macro_rules! for_each_level {
    ($bits:ident, $wu:expr, |$vi:ident, $q:ident| $body:block) => {{
        let pb = 8 / $bits as usize;
        let mask = _mm256_set1_epi32((1 << $bits) - 1);
        for blk in 0..4 / pb {
            let mut v = _mm256_cvtepu8_epi32(_mm_loadl_epi64($wu.add(8 * blk) as *const __m128i));
            for k in 0..pb {
                let $q = _mm256_cvtepi32_ps(_mm256_and_si256(v, mask));
                v = _mm256_srli_epi32::<$bits>(v);
                let $vi = blk * pb + k;
                $body
            }
        }
    }};
}

/// One token: `out[i] = row r0+i · x`, as `Σ_g s_g·Σ q·x + Σ_g b_g·Σ x`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quant_matvec<const BITS: i32>(m: &QuantMat, a: &Acts, r0: usize, out: &mut [f32]) {
    let (gs, groups) = (m.group_size, m.groups());
    let units = gs / 32; // 32 columns = 4 registers = 4·bits bytes
    let xp = a.xp.as_ptr();
    let mut sb = vec![0.0f32; 2 * groups];
    for (i, o) in out.iter_mut().enumerate() {
        let r = r0 + i;
        row_scales(m, r, &mut sb);
        let w = m.weight.as_ptr().add(r * m.row_bytes());
        let mut tot = _mm256_setzero_ps();
        for g in 0..groups {
            let mut acc = [_mm256_setzero_ps(); 4];
            for u in 0..units {
                let c = g * gs + 32 * u;
                let wu = w.add(c * BITS as usize / 8);
                for_each_level!(BITS, wu, |vi, q| {
                    acc[vi] = _mm256_fmadd_ps(q, _mm256_loadu_ps(xp.add(c + 8 * vi)), acc[vi]);
                });
            }
            let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            tot = _mm256_fmadd_ps(sum, _mm256_set1_ps(*sb.get_unchecked(g)), tot);
        }
        *o = hsum(tot) + dot(&sb[groups..], &a.xsum[..groups]);
    }
}

/// Several tokens: rows decoded four at a time into f32, then `gemm_block`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quant_gemm<const BITS: i32>(m: &QuantMat, a: &Acts, r0: usize, out: &mut [f32]) {
    let (n, cols, gs) = (a.n, m.cols, m.group_size);
    let mut sb = vec![0.0f32; 2 * m.groups()];
    let mut wbuf = vec![0.0f32; 4 * cols]; // [4, cols], x's column order
    for (bi, ob) in out.chunks_mut(4 * n).enumerate() {
        let rr = ob.len() / n;
        for (j, wrow) in wbuf.chunks_exact_mut(cols).take(rr).enumerate() {
            let r = r0 + 4 * bi + j;
            row_scales(m, r, &mut sb);
            let w = m.weight.as_ptr().add(r * m.row_bytes());
            let wp = wrow.as_mut_ptr();
            for c in (0..cols).step_by(32) {
                let g = c / gs;
                let s = _mm256_set1_ps(*sb.get_unchecked(g));
                let b = _mm256_set1_ps(*sb.get_unchecked(m.groups() + g));
                let wu = w.add(c * BITS as usize / 8);
                for_each_level!(BITS, wu, |vi, q| {
                    _mm256_storeu_ps(wp.add(c + 8 * vi), _mm256_fmadd_ps(q, s, b));
                });
            }
        }
        gemm_block(&wbuf[..rr * cols], &a.xp, n, cols, ob);
    }
}

/// Eight weights at element `i` of a float row, as f32
/// (`D`: 0 = f32, 1 = bf16, 2 = f16).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8<const D: u8>(p: *const u8, i: usize) -> __m256 {
    match D {
        0 => _mm256_loadu_ps(p.add(4 * i) as *const f32),
        1 => {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(2 * i) as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
        }
        _ => _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i) as *const __m128i)),
    }
}

/// One weight of a float row, as f32.
#[inline]
unsafe fn load1<const D: u8>(p: *const u8, i: usize) -> f32 {
    match D {
        0 => (p.add(4 * i) as *const f32).read_unaligned(),
        1 => bf16_bits_to_f32((p.add(2 * i) as *const u16).read_unaligned()),
        _ => half::f16::from_bits((p.add(2 * i) as *const u16).read_unaligned()).to_f32(),
    }
}

/// Float rows: one token straight from the weights (four FMA chains);
/// several tokens through f32 rows and `gemm_block`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float_kernel<const D: u8>(m: &FloatMat, a: &Acts, r0: usize, out: &mut [f32]) {
    let (n, cols) = (a.n, m.cols);
    let x = a.x.as_ptr();
    if n == 1 {
        for (i, o) in out.iter_mut().enumerate() {
            let w = m.data.as_ptr().add((r0 + i) * m.row_bytes());
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut c = 0;
            while c + 32 <= cols {
                for (vi, av) in acc.iter_mut().enumerate() {
                    *av = _mm256_fmadd_ps(load8::<D>(w, c + 8 * vi), _mm256_loadu_ps(x.add(c + 8 * vi)), *av);
                }
                c += 32;
            }
            while c + 8 <= cols {
                acc[0] = _mm256_fmadd_ps(load8::<D>(w, c), _mm256_loadu_ps(x.add(c)), acc[0]);
                c += 8;
            }
            let mut s = hsum(_mm256_add_ps(
                _mm256_add_ps(acc[0], acc[1]),
                _mm256_add_ps(acc[2], acc[3]),
            ));
            for j in c..cols {
                s += load1::<D>(w, j) * *x.add(j);
            }
            *o = s;
        }
        return;
    }
    let mut wbuf = vec![0.0f32; 4 * cols]; // [4, cols]
    for (bi, ob) in out.chunks_mut(4 * n).enumerate() {
        let rr = ob.len() / n;
        for (j, wrow) in wbuf.chunks_exact_mut(cols).take(rr).enumerate() {
            let w = m.data.as_ptr().add((r0 + 4 * bi + j) * m.row_bytes());
            let mut c = 0;
            while c + 8 <= cols {
                _mm256_storeu_ps(wrow.as_mut_ptr().add(c), load8::<D>(w, c));
                c += 8;
            }
            for (k, v) in wrow.iter_mut().enumerate().skip(c) {
                *v = load1::<D>(w, k);
            }
        }
        gemm_block(&wbuf[..rr * cols], a.x, n, cols, ob);
    }
}

/// `out[r·n + t] = w[r] · x[t]` for up to 4 rows `w` `[rr, k]` and all
/// tokens `x` `[n, k]`, in register tiles of 4 rows × 3 tokens.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn gemm_block(w: &[f32], x: &[f32], n: usize, k: usize, out: &mut [f32]) {
    let rr = w.len() / k;
    let mut t0 = 0;
    while t0 < n {
        let tt = (n - t0).min(3);
        match (rr, tt) {
            (4, 3) => tile::<4, 3>(w, x, k, t0, n, out),
            (4, 2) => tile::<4, 2>(w, x, k, t0, n, out),
            (4, _) => tile::<4, 1>(w, x, k, t0, n, out),
            (3, 3) => tile::<3, 3>(w, x, k, t0, n, out),
            (3, 2) => tile::<3, 2>(w, x, k, t0, n, out),
            (3, _) => tile::<3, 1>(w, x, k, t0, n, out),
            (2, 3) => tile::<2, 3>(w, x, k, t0, n, out),
            (2, 2) => tile::<2, 2>(w, x, k, t0, n, out),
            (2, _) => tile::<2, 1>(w, x, k, t0, n, out),
            (_, 3) => tile::<1, 3>(w, x, k, t0, n, out),
            (_, 2) => tile::<1, 2>(w, x, k, t0, n, out),
            (_, _) => tile::<1, 1>(w, x, k, t0, n, out),
        }
        t0 += tt;
    }
}

/// An `R`-row × `T`-token tile over the whole length `k`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile<const R: usize, const T: usize>(w: &[f32], x: &[f32], k: usize, t0: usize, n: usize, out: &mut [f32]) {
    let (wp, xp) = (w.as_ptr(), x.as_ptr().add(t0 * k));
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let mut c = 0;
    while c + 8 <= k {
        let mut xv = [_mm256_setzero_ps(); T];
        for (t, v) in xv.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(xp.add(t * k + c));
        }
        for (r, ar) in acc.iter_mut().enumerate() {
            let wv = _mm256_loadu_ps(wp.add(r * k + c));
            for (t, v) in ar.iter_mut().enumerate() {
                *v = _mm256_fmadd_ps(wv, xv[t], *v);
            }
        }
        c += 8;
    }
    for (r, ar) in acc.iter().enumerate() {
        for (t, v) in ar.iter().enumerate() {
            let mut s = hsum(*v);
            for j in c..k {
                s += *wp.add(r * k + j) * *xp.add(t * k + j);
            }
            out[r * n + t0 + t] = s;
        }
    }
}
