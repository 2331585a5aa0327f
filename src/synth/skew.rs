//! Skewed routing (`--routing skewed`): weights under which a few experts
//! of each layer are chosen far more often than the others, as in trained
//! models.
//!
//! Qwen models (softmax routing): the last [`BLOCK`] dimensions of the
//! hidden state are a block that only the token embedding writes — every
//! matrix that adds to the residual stream (`o_proj`, `out_proj`, every
//! `down_proj`, routed experts included) has zero rows there — so at every
//! layer that block holds exactly the current token's embedding. Its first
//! half is the same for every token (`c_j = ±1`), its second half random
//! per token. Routers read that block only: row `e` is `b_e·c/HALF` on the
//! first half (logit `+b_e` for every token: the expert's preference) and
//! random on the second (a token-dependent logit of standard deviation 2,
//! as the uniform routers have). RMS normalization scales the whole logit
//! vector of a token, which leaves its top-k unchanged, so the routing
//! statistics are the same at every depth. `b_e = P·(−ln u_e)` with `u_e`
//! uniform, per expert and layer: exponentially distributed preferences
//! make a heavy-tailed (Zipf-like) popularity.
//!
//! DeepSeek models (sigmoid scores, selection on score + bias): the
//! routers are those of uniform routing, and the selection bias
//! `e_score_correction_bias` holds the preferences, `P·(−ln u_e)`.
//!
//! The embeddings and Qwen routers are generated as float rows and
//! quantized as MLX does ([`crate::format::quant::quantize_row`]), each
//! chunk of each part (words, scales, biases) from the rows it covers.

use super::random::{group_scale, jitter, mix, SplitMix64};
use crate::format::quant::quantize_row;
use half::bf16;

/// Width of the block of hidden dimensions that Qwen routers read.
pub const BLOCK: usize = 64;
/// The block's halves: shared by all tokens, then per token.
const HALF: usize = BLOCK / 2;
/// Mean of DeepSeek's selection bias (the sigmoid scores lie in (0, 1)):
/// with DeepSeek-V3's 256 experts, 8 per token from 4 of 8 groups, an LRU
/// cache of 12.5% of a layer's experts hits about 60% (measured by
/// `tests/synth/routing.rs`).
pub const DEEPSEEK_PREFERENCE: f32 = 0.09;

/// Mean preference `P` of a Qwen router row, in logit units (the
/// token-dependent part has standard deviation 2), for `k` of `n` experts
/// per token: chosen so that an LRU cache of 12.5% of a layer's experts
/// hits about 65% (measured by `tests/synth/routing.rs`: `P` = 1.0 for
/// 10 of 512, 1.2 for 8 of 256, 1.75 for 8 of 128).
pub fn qwen_preference(k: usize, n: usize) -> f32 {
    (0.66 + 17.5 * k as f32 / n.max(1) as f32).clamp(0.5, 2.5)
}

/// Expert routing of a synthetic model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Routing {
    /// Random routers: every expert about equally likely.
    #[default]
    Uniform,
    /// A few experts take most tokens, different ones in each layer.
    Skewed,
}

impl Routing {
    pub fn name(self) -> &'static str {
        match self {
            Routing::Uniform => "uniform",
            Routing::Skewed => "skewed",
        }
    }
}

impl std::str::FromStr for Routing {
    type Err = String;
    fn from_str(s: &str) -> Result<Routing, String> {
        match s {
            "uniform" => Ok(Routing::Uniform),
            "skewed" => Ok(Routing::Skewed),
            other => Err(format!("unknown routing `{other}`: give uniform or skewed")),
        }
    }
}

/// Rows `[first, first + BLOCK)` (the block) of a matrix whose rows are
/// hidden dimensions: zeroed in a writer's scales and biases (or weights
/// where unquantized), `per_row` elements per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowMask {
    pub per_row: usize,
    pub first: usize,
}

impl RowMask {
    /// Zero the masked rows among elements `[start, start + n)` of `size` bytes.
    pub fn apply(&self, start: usize, size: usize, bytes: &mut [u8]) {
        let (lo, hi) = (self.first * self.per_row, (self.first + BLOCK) * self.per_row);
        let n = bytes.len() / size;
        let (a, b) = (lo.max(start), hi.min(start + n));
        if a < b {
            bytes[(a - start) * size..(b - start) * size].fill(0);
        }
    }
}

