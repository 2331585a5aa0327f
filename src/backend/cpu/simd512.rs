//! AVX-512 (F + BW + VL) kernels for the quantized `linear` of one token
//! (decode) and of a few (a batched decode step, up to
//! `matmul::AVX512_MAX_TOKENS`), chosen at run time on CPUs that have
//! them; the AVX2 kernels in `simd` do the rest (more tokens, float
//! weights) on such CPUs.
//!
//! 16 bytes of packed weights are widened to sixteen 32-bit lanes
//! (`vpmovzxbd`) and value k of every byte is taken out with a shift and a
//! mask, so one register holds columns `PB·i + k` (i = 0..16, PB values per
//! byte); x is permuted once per call into that order (`permute_x`). Each
//! group accumulates `Σ q·x` in registers and is scaled once; the biases
//! multiply the precomputed group sums of x, sixteen groups at a time.

use super::qmatvec::{Acts, QuantMat};
use std::arch::x86_64::*;

/// Whether this CPU runs this kernel (and the AVX2 ones beside it).
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && super::simd::available()
}

/// Whether the kernel takes this layout: groups of whole 16-byte blocks.
pub(crate) fn quant_supported(m: &QuantMat) -> bool {
    (m.group_size * m.bits / 8).is_multiple_of(16)
}

/// x `[n, cols]` with its columns in unpacking order: in each block of
/// `16·PB` columns (16 bytes of weights), column `PB·i + k` moves to `16k + i`.
pub(crate) fn permute_x(x: &[f32], bits: usize) -> Vec<f32> {
    let pb = 8 / bits;
    let mut out = vec![0.0f32; x.len()];
    for (o, xb) in out.chunks_exact_mut(16 * pb).zip(x.chunks_exact(16 * pb)) {
        for i in 0..16 {
            for k in 0..pb {
                o[16 * k + i] = xb[pb * i + k];
            }
        }
    }
    out
}

/// Rows `r0..` into `out` (`[rows]` for one token, `[rows, n]` for
/// several). `a.xp` must hold `permute_x(x, bits)`.
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

/// Several tokens (a batched decode step): rows `r0..` into `out`
/// `[rows, n]`, each row's weights unpacked once per tile of up to four
/// tokens (the row stays in L1 for the next tile).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn quant_tokens<const BITS: u32>(m: &QuantMat, a: &Acts, r0: usize, out: &mut [f32]) {
    let n = a.n;
    for (i, o) in out.chunks_exact_mut(n).enumerate() {
        let mut t0 = 0;
        while t0 < n {
            match n - t0 {
                1 => quant_tile::<BITS, 1>(m, a, r0 + i, t0, o),
                2 => quant_tile::<BITS, 2>(m, a, r0 + i, t0, o),
                3 => quant_tile::<BITS, 3>(m, a, r0 + i, t0, o),
                _ => quant_tile::<BITS, 4>(m, a, r0 + i, t0, o),
            }
            t0 += (n - t0).min(4);
        }
    }
}

