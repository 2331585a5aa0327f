//! The fast quantized product over several tokens on AMX (Intel's tile
//! matrix unit, Sapphire Rapids and later): 16 rows × 16 tokens × 64
//! columns per instruction, in 8-bit integers.
//!
//! The arithmetic is the VNNI fast path's (`vnni`, SPEC §6): x rounded to
//! 16-bit integers per group, exact integer sums per group, scaled per
//! group in f32. AMX multiplies bytes, so each 16-bit level is split as
//! `xq = 256·hi + lo` (`hi` signed, `lo` unsigned) and a group's sum is
//! `256·Σ q·hi + Σ q·lo`: `tdpbusd` (unsigned levels × signed `hi`) and
//! `tdpbuud` (× unsigned `lo`) into two accumulator tiles, joined exactly
//! in 32 bits once per group. Then, for each of the 16 rows, the group's
//! scale, bias and middle-level terms are applied to the 16 tokens at once
//! (one register of tokens per row).
//!
//! Tiles: A (tmm0, and tmm5 for a second row tile) is 16 rows × 64 levels
//! of one 64-column block, unpacked to bytes group by group just before
//! its products with every token tile (the bytes stay in L1); B (tmm1
//! `hi`, tmm2 `lo`) is the block's 64 columns × 16 tokens in the VNNI
//! layout (four columns of a token per dword), laid out once per call; C
//! (tmm3, tmm4; tmm6, tmm7) is 16 rows × 16 tokens. Two row tiles share
//! each load of B and give the tile unit four independent products a
//! group: tiles are not renamed, so with one row tile each
//! group's loads waited for the previous group's products. Levels and x
//! are both in natural column order (a 4-bit byte is widened to a word
//! whose two bytes take its two levels), so x needs no permutation.
//!
//! The tile instructions are written as inline assembly (their intrinsics
//! are not stable Rust); the kernel is generic over [`TileOps`] so that
//! the tests run it on an emulation of the tiles on machines without AMX.

use super::qmatvec::{Order, QuantMat, QuantX};
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

/// The bytes of B tiles (x) that a task walks with each pair of row
/// tiles: a quarter of a 2 MiB L2, so that they stay there from one pair
/// to the next (at 512 tokens and 2048 columns all of x's tiles are 2
/// MiB, and were read from L3 by every pair).
const B_BLOCK_BYTES: usize = 512 << 10;

/// Tokens from which a product takes this kernel.
pub(crate) const MIN_TOKENS: usize = 4;

/// Rows, tokens and columns of one tile product.
const TR: usize = 16;
const TT: usize = 16;
const TK: usize = 64;

/// Whether this CPU has AMX-INT8 and this process may use the tiles (on
/// Linux the tile state needs a permission, asked for once here).
pub(crate) fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        if !super::vnni::available() {
            return false;
        }
        let c = __cpuid_count(7, 0);
        let (tile, int8) = (c.edx & (1 << 24) != 0, c.edx & (1 << 25) != 0);
        tile && int8 && permission()
    })
}

#[cfg(target_os = "linux")]
fn permission() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes which state
    // the kernel saves for this process.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn permission() -> bool {
    false
}

/// Whether the kernel takes this layout: 4- or 8-bit levels in groups of
/// whole 64-column blocks whose sums fit in 32 bits.
pub(crate) fn quant_supported(m: &QuantMat) -> bool {
    matches!(m.bits, 4 | 8) && m.group_size.is_multiple_of(TK) && super::vnni::quant_supported(m)
}

/// x laid out as B tiles.
pub(crate) struct Tiled {
    n: usize,
    blocks: usize,
    groups: usize,
    /// `[n/16, blocks, 2 (hi, lo), 16 (4 columns each), 64 (16 tokens × 4)]`.
    b: Vec<u8>,
    /// `[n/16, groups, 3, 16]`: per token, the group's scale of x, sum of x
    /// and rounding residual times the weights' middle level.
    lanes: Vec<f32>,
}

