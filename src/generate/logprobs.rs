//! Log-probabilities of the generated tokens (OpenAI's `logprobs`): from
//! the model's logits as they come out of the model, before the grammar
//! mask, bias, penalties and temperature (as vLLM reports them).

use serde::Serialize;

/// One generated token, how likely the model found it, and the most
/// likely tokens at its place.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenLogprob {
    pub token: u32,
    /// Natural log of its probability.
    pub logprob: f32,
    /// The `top` most likely (token, logprob), most likely first.
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprob {
    /// `token`'s entry from the raw `logits` `[vocab]`, with `top` alternatives.
    pub fn of(logits: &[f32], token: u32, top: usize) -> TokenLogprob {
        let max = logits
            .iter()
            .copied()
            .filter(|l| !l.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits
            .iter()
            .filter(|l| !l.is_nan())
            .map(|&l| f64::from(l - max).exp())
            .sum();
        let lse = f64::from(max) + sum.ln();
        let lp = |l: f32| {
            if l.is_nan() {
                f32::NEG_INFINITY
            } else {
                (f64::from(l) - lse) as f32
            }
        };
        let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
        if top > 0 {
            for (id, &l) in logits.iter().enumerate() {
                if l.is_nan() || (best.len() == top && l <= best[top - 1].1) {
                    continue;
                }
                let at = best.partition_point(|&(_, b)| b >= l);
                best.insert(at, (id as u32, l));
                best.truncate(top);
            }
        }
        TokenLogprob {
            token,
            logprob: logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| lp(l)),
            top: best.into_iter().map(|(id, l)| (id, lp(l))).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_log_softmax_and_top_is_sorted() {
        let logits = [0.0f32, (2.0f32).ln(), f32::NAN, (5.0f32).ln()];
        let t = TokenLogprob::of(&logits, 1, 2);
        assert!((t.logprob - (2.0f32 / 8.0).ln()).abs() < 1e-6, "{t:?}");
        assert_eq!(t.top.iter().map(|x| x.0).collect::<Vec<_>>(), vec![3, 1]);
        assert!((t.top[0].1 - (5.0f32 / 8.0).ln()).abs() < 1e-6);
        assert!(TokenLogprob::of(&logits, 1, 0).top.is_empty());
    }
}
