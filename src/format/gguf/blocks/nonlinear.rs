//! Formats whose 4-bit codes index a table of levels instead of being the
//! levels: IQ4_NL and IQ4_XS (a non-uniform int8 grid), and MXFP4 (OCP
//! microscaling: e2m1 values, doubled so they are integers, under a
//! power-of-two e8m0 scale that is halved to match).

use super::{dot_lanes, f16_at, Block};

/// ggml's `kvalues_iq4nl`.
const IQ4: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];
/// ggml's `kvalues_mxfp4`: e2m1 values times two.
const FP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Levels of 32 values from 16 bytes: value `16h + l` is code nibble `h`
/// of byte `l`.
#[inline(always)]
fn lookup(qs: &[u8], table: &[i8; 16]) -> [f32; 32] {
    let qs = &qs[..16];
    let mut v = [0.0f32; 32];
    for l in 0..16 {
        v[l] = table[(qs[l] & 0xF) as usize] as f32;
        v[l + 16] = table[(qs[l] >> 4) as usize] as f32;
    }
    v
}

/// `d(f16) qs[16]`: `w = d·IQ4[code]`.
pub struct Iq4Nl;
impl Block for Iq4Nl {
    const ELEMS: usize = 32;
    const BYTES: usize = 18;
    fn dequant(b: &[u8], out: &mut [f32]) {
        let d = f16_at(b, 0);
        for (o, v) in out.iter_mut().zip(lookup(&b[2..18], &IQ4)) {
            *o = d * v;
        }
    }
    fn dot(b: &[u8], x: &[f32]) -> f32 {
        f16_at(b, 0) * dot_lanes(&lookup(&b[2..18], &IQ4), x)
    }
}

/// `d(f16) scales_h(u16) scales_l[4] qs[128]`: 8 sub-blocks of 32, each
/// with a 6-bit scale minus 32 (low nibble `i % 2` of `scales_l[i / 2]`,
/// high bits `2i..2i+2` of `scales_h`), codes as IQ4_NL's.
pub struct Iq4Xs;
impl Iq4Xs {
    fn scales(b: &[u8]) -> [f32; 8] {
        let d = f16_at(b, 0);
        let sh = u16::from_le_bytes([b[2], b[3]]);
        let mut dl = [0.0f32; 8];
        for (i, o) in dl.iter_mut().enumerate() {
            let low = (b[4 + i / 2] >> (4 * (i % 2))) & 0xF;
            let high = ((sh >> (2 * i)) & 3) as u8;
            *o = d * (((low | (high << 4)) as i32) - 32) as f32;
        }
        dl
    }
}
impl Block for Iq4Xs {
    const ELEMS: usize = 256;
    const BYTES: usize = 136;
    fn dequant(b: &[u8], out: &mut [f32]) {
        let dl = Self::scales(b);
        for (i, (qs, os)) in b[8..136].chunks_exact(16).zip(out.chunks_exact_mut(32)).enumerate() {
            for (o, v) in os.iter_mut().zip(lookup(qs, &IQ4)) {
                *o = dl[i] * v;
            }
        }
    }
    fn dot(b: &[u8], x: &[f32]) -> f32 {
        let dl = Self::scales(b);
        let mut s = 0.0f32;
        for (i, (qs, xs)) in b[8..136].chunks_exact(16).zip(x.chunks_exact(32)).enumerate() {
            s += dl[i] * dot_lanes(&lookup(qs, &IQ4), xs);
        }
        s
    }
}

/// Half of the e8m0 scale `2^(e − 127)`, as ggml's
/// `ggml_e8m0_to_fp32_half` (subnormal for `e < 2`).
#[inline(always)]
fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        ((e as u32) - 1) << 23
    };
    f32::from_bits(bits)
}

/// `e(e8m0) qs[16]`: `w = e8m0_half(e)·FP4[code]`.
pub struct Mxfp4;
impl Block for Mxfp4 {
    const ELEMS: usize = 32;
    const BYTES: usize = 17;
    fn dequant(b: &[u8], out: &mut [f32]) {
        let d = e8m0_half(b[0]);
        for (o, v) in out.iter_mut().zip(lookup(&b[1..17], &FP4)) {
            *o = d * v;
        }
    }
    fn dot(b: &[u8], x: &[f32]) -> f32 {
        e8m0_half(b[0]) * dot_lanes(&lookup(&b[1..17], &FP4), x)
    }
}