/// The tiles of x `[n, cols]` from its 16-bit levels `xq` (in
/// `Order::Natural`, as `unpack_group` lays out the weights) and group
/// sums. Blocks of token tiles in parallel.
pub(crate) fn tile_x(m: &QuantMat, xq: &QuantX, xsum: &[f32], n: usize) -> Tiled {
    debug_assert_eq!(xq.order, Order::Natural);
    let (cols, groups) = (m.cols, m.groups());
    let blocks = cols / TK;
    let tiles = n.div_ceil(TT);
    let mid = ((1u32 << m.bits) - 1) as f32 / 2.0;
    let mut b = crate::parallel::zeros(tiles * blocks * 2 * TK * TT);
    crate::parallel::for_each_chunk(&mut b, 2 * TK * TT, |i, bb| {
        let (tt, kb) = (i / blocks, i % blocks);
        let (hi, lo) = bb.split_at_mut(TK * TT);
        for u in 0..TT.min(n - tt * TT) {
            let t = tt * TT + u;
            let q = &xq.q[t * cols + kb * TK..][..TK];
            // Row j of B: columns 4j..4j + 4 of every token, 4 bytes a
            // token.
            for (j, v) in q.chunks_exact(4).enumerate() {
                let v: [i16; 4] = [v[0], v[1], v[2], v[3]];
                let o = (j * TT + u) * 4;
                hi[o..o + 4].copy_from_slice(&v.map(|x| (x >> 8) as u8));
                lo[o..o + 4].copy_from_slice(&v.map(|x| x as u8));
            }
        }
    });
    let mut lanes = vec![0.0f32; tiles * groups * 3 * TT];
    crate::parallel::for_each_chunk(&mut lanes, groups * 3 * TT, |tt, lt| {
        for u in 0..TT.min(n - tt * TT) {
            let t = tt * TT + u;
            for (g, lg) in lt.chunks_exact_mut(3 * TT).enumerate() {
                lg[u] = xq.scale[t * groups + g];
                lg[TT + u] = xsum[t * groups + g];
                lg[2 * TT + u] = mid * xq.resid[t * groups + g];
            }
        }
    });
    Tiled {
        n,
        blocks,
        groups,
        b,
        lanes,
    }
}

/// The tile operations the kernel uses, on fixed tile registers.
pub(crate) trait TileOps {
    /// Configure the eight tiles (16 rows of 64 bytes each).
    unsafe fn config(&mut self);
    /// C (hi and lo) of both row tiles = 0.
    unsafe fn zero_c(&mut self);
    /// A of both row tiles = 16 rows of 64 bytes each at `p0` and `p1`,
    /// contiguous.
    unsafe fn load_a(&mut self, p0: *const u8, p1: *const u8);
    /// B hi and lo = 16 rows of 64 bytes at `hi` and `lo`.
    unsafe fn load_b(&mut self, hi: *const u8, lo: *const u8);
    /// For both row tiles: C hi += A (unsigned) · B hi (signed); C lo +=
    /// A · B lo (unsigned).
    unsafe fn dot(&mut self);
    /// C hi and lo of both row tiles to 32 rows of 16 i32 at `hi` and
    /// `lo` (the first row tile's 16, then the second's).
    unsafe fn store_c(&mut self, hi: *mut i32, lo: *mut i32);
    /// Give the tile state back.
    unsafe fn release(&mut self);
}

/// The tile unit.
pub(crate) struct Amx;

#[repr(C, align(64))]
struct Config([u8; 64]);

/// Palette 1; tiles 0–7 of 16 rows × 64 bytes.
static CONFIG: Config = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    Config(c)
};

impl TileOps for Amx {
    #[inline(always)]
    unsafe fn config(&mut self) {
        std::arch::asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
    }
    #[inline(always)]
    unsafe fn zero_c(&mut self) {
        std::arch::asm!(
            "tilezero tmm3",
            "tilezero tmm4",
            "tilezero tmm6",
            "tilezero tmm7",
            options(nomem, nostack)
        );
    }
    #[inline(always)]
    unsafe fn load_a(&mut self, p0: *const u8, p1: *const u8) {
        std::arch::asm!(
            "tileloadd tmm0, [{a} + {s}*1]",
            "tileloadd tmm5, [{b} + {s}*1]",
            a = in(reg) p0,
            b = in(reg) p1,
            s = in(reg) 64usize,
            options(nostack, readonly)
        );
    }
    #[inline(always)]
    unsafe fn load_b(&mut self, hi: *const u8, lo: *const u8) {
        std::arch::asm!(
            "tileloadd tmm1, [{h} + {s}*1]",
            "tileloadd tmm2, [{l} + {s}*1]",
            h = in(reg) hi,
            l = in(reg) lo,
            s = in(reg) 64usize,
            options(nostack, readonly)
        );
    }
    #[inline(always)]
    unsafe fn dot(&mut self) {
        std::arch::asm!(
            "tdpbusd tmm3, tmm0, tmm1",
            "tdpbuud tmm4, tmm0, tmm2",
            "tdpbusd tmm6, tmm5, tmm1",
            "tdpbuud tmm7, tmm5, tmm2",
            options(nomem, nostack)
        );
    }
    #[inline(always)]
    unsafe fn store_c(&mut self, hi: *mut i32, lo: *mut i32) {
        std::arch::asm!(
            "tilestored [{h} + {s}*1], tmm3",
            "tilestored [{l} + {s}*1], tmm4",
            "tilestored [{h2} + {s}*1], tmm6",
            "tilestored [{l2} + {s}*1], tmm7",
            h = in(reg) hi,
            l = in(reg) lo,
            h2 = in(reg) hi.add(TR * TT),
            l2 = in(reg) lo.add(TR * TT),
            s = in(reg) 64usize,
            options(nostack)
        );
    }
    #[inline(always)]
    unsafe fn release(&mut self) {
        std::arch::asm!("tilerelease", options(nomem, nostack));
    }
}