/// Row `r` · tokens `t0..t0 + T` into `o[t0..]`: each level vector is
/// dequantized once (`q·s + b`, as the AVX2 kernels form their f32 rows,
/// so no large `Σ q·x` cancels against `b·Σ x`) and applied to the T
/// tokens' x before the next is unpacked.
// Index loops, not iterators: constant indices after unrolling keep the
// accumulators in registers (see quant_matvec).
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn quant_tile<const BITS: u32, const T: usize>(m: &QuantMat, a: &Acts, r: usize, t0: usize, o: &mut [f32]) {
    let pb = 8 / BITS as usize;
    let (gs, groups, cols) = (m.group_size, m.groups(), m.cols);
    let blocks = gs * BITS as usize / 128; // 16-byte blocks per group
    let mask = _mm512_set1_epi32((1 << BITS) - 1);
    let xp = a.xp.as_ptr().add(t0 * cols);
    let w = m.weight.as_ptr().add(r * m.row_bytes());
    let sp = m.scales.as_ptr().add(2 * r * groups);
    let bp = m.biases.as_ptr().add(2 * r * groups);
    let (mut s16, mut b16) = ([0.0f32; 16], [0.0f32; 16]);
    let mut acc = [_mm512_setzero_ps(); T];
    for g0 in (0..groups).step_by(16) {
        let gn = (groups - g0).min(16);
        _mm512_storeu_ps(s16.as_mut_ptr(), halves16(sp.add(2 * g0), gn, m.f16_scales));
        _mm512_storeu_ps(b16.as_mut_ptr(), halves16(bp.add(2 * g0), gn, m.f16_scales));
        for gi in 0..gn {
            let g = g0 + gi;
            let (sv, bv) = (_mm512_set1_ps(s16[gi]), _mm512_set1_ps(b16[gi]));
            let gw = w.add(g * gs * BITS as usize / 8);
            for blk in 0..blocks {
                let mut v = _mm512_cvtepu8_epi32(_mm_loadu_si128(gw.add(16 * blk) as *const __m128i));
                for k in 0..pb {
                    let lv = if k + 1 == pb { v } else { _mm512_and_si512(v, mask) };
                    let wv = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lv), sv, bv);
                    let off = g * gs + 16 * pb * blk + 16 * k;
                    for t in 0..T {
                        acc[t] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xp.add(t * cols + off)), acc[t]);
                    }
                    if k + 1 < pb {
                        v = _mm512_srli_epi32::<BITS>(v);
                    }
                }
            }
        }
    }
    for t in 0..T {
        o[t0 + t] = _mm512_reduce_add_ps(acc[t]);
    }
}

/// Up to 16 bf16 (or f16) values at `p` as f32 lanes (missing lanes 0).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn halves16(p: *const u8, len: usize, f16: bool) -> __m512 {
    let mask: __mmask16 = if len >= 16 { 0xFFFF } else { (1u16 << len) - 1 };
    let h = _mm256_maskz_loadu_epi16(mask, p as *const i16);
    if f16 {
        _mm512_cvtph_ps(h)
    } else {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    }
}

/// `out[i] = row r0+i · x`, as `Σ_g s_g·Σ q·x + Σ_g b_g·Σ x`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn quant_matvec<const BITS: u32>(m: &QuantMat, a: &Acts, r0: usize, out: &mut [f32]) {
    let pb = 8 / BITS as usize;
    let (gs, groups) = (m.group_size, m.groups());
    let blocks = gs * BITS as usize / 128; // 16-byte blocks per group
    let mask = _mm512_set1_epi32((1 << BITS) - 1);
    let xp = a.xp.as_ptr();
    let xsum = a.xsum.as_ptr();
    let mut s16 = [0.0f32; 16];
    let pf = prefetch_rows(m.row_bytes());
    for (i, o) in out.iter_mut().enumerate() {
        let r = r0 + i;
        let w = m.weight.as_ptr().add(r * m.row_bytes());
        let sp = m.scales.as_ptr().add(2 * r * groups);
        let bp = m.biases.as_ptr().add(2 * r * groups);
        prefetch_row(w, sp, bp, m.row_bytes(), 2 * groups, pf);
        let mut tot = [_mm512_setzero_ps(); 2];
        let mut btot = _mm512_setzero_ps();
        for g0 in (0..groups).step_by(16) {
            let gn = (groups - g0).min(16);
            _mm512_storeu_ps(s16.as_mut_ptr(), halves16(sp.add(2 * g0), gn, m.f16_scales));
            let b = halves16(bp.add(2 * g0), gn, m.f16_scales);
            let xs = _mm512_maskz_loadu_ps(if gn >= 16 { 0xFFFF } else { (1u16 << gn) - 1 }, xsum.add(g0));
            btot = _mm512_fmadd_ps(b, xs, btot);
            for (gi, &s) in s16.iter().enumerate().take(gn) {
                let g = g0 + gi;
                // Two sets of accumulators (even and odd blocks), indexed by
                // level only, so that every index is a constant after
                // unrolling and the accumulators stay in registers.
                let mut acc = [[_mm512_setzero_ps(); 4]; 2];
                let gw = w.add(g * gs * BITS as usize / 8);
                let gx = xp.add(g * gs);
                let mut blk = 0;
                while blk < blocks {
                    for (half, ah) in acc.iter_mut().enumerate() {
                        let b = blk + half;
                        if b < blocks {
                            block::<BITS>(gw.add(16 * b), gx.add(16 * pb * b), mask, ah);
                        }
                    }
                    blk += 2;
                }
                // Constant indices (no iterator over `acc`, which would
                // keep it in memory: 3× slower).
                let mut sum = _mm512_add_ps(acc[0][0], acc[1][0]);
                if pb > 1 {
                    sum = _mm512_add_ps(sum, _mm512_add_ps(acc[0][1], acc[1][1]));
                }
                if pb > 2 {
                    sum = _mm512_add_ps(sum, _mm512_add_ps(acc[0][2], acc[1][2]));
                    sum = _mm512_add_ps(sum, _mm512_add_ps(acc[0][3], acc[1][3]));
                }
                tot[g & 1] = _mm512_fmadd_ps(sum, _mm512_set1_ps(s), tot[g & 1]);
            }
        }
        *o = _mm512_reduce_add_ps(_mm512_add_ps(tot[0], tot[1])) + _mm512_reduce_add_ps(btot);
    }
}

