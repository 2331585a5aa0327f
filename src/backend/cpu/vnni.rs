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
//! The weights are read 64 bytes at a time, as 32 words of 16 bits;
//! level k of every word is taken out with a shift and a mask (no
//! widening), so one register holds columns `2P·i + k` (i = 0..32, P
//! values per byte), and `quantize_x` writes xq in that order
//! (`Order::Words`). A group fills `h = gs·bits/32` of a register's 16
//! sums: 16/h groups share a register when h < 16 (two for 4-bit g64), a
//! group spans h/16 registers otherwise; either way a register is scaled
//! by one vector.

use super::qmatvec::{Acts, Order, QuantMat, QuantX};
use std::arch::x86_64::*;

/// Whether this CPU runs this kernel.
pub(crate) fn available() -> bool {
    super::simd512::available() && is_x86_feature_detected!("avx512vnni")
}

/// Whether the kernel takes this layout: groups that fill an eighth, a
/// quarter or half of a register of sums or whole ones (`h` of 2, 4, 8 or
/// a multiple of 16), and group sums that fit in 32 bits.
pub(crate) fn quant_supported(m: &QuantMat) -> bool {
    let h = m.group_size * m.bits / 32;
    (m.group_size * m.bits).is_multiple_of(32)
        && (matches!(h, 2 | 4 | 8) || h.is_multiple_of(16))
        && m.group_size * ((1 << m.bits) - 1) <= 65535
}

/// `x` `[n, cols]` quantized for `bits`-bit weights in groups of `gs`, as
/// `qmatvec::quantize_x` does but with AVX-512 (rounding half to even),
/// using `xsum` (the group sums of x) for the residuals; in `order`.
pub(crate) fn quantize_x(x: &[f32], xsum: &[f32], cols: usize, gs: usize, bits: usize, order: Order) -> QuantX {
    if !available() || !gs.is_multiple_of(16) {
        return super::qmatvec::quantize_x(x, cols, gs, bits, order);
    }
    let mut out = QuantX {
        q: crate::parallel::zeros(x.len()),
        scale: vec![0.0; x.len() / gs],
        resid: vec![0.0; x.len() / gs],
        order,
    };
    let per = cols / gs;
    // Whole tokens, in parallel: levels, then scales and residuals.
    let mut sums: Vec<(&mut [f32], &mut [f32])> = out.scale.chunks_mut(per).zip(out.resid.chunks_mut(per)).collect();
    crate::parallel::for_each_chunk2(&mut out.q, cols, &mut sums, 1, |t, q, sr| {
        let (scale, resid) = &mut sr[0];
        let (x, xsum) = (&x[t * cols..(t + 1) * cols], &xsum[t * per..(t + 1) * per]);
        // SAFETY: AVX-512 is available; every group is `gs` long, a
        // multiple of 16 columns, and the outputs are sized for x.
        unsafe { quantize_avx512(x, xsum, gs, q, scale, resid) };
        order.arrange(q, cols, bits);
    });
    drop(sums);
    out
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn quantize_avx512(x: &[f32], xsum: &[f32], gs: usize, q: &mut [i16], scale: &mut [f32], resid: &mut [f32]) {
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
        for c in (0..gs).step_by(16) {
            let q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xp.add(c)), inv));
            sq = _mm512_add_epi32(sq, q);
            _mm256_storeu_si256(qp.add(c) as *mut __m256i, _mm512_cvtsepi32_epi16(q));
        }
        let sq = _mm512_reduce_add_epi32(sq) as f64;
        resid[g] = (xsum[g] as f64 - s as f64 * sq) as f32;
    }
}

