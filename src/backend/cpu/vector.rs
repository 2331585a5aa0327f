//! Small vector helpers the CPU kernels share.

/// `Σ a[i]·b[i]`.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators: vectorizes and keeps the sum accurate.
    let mut acc = [0.0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `e^x` within 2 ulp for x in [−87, 88] (clamped there: below, e^−87
/// instead of a denormal or 0; above, e^88 instead of overflow). Plain
/// arithmetic the compiler vectorizes, unlike `f32::exp` (a call per
/// element): x = n·ln 2 + r, |r| ≤ ln 2 / 2, e^r by a degree-6 polynomial
/// (the Cephes `expf` coefficients), 2^n put in the exponent bits.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 as a short high part (exact in n·LN2_HI) and the rest.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5·2^23: adding and subtracting it rounds to an integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp_of_std() {
        let mut worst = 0.0f64;
        for i in 0..=1_750_000 {
            let x = -87.0 + i as f32 * 1e-4;
            let (got, want) = (exp(x) as f64, (x as f64).exp());
            worst = worst.max((got - want).abs() / want);
        }
        // 2 ulp of f32 is 2.4e-7 relative.
        assert!(worst < 2.4e-7, "worst relative error {worst:e}");
        assert_eq!(exp(-1000.0), exp(-87.0));
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
    }
}
