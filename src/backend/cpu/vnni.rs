//! The fast quantized `linear` (decode, and by tiles of four tokens
//! prefill): AVX-512 VNNI integer dot products against activations
//! rounded to 16-bit integers per group.
//!
//! x is quantized once per call, per group of `group_size` columns:
//! `x ≈ xs_g · xq` with `xq` in [−32767, 32767] and `xs_g = max|x_g| / 32767`
//! (a relative error of at most 1.5e-5 of the group's largest value). A
//! row is then
//!
//! `y = Σ_g s_g · xs_g · Σ_i q_i·xq_i  +  Σ_g b_g · Σ_i x_i`
//!
//! where `Σ q·xq` is exact in 32-bit integers (`vpdpwssd`: 32 weights per
//! instruction; a group's sum is below 2^31 while `group_size · (2^bits − 1)`
//! is at most 65535) and `Σ x` is the exact f32 group sum. The rounding
//! error `s_g·Σ q_i·(x_i − xs_g·xq_i)` is largest where the levels are; the
//! part of it that the middle level `m = (2^bits − 1)/2` makes,
//! `m·s_g·(Σ x − xs_g·Σ xq)`, is added back from the per-group residuals
//! (`QuantX::resid`), which halves the error. Against the f32
//! kernels (`simd512`, 16 weights per multiply-add after a conversion to
//! f32) this does about a third of the instructions per weight. It changes
//! the numerics, so it is the fast path, chosen unless the backend is asked
//! for exact products (SPEC §6).
//!
//! 32 bytes of packed weights are widened to 32 16-bit lanes
//! (`vpmovzxbw`), and level k of every byte is taken out with a shift and a
//! mask, so one register holds columns `PB·i + k` (i = 0..32, PB values per
//! byte); `qmatvec::quantize_x` writes xq in that order.

use super::qmatvec::{Acts, QuantMat, QuantX};
use std::arch::x86_64::*;

/// Whether this CPU runs this kernel.
pub(crate) fn available() -> bool {
    super::simd512::available() && is_x86_feature_detected!("avx512vnni")
}

/// Whether the kernel takes this layout: groups of whole 32-byte blocks,
/// and group sums that fit in 32 bits.
pub(crate) fn quant_supported(m: &QuantMat) -> bool {
    (m.group_size * m.bits / 8).is_multiple_of(32) && m.group_size * ((1 << m.bits) - 1) <= 65535
}

/// `x` `[n, cols]` quantized for `bits`-bit weights in groups of `gs`, as
/// `qmatvec::quantize_x` does but with AVX-512 for 4- and 8-bit weights
/// (rounding half to even), and `xsum` (the group sums of x) for the
/// residuals.
pub(crate) fn quantize_x(x: &[f32], xsum: &[f32], gs: usize, bits: usize) -> QuantX {
    if bits == 2 || !available() {
        return super::qmatvec::quantize_x(x, gs, bits);
    }
    use rayon::prelude::*;
    let mut out = QuantX {
        q: vec![0i16; x.len()],
        scale: vec![0.0; x.len() / gs],
        resid: vec![0.0; x.len() / gs],
    };
    // Pieces of 64 groups (a token of 4096 columns at g64), in parallel.
    const PIECE: usize = 64;
    out.q
        .par_chunks_mut(PIECE * gs)
        .zip(out.scale.par_chunks_mut(PIECE).zip(out.resid.par_chunks_mut(PIECE)))
        .zip(x.par_chunks(PIECE * gs).zip(xsum.par_chunks(PIECE)))
        .for_each(|((q, (scale, resid)), (x, xsum))| {
            // SAFETY: AVX-512 is available; every group is `gs` long, a
            // multiple of 64 columns for these layouts (`quant_supported`),
            // and each piece's outputs are sized for its x.
            unsafe { quantize_avx512(x, xsum, gs, bits, q, scale, resid) }
        });
    out
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn quantize_avx512(
    x: &[f32],
    xsum: &[f32],
    gs: usize,
    bits: usize,
    q: &mut [i16],
    scale: &mut [f32],
    resid: &mut [f32],
) {
    // Even and odd columns of two registers (4-bit: the low and high
    // nibbles of 32 bytes are columns 2i and 2i + 1).
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (g, (xg, qg)) in x.chunks_exact(gs).zip(q.chunks_exact_mut(gs)).enumerate() {
        let xp = xg.as_ptr();
        let mut m = _mm512_setzero_ps();
        for c in (0..gs).step_by(16) {
            m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(xp.add(c))));
        }
        let amax = _mm512_reduce_max_ps(m);
        let s = amax / 32767.0;
        scale[g] = s;
        if amax == 0.0 || !amax.is_finite() {
            resid[g] = 0.0;
            continue;
        }
        let inv = _mm512_set1_ps(32767.0 / amax);
        let qp = qg.as_mut_ptr();
        let mut sq = _mm512_setzero_si512();
        let mut put = |at: usize, v: __m512| {
            let q = _mm512_cvtps_epi32(_mm512_mul_ps(v, inv));
            sq = _mm512_add_epi32(sq, q);
            _mm256_storeu_si256(qp.add(at) as *mut __m256i, _mm512_cvtsepi32_epi16(q));
        };
        if bits == 8 {
            for c in (0..gs).step_by(16) {
                put(c, _mm512_loadu_ps(xp.add(c)));
            }
        } else {
            // 64 columns (32 bytes of 4-bit weights): evens to 0..32, odds to 32..64.
            for c in (0..gs).step_by(64) {
                let (a, b) = (_mm512_loadu_ps(xp.add(c)), _mm512_loadu_ps(xp.add(c + 16)));
                let (d, e) = (_mm512_loadu_ps(xp.add(c + 32)), _mm512_loadu_ps(xp.add(c + 48)));
                put(c, _mm512_permutex2var_ps(a, even, b));
                put(c + 16, _mm512_permutex2var_ps(d, even, e));
                put(c + 32, _mm512_permutex2var_ps(a, odd, b));
                put(c + 48, _mm512_permutex2var_ps(d, odd, e));
            }
        }
        let sq = _mm512_reduce_add_epi32(sq) as f64;
        resid[g] = (xsum[g] as f64 - s as f64 * sq) as f32;
    }
}

