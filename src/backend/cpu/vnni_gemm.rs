//! The fast quantized product for several tokens (prefill, batched
//! decode steps): AVX-512 VNNI on weights repacked so that each of a
//! register's 16 lanes holds a different group.
//!
//! `vnni::quant_tile` sums one group (or a few: two at 4 bits in groups of 64)
//! per register, so every register of every (row, token) pair ends with a
//! conversion and a multiply-add: at 4 bits in groups of 64 that is four
//! `vpdpwssd` per pair of groups against three instructions of scaling.
//! Here a task first repacks
//! its rows (in L2, once for all tokens) so that lane `l` of step `s`
//! holds the pair of levels `s` of group `l` of a chunk of 16 groups; a
//! chunk then takes `gs/2` `vpdpwssd` per (row, token) and one
//! conversion and three multiply-adds for all its 16 groups, their
//! scales in lanes as well. A register tile of 4 rows × 3 tokens keeps
//! the integer sums and the f32 totals in registers; the activations are
//! laid out once per call in the same lane order.
//!
//! A chunk of fewer groups (the last ones of a row) spreads each group
//! over `16/ng` lanes (its "parts"); the group's bias terms go in its
//! first lane only. The arithmetic is `vnni`'s: the same 16-bit levels of
//! x, the same exact integer group sums, the same per-group scaling and
//! residual correction; only the order of the f32 additions differs.
//!
//! Packed dwords hold `32/bits` levels, lowest bits first; a dword's pair
//! `j` (of `16/bits`) is `(level j, level 16/bits + j)`, taken out with one
//! shift and one mask of both 16-bit halves.

use super::qmatvec::{QuantMat, QuantX};
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::{Arc, Mutex};

/// Tokens from which a product takes this kernel (fewer take
/// `vnni::quant_tile`, which needs no repacking and takes 4 tokens in one
/// register tile: on a Zen 4 VM, 4 tokens through a 248320-row matrix
/// took 22 ms there against 33 ms here; from 5 tokens the two were even).
pub(crate) const MIN_TOKENS: usize = 5;

/// Rows of a register tile.
const R: usize = 4;
/// Most tokens of a register tile.
const T: usize = 3;
/// f32 per chunk of the lane vectors: scales, biases, middle-level terms
/// (weights) or scales, group sums, residuals (activations), 16 each.
const LANES: usize = 48;

/// 16 groups of a row (fewer at its end), as the kernel walks them.
#[derive(Debug, Clone, PartialEq)]
struct Chunk {
    /// First group.
    g0: usize,
    /// Lanes per group: 16 / groups in the chunk (a power of two).
    h: usize,
    /// Packed dwords per lane.
    dp: usize,
    /// Steps of 16 lanes (one `vpdpwssd` each).
    steps: usize,
    /// First dword of the chunk in a repacked row.
    off: usize,
}

/// How a layout (bits, group size, columns) is cut into chunks.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plan {
    bits: usize,
    gs: usize,
    cols: usize,
    chunks: Vec<Chunk>,
}

impl Plan {
    /// The plan for `m`'s layout, or `None` when a chunk cannot be spread
    /// over 16 lanes (a group of fewer packed dwords than its lanes).
    pub(crate) fn new(m: &QuantMat) -> Option<Plan> {
        let (bits, gs) = (m.bits, m.group_size);
        // Whole 32-byte blocks per group (`Order::Blocks`).
        if !matches!(bits, 2 | 4 | 8) || gs * bits % 256 != 0 {
            return None;
        }
        let d = gs * bits / 32; // packed dwords per group
        let groups = m.groups();
        let (mut chunks, mut g0, mut off) = (Vec::new(), 0, 0);
        while g0 < groups {
            let left = groups - g0;
            // The largest power of two up to 16 that fits.
            let ng = if left >= 16 {
                16
            } else {
                1 << (usize::BITS - 1 - left.leading_zeros())
            };
            let h = 16 / ng;
            if d % h != 0 {
                return None;
            }
            let dp = d / h;
            let steps = dp * 16 / bits;
            chunks.push(Chunk { g0, h, dp, steps, off });
            off += 16 * steps;
            g0 += ng;
        }
        Some(Plan {
            bits,
            gs,
            cols: m.cols,
            chunks,
        })
    }

    /// Dwords (pairs of 16-bit levels) of a repacked row.
    fn row_dwords(&self) -> usize {
        self.cols / 2
    }