/// Rows `r0..` into `out` (`[rows]` for one token, `[rows, n]` for
/// several), by tiles of up to four tokens: a tile's activations (16 KiB
/// for 2048 columns) stay in L1 while the task's rows pass through it
/// (from memory the first time, from L2 after), each chunk of weights
/// unpacked once per tile.
///
/// # Safety
/// `available()` and `quant_supported(m)` must hold, `m` must come from
/// `Mat::new` (sizes checked), and `a.xq` must be
/// `quantize_x(x, xsum, cols, group_size, bits, Order::Words)`.
pub(crate) unsafe fn quant_rows(m: &QuantMat, a: &Acts, r0: usize, out: &mut [f32]) {
    debug_assert_eq!(a.xq.order, Order::Words);
    match m.bits {
        2 => quant_tokens::<2>(m, a, r0, out),
        4 => quant_tokens::<4>(m, a, r0, out),
        _ => quant_tokens::<8>(m, a, r0, out),
    }
}

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

/// One 64-byte chunk of a row (32 words; `words` in a short last chunk,
/// then loaded under a mask) times tokens `0..T` of xq (rows
/// of `cols`, from `x`, the chunk's first slot), into `acc`: level k of
/// every word against slots `words·k..`, two sums per token (even and odd
/// levels) for two chains of `vpdpwssd`.
// Index loops with constant bounds: the accumulators stay in registers.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn chunk<const BITS: u32, const T: usize, const FULL: bool>(
    acc: &mut [[__m512i; 2]; T],
    w: *const u8,
    x: *const i16,
    cols: usize,
    words: usize,
) {
    let words = if FULL { 32 } else { words };
    let mut v = if FULL {
        _mm512_loadu_si512(w as *const __m512i)
    } else {
        _mm512_maskz_loadu_epi16((1u32 << words) - 1, w as *const i16)
    };
    let mask = _mm512_set1_epi16((1 << BITS) - 1);
    let levels = 16 / BITS as usize;
    for k in 0..levels {
        let lv = if k + 1 == levels { v } else { _mm512_and_si512(v, mask) };
        for t in 0..T {
            let xp = x.add(t * cols + words * k);
            let xv = if FULL {
                _mm512_loadu_si512(xp as *const __m512i)
            } else {
                _mm512_maskz_loadu_epi16((1u32 << words) - 1, xp)
            };
            acc[t][k & 1] = dpwssd(acc[t][k & 1], lv, xv);
        }
        if k + 1 < levels {
            v = _mm512_srli_epi16::<BITS>(v);
        }
    }
}

