//! DeepSeek-V3 fp8 weights: `float8_e4m3fn` values and a `weight_scale_inv`
//! **multiplier** per `[B0, B1]` block (SPEC.md §1); edge blocks are
//! partial. Dequantized values are rounded to bf16, as `mlx_lm.convert`
//! and transformers' dequantizing loader do, before anything else happens
//! to them.

use half::bf16;

/// The value of one `float8_e4m3fn` byte: 1 sign, 4 exponent (bias 7) and 3
/// mantissa bits; no infinities, `S.1111.111` is NaN.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((b >> 3) & 0x0F) as i32;
    let man = (b & 0x07) as f32;
    if exp == 0x0F && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    }
}

/// Dequantize row `r` of an fp8 matrix `[rows, cols]` whose block
/// multipliers are `scale_inv` `[ceil(rows/B0), ceil(cols/B1)]`.
pub fn dequantize_row(data: &[u8], scale_inv: &[f32], block: [usize; 2], cols: usize, r: usize, out: &mut [f32]) {
    let scale_cols = cols.div_ceil(block[1]);
    let srow = &scale_inv[(r / block[0]) * scale_cols..(r / block[0] + 1) * scale_cols];
    for (c, (o, &q)) in out.iter_mut().zip(&data[r * cols..(r + 1) * cols]).enumerate() {
        *o = bf16::from_f32(e4m3_to_f32(q) * srow[c / block[1]]).to_f32();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_values() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0); // exp 7, man 0
        assert_eq!(e4m3_to_f32(0xB8), -1.0);
        assert_eq!(e4m3_to_f32(0x7E), 448.0); // largest finite
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9)); // smallest subnormal
        assert_eq!(e4m3_to_f32(0x3C), 1.5);
        assert!(e4m3_to_f32(0x7F).is_nan());
    }

    #[test]
    fn partial_edge_blocks_use_their_own_scale() {
        // [3, 3] with 2×2 blocks: scale grid [2, 2].
        let data = [0x38u8; 9];
        let scales = [1.0f32, 2.0, 3.0, 4.0];
        let mut out = [0.0f32; 3];
        dequantize_row(&data, &scales, [2, 2], 3, 0, &mut out);
        assert_eq!(out, [1.0, 1.0, 2.0]);
        dequantize_row(&data, &scales, [2, 2], 3, 2, &mut out);
        assert_eq!(out, [3.0, 3.0, 4.0]);
    }
}