    /// For each 16-bit slot of a repacked row, the column whose level it
    /// holds.
    fn columns(&self) -> Vec<usize> {
        let (bits, gs) = (self.bits, self.gs);
        let (ppd, lpd) = (16 / bits, 32 / bits);
        let mut col = vec![0usize; self.cols];
        for c in &self.chunks {
            for s in 0..c.steps {
                let (kp, j) = (s / ppd, s % ppd);
                for l in 0..16 {
                    let (g, part) = (c.g0 + l / c.h, l % c.h);
                    let k = part * c.dp + kp; // dword in the group
                    let at = 2 * (c.off + 16 * s + l);
                    col[at] = g * gs + k * lpd + j;
                    col[at + 1] = g * gs + k * lpd + lpd / 2 + j;
                }
            }
        }
        col
    }
}

/// The activations laid out for the kernel.
pub(crate) struct Tiled {
    plan: Plan,
    /// `[n, cols/2]` pairs of 16-bit levels, in the repacked order.
    x: Vec<i32>,
    /// `[n, chunks, 48]`: per lane, the group's scale, sum and residual.
    lanes: Vec<f32>,
}

/// x's 16-bit levels `xq` (in `Order::Blocks`: columns `PB·i + k` of
/// each 32-byte block at `32·k + i`) and group sums `xsum`,
/// `[n, cols]`, laid out by `plan` (`Plan::new` of the weights).
pub(crate) fn tile_x(plan: Plan, xq: &QuantX, xsum: &[f32], n: usize) -> Tiled {
    let (cols, groups) = (plan.cols, plan.cols / plan.gs);
    let src = sources(&plan);
    let nc = plan.chunks.len();
    let mut x = vec![0i32; n * cols / 2];
    let mut lanes = vec![0.0f32; n * nc * LANES];
    crate::parallel::for_each_chunk2(&mut x, cols / 2, &mut lanes, nc * LANES, |t, xt, lt| {
        let q = &xq.q[t * cols..(t + 1) * cols];
        for (i, v) in xt.iter_mut().enumerate() {
            let (lo, hi) = (
                q[src[2 * i] as usize] as u16 as u32,
                q[src[2 * i + 1] as usize] as u16 as u32,
            );
            *v = (lo | hi << 16) as i32;
        }
        for (c, lc) in plan.chunks.iter().zip(lt.chunks_exact_mut(LANES)) {
            for l in 0..16 {
                let g = t * groups + c.g0 + l / c.h;
                lc[l] = xq.scale[g];
                lc[16 + l] = xsum[g];
                lc[32 + l] = xq.resid[g];
            }
        }
    });
    Tiled { plan, x, lanes }
}

/// For each 16-bit slot of a repacked row, where `quantize_x` put its
/// column's level (computed once per layout and kept).
fn sources(plan: &Plan) -> Arc<[u32]> {
    /// (bits, group size, columns) and the sources of that layout.
    type Known = Vec<((usize, usize, usize), Arc<[u32]>)>;
    static KNOWN: Mutex<Known> = Mutex::new(Vec::new());
    let key = (plan.bits, plan.gs, plan.cols);
    let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, s)) = known.iter().find(|(k, _)| *k == key) {
        return s.clone();
    }
    let pb = 8 / plan.bits;
    // Column → its slot in xq's order.
    let slot = |c: usize| {
        let (b, l) = (c / (32 * pb), c % (32 * pb));
        (b * 32 * pb + (l % pb) * 32 + l / pb) as u32
    };
    let s: Arc<[u32]> = plan.columns().into_iter().map(slot).collect();
    known.push((key, s.clone()));
    s
}