/// One 16-byte block of weights at `wb` against x (permuted) at `xb`: level
/// k of every byte into `acc[k]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn block<const BITS: u32>(wb: *const u8, xb: *const f32, mask: __m512i, acc: &mut [__m512; 4]) {
    let pb = 8 / BITS as usize;
    let mut v = _mm512_cvtepu8_epi32(_mm_loadu_si128(wb as *const __m128i));
    for (k, a) in acc.iter_mut().enumerate().take(pb) {
        let lv = if k + 1 == pb { v } else { _mm512_and_si512(v, mask) };
        *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lv), _mm512_loadu_ps(xb.add(16 * k)), *a);
        if k + 1 < pb {
            v = _mm512_srli_epi32::<BITS>(v);
        }
    }
}

/// How far ahead of the row being computed the one-token kernels ask for
/// weights. Each thread streams its rows with too few reads in flight for
/// this memory to keep up; asking 8 KiB ahead overlaps the reads with the
/// arithmetic (`kernel_bench`, 4-bit 8192×2048: 2 Zen 4 threads
/// 23.6 → 32.7 GB/s; 16 Sapphire Rapids threads 44.2 → 53.2 GB/s).
const PREFETCH_BYTES: usize = 8 << 10;

/// Rows of `row_bytes` that make up `PREFETCH_BYTES`.
pub(crate) fn prefetch_rows(row_bytes: usize) -> usize {
    (PREFETCH_BYTES / row_bytes.max(1)).max(1)
}

/// Ask for the row `pf` rows ahead of the one at `w` (its weights, and
/// its scales and biases at `sp` and `bp`, `sb_bytes` per row). A
/// prefetch past the end of the matrix is harmless: it does not fault.
#[inline(always)]
pub(crate) unsafe fn prefetch_row(
    w: *const u8,
    sp: *const u8,
    bp: *const u8,
    row_bytes: usize,
    sb_bytes: usize,
    pf: usize,
) {
    let wa = w.wrapping_add(pf * row_bytes);
    let mut off = 0;
    while off < row_bytes {
        _mm_prefetch::<_MM_HINT_T0>(wa.wrapping_add(off) as *const i8);
        off += 64;
    }
    _mm_prefetch::<_MM_HINT_T0>(sp.wrapping_add(pf * sb_bytes) as *const i8);
    _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(pf * sb_bytes) as *const i8);
}