/// A task's scratch: one group of a pair of row tiles unpacked to one
/// byte per level (`[blocks of the group, 2 row tiles, 16, 64]`), the
/// scales and biases of the task's rows (`[rows, 2, groups]`), and the
/// f32 sums of a pair of row tiles for every token tile (`[token tiles,
/// 32 rows, 16 tokens]`).
#[derive(Default)]
struct Scratch {
    w: Vec<Line>,
    sc: Vec<f32>,
    acc: Vec<Row>,
}

/// 64 bytes on a cache line of their own: a tile row, loaded and stored
/// whole.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Where the kernel writes its results: row `r` of the matrix for token
/// `t` at `p[t * ld + r]` (y `[n, ld]`, the layout products return).
/// Tasks write disjoint rows of it.
#[derive(Clone, Copy)]
pub(crate) struct TokenRows {
    pub p: *mut f32,
    pub ld: usize,
}

// SAFETY: a pointer handed to tasks that write disjoint rows.
unsafe impl Send for TokenRows {}
unsafe impl Sync for TokenRows {}

/// Rows `r0..r0 + rows` of every token into `out` on the tile unit.
///
/// # Safety
/// `available()` must hold, `m` must come from `Mat::new` (sizes
/// checked) with `quant_supported(m)`, `xa` must be `tile_x` of `m`'s
/// layout over `n` tokens, `r0 + rows` must not pass `m`'s rows nor
/// `out.ld`, `out.p` must hold `n · out.ld` floats, and no other thread
/// may touch these rows of it meanwhile.
pub(crate) unsafe fn quant_rows(m: &QuantMat, xa: &Tiled, r0: usize, rows: usize, out: TokenRows) {
    quant_rows_on(&mut Amx, m, xa, r0, rows, out, B_BLOCK_BYTES)
}

/// [`quant_rows`] on the tile operations `ops`, with blocks of token
/// tiles of at most `block_bytes` of B (at least one tile).
///
/// Pairs of row tiles one after another; for each, group by group: the
/// group's levels of the 32 rows are unpacked into a 2 KiB block (per 64
/// columns) that stays in L1, then multiplied by every token tile of a
/// block of them (all of them up to 128 tokens at 2048 columns). The
/// weights are read from memory once, as they are multiplied (for later
/// blocks of tokens, again from L2), and the unpacked levels never leave
/// L1. A pair's sums for a token tile are turned in registers and
/// written as each token's 32 rows.
///
/// # Safety
/// As for `quant_rows`, `available()` only where `ops` is the tile unit.
pub(crate) unsafe fn quant_rows_on<O: TileOps>(
    ops: &mut O,
    m: &QuantMat,
    xa: &Tiled,
    r0: usize,
    rows: usize,
    out: TokenRows,
    block_bytes: usize,
) {
    let n = xa.n;
    let (groups, per_group) = (xa.groups, m.group_size / TK);
    let tiles = n.div_ceil(TT);
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let Scratch { w, sc, acc } = &mut *s;
        w.resize(per_group * 2 * TR, Line([0; 64]));
        sc.resize(rows * 2 * groups, 0.0);
        // Token tiles in blocks whose B tiles stay in L2 while every pair
        // of the task's rows passes through them.
        let tblock = (block_bytes / (xa.blocks * 2 * TK * TT)).clamp(1, tiles);
        acc.resize(tblock * 2 * TR, Row([0.0; TT]));
        scales(m, r0, rows, sc);
        let mut c = Sums([[0; TT]; 2 * TR], [[0; TT]; 2 * TR]);
        ops.config();
        for t0 in (0..tiles).step_by(tblock) {
            let t1 = (t0 + tblock).min(tiles);
            for p0 in (0..rows).step_by(2 * TR) {
                let live = (rows - p0).min(2 * TR);
                let sc = &sc[p0 * 2 * groups..];
                acc.fill(Row([0.0; TT]));
                for g in 0..groups {
                    unpack_group(m, r0 + p0, live, g, rows - p0 - live, w);
                    for tt in t0..t1 {
                        products(ops, xa, tt, g, w);
                        ops.store_c(c.0.as_mut_ptr() as *mut i32, c.1.as_mut_ptr() as *mut i32);
                        scale(xa, tt, g, sc, live, &c, &mut acc[(tt - t0) * 2 * TR..][..2 * TR]);
                    }
                }
                for tt in t0..t1 {
                    let tn = TT.min(n - tt * TT);
                    let at = out.p.add(tt * TT * out.ld + r0 + p0);
                    write_tokens(&acc[(tt - t0) * 2 * TR..][..2 * TR], live, tn, at, out.ld);
                }
            }
        }
        ops.release();
    });
}