thread_local! {
    /// A register tile's repacked rows and their lane vectors, kept
    /// between tasks.
    static SCRATCH: RefCell<(Vec<i32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Rows `r0..` into `out` `[rows, n]`, a register tile of 4 rows at a
/// time: its rows repacked (into L1), then every tile of up to 3 tokens
/// over them. (Repacking all of a task's rows first and reading them back
/// from L2 once per token tile took 1.49–1.56 ms for 8 tokens through a
/// 4-bit 8192×2048 matrix on the 2-core Zen 4 VM, the repacking about
/// half of it; BENCHMARKS.)
///
/// # Safety
/// AVX-512 F/BW and VNNI must be available, `m` must come from `Mat::new`
/// (sizes checked), `xt` must be `tile_x` of `m`'s layout over `n` tokens,
/// and `r0 + out.len()/n` must not pass `m`'s rows.
pub(crate) unsafe fn quant_rows(m: &QuantMat, xt: &Tiled, n: usize, r0: usize, out: &mut [f32]) {
    let plan = &xt.plan;
    let rows = out.len() / n;
    let (wd, nc) = (plan.row_dwords(), plan.chunks.len());
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let (w, wl) = &mut *s;
        w.resize(R * wd, 0);
        wl.resize(R * nc * LANES, 0.0);
        let pf = super::simd512::prefetch_rows(m.row_bytes());
        let groups = m.groups();
        for i0 in (0..rows).step_by(R) {
            let nr = (rows - i0).min(R);
            for i in 0..nr {
                let r = r0 + i0 + i;
                super::simd512::prefetch_row(
                    m.weight.as_ptr().add(r * m.row_bytes()),
                    m.scales.as_ptr().add(2 * r * groups),
                    m.biases.as_ptr().add(2 * r * groups),
                    m.row_bytes(),
                    2 * groups,
                    pf,
                );
                repack_row(
                    m,
                    plan,
                    r,
                    &mut w[i * wd..(i + 1) * wd],
                    &mut wl[i * nc * LANES..(i + 1) * nc * LANES],
                );
            }
            // A last tile's missing rows multiply zeros.
            w[nr * wd..].fill(0);
            wl[nr * nc * LANES..].fill(0.0);
            let mut t0 = 0;
            while t0 < n {
                let tn = (n - t0).min(T);
                let xp = xt.x.as_ptr().add(t0 * wd);
                let xl = xt.lanes.as_ptr().add(t0 * nc * LANES);
                let mut o = [[0.0f32; T]; R];
                match tn {
                    1 => tile::<1>(plan, w.as_ptr(), wl.as_ptr(), xp, xl, &mut o),
                    2 => tile::<2>(plan, w.as_ptr(), wl.as_ptr(), xp, xl, &mut o),
                    _ => tile::<3>(plan, w.as_ptr(), wl.as_ptr(), xp, xl, &mut o),
                }
                for (r, or) in o.iter().enumerate().take(nr) {
                    out[(i0 + r) * n + t0..][..tn].copy_from_slice(&or[..tn]);
                }
                t0 += tn;
            }
        }
    });
}

/// Row `r` of `m` repacked into `w` (`plan.row_dwords()`) and its lane
/// vectors into `wl` (`[chunks, 48]`: scales, first-lane biases,
/// first-lane middle-level terms `m·s`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn repack_row(m: &QuantMat, plan: &Plan, r: usize, w: &mut [i32], wl: &mut [f32]) {
    let bits = plan.bits;
    let gbytes = plan.gs * bits / 8;
    let mid = _mm512_set1_ps(((1u32 << bits) - 1) as f32 / 2.0);
    let row = m.weight.as_ptr().add(r * m.row_bytes());
    let groups = m.groups();
    let (sp, bp) = (
        m.scales.as_ptr().add(2 * r * groups),
        m.biases.as_ptr().add(2 * r * groups),
    );
    for (c, lc) in plan.chunks.iter().zip(wl.chunks_exact_mut(LANES)) {
        let src = row.add(c.g0 * gbytes) as *const i32;
        let dst = w.as_mut_ptr().add(c.off);
        match c.dp {
            1 => repack_chunk::<1>(src, dst, bits),
            2 => repack_chunk::<2>(src, dst, bits),
            4 => repack_chunk::<4>(src, dst, bits),
            8 => repack_chunk::<8>(src, dst, bits),
            16 => repack_chunk::<16>(src, dst, bits),
            _ => repack_chunk::<32>(src, dst, bits),
        }
        // The chunk's scales and biases, group l/h in lane l; the bias
        // terms in each group's first lane only.
        let ng = 16 / c.h;
        let s = super::simd512::halves16(sp.add(2 * c.g0), ng, m.f16_scales);
        let b = super::simd512::halves16(bp.add(2 * c.g0), ng, m.f16_scales);
        let shift = c.h.trailing_zeros() as i32;
        let idx = _mm512_srlv_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(shift),
        );
        let first: __mmask16 = FIRST_LANES[shift as usize];
        let s = _mm512_permutexvar_ps(idx, s);
        let b = _mm512_permutexvar_ps(idx, b);
        _mm512_storeu_ps(lc.as_mut_ptr(), s);
        _mm512_storeu_ps(lc.as_mut_ptr().add(16), _mm512_maskz_mov_ps(first, b));
        _mm512_storeu_ps(lc.as_mut_ptr().add(32), _mm512_maskz_mul_ps(first, s, mid));
    }
}

