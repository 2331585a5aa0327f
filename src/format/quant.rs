//! MLX affine quantization (SPEC.md §2): per group of `group_size`
//! consecutive inputs of one row, `w = q·scale + bias`, `q ∈ [0, 2^bits)`,
//! packed into little-endian u32 words lowest bits first.

use half::bf16;

/// Bits accepted for packed weights.
pub fn check_bits(bits: u32) -> bool {
    matches!(bits, 2 | 4 | 8)
}

/// Quantize one row (`row.len()` a multiple of `group_size`) exactly as
/// MLX does. Appends packed words to `words`, and one scale and bias per
/// group (rounded to bf16 at the end) to `scales` / `biases`.
pub fn quantize_row(
    row: &[f32],
    bits: u32,
    group_size: usize,
    words: &mut Vec<u32>,
    scales: &mut Vec<bf16>,
    biases: &mut Vec<bf16>,
) {
    debug_assert!(row.len().is_multiple_of(group_size) && check_bits(bits));
    let n_levels = ((1u32 << bits) - 1) as f32;
    let per_word = 32 / bits as usize;
    let mut q_row: Vec<u32> = Vec::with_capacity(row.len());
    for g in row.chunks_exact(group_size) {
        let (mut mn, mut mx) = (f32::INFINITY, f32::NEG_INFINITY);
        for &w in g {
            mn = mn.min(w);
            mx = mx.max(w);
        }
        let mut s = ((mx - mn) / n_levels).max(1e-7);
        let edge = if mn.abs() > mx.abs() {
            mn
        } else {
            s = -s;
            mx
        };
        let q0 = (edge / s).round_ties_even();
        let b = if q0 != 0.0 {
            s = edge / q0;
            edge
        } else {
            0.0
        };
        for &w in g {
            let q = ((w - b) / s).round_ties_even().clamp(0.0, n_levels);
            q_row.push(q as u32);
        }
        scales.push(bf16::from_f32(s));
        biases.push(bf16::from_f32(b));
    }
    for chunk in q_row.chunks_exact(per_word) {
        let mut word = 0u32;
        for (n, &q) in chunk.iter().enumerate() {
            word |= q << (bits as usize * n);
        }
        words.push(word);
    }
}

/// Unpack quantized value `col` of a packed row.
#[inline]
pub fn unpack(words: &[u32], bits: u32, col: usize) -> u32 {
    let per_word = 32 / bits as usize;
    let mask = (1u32 << bits) - 1;
    (words[col / per_word] >> (bits as usize * (col % per_word))) & mask
}

/// Dequantize one packed row into `out` (`out.len()` = logical columns).
pub fn dequantize_row(words: &[u32], scales: &[f32], biases: &[f32], bits: u32, group_size: usize, out: &mut [f32]) {
    for (c, o) in out.iter_mut().enumerate() {
        let g = c / group_size;
        *o = unpack(words, bits, c) as f32 * scales[g] + biases[g];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_error_is_within_half_a_step() {
        let row: Vec<f32> = (0..128).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect();
        for bits in [2u32, 4, 8] {
            let (mut w, mut s, mut b) = (vec![], vec![], vec![]);
            quantize_row(&row, bits, 64, &mut w, &mut s, &mut b);
            assert_eq!(w.len(), 128 * bits as usize / 32);
            let sf: Vec<f32> = s.iter().map(|x| x.to_f32()).collect();
            let bf: Vec<f32> = b.iter().map(|x| x.to_f32()).collect();
            let mut out = vec![0.0; 128];
            dequantize_row(&w, &sf, &bf, bits, 64, &mut out);
            let step = 101.0 * 0.013 / ((1 << bits) - 1) as f32;
            for (a, o) in row.iter().zip(&out) {
                // MLX snaps the grid to the edge of larger magnitude, so the far
                // edge can be clamped by up to a step; bf16 rounding of scale
                // and bias adds a little more.
                assert!((a - o).abs() <= 1.05 * step + 0.01 * a.abs(), "{bits}: {a} vs {o}");
            }
        }
    }

    #[test]
    fn packing_is_lowest_bits_first() {
        let mut row = vec![0.0f32; 64];
        row[0] = 1.0;
        row[1] = -1.0;
        let (mut w, mut s, mut b) = (vec![], vec![], vec![]);
        quantize_row(&row, 4, 64, &mut w, &mut s, &mut b);
        let sf = [s[0].to_f32()];
        let bf = [b[0].to_f32()];
        let mut out = vec![9.0; 64];
        dequantize_row(&w, &sf, &bf, 4, 64, &mut out);
        assert!(out[5].abs() < 4e-3, "{}", out[5]);
        assert!((out[0] - 1.0).abs() < 1e-2 && (out[1] + 1.0).abs() < 1e-2);
        assert_eq!(unpack(&w, 4, 0), w[0] & 0xF);
        assert_eq!(unpack(&w, 4, 1), (w[0] >> 4) & 0xF);
    }
}