/// What the float rows of a matrix hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shared {
    /// An embedding: values of standard deviation 1 (as uniform routing's
    /// embeddings), but `c` on the first half of the block (`block` is its
    /// first dimension).
    Embedding { block: usize },
    /// A Qwen router of `experts` rows: zero outside the block; `b_r·c/HALF`
    /// on its first half, `b_r` the preference of expert `r` ([`preferences`]
    /// of mean `pop`, key `pref`); uniform noise of standard deviation
    /// `noise` on the second.
    Router {
        block: usize,
        pop: f32,
        pref: u64,
        noise: f32,
        experts: usize,
    },
}

/// A quantized matrix given by float rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rows {
    pub cols: usize,
    pub bits: u32,
    pub group_size: usize,
    pub shared: Shared,
    /// Key of the noise, and of the direction `c`.
    pub key: u64,
    pub dir: u64,
}

/// Which part of the quantized matrix a tensor holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Words,
    Scales,
    Biases,
}

/// `c_j = ±1`.
#[inline]
fn direction(dir: u64, j: usize) -> f32 {
    if mix(dir, j as u64) & 1 == 0 {
        1.0
    } else {
        -1.0
    }
}

/// The preferences of `n` experts (the vector keyed `key`): the expert of
/// rank `i` (a random order) gets `pop·(−ln((i + ½)/n))`, the quantiles of
/// an exponential distribution of mean `pop`, so that every layer has the
/// same profile of popularity, on different experts.
pub fn preferences(pop: f32, key: u64, n: usize) -> Vec<f32> {
    let mut order: Vec<(u64, usize)> = (0..n).map(|e| (mix(key, e as u64), e)).collect();
    order.sort_unstable();
    let mut out = vec![0.0; n];
    for (rank, (_, e)) in order.into_iter().enumerate() {
        out[e] = -pop * ((rank as f32 + 0.5) / n as f32).ln();
    }
    out
}

impl Rows {
    /// Elements of one row of `part`.
    fn per_row(&self, part: Part) -> usize {
        match part {
            Part::Words => self.cols * self.bits as usize / 32,
            Part::Scales | Part::Biases => self.cols / self.group_size,
        }
    }

    /// The preferences of a router's rows (empty for an embedding).
    fn preferences(&self) -> Vec<f32> {
        match self.shared {
            Shared::Router { pop, pref, experts, .. } => preferences(pop, pref, experts),
            Shared::Embedding { .. } => Vec::new(),
        }
    }

    /// Router row `r` as floats; `prefs` from [`Rows::preferences`].
    fn router_row(&self, block: usize, noise: f32, r: usize, prefs: &[f32], out: &mut Vec<f32>) {
        out.clear();
        let mut rng = SplitMix64::new(mix(self.key, r as u64));
        let b = prefs.get(r).copied().unwrap_or_default() / HALF as f32;
        for j in 0..self.cols {
            out.push(match j.checked_sub(block) {
                Some(i) if i < HALF => b * direction(self.dir, j),
                Some(i) if i < BLOCK => uniform(&mut rng, noise),
                _ => 0.0,
            });
        }
    }

    /// Embedding row `r`, quantized: the groups that meet the block from
    /// floats (uniform noise of standard deviation 1, `c` on the block's
    /// first half), the others straight as random levels with jittered
    /// scales (as uniform routing's embeddings, which is much faster). Only
    /// `part` is complete in the output.
    fn embedding_row(&self, block: usize, r: usize, part: Part, q: &mut Quantized) {
        let gs = self.group_size;
        let (base, levels) = group_scale(1.0, self.bits);
        let words_per_group = gs * self.bits as usize / 32;
        let mut words = SplitMix64::new(mix(self.key, 2 * r as u64));
        let mut jitters = SplitMix64::new(mix(self.key, 2 * r as u64 + 1));
        for g in 0..self.cols / gs {
            let dims = g * gs..(g + 1) * gs;
            if dims.start < block + BLOCK && dims.end > block {
                let mut rng = SplitMix64::new(mix(mix(self.key, r as u64), g as u64));
                q.floats.clear();
                for j in dims {
                    let c = (block..block + HALF).contains(&j);
                    let noise = uniform(&mut rng, 1.0);
                    q.floats.push(if c { direction(self.dir, j) } else { noise });
                }
                quantize_row(&q.floats, self.bits, gs, &mut q.words, &mut q.scales, &mut q.biases);
            } else if part == Part::Words {
                q.words.extend((0..words_per_group).map(|_| words.next_u64() as u32));
            } else {
                let s = base * jitter(&mut jitters);
                q.scales.push(bf16::from_f32(s));
                q.biases
                    .push(bf16::from_f32(-bf16::from_f32(s).to_f32() * levels / 2.0));
            }
        }
    }