/// The lanes that begin a group, for 1, 2, 4, 8 and 16 lanes per group.
const FIRST_LANES: [__mmask16; 5] = [0xFFFF, 0x5555, 0x1111, 0x0101, 0x0001];

/// One chunk (16 lanes of `DP` packed dwords each, contiguous at `src`)
/// into `16·DP·16/bits` dwords at `dst`: step `k·16/bits + j` holds pair
/// `j` of dword `k` of every lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn repack_chunk<const DP: usize>(src: *const i32, dst: *mut i32, bits: usize) {
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    let mut v = [_mm512_setzero_si512(); DP];
    for (k, vk) in v.iter_mut().enumerate() {
        *vk = _mm512_loadu_si512(src.add(16 * k) as *const _);
    }
    // Deinterleave in log2(DP) rounds: v[p] becomes dword bitrev(p) of
    // every lane.
    let mut len = DP;
    while len > 1 {
        let half = len / 2;
        let mut next = [_mm512_setzero_si512(); DP];
        for base in (0..DP).step_by(len) {
            for i in 0..half {
                let (a, b) = (v[base + 2 * i], v[base + 2 * i + 1]);
                next[base + i] = _mm512_permutex2var_epi32(a, even, b);
                next[base + half + i] = _mm512_permutex2var_epi32(a, odd, b);
            }
        }
        v = next;
        len = half;
    }
    let rbits = DP.trailing_zeros();
    let ppd = 16 / bits;
    let mask = _mm512_set1_epi32(((1 << bits) - 1) * 0x0001_0001);
    for kp in 0..DP {
        let p = if rbits == 0 {
            0
        } else {
            kp.reverse_bits() >> (usize::BITS - rbits)
        };
        let mut z = v[p];
        for j in 0..ppd {
            _mm512_storeu_si512(dst.add(16 * (kp * ppd + j)) as *mut _, _mm512_and_si512(z, mask));
            z = _mm512_srlv_epi32(z, _mm512_set1_epi32(bits as i32));
        }
    }
}

