//! Random tensor contents, generated straight into their on-disk bytes.
//! Deterministic: the bytes of a segment depend only on its key and chunk
//! number, so chunks can be generated in any order, in parallel.

use super::random::{group_scale, jitter, mix, SplitMix64};
use super::skew::{preferences, Part, Rows};
use half::bf16;

/// Elements per generated chunk of a large tensor (8 MiB of packed words).
pub const CHUNK_ELEMS: usize = 1 << 21;

/// What a tensor holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fill {
    /// Uniformly random packed quantized words (U32).
    Words,
    /// Group scales (BF16): `base·j` with a random jitter `j` per group.
    Scales { base: f32 },
    /// Group biases (BF16) that centre the groups of `Scales { base }` on
    /// zero: `−s·levels/2`, where `levels = 2^bits − 1`. Generated from the
    /// same key as the scales, so the jitter matches.
    Biases { base: f32, levels: f32 },
    /// BF16 values uniform in `[−bound, bound)`.
    Bf16 { bound: f32 },
    /// F32 values uniform in `[lo, hi)`.
    F32 { lo: f32, hi: f32 },
    /// F32 values `ln(u)`, `u` uniform in `[lo, hi)` (`A_log`).
    LnF32 { lo: f32, hi: f32 },
    /// One part of a quantized matrix given by float rows (skewed routing).
    Rows { part: Part, rows: Rows },
    /// F32 preferences of mean `pop` (skewed routing; the whole vector in
    /// one chunk).
    Preference { pop: f32 },
}

impl Fill {
    /// Bytes per element.
    pub fn elem_size(self) -> usize {
        match self {
            Fill::Words | Fill::F32 { .. } | Fill::LnF32 { .. } | Fill::Preference { .. } => 4,
            Fill::Rows { part: Part::Words, .. } => 4,
            Fill::Scales { .. } | Fill::Biases { .. } | Fill::Bf16 { .. } | Fill::Rows { .. } => 2,
        }
    }

    /// Append the bytes of `n` elements, chunk `chunk` of the tensor keyed `key`.
    pub fn generate(self, key: u64, chunk: u64, n: usize, out: &mut Vec<u8>) {
        let mut rng = SplitMix64::new(mix(key, chunk));
        let first = chunk as usize * CHUNK_ELEMS;
        let start = out.len();
        out.resize(start + n * self.elem_size(), 0);
        let dst = &mut out[start..];
        match self {
            Fill::Words => {
                let mut words = dst.chunks_exact_mut(8);
                for w in &mut words {
                    w.copy_from_slice(&rng.next_u64().to_le_bytes());
                }
                let rest = words.into_remainder();
                let last = rng.next_u64().to_le_bytes();
                rest.copy_from_slice(&last[..rest.len()]);
            }
            Fill::Scales { base } => put_bf16(dst, || base * jitter(&mut rng)),
            Fill::Biases { base, levels } => put_bf16(dst, || -bf16_round(base * jitter(&mut rng)) * levels / 2.0),
            Fill::Bf16 { bound } => put_bf16(dst, || (2.0 * rng.unit() - 1.0) * bound),
            Fill::F32 { lo, hi } => put_f32(dst, || lo + (hi - lo) * rng.unit()),
            Fill::LnF32 { lo, hi } => put_f32(dst, || (lo + (hi - lo) * rng.unit()).ln()),
            Fill::Rows { part, rows } => rows.generate(part, first, dst),
            Fill::Preference { pop } => {
                let mut p = preferences(pop, key, n).into_iter();
                put_f32(dst, || p.next().unwrap_or_default())
            }
        }
    }
}

/// The value a scale has once stored, so that the bias centres the group
/// around the scale actually used.
#[inline]
fn bf16_round(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

fn put_bf16(dst: &mut [u8], mut f: impl FnMut() -> f32) {
    for c in dst.chunks_exact_mut(2) {
        c.copy_from_slice(&bf16::from_f32(f()).to_le_bytes());
    }
}

fn put_f32(dst: &mut [u8], mut f: impl FnMut() -> f32) {
    for c in dst.chunks_exact_mut(4) {
        c.copy_from_slice(&f().to_le_bytes());
    }
}

/// The fills of a matrix `[rows, cols]` quantized at `bits` whose
/// dequantized values are uniform, centred on zero, with standard
/// deviation `std`: weights, scales, biases.
pub fn quantized_fills(std: f32, bits: u32) -> [Fill; 3] {
    let (base, levels) = group_scale(std, bits);
    [Fill::Words, Fill::Scales { base }, Fill::Biases { base, levels }]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_deterministic_and_distinct() {
        let (mut a, mut b, mut c) = (vec![], vec![], vec![]);
        Fill::Words.generate(7, 0, 1001, &mut a);
        Fill::Words.generate(7, 0, 1001, &mut b);
        Fill::Words.generate(7, 1, 1001, &mut c);
        assert_eq!(a.len(), 4004);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn biases_centre_the_groups_of_their_scales() {
        let [_, s, b] = quantized_fills(0.05, 4);
        let (mut sb, mut bb) = (vec![], vec![]);
        s.generate(3, 2, 500, &mut sb);
        b.generate(3, 2, 500, &mut bb);
        let sv = crate::format::Dtype::Bf16.to_f32(&sb);
        let bv = crate::format::Dtype::Bf16.to_f32(&bb);
        for (s, b) in sv.iter().zip(&bv) {
            // Dequantized q ∈ {0..15}: q=0 and q=15 land symmetric about 0.
            let (lo, hi) = (*b, b + 15.0 * s);
            // Off by at most twice the bf16 rounding of the bias (2^-8 relative).
            assert!((lo + hi).abs() <= 0.06 * s.abs(), "{lo} {hi}");
        }
    }
}
