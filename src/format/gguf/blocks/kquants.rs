//! The K-quants: super-blocks of 256 values in sub-blocks of 16 or 32,
//! each sub-block with its own scale (and for Q2_K/Q4_K/Q5_K a minimum),
//! the sub-block scales quantized against f16 super-scales. Each block is
//! decoded to its 256 levels on the stack; the scales are applied per
//! sub-block (dequantize) or to the sub-block's partial sums (dot).

use super::{dot_lanes, f16_at, sum_lanes, Block};
use crate::format::gguf::types::QK_K;

/// `Σ_sub (d_s·Σ q·x − m_s·Σ x)` over sub-blocks of `n` values.
#[inline(always)]
fn dot_subs(q: &[f32; QK_K], x: &[f32], n: usize, d: &[f32], m: Option<&[f32]>) -> f32 {
    let mut s = 0.0f32;
    for (i, (qs, xs)) in q.chunks_exact(n).zip(x[..QK_K].chunks_exact(n)).enumerate() {
        s += d[i] * dot_lanes(qs, xs);
        if let Some(m) = m {
            s -= m[i] * sum_lanes(xs);
        }
    }
    s
}

/// `w = d_s·q − m_s` over sub-blocks of `n`.
#[inline(always)]
fn dequant_subs(q: &[f32; QK_K], out: &mut [f32], n: usize, d: &[f32], m: Option<&[f32]>) {
    for (i, (qs, os)) in q.chunks_exact(n).zip(out[..QK_K].chunks_exact_mut(n)).enumerate() {
        match m {
            Some(m) => {
                for (o, &v) in os.iter_mut().zip(qs) {
                    *o = d[i] * v - m[i];
                }
            }
            None => {
                for (o, &v) in os.iter_mut().zip(qs) {
                    *o = d[i] * v;
                }
            }
        }
    }
}

/// 2-bit levels, the layout Q2_K and Q3_K share: value `128j + 32s + l`
/// is bits `2s..2s+2` of `qs[32j + l]`.
#[inline(always)]
fn crumbs(qs: &[u8]) -> [u8; QK_K] {
    let qs = &qs[..64];
    let mut q = [0u8; QK_K];
    for j in 0..2 {
        for s in 0..4 {
            for l in 0..32 {
                q[128 * j + 32 * s + l] = (qs[32 * j + l] >> (2 * s)) & 3;
            }
        }
    }
    q
}

/// 4-bit levels, the layout Q4_K and Q5_K share: value `64c + 32h + l` is
/// nibble `h` of `qs[32c + l]`.
#[inline(always)]
fn nibbles(qs: &[u8]) -> [u8; QK_K] {
    let qs = &qs[..128];
    let mut q = [0u8; QK_K];
    for c in 0..4 {
        for l in 0..32 {
            q[64 * c + l] = qs[32 * c + l] & 0xF;
            q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
        }
    }
    q
}

fn to_f32(q: &[u8; QK_K]) -> [f32; QK_K] {
    let mut v = [0.0f32; QK_K];
    for (o, &l) in v.iter_mut().zip(q) {
        *o = l as f32;
    }
    v
}

/// `scales[16] qs[64] d(f16) dmin(f16)`: 16 sub-blocks of 16, each scale
/// byte a 4-bit scale (low) and 4-bit minimum (high).
pub struct Q2K;
impl Q2K {
    fn parts(b: &[u8]) -> ([f32; QK_K], [f32; 16], [f32; 16]) {
        let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
        let (mut dl, mut ml) = ([0.0f32; 16], [0.0f32; 16]);
        for (i, &s) in b[..16].iter().enumerate() {
            dl[i] = d * (s & 0xF) as f32;
            ml[i] = dmin * (s >> 4) as f32;
        }
        (to_f32(&crumbs(&b[16..80])), dl, ml)
    }
}
impl Block for Q2K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 84;
    fn dequant(b: &[u8], out: &mut [f32]) {
        let (q, dl, ml) = Self::parts(b);
        dequant_subs(&q, out, 16, &dl, Some(&ml));
    }
    fn dot(b: &[u8], x: &[f32]) -> f32 {
        let (q, dl, ml) = Self::parts(b);
        dot_subs(&q, x, 16, &dl, Some(&ml))
    }
}

/// `hmask[32] qs[64] scales[12] d(f16)`: 16 sub-blocks of 16, 6-bit signed
/// scales (low nibbles in bytes 0..8, high pairs in 8..12); the third bit
/// of value `32b + l` is bit `b` of `hmask[l]`, and a clear bit means −4.
pub struct Q3K;
impl Q3K {
    fn parts(b: &[u8]) -> ([f32; QK_K], [f32; 16]) {
        let d = f16_at(b, 108);
        let sc = &b[96..108];
        let mut dl = [0.0f32; 16];
        for (i, o) in dl.iter_mut().enumerate() {
            let low = if i < 8 { sc[i] & 0xF } else { sc[i - 8] >> 4 };
            let high = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
            *o = d * (((low | (high << 4)) as i32) - 32) as f32;
        }
        let low = crumbs(&b[32..96]);
        let hmask = &b[..32];
        let mut q = [0.0f32; QK_K];
        for bit in 0..8 {
            for (l, &hm) in hmask.iter().enumerate() {
                let i = 32 * bit + l;
                let h = (hm >> bit) & 1;
                q[i] = (low[i] as i32 - 4 * (1 - h as i32)) as f32;
            }
        }
        (q, dl)
    }
}
impl Block for Q3K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 110;
    fn dequant(b: &[u8], out: &mut [f32]) {
        let (q, dl) = Self::parts(b);
        dequant_subs(&q, out, 16, &dl, None);
    }
    fn dot(b: &[u8], x: &[f32]) -> f32 {
        let (q, dl) = Self::parts(b);
        dot_subs(&q, x, 16, &dl, None)
    }
}

