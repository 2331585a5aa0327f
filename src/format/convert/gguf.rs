//! GGUF block formats that the packed affine format holds exactly. A
//! block of 32 values `w = d·q` (Q8_0, q signed), `w = d·(q − 8)` (Q4_0)
//! or `w = d·q + m` (Q4_1) is an affine group of 32 with an f16 scale and
//! an f16 bias: Q8_0 as 8 bits, `q + 128` with bias `−128·d`; Q4_0 as 4
//! bits with bias `−8·d`; Q4_1 as 4 bits with bias `m`. The products by
//! powers of two are exact, so every value dequantizes to the same f32 as
//! ggml computes it (`verify` checks each row), but for the sign of a
//! zero: ggml's `d·0` is −0 where `d < 0`, the affine `8·d − 8·d` is +0.

use crate::format::gguf::GgmlType;
use half::f16;

/// Values of one block.
const BLOCK: usize = 32;

/// `(bits, group_size)` of the affine form that holds `ty` exactly.
pub fn affine(ty: GgmlType) -> Option<(u32, usize)> {
    match ty {
        GgmlType::Q8_0 => Some((8, BLOCK)),
        GgmlType::Q4_0 | GgmlType::Q4_1 => Some((4, BLOCK)),
        _ => None,
    }
}

fn f16_at(b: &[u8], at: usize) -> f16 {
    f16::from_le_bytes([b[at], b[at + 1]])
}

/// One row of `ty` blocks → affine weight bytes (`cols·bits/8`), f16
/// scales and biases (one of each per block). `ty` must be one
/// [`affine`] accepts.
pub fn row_to_affine(ty: GgmlType, row: &[u8], w: &mut [u8], s: &mut [u8], b: &mut [u8]) {
    let Some((_, bb)) = ty.block() else { return };
    for (i, blk) in row.chunks_exact(bb).enumerate() {
        let d = f16_at(blk, 0);
        let (scale, bias) = match ty {
            GgmlType::Q8_0 => (d, f16::from_f32(-128.0 * d.to_f32())),
            GgmlType::Q4_0 => (d, f16::from_f32(-8.0 * d.to_f32())),
            _ => (d, f16_at(blk, 2)),
        };
        s[2 * i..2 * i + 2].copy_from_slice(&scale.to_le_bytes());
        b[2 * i..2 * i + 2].copy_from_slice(&bias.to_le_bytes());
        match ty {
            GgmlType::Q8_0 => {
                // Unsigned levels, one byte each, in column order.
                let out = &mut w[i * BLOCK..(i + 1) * BLOCK];
                for (o, q) in out.iter_mut().zip(&blk[2..2 + BLOCK]) {
                    *o = q ^ 0x80;
                }
            }
            _ => {
                // ggml: byte j holds value j (low nibble) and j + 16 (high);
                // affine: byte k holds columns 2k (low) and 2k + 1 (high).
                let qs = &blk[bb - BLOCK / 2..];
                let level = |c: usize| if c < 16 { qs[c] & 0xF } else { qs[c - 16] >> 4 };
                let out = &mut w[i * BLOCK / 2..(i + 1) * BLOCK / 2];
                for (k, o) in out.iter_mut().enumerate() {
                    *o = level(2 * k) | (level(2 * k + 1) << 4);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::gguf::BlockFormat;
    use crate::format::quant::dequantize_row;

    /// Random valid blocks of each type, converted, give ggml's values
    /// through the affine dequantization (bit for bit but a zero's sign).
    #[test]
    fn affine_rows_dequantize_to_ggmls_values() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1] {
            let (bits, gs) = affine(ty).unwrap();
            let cols = 256;
            let (_, bb) = ty.block().unwrap();
            let mut row: Vec<u8> = (0..cols / BLOCK * bb).map(|_| next() as u8).collect();
            for blk in row.chunks_exact_mut(bb) {
                // Finite scales and minimums of typical size.
                let d = f16::from_f32((next() % 1000) as f32 * 1e-5 - 5e-3);
                blk[..2].copy_from_slice(&d.to_le_bytes());
                if ty == GgmlType::Q4_1 {
                    let m = f16::from_f32((next() % 1000) as f32 * 1e-4 - 5e-2);
                    blk[2..4].copy_from_slice(&m.to_le_bytes());
                }
            }
            let mut want = vec![0f32; cols];
            BlockFormat::new(ty).unwrap().dequantize_row(&row, &mut want);
            let (mut w, mut sc, mut bi) = (
                vec![0u8; cols * bits as usize / 8],
                vec![0u8; cols / 16],
                vec![0u8; cols / 16],
            );
            row_to_affine(ty, &row, &mut w, &mut sc, &mut bi);
            let words: Vec<u32> = w
                .chunks_exact(4)
                .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                .collect();
            let f = |v: &[u8]| -> Vec<f32> {
                v.chunks_exact(2)
                    .map(|x| f16::from_le_bytes([x[0], x[1]]).to_f32())
                    .collect()
            };
            let mut got = vec![0f32; cols];
            dequantize_row(&words, &f(&sc), &f(&bi), bits, gs, &mut got);
            for (c, (g, x)) in got.iter().zip(&want).enumerate() {
                let same = g.to_bits() == x.to_bits() || (*g == 0.0 && *x == 0.0);
                assert!(same, "{ty} column {c}: {g} vs {x}");
            }
        }
    }
}
