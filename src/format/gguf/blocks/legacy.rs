//! The first ggml formats: blocks of 32 values with one f16 scale (and for
//! `_1`, an f16 minimum). Nibbles: value `l` of a block is the low half of
//! byte `l`, value `l + 16` its high half; `Q5` adds a fifth bit per
//! value from a little-endian u32 (bit `j` for value `j`).

use super::{dot_lanes, f16_at, sum_lanes, Block};

/// The 32 4-bit levels of a block (`qs`: 16 bytes).
#[inline(always)]
fn nibbles(qs: &[u8]) -> [u8; 32] {
    let qs = &qs[..16];
    let mut q = [0u8; 32];
    for l in 0..16 {
        q[l] = qs[l] & 0xF;
        q[l + 16] = qs[l] >> 4;
    }
    q
}

/// The 32 5-bit levels: nibbles plus the high bits of `qh`.
#[inline(always)]
fn five_bits(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = nibbles(qs);
    for (j, v) in q.iter_mut().enumerate() {
        *v |= (((h >> j) & 1) as u8) << 4;
    }
    q
}

/// Levels minus an offset, as f32.
#[inline(always)]
fn centered(q: &[u8; 32], off: i32) -> [f32; 32] {
    let mut v = [0.0f32; 32];
    for (o, &l) in v.iter_mut().zip(q) {
        *o = (l as i32 - off) as f32;
    }
    v
}

#[inline(always)]
fn levels(q: &[u8; 32]) -> [f32; 32] {
    centered(q, 0)
}

/// `d(f16) qs[16]`: `w = d·(q − 8)`.
pub struct Q4_0;
impl Block for Q4_0 {
    const ELEMS: usize = 32;
    const BYTES: usize = 18;
    fn dequant(b: &[u8], out: &mut [f32]) {
        let d = f16_at(b, 0);
        for (o, q) in out.iter_mut().zip(centered(&nibbles(&b[2..18]), 8)) {
            *o = d * q;
        }
    }
    fn dot(b: &[u8], x: &[f32]) -> f32 {
        f16_at(b, 0) * dot_lanes(&centered(&nibbles(&b[2..18]), 8), x)
    }
}

/// `d(f16) m(f16) qs[16]`: `w = d·q + m`.
pub struct Q4_1;
impl Block for Q4_1 {
    const ELEMS: usize = 32;
    const BYTES: usize = 20;
    fn dequant(b: &[u8], out: &mut [f32]) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for (o, q) in out.iter_mut().zip(levels(&nibbles(&b[4..20]))) {
            *o = d * q + m;
        }
    }
    fn dot(b: &[u8], x: &[f32]) -> f32 {
        f16_at(b, 0) * dot_lanes(&levels(&nibbles(&b[4..20])), x) + f16_at(b, 2) * sum_lanes(x)
    }
}

/// `d(f16) qh(u32) qs[16]`: `w = d·(q − 16)`.
pub struct Q5_0;
impl Block for Q5_0 {
    const ELEMS: usize = 32;
    const BYTES: usize = 22;
    fn dequant(b: &[u8], out: &mut [f32]) {
        let d = f16_at(b, 0);
        for (o, q) in out.iter_mut().zip(centered(&five_bits(&b[2..6], &b[6..22]), 16)) {
            *o = d * q;
        }
    }
    fn dot(b: &[u8], x: &[f32]) -> f32 {
        f16_at(b, 0) * dot_lanes(&centered(&five_bits(&b[2..6], &b[6..22]), 16), x)
    }
}

/// `d(f16) m(f16) qh(u32) qs[16]`: `w = d·q + m`.
pub struct Q5_1;
impl Block for Q5_1 {
    const ELEMS: usize = 32;
    const BYTES: usize = 24;
    fn dequant(b: &[u8], out: &mut [f32]) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for (o, q) in out.iter_mut().zip(levels(&five_bits(&b[4..8], &b[8..24]))) {
            *o = d * q + m;
        }
    }
    fn dot(b: &[u8], x: &[f32]) -> f32 {
        f16_at(b, 0) * dot_lanes(&levels(&five_bits(&b[4..8], &b[8..24])), x) + f16_at(b, 2) * sum_lanes(x)
    }
}

/// `d(f16) qs[32](i8)`: `w = q·d`.
pub struct Q8_0;
impl Block for Q8_0 {
    const ELEMS: usize = 32;
    const BYTES: usize = 34;
    fn dequant(b: &[u8], out: &mut [f32]) {
        let d = f16_at(b, 0);
        for (o, &q) in out.iter_mut().zip(&b[2..34]) {
            *o = (q as i8) as f32 * d;
        }
    }
    fn dot(b: &[u8], x: &[f32]) -> f32 {
        let mut v = [0.0f32; 32];
        for (o, &q) in v.iter_mut().zip(&b[2..34]) {
            *o = (q as i8) as f32;
        }
        f16_at(b, 0) * dot_lanes(&v, x)
    }
}