/// The 8 six-bit scales and minimums of Q4_K / Q5_K, packed in 12 bytes:
/// `j < 4`: scale `s[j] & 63`, minimum `s[j+4] & 63`; `j ≥ 4`: the low
/// nibbles of `s[j+4]` with the top two bits of `s[j−4]` (scale) and of
/// `s[j]` (minimum).
#[inline(always)]
fn scale_min_k4(d: f32, dmin: f32, s: &[u8]) -> ([f32; 8], [f32; 8]) {
    let s = &s[..12];
    let (mut ds, mut ms) = ([0.0f32; 8], [0.0f32; 8]);
    for j in 0..8 {
        let (sc, m) = if j < 4 {
            (s[j] & 63, s[j + 4] & 63)
        } else {
            (
                (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
                (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
            )
        };
        ds[j] = d * sc as f32;
        ms[j] = dmin * m as f32;
    }
    (ds, ms)
}

/// `d(f16) dmin(f16) scales[12] qs[128]`: 8 sub-blocks of 32.
pub struct Q4K;
impl Q4K {
    fn parts(b: &[u8]) -> ([f32; QK_K], [f32; 8], [f32; 8]) {
        let (ds, ms) = scale_min_k4(f16_at(b, 0), f16_at(b, 2), &b[4..16]);
        (to_f32(&nibbles(&b[16..144])), ds, ms)
    }
}
impl Block for Q4K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 144;
    fn dequant(b: &[u8], out: &mut [f32]) {
        let (q, ds, ms) = Self::parts(b);
        dequant_subs(&q, out, 32, &ds, Some(&ms));
    }
    fn dot(b: &[u8], x: &[f32]) -> f32 {
        let (q, ds, ms) = Self::parts(b);
        dot_subs(&q, x, 32, &ds, Some(&ms))
    }
}

/// `d(f16) dmin(f16) scales[12] qh[32] qs[128]`: Q4_K's layout plus a
/// fifth bit, bit `j` of `qh[l]` for value `32j + l`.
pub struct Q5K;
impl Q5K {
    fn parts(b: &[u8]) -> ([f32; QK_K], [f32; 8], [f32; 8]) {
        let (ds, ms) = scale_min_k4(f16_at(b, 0), f16_at(b, 2), &b[4..16]);
        let mut q = nibbles(&b[48..176]);
        let qh = &b[16..48];
        for j in 0..8 {
            for l in 0..32 {
                q[32 * j + l] |= ((qh[l] >> j) & 1) << 4;
            }
        }
        (to_f32(&q), ds, ms)
    }
}
impl Block for Q5K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 176;
    fn dequant(b: &[u8], out: &mut [f32]) {
        let (q, ds, ms) = Self::parts(b);
        dequant_subs(&q, out, 32, &ds, Some(&ms));
    }
    fn dot(b: &[u8], x: &[f32]) -> f32 {
        let (q, ds, ms) = Self::parts(b);
        dot_subs(&q, x, 32, &ds, Some(&ms))
    }
}

/// `ql[128] qh[64] scales[16](i8) d(f16)`: 16 sub-blocks of 16, 6-bit
/// levels minus 32. Value `128j + 64h + t`: nibble `h` of `ql[64j + t]`;
/// its top two bits, for value `128j + 32s + l`, bits `2s..2s+2` of
/// `qh[32j + l]`.
pub struct Q6K;
impl Q6K {
    fn parts(b: &[u8]) -> ([f32; QK_K], [f32; 16]) {
        let d = f16_at(b, 208);
        let mut dl = [0.0f32; 16];
        for (o, &s) in dl.iter_mut().zip(&b[192..208]) {
            *o = d * (s as i8) as f32;
        }
        let (ql, qh) = (&b[..128], &b[128..192]);
        let high = crumbs(qh);
        let mut q = [0.0f32; QK_K];
        for j in 0..2 {
            for h in 0..2 {
                for t in 0..64 {
                    let i = 128 * j + 64 * h + t;
                    let low = (ql[64 * j + t] >> (4 * h)) & 0xF;
                    q[i] = ((low | (high[i] << 4)) as i32 - 32) as f32;
                }
            }
        }
        (q, dl)
    }
}
impl Block for Q6K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 210;
    fn dequant(b: &[u8], out: &mut [f32]) {
        let (q, dl) = Self::parts(b);
        dequant_subs(&q, out, 16, &dl, None);
    }
    fn dot(b: &[u8], x: &[f32]) -> f32 {
        let (q, dl) = Self::parts(b);
        dot_subs(&q, x, 16, &dl, None)
    }
}