/// Rows `wp` (4, repacked) · tokens `xp` (TN) into `o[r][t]`.
// Index loops with constant bounds: the sums stay in registers.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<const TN: usize>(
    plan: &Plan,
    wp: *const i32,
    wl: *const f32,
    xp: *const i32,
    xl: *const f32,
    o: &mut [[f32; T]; R],
) {
    let (wd, nc) = (plan.row_dwords(), plan.chunks.len());
    let mut tot = [[_mm512_setzero_ps(); TN]; R];
    for (ci, c) in plan.chunks.iter().enumerate() {
        let mut acc = [[_mm512_setzero_si512(); TN]; R];
        for s in 0..c.steps {
            let at = c.off + 16 * s;
            let mut wv = [_mm512_setzero_si512(); R];
            for r in 0..R {
                wv[r] = _mm512_loadu_si512(wp.add(r * wd + at) as *const _);
            }
            for t in 0..TN {
                let xv = _mm512_loadu_si512(xp.add(t * wd + at) as *const _);
                for r in 0..R {
                    acc[r][t] = super::vnni::dpwssd(acc[r][t], wv[r], xv);
                }
            }
        }
        for r in 0..R {
            let lw = wl.add(r * nc * LANES + ci * LANES);
            let (sw, bw, mw) = (
                _mm512_loadu_ps(lw),
                _mm512_loadu_ps(lw.add(16)),
                _mm512_loadu_ps(lw.add(32)),
            );
            for t in 0..TN {
                let lx = xl.add(t * nc * LANES + ci * LANES);
                let d = _mm512_mul_ps(sw, _mm512_loadu_ps(lx));
                let mut v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][t]), d, tot[r][t]);
                v = _mm512_fmadd_ps(bw, _mm512_loadu_ps(lx.add(16)), v);
                tot[r][t] = _mm512_fmadd_ps(mw, _mm512_loadu_ps(lx.add(32)), v);
            }
        }
    }
    for r in 0..R {
        for t in 0..TN {
            o[r][t] = _mm512_reduce_add_ps(tot[r][t]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::fast_tests::check_against_vnni_tiles;

    /// The repacked kernel gives `vnni`'s tiles' results (the same integer
    /// sums; f32 additions in another order), for full and partial chunks,
    /// row counts that are not a multiple of the register tile, and token
    /// counts that are not a multiple of 3.
    #[test]
    fn repacked_products_match_the_tiles() {
        let layouts = [
            (4, 64, 2048, false),
            (4, 64, 512, false),
            (4, 64, 1536, false),
            (8, 64, 1280, false),
            (4, 128, 640, true),
            (8, 32, 256, false),
        ];
        check_against_vnni_tiles(5, &layouts, 9, 2, &[4, 5, 7, 16], |m, a, r0, out| {
            let xt = tile_x(Plan::new(m).expect("a plan for this layout"), &a.xq, &a.xsum, a.n);
            // SAFETY: VNNI is available (checked by the caller), the sizes
            // match, and `xt` is x laid out for this layout.
            unsafe { quant_rows(m, &xt, a.n, r0, out) };
        });
    }

    /// Layouts whose last groups cannot spread over 16 lanes have no plan;
    /// the model's layouts have one.
    #[test]
    fn plans_cover_the_model_layouts() {
        let plan = |bits: usize, gs: usize, cols: usize| {
            let m = QuantMat {
                bits,
                group_size: gs,
                cols,
                weight: &[],
                scales: &[],
                biases: &[],
                f16_scales: false,
            };
            Plan::new(&m)
        };
        for cols in [512, 2048, 4096, 1536] {
            let p = plan(4, 64, cols).expect("a plan");
            assert_eq!(p.columns().len(), cols);
            let mut seen = p.columns();
            seen.sort_unstable();
            assert!(seen.iter().enumerate().all(|(i, &c)| i == c), "every column once");
        }
        assert!(plan(8, 32, 96).is_none(), "one group of 8 dwords cannot fill 16 lanes");
    }

    /// A product large enough to be split into many tasks (each at most
    /// `REPACK_TASK_BYTES` of weights, so that its repacked rows stay in
    /// L2) gives the bits of the same rows taken as separate matrices:
    /// where the tasks fall does not change a row's sums.
    #[test]
    fn split_tasks_give_the_same_bits() {
        use crate::backend::cpu::matmul::{linear_with, Kernel};
        use crate::format::{Dtype, MatrixData, MatrixView, Region};
        use std::sync::Arc;
        if !crate::backend::cpu::vnni::available() {
            eprintln!("no AVX-512 VNNI here: nothing to compare");
            return;
        }
        // 768 bytes a row: tasks of 341 rows, not a multiple of the register tile.
        let (rows, cols, gs, n) = (1100, 1536, 64, 6);
        let mut rng = crate::backend::cpu::fast_tests::Lcg(7);
        let w: Vec<u8> = (0..rows * cols / 2).map(|_| rng.next() as u8).collect();
        let mut half = || -> Vec<u8> {
            (0..rows * cols / gs)
                .flat_map(|_| half::bf16::from_f32(0.02 * rng.f32()).to_le_bytes())
                .collect()
        };
        let (sc, bi) = (half(), half());
        let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
        // Rows [r0, r1) as a matrix of their own.
        let view = |r0: usize, r1: usize| {
            let g = cols / gs;
            let part = |v: &[u8], per: usize| Region::whole(Arc::new(v[r0 * per..r1 * per].to_vec()));
            MatrixView {
                rows: r1 - r0,
                cols,
                data: MatrixData::Quant {
                    bits: 4,
                    group_size: gs,
                    weight: part(&w, cols / 2),
                    scales: part(&sc, 2 * g),
                    biases: part(&bi, 2 * g),
                    scale_dtype: Dtype::Bf16,
                },
            }
        };
        let mut whole = vec![0f32; n * rows];
        linear_with(Kernel::Avx512Vnni, &view(0, rows), &x, n, &mut whole).expect("the whole product");
        for (r0, r1) in [(0, 4), (4, 260), (260, rows)] {
            let mut y = vec![0f32; n * (r1 - r0)];
            linear_with(Kernel::Avx512Vnni, &view(r0, r1), &x, n, &mut y).expect("a part");
            for t in 0..n {
                let (a, b) = (
                    &whole[t * rows + r0..t * rows + r1],
                    &y[t * (r1 - r0)..(t + 1) * (r1 - r0)],
                );
                assert!(
                    a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits()),
                    "token {t}, rows {r0}..{r1}"
                );
            }
        }
    }
}