/// Rows `r0..` into `out` (`[rows]` for one token, `[rows, n]` for
/// several). `a.xq` must hold `quantize_x(x, xsum, group_size, bits)`.
///
/// # Safety
/// `available()` and `quant_supported(m)` must hold, `m` must come from
/// `Mat::new` (sizes checked), and `a` must be built for it.
pub(crate) unsafe fn quant_rows(m: &QuantMat, a: &Acts, r0: usize, out: &mut [f32]) {
    if a.n > 1 {
        return match m.bits {
            2 => quant_tokens::<2>(m, a, r0, out),
            4 => quant_tokens::<4>(m, a, r0, out),
            _ => quant_tokens::<8>(m, a, r0, out),
        };
    }
    match m.bits {
        2 => quant_matvec::<2>(m, a, r0, out),
        4 => quant_matvec::<4>(m, a, r0, out),
        _ => quant_matvec::<8>(m, a, r0, out),
    }
}

/// `out[i] = Σ_g (s_g·xs_g)·Σ q·xq + Σ_g b_g·Σ x + m·Σ_g s_g·resid_g` for
/// row `r0 + i`.
// Index loops with constant bounds: the accumulators stay in registers.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn quant_matvec<const BITS: u32>(m: &QuantMat, a: &Acts, r0: usize, out: &mut [f32]) {
    let pb = 8 / BITS as usize;
    let (gs, groups) = (m.group_size, m.groups());
    let blocks = gs * BITS as usize / 256; // 32-byte blocks per group
    let mask = _mm512_set1_epi16((1 << BITS) - 1);
    let xq = a.xq.q.as_ptr();
    let xs = a.xq.scale.as_ptr();
    let resid = a.xq.resid.as_ptr();
    let xsum = a.xsum.as_ptr();
    let mid = ((1u32 << BITS) - 1) as f32 / 2.0;
    let mut d16 = [0.0f32; 16];
    let pf = super::simd512::prefetch_rows(m.row_bytes());
    for (i, o) in out.iter_mut().enumerate() {
        let r = r0 + i;
        let w = m.weight.as_ptr().add(r * m.row_bytes());
        let sp = m.scales.as_ptr().add(2 * r * groups);
        let bp = m.biases.as_ptr().add(2 * r * groups);
        super::simd512::prefetch_row(w, sp, bp, m.row_bytes(), 2 * groups, pf);
        let mut tot = [_mm512_setzero_ps(); 2];
        let mut btot = _mm512_setzero_ps();
        let mut ctot = _mm512_setzero_ps();
        for g0 in (0..groups).step_by(16) {
            let gn = (groups - g0).min(16);
            let lanes: __mmask16 = if gn >= 16 { 0xFFFF } else { (1u16 << gn) - 1 };
            let s = super::simd512::halves16(sp.add(2 * g0), gn, m.f16_scales);
            ctot = _mm512_fmadd_ps(s, _mm512_maskz_loadu_ps(lanes, resid.add(g0)), ctot);
            _mm512_storeu_ps(
                d16.as_mut_ptr(),
                _mm512_mul_ps(s, _mm512_maskz_loadu_ps(lanes, xs.add(g0))),
            );
            let b = super::simd512::halves16(bp.add(2 * g0), gn, m.f16_scales);
            btot = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(lanes, xsum.add(g0)), btot);
            for gi in 0..gn {
                let g = g0 + gi;
                let gw = w.add(g * gs * BITS as usize / 8);
                let gx = xq.add(g * gs);
                let mut acc = _mm512_setzero_si512();
                for blk in 0..blocks {
                    let mut v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(gw.add(32 * blk) as *const __m256i));
                    for k in 0..pb {
                        let lv = if k + 1 == pb { v } else { _mm512_and_si512(v, mask) };
                        let xv = _mm512_loadu_si512(gx.add(32 * pb * blk + 32 * k) as *const __m512i);
                        acc = _mm512_dpwssd_epi32(acc, lv, xv);
                        if k + 1 < pb {
                            v = _mm512_srli_epi16::<BITS>(v);
                        }
                    }
                }
                tot[g & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(d16[gi]), tot[g & 1]);
            }
        }
        *o = _mm512_reduce_add_ps(_mm512_add_ps(tot[0], tot[1]))
            + _mm512_reduce_add_ps(btot)
            + mid * _mm512_reduce_add_ps(ctot);
    }
}