/// `acc + Σ pairs of a·b` (`vpdpwssd`), written out: the compiler
/// otherwise splits the intrinsic into `vpmaddwd` and `vpaddd`, twice the
/// instructions of the kernel's inner loop.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
pub(crate) unsafe fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut acc = acc;
    std::arch::asm!(
        "vpdpwssd {acc}, {a}, {b}",
        acc = inout(zmm_reg) acc,
        a = in(zmm_reg) a,
        b = in(zmm_reg) b,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

/// `tot += sum·scale` into the first of two accumulators, which then
/// swap: two chains of additions, with register indices known at compile
/// time (an index that alternates at run time puts them on the stack).
#[inline(always)]
unsafe fn add_rotating(tot: &mut [__m512; 2], sum: __m512, scale: __m512) {
    let t = _mm512_fmadd_ps(sum, scale, tot[0]);
    tot[0] = tot[1];
    tot[1] = t;
}

/// Row `r` · tokens `t0..t0 + T` into `o[t0..]`: each chunk of weights is
/// unpacked once and multiplied into the T tokens' integer sums; a
/// register of sums is scaled into f32 once per token.
// Index loops with constant bounds: the accumulators stay in registers.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn quant_tile<const BITS: u32, const T: usize>(m: &QuantMat, a: &Acts, r: usize, t0: usize, o: &mut [f32]) {
    let (gs, groups, cols) = (m.group_size, m.groups(), m.cols);
    let h = gs * BITS as usize / 32; // 32-bit sums per group
    let ccols = 512 / BITS as usize; // columns per 64-byte chunk
    let mid = ((1u32 << BITS) - 1) as f32 / 2.0;
    let xq = a.xq.q.as_ptr().add(t0 * cols);
    let (xs, resid, xsum) = (
        a.xq.scale.as_ptr().add(t0 * groups),
        a.xq.resid.as_ptr().add(t0 * groups),
        a.xsum.as_ptr().add(t0 * groups),
    );
    let (w, sp, bp) = row_ptrs(m, r);
    // Sum j of a chunk's register belongs to its group j / h.
    let first = _mm512_srlv_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(h.trailing_zeros() as i32),
    );
    let mut d = [_mm512_setzero_ps(); T];
    let mut d16 = [[0.0f32; 16]; T];
    let mut tot = [[_mm512_setzero_ps(); 2]; T];
    let mut btot = [_mm512_setzero_ps(); T];
    for g0 in (0..groups).step_by(16) {
        let gn = (groups - g0).min(16);
        let lanes: __mmask16 = if gn >= 16 { 0xFFFF } else { (1u16 << gn) - 1 };
        let s = super::simd512::halves16(sp.add(2 * g0), gn, m.f16_scales);
        let b = super::simd512::halves16(bp.add(2 * g0), gn, m.f16_scales);
        for t in 0..T {
            let at = t * groups + g0;
            d[t] = _mm512_mul_ps(s, _mm512_maskz_loadu_ps(lanes, xs.add(at)));
            if h >= 16 {
                _mm512_storeu_ps(d16[t].as_mut_ptr(), d[t]);
            }
            // b·Σx and the middle level's share of the rounding, m·s·resid.
            btot[t] = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(lanes, xsum.add(at)), btot[t]);
            let c = _mm512_mul_ps(s, _mm512_maskz_loadu_ps(lanes, resid.add(at)));
            btot[t] = _mm512_fmadd_ps(c, _mm512_set1_ps(mid), btot[t]);
        }
        if h < 16 {
            // 16/h groups per chunk; a short last chunk holds the rest.
            let gc = 16 / h;
            for p in 0..gn.div_ceil(gc) {
                let g = g0 + gc * p;
                let mut acc = [[_mm512_setzero_si512(); 2]; T];
                let (wc, xc) = (w.add(g * gs * BITS as usize / 8), xq.add(g * gs));
                if g + gc <= groups {
                    chunk::<BITS, T, true>(&mut acc, wc, xc, cols, 32);
                } else {
                    chunk::<BITS, T, false>(&mut acc, wc, xc, cols, 2 * h * (groups - g));
                }
                let idx = _mm512_add_epi32(first, _mm512_set1_epi32((gc * p) as i32));
                for t in 0..T {
                    let sum = _mm512_cvtepi32_ps(_mm512_add_epi32(acc[t][0], acc[t][1]));
                    add_rotating(&mut tot[t], sum, _mm512_permutexvar_ps(idx, d[t]));
                }
            }
        } else {
            // h/16 whole chunks per group.
            let per = h / 16;
            for gi in 0..gn {
                let c0 = (g0 + gi) * per;
                let mut acc = [[_mm512_setzero_si512(); 2]; T];
                for c in c0..c0 + per {
                    chunk::<BITS, T, true>(&mut acc, w.add(64 * c), xq.add(c * ccols), cols, 32);
                }
                for t in 0..T {
                    let sum = _mm512_cvtepi32_ps(_mm512_add_epi32(acc[t][0], acc[t][1]));
                    add_rotating(&mut tot[t], sum, _mm512_set1_ps(d16[t][gi]));
                }
            }
        }
    }
    for t in 0..T {
        o[t0 + t] = _mm512_reduce_add_ps(_mm512_add_ps(tot[t][0], tot[t][1])) + _mm512_reduce_add_ps(btot[t]);
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
        let layouts = [(4, 64), (4, 128), (8, 32), (8, 64), (2, 128)];
        for ((bits, gs), order) in layouts
            .into_iter()
            .flat_map(|l| [(l, Order::Blocks), (l, Order::Words)])
        {
            let xsum: Vec<f32> = x
                .chunks_exact(gs)
                .map(|g| g.iter().map(|&v| v as f64).sum::<f64>() as f32)
                .collect();
            let (a, b) = (
                quantize_x(&x, &xsum, 256, gs, bits, order),
                crate::backend::cpu::qmatvec::quantize_x(&x, 256, gs, bits, order),
            );
            assert_eq!((a.order, b.order), (order, order));
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