    /// Row `r` quantized into `q` (only `part` complete for an embedding).
    fn quantized_row(&self, r: usize, part: Part, prefs: &[f32], q: &mut Quantized) {
        q.words.clear();
        q.scales.clear();
        q.biases.clear();
        match self.shared {
            Shared::Embedding { block } => self.embedding_row(block, r, part, q),
            Shared::Router { block, noise, .. } => {
                let mut floats = std::mem::take(&mut q.floats);
                self.router_row(block, noise, r, prefs, &mut floats);
                quantize_row(
                    &floats,
                    self.bits,
                    self.group_size,
                    &mut q.words,
                    &mut q.scales,
                    &mut q.biases,
                );
                q.floats = floats;
            }
        }
    }

    /// The bytes of elements `[start, start + dst.len()/size)` of `part`.
    pub fn generate(&self, part: Part, start: usize, dst: &mut [u8]) {
        let per = self.per_row(part);
        let size = if part == Part::Words { 4 } else { 2 };
        let n = dst.len() / size;
        let mut q = Quantized::default();
        let mut bytes = Vec::with_capacity(per * size);
        let prefs = self.preferences();
        let (mut at, mut done) = (start, 0);
        while at < start + n {
            let (r, from) = (at / per, at % per);
            let take = (per - from).min(start + n - at);
            self.quantized_row(r, part, &prefs, &mut q);
            bytes.clear();
            match part {
                Part::Words => q.words[from..from + take]
                    .iter()
                    .for_each(|w| bytes.extend_from_slice(&w.to_le_bytes())),
                Part::Scales => put(&q.scales[from..from + take], &mut bytes),
                Part::Biases => put(&q.biases[from..from + take], &mut bytes),
            }
            dst[done..done + bytes.len()].copy_from_slice(&bytes);
            done += bytes.len();
            at += take;
        }
    }
}

/// One quantized row, and the floats it was made from.
#[derive(Default)]
struct Quantized {
    floats: Vec<f32>,
    words: Vec<u32>,
    scales: Vec<bf16>,
    biases: Vec<bf16>,
}

/// Uniform in `±std·√3` (standard deviation `std`).
fn uniform(rng: &mut SplitMix64, std: f32) -> f32 {
    (2.0 * rng.unit() - 1.0) * std * 3f32.sqrt()
}

fn put(v: &[bf16], out: &mut Vec<u8>) {
    v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preferences_have_the_same_profile_on_different_experts() {
        let (a, b) = (preferences(1.0, 1, 256), preferences(1.0, 2, 256));
        let sorted = |v: &[f32]| {
            let mut v = v.to_vec();
            v.sort_by(f32::total_cmp);
            v
        };
        assert_eq!(sorted(&a), sorted(&b));
        assert_ne!(a, b);
        let mean = a.iter().sum::<f32>() / 256.0;
        assert!((mean - 1.0).abs() < 0.01, "{mean}");
    }

    #[test]
    fn masks_zero_exactly_the_block_rows() {
        let m = RowMask { per_row: 2, first: 128 };
        // Elements 250..270 of 2 bytes: rows 125..135, of which 128..135 are masked.
        let mut bytes = vec![1u8; 40];
        m.apply(250, 2, &mut bytes);
        assert!(bytes[..12].iter().all(|&b| b == 1));
        assert!(bytes[12..].iter().all(|&b| b == 0));
    }

    #[test]
    fn router_rows_read_the_block_only() {
        let rows = Rows {
            cols: 256,
            bits: 8,
            group_size: 64,
            shared: Shared::Router {
                block: 192,
                pop: 2.0,
                pref: 5,
                noise: 0.3,
                experts: 16,
            },
            key: 1,
            dir: 2,
        };
        let mut r = vec![];
        rows.router_row(192, 0.3, 3, &rows.preferences(), &mut r);
        assert!(r[..192].iter().all(|&x| x == 0.0));
        let b = preferences(2.0, 5, 16)[3] / HALF as f32;
        assert!(r[192..224].iter().all(|x| (x.abs() - b).abs() < 1e-6));
        assert!(r[224..].iter().all(|x| x.abs() < 0.3 * 3f32.sqrt()));
    }
}