/// Several tokens (prefill, batched decode): rows `r0..` into `out`
/// `[rows, n]`, by tiles of up to four tokens: a tile's activations
/// (16 KiB for 2048 columns) stay in L1 while the task's rows pass
/// through it (from memory the first time, from L2 after), each 32-byte
/// block of weights unpacked once per tile.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn quant_tokens<const BITS: u32>(m: &QuantMat, a: &Acts, r0: usize, out: &mut [f32]) {
    let n = a.n;
    let rows = out.len() / n;
    let pf = super::simd512::prefetch_rows(m.row_bytes());
    let mut t0 = 0;
    while t0 < n {
        for i in 0..rows {
            let o = &mut out[i * n..(i + 1) * n];
            let r = r0 + i;
            if t0 == 0 {
                let (w, sp, bp) = row_ptrs(m, r);
                super::simd512::prefetch_row(w, sp, bp, m.row_bytes(), 2 * m.groups(), pf);
            }
            match n - t0 {
                1 => quant_tile::<BITS, 1>(m, a, r, t0, o),
                2 => quant_tile::<BITS, 2>(m, a, r, t0, o),
                3 => quant_tile::<BITS, 3>(m, a, r, t0, o),
                _ => quant_tile::<BITS, 4>(m, a, r, t0, o),
            }
        }
        t0 += (n - t0).min(4);
    }
}

/// Row `r`'s weights, scales and biases.
#[inline(always)]
unsafe fn row_ptrs(m: &QuantMat, r: usize) -> (*const u8, *const u8, *const u8) {
    let groups = m.groups();
    (
        m.weight.as_ptr().add(r * m.row_bytes()),
        m.scales.as_ptr().add(2 * r * groups),
        m.biases.as_ptr().add(2 * r * groups),
    )
}