/// 16 floats on a cache line of their own: one row's sums for a token
/// tile.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Row([f32; TT]);

/// A pair of row tiles' sums for one token tile (`acc` `[32 rows, 16
/// tokens]`) as `tn` tokens' first `live` rows: token `u`'s at `at + u ·
/// ld`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn write_tokens(acc: &[Row], live: usize, tn: usize, at: *mut f32, ld: usize) {
    for h in 0..2 {
        if live <= h * TR {
            break;
        }
        let mask = mask16(live - h * TR);
        let mut r: [__m512; 16] = std::array::from_fn(|i| _mm512_load_ps(acc[h * TR + i].0.as_ptr()));
        transpose16(&mut r);
        for (u, v) in r.iter().enumerate().take(tn) {
            _mm512_mask_storeu_ps(at.add(u * ld + h * TR), mask, *v);
        }
    }
}

/// `r` (16 rows of 16 floats) transposed in registers.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn transpose16(r: &mut [__m512; 16]) {
    // Within each 128-bit lane k: t[2i] = rows 2i, 2i+1 at columns 4k and
    // 4k + 1 interleaved; t[2i + 1] at 4k + 2 and 4k + 3.
    let t: [__m512; 16] = std::array::from_fn(|i| match i % 2 {
        0 => _mm512_unpacklo_ps(r[i], r[i + 1]),
        _ => _mm512_unpackhi_ps(r[i - 1], r[i]),
    });
    // r[4j + m], lane k: column 4k + m of rows 4j..4j + 4.
    for j in 0..4 {
        let (a, b) = (_mm512_castps_pd(t[4 * j]), _mm512_castps_pd(t[4 * j + 1]));
        let (c, d) = (_mm512_castps_pd(t[4 * j + 2]), _mm512_castps_pd(t[4 * j + 3]));
        r[4 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    // Column 4k + m: lane k of r[m], r[4 + m], r[8 + m], r[12 + m].
    let q = *r;
    for m in 0..4 {
        let u0 = _mm512_shuffle_f32x4::<0x88>(q[m], q[4 + m]);
        let u1 = _mm512_shuffle_f32x4::<0xDD>(q[m], q[4 + m]);
        let u2 = _mm512_shuffle_f32x4::<0x88>(q[8 + m], q[12 + m]);
        let u3 = _mm512_shuffle_f32x4::<0xDD>(q[8 + m], q[12 + m]);
        r[m] = _mm512_shuffle_f32x4::<0x88>(u0, u2);
        r[8 + m] = _mm512_shuffle_f32x4::<0xDD>(u0, u2);
        r[4 + m] = _mm512_shuffle_f32x4::<0x88>(u1, u3);
        r[12 + m] = _mm512_shuffle_f32x4::<0xDD>(u1, u3);
    }
}

/// The scales and biases of rows `r0..r0 + rows` as f32, `[rows, 2,
/// groups]` in `sc`, 16 groups at a time.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn scales(m: &QuantMat, r0: usize, rows: usize, sc: &mut [f32]) {
    let groups = m.groups();
    for i in 0..rows {
        let row = sc.as_mut_ptr().add(i * 2 * groups);
        let at = 2 * (r0 + i) * groups;
        let (ps, pb) = (m.scales.as_ptr().add(at), m.biases.as_ptr().add(at));
        for g in (0..groups).step_by(16) {
            let (len, mask) = ((groups - g).min(16), mask16(groups - g));
            let s = super::simd512::halves16(ps.add(2 * g), len, m.f16_scales);
            let b = super::simd512::halves16(pb.add(2 * g), len, m.f16_scales);
            _mm512_mask_storeu_ps(row.add(g), mask, s);
            _mm512_mask_storeu_ps(row.add(groups + g), mask, b);
        }
    }
}

