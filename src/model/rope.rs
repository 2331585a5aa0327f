//! RoPE frequencies: plain (`θ^(−2j/d)` over the rotated dims) and YaRN
//! with its two scale corrections (SPEC.md §5, deepseek_v3).

use crate::config::Yarn;

/// `inv_freq[j] = θ^(−2j/dim)` for `j < dim/2`.
pub fn inv_freq(theta: f64, dim: usize) -> Vec<f32> {
    (0..dim / 2)
        .map(|j| (1.0 / theta.powf((2 * j) as f64 / dim as f64)) as f32)
        .collect()
}

/// `m(s, a) = 1 if s ≤ 1 else 0.1·a·ln s + 1`.
pub fn yarn_mscale(scale: f64, a: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * a * scale.ln() + 1.0
    }
}

/// YaRN frequencies for `dim` rotated channels.
pub fn yarn_inv_freq(theta: f64, dim: usize, y: &Yarn) -> Vec<f32> {
    let d = dim as f64;
    let corr_dim =
        |n: f64| d * (y.original_max_position_embeddings / (n * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln());
    let (low, high) = (corr_dim(y.beta_fast), corr_dim(y.beta_slow));
    let (low, high) = match y.truncate {
        true => (low.floor(), high.ceil()),
        false => (low, high),
    };
    let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
    if low == high {
        high += 0.001;
    }
    (0..dim / 2)
        .map(|i| {
            let pf = theta.powf((2 * i) as f64 / d);
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            (ramp / (y.factor * pf) + (1.0 - ramp) / pf) as f32
        })
        .collect()
}

/// The factor applied to cos and sin (`attention_factor`).
pub fn yarn_attention_factor(y: &Yarn) -> f64 {
    if let Some(a) = y.attention_factor {
        return a;
    }
    match (y.mscale, y.mscale_all_dim) {
        // transformers tests truthiness: a zero counts as unset.
        (Some(m), Some(ma)) if m != 0.0 && ma != 0.0 => yarn_mscale(y.factor, m) / yarn_mscale(y.factor, ma),
        _ => yarn_mscale(y.factor, 1.0),
    }
}

/// The factor applied to the softmax scale: `m(f, mscale_all_dim)²`.
pub fn yarn_softmax_factor(y: &Yarn) -> f64 {
    match y.mscale_all_dim {
        Some(ma) if ma != 0.0 => yarn_mscale(y.factor, ma).powi(2),
        _ => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_frequencies() {
        let f = inv_freq(10000.0, 8);
        assert_eq!(f.len(), 4);
        assert_eq!(f[0], 1.0);
        assert!((f[1] as f64 / 10000f64.powf(-0.25) - 1.0).abs() < 1e-7);
    }

    #[test]
    fn yarn_ramps_from_extrapolation_to_interpolation() {
        let y = Yarn {
            factor: 40.0,
            original_max_position_embeddings: 4096.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: Some(1.0),
            mscale_all_dim: Some(1.0),
            attention_factor: None,
            truncate: true,
        };
        let plain = inv_freq(10000.0, 64);
        let yarn = yarn_inv_freq(10000.0, 64, &y);
        // High frequencies are kept, low ones divided by the factor.
        assert!((yarn[0] - plain[0]).abs() < 1e-7);
        assert!((yarn[31] - plain[31] / 40.0).abs() < 1e-9);
        assert_eq!(yarn_attention_factor(&y), 1.0);
        let m = 0.1 * 40f64.ln() + 1.0;
        assert!((yarn_softmax_factor(&y) - m * m).abs() < 1e-12);
        // Without truncation the ramp starts at the fractional dimension
        // (transformers' `truncate: false`, as gpt-oss sets it).
        let exact = yarn_inv_freq(10000.0, 64, &Yarn { truncate: false, ..y });
        assert_eq!((exact[0], exact[31]), (yarn[0], yarn[31]));
        assert!(
            exact.iter().zip(&yarn).any(|(a, b)| a != b),
            "truncate changes the ramp"
        );
    }
}