/// Row `r` · tokens `t0..t0 + T` into `o[t0..]`: each 32-byte block of
/// weights is unpacked once and multiplied into the T tokens' integer
/// accumulators; a group's sums are scaled into f32 once per token.
// Index loops with constant bounds: the accumulators stay in registers.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn quant_tile<const BITS: u32, const T: usize>(m: &QuantMat, a: &Acts, r: usize, t0: usize, o: &mut [f32]) {
    let pb = 8 / BITS as usize;
    let (gs, groups, cols) = (m.group_size, m.groups(), m.cols);
    let blocks = gs * BITS as usize / 256; // 32-byte blocks per group
    let mask = _mm512_set1_epi16((1 << BITS) - 1);
    let mid = ((1u32 << BITS) - 1) as f32 / 2.0;
    let xq = a.xq.q.as_ptr().add(t0 * cols);
    let (xs, resid, xsum) = (
        a.xq.scale.as_ptr().add(t0 * groups),
        a.xq.resid.as_ptr().add(t0 * groups),
        a.xsum.as_ptr().add(t0 * groups),
    );
    let (w, sp, bp) = row_ptrs(m, r);
    let mut d16 = [[0.0f32; 16]; T];
    let mut tot = [_mm512_setzero_ps(); T];
    let mut btot = [_mm512_setzero_ps(); T];
    for g0 in (0..groups).step_by(16) {
        let gn = (groups - g0).min(16);
        let lanes: __mmask16 = if gn >= 16 { 0xFFFF } else { (1u16 << gn) - 1 };
        let s = super::simd512::halves16(sp.add(2 * g0), gn, m.f16_scales);
        let b = super::simd512::halves16(bp.add(2 * g0), gn, m.f16_scales);
        for t in 0..T {
            let at = t * groups + g0;
            _mm512_storeu_ps(
                d16[t].as_mut_ptr(),
                _mm512_mul_ps(s, _mm512_maskz_loadu_ps(lanes, xs.add(at))),
            );
            // b·Σx and the middle level's share of the rounding, m·s·resid.
            btot[t] = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(lanes, xsum.add(at)), btot[t]);
            let c = _mm512_mul_ps(s, _mm512_maskz_loadu_ps(lanes, resid.add(at)));
            btot[t] = _mm512_fmadd_ps(c, _mm512_set1_ps(mid), btot[t]);
        }
        for gi in 0..gn {
            let g = g0 + gi;
            let gw = w.add(g * gs * BITS as usize / 8);
            let mut acc = [_mm512_setzero_si512(); T];
            for blk in 0..blocks {
                let mut v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(gw.add(32 * blk) as *const __m256i));
                for k in 0..pb {
                    let lv = if k + 1 == pb { v } else { _mm512_and_si512(v, mask) };
                    let off = g * gs + 32 * pb * blk + 32 * k;
                    for t in 0..T {
                        let xv = _mm512_loadu_si512(xq.add(t * cols + off) as *const __m512i);
                        acc[t] = _mm512_dpwssd_epi32(acc[t], lv, xv);
                    }
                    if k + 1 < pb {
                        v = _mm512_srli_epi16::<BITS>(v);
                    }
                }
            }
            for t in 0..T {
                tot[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t]), _mm512_set1_ps(d16[t][gi]), tot[t]);
            }
        }
    }
    for t in 0..T {
        o[t0 + t] = _mm512_reduce_add_ps(tot[t]) + _mm512_reduce_add_ps(btot[t]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX-512 quantization gives the portable one's scales, levels
    /// within one (the two round ties differently) and residuals.
    #[test]
    fn quantize_matches_the_portable_form() {
        if !available() {
            eprintln!("no AVX-512 VNNI here: nothing to compare");
            return;
        }
        let mut seed = 7u32;
        let x: Vec<f32> = (0..3 * 256)
            .map(|i| {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let v = (seed >> 8) as f32 / (1 << 24) as f32 - 0.5;
                if i % 97 == 0 {
                    40.0 * v
                } else {
                    v
                }
            })
            .collect();
        for (bits, gs) in [(4, 64), (4, 128), (8, 32), (8, 64)] {
            let xsum: Vec<f32> = x
                .chunks_exact(gs)
                .map(|g| g.iter().map(|&v| v as f64).sum::<f64>() as f32)
                .collect();
            let (a, b) = (
                quantize_x(&x, &xsum, gs, bits),
                crate::backend::cpu::qmatvec::quantize_x(&x, gs, bits),
            );
            assert_eq!(a.scale, b.scale, "{bits}-bit g{gs}: scales");
            for (i, (p, q)) in a.q.iter().zip(&b.q).enumerate() {
                assert!((p - q).abs() <= 1, "{bits}-bit g{gs}: level {i}: {p} against {q}");
            }
            for (g, (p, q)) in a.resid.iter().zip(&b.resid).enumerate() {
                let s = a.scale[g];
                assert!(
                    (p - q).abs() <= 2.0 * s,
                    "{bits}-bit g{gs}: residual {g}: {p} against {q} (scale {s})"
                );
            }
        }
    }
}