/// The first `len` of 16 lanes.
fn mask16(len: usize) -> __mmask16 {
    if len >= 16 {
        0xFFFF
    } else {
        (1u16 << len) - 1
    }
}

/// Group `g` of rows `r0..r0 + live` (live ≤ 32) as bytes into `w`: A
/// tiles `[blocks of the group, 2, 16, 64]`, columns in natural order;
/// rows past `live` zero. The same columns of the next pair of row tiles
/// (`ahead` rows remain after these) are asked for meanwhile, into L2.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn unpack_group(m: &QuantMat, r0: usize, live: usize, g: usize, ahead: usize, w: &mut [Line]) {
    let rb = m.row_bytes();
    let per_group = m.group_size / TK;
    let gb = m.group_size * m.bits / 8;
    let nib = _mm512_set1_epi8(0x0F);
    let base = m.weight.as_ptr().add(r0 * rb + g * gb);
    // The next pair's rows, a line at a time.
    if (g * gb).is_multiple_of(64) {
        for i in 0..ahead.min(2 * TR) {
            _mm_prefetch::<_MM_HINT_T1>(base.add((2 * TR + i) * rb) as *const i8);
        }
    }
    for j in 0..per_group {
        let tile = &mut w[j * 2 * TR..][..2 * TR];
        for (i, line) in tile.iter_mut().enumerate() {
            let d = line.0.as_mut_ptr();
            if i >= live {
                _mm512_store_si512(d as *mut _, _mm512_setzero_si512());
            } else if m.bits == 8 {
                let v = _mm512_loadu_si512(base.add(i * rb + j * TK) as *const _);
                _mm512_store_si512(d as *mut _, v);
            } else {
                // Each byte widened to a word: its low level stays in the
                // word's low byte, its high level is shifted into the high
                // byte, and the rest masked off: the 64 levels in order.
                let v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(base.add(i * rb + j * TK / 2) as *const __m256i));
                let w = _mm512_ternarylogic_epi32::<0xA8>(v, _mm512_slli_epi16::<4>(v), nib);
                _mm512_store_si512(d as *mut _, w);
            }
        }
    }
}

/// The integer sums of a pair of row tiles for one group, `hi` and `lo`,
/// as the tiles store them (`[32 rows, 16 tokens]` each).
#[repr(C, align(64))]
struct Sums([[i32; TT]; 2 * TR], [[i32; TT]; 2 * TR]);

/// Group `g` of a pair of row tiles (`w` from `unpack_group`) × token
/// tile `tt` into the accumulator tiles.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn products<O: TileOps>(ops: &mut O, xa: &Tiled, tt: usize, g: usize, w: &[Line]) {
    let per_group = w.len() / (2 * TR);
    let bt = xa.b.as_ptr().add(tt * xa.blocks * 2 * TK * TT);
    ops.zero_c();
    for j in 0..per_group {
        let a = w.as_ptr().add(j * 2 * TR) as *const u8;
        ops.load_a(a, a.add(TR * TK));
        let b = bt.add((g * per_group + j) * 2 * TK * TT);
        ops.load_b(b, b.add(TK * TT));
        ops.dot();
    }
}

/// The stored sums `c` of group `g` × token tile `tt` (`sc` at the pair's
/// first row; `live` rows), added to `acc[row][token]`: per row, `s·(xs·c
/// + m·resid) + b·Σx`, 16 tokens at once.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn scale(xa: &Tiled, tt: usize, g: usize, sc: &[f32], live: usize, c: &Sums, acc: &mut [Row]) {
    let groups = xa.groups;
    let lg = xa.lanes.as_ptr().add((tt * groups + g) * 3 * TT);
    let (xs, xsum, mres) = (
        _mm512_loadu_ps(lg),
        _mm512_loadu_ps(lg.add(TT)),
        _mm512_loadu_ps(lg.add(2 * TT)),
    );
    for (r, a) in acc.iter_mut().enumerate().take(live) {
        let c = _mm512_add_epi32(
            _mm512_slli_epi32::<8>(_mm512_load_si512(c.0[r].as_ptr() as *const _)),
            _mm512_load_si512(c.1[r].as_ptr() as *const _),
        );
        let u = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), xs, mres);
        let p = sc.as_ptr().add(r * 2 * groups + g);
        let v = _mm512_fmadd_ps(_mm512_set1_ps(*p), u, _mm512_load_ps(a.0.as_ptr()));
        _mm512_store_ps(
            a.0.as_mut_ptr(),
            _mm512_fmadd_ps(_mm512_set1_ps(*p.add(groups)), xsum, v),
        );
    }
}

#[cfg(test)]
mod tests;
