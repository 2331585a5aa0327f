//! Choosing the next token from logits: penalties over the history, then
//! greedy or temperature / top-k / top-p / min-p sampling (in transformers'
//! order) with a seeded PRNG.

use super::files::GenerationDefaults;
use super::rng::Rng;
use crate::error::{Error, Result};

/// How to pick tokens and when to stop. `Default` is plain sampling at
/// temperature 1 with every filter and penalty off.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// `0` picks the most likely token (greedy).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; `0` keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose mass is ≥ `top_p`; `1` keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one; `0` keeps all.
    pub min_p: f32,
    /// Transformers' penalty on every token seen in the history: positive
    /// logits divided by it, negative ones multiplied; `1` is off.
    pub repetition_penalty: f32,
    /// OpenAI's: subtracted once from the logit of every token seen.
    pub presence_penalty: f32,
    /// OpenAI's: subtracted per occurrence of a token in the history.
    pub frequency_penalty: f32,
    /// `Some` makes the run reproducible; `None` seeds from entropy.
    pub seed: Option<u64>,
    /// Stop after this many generated tokens.
    pub max_tokens: Option<usize>,
    /// Stop when the text produces one of these (which is not emitted).
    pub stop: Vec<String>,
    /// Added to the logits of these token ids before anything else
    /// (OpenAI's `logit_bias`); ids outside the vocabulary are skipped.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            max_tokens: None,
            stop: Vec::new(),
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// The model authors' defaults from `generation_config.json`: only the
    /// fields it sets change from `Default`. Decoding is greedy (temperature
    /// 0) when it says `do_sample: false`, or sets neither `do_sample` nor
    /// `temperature` (no file at all included), as transformers' `generate`
    /// is (SPEC.md §7).
    pub fn from_defaults(g: &GenerationDefaults) -> SamplingParams {
        let d = SamplingParams::default();
        SamplingParams {
            temperature: match (g.do_sample, g.temperature) {
                (Some(false), _) | (None, None) => 0.0,
                (_, t) => t.unwrap_or(d.temperature),
            },
            top_k: g.top_k.unwrap_or(d.top_k),
            top_p: g.top_p.unwrap_or(d.top_p),
            min_p: g.min_p.unwrap_or(d.min_p),
            repetition_penalty: g.repetition_penalty.unwrap_or(d.repetition_penalty),
            max_tokens: g.max_new_tokens,
            ..d
        }
    }

    /// Refuse values that cannot mean anything (naming the field).
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, want: &str, v: f32| {
            Err(Error::Invalid(format!("sampling `{field}` must be {want}, got {v}")))
        };
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature", "≥ 0", self.temperature);
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", "in (0, 1]", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", "in [0, 1]", self.min_p);
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad("repetition_penalty", "> 0", self.repetition_penalty);
        }
        if !self.presence_penalty.is_finite() {
            return bad("presence_penalty", "finite", self.presence_penalty);
        }
        if !self.frequency_penalty.is_finite() {
            return bad("frequency_penalty", "finite", self.frequency_penalty);
        }
        if let Some(&(_, b)) = self.logit_bias.iter().find(|(_, b)| !b.is_finite()) {
            return bad("logit_bias", "finite", b);
        }
        Ok(())
    }
}

/// Candidates examined before falling back to a full sort for top-p.
const TOP_P_FIRST_PASS: usize = 1024;

/// Picks tokens under one `SamplingParams`, with its own PRNG.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// (token, logit then probability) of the tokens still in the running.
    cand: Vec<(u32, f64)>,
    /// Sorted copy of the history, for counting.
    seen: Vec<u32>,
}

impl Sampler {
    /// `vocab` sizes the scratch buffers (the length of the logits).
    pub fn new(params: SamplingParams, vocab: usize) -> Result<Sampler> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(Rng::entropy_seed);
        Ok(Sampler {
            rng: Rng::new(seed),
            params,
            cand: Vec::with_capacity(vocab),
            seen: Vec::new(),
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The next token after `history`, all of which counts as output:
    /// [`Sampler::sample_after`] with no prompt.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.sample_after(logits, history, 0)
    }

    /// The next token. The penalties are applied to `logits` in place
    /// (SPEC.md §7): the repetition penalty over the whole `history`
    /// (prompt and output, as transformers counts), the presence and
    /// frequency penalties over the output only, `history[prompt_len..]`
    /// (as OpenAI counts). NaN logits never win. Returns 0 when `logits` is
    /// empty.
    pub fn sample_after(&mut self, logits: &mut [f32], history: &[u32], prompt_len: usize) -> u32 {
        for &(id, bias) in &self.params.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        self.apply_penalties(logits, history, prompt_len.min(history.len()));
        let p = &self.params;
        if p.temperature == 0.0 {
            return argmax(logits);
        }
        let inv_t = 1.0 / f64::from(p.temperature);
        self.cand.clear();
        self.cand.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.is_nan() && **l != f32::NEG_INFINITY)
                .map(|(i, &l)| (i as u32, f64::from(l) * inv_t)),
        );
        if self.cand.is_empty() {
            return argmax(logits);
        }
        if p.top_k > 0 && p.top_k < self.cand.len() {
            keep_top_k(&mut self.cand, p.top_k);
        }
        softmax(&mut self.cand);
        if p.top_p < 1.0 {
            keep_top_p(&mut self.cand, f64::from(p.top_p));
        }
        if p.min_p > 0.0 {
            let max = self.cand.iter().map(|c| c.1).fold(0.0, f64::max);
            let floor = f64::from(p.min_p) * max;
            self.cand.retain(|c| c.1 >= floor);
        }
        let total: f64 = self.cand.iter().map(|c| c.1).sum();
        let mut u = self.rng.next_f64() * total;
        for &(id, prob) in &self.cand {
            if u < prob {
                return id;
            }
            u -= prob;
        }
        // Rounding left `u` past the end: the last candidate.
        self.cand.last().map_or(0, |c| c.0)
    }

    fn apply_penalties(&mut self, logits: &mut [f32], history: &[u32], prompt_len: usize) {
        let rep = self.params.repetition_penalty;
        let (presence, frequency) = (self.params.presence_penalty, self.params.frequency_penalty);
        if rep != 1.0 {
            self.count(history, logits.len());
            for run in self.seen.chunk_by(|a, b| a == b) {
                let l = &mut logits[run[0] as usize];
                *l = if *l > 0.0 { *l / rep } else { *l * rep };
            }
        }
        if presence != 0.0 || frequency != 0.0 {
            self.count(&history[prompt_len..], logits.len());
            for run in self.seen.chunk_by(|a, b| a == b) {
                logits[run[0] as usize] -= presence + frequency * run.len() as f32;
            }
        }
    }

    /// `seen` = the ids of `tokens` below `vocab`, sorted.
    fn count(&mut self, tokens: &[u32], vocab: usize) {
        self.seen.clear();
        self.seen.extend(tokens.iter().filter(|&&t| (t as usize) < vocab));
        self.seen.sort_unstable();
    }
}

/// Index of the largest logit (the first on ties, NaN never); 0 if none.
fn argmax(logits: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        let better = match best {
            None => !l.is_nan(),
            Some((_, b)) => l > b,
        };
        if better {
            best = Some((i, l));
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

/// Descending by value, ascending by token on ties (a total order).
fn by_value_desc(a: &(u32, f64), b: &(u32, f64)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Keep every candidate at least as large as the k-th largest (ties at the
/// boundary all kept, as transformers does).
fn keep_top_k(cand: &mut Vec<(u32, f64)>, k: usize) {
    let kth = {
        let (_, kth, _) = cand.select_nth_unstable_by(k - 1, by_value_desc);
        kth.1
    };
    cand.retain(|c| c.1 >= kth);
}

/// Logits → probabilities, in place.
fn softmax(cand: &mut [(u32, f64)]) {
    let max = cand.iter().map(|c| c.1).fold(f64::NEG_INFINITY, f64::max);
    let mut sum = 0.0;
    for c in cand.iter_mut() {
        c.1 = (c.1 - max).exp();
        sum += c.1;
    }
    for c in cand.iter_mut() {
        c.1 /= sum;
    }
}

/// Keep the smallest most-likely prefix whose mass reaches `top_p`; leaves
/// `cand` sorted by descending probability.
fn keep_top_p(cand: &mut Vec<(u32, f64)>, top_p: f64) {
    let prefix_len = |sorted: &[(u32, f64)]| {
        let mut mass = 0.0;
        for (i, c) in sorted.iter().enumerate() {
            mass += c.1;
            if mass >= top_p {
                return Some(i + 1);
            }
        }
        None
    };
    // Most of the mass sits in few tokens: sort only a head of the most
    // likely ones, growing it until it holds the mass.
    let mut head = TOP_P_FIRST_PASS;
    while head < cand.len() {
        cand.select_nth_unstable_by(head - 1, by_value_desc);
        cand[..head].sort_unstable_by(by_value_desc);
        if let Some(n) = prefix_len(&cand[..head]) {
            cand.truncate(n);
            return;
        }
        head *= 4;
    }
    cand.sort_unstable_by(by_value_desc);
    let n = prefix_len(cand).unwrap_or(cand.len());
    cand.truncate(n.max(1));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(params: SamplingParams) -> Sampler {
        Sampler::new(params, 8).unwrap()
    }

    fn draws(params: SamplingParams, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = sampler(params);
        (0..n).map(|_| s.sample(&mut logits.to_vec(), &[])).collect()
    }

    fn log_probs(p: &[f64]) -> Vec<f32> {
        p.iter().map(|x| x.ln() as f32).collect()
    }

    #[test]
    fn greedy_and_top_k_1_pick_the_argmax() {
        let logits = [0.5, 3.0, -1.0, 2.9, f32::NAN];
        let greedy = SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        };
        assert_eq!(draws(greedy, &logits, 5), vec![1; 5]);
        let top1 = SamplingParams {
            top_k: 1,
            seed: Some(3),
            ..SamplingParams::default()
        };
        assert_eq!(draws(top1, &logits, 50), vec![1; 50]);
    }

    #[test]
    fn same_seed_same_sequence() {
        let logits = log_probs(&[0.3, 0.3, 0.2, 0.2]);
        let p = |seed| SamplingParams {
            seed: Some(seed),
            ..SamplingParams::default()
        };
        assert_eq!(draws(p(11), &logits, 200), draws(p(11), &logits, 200));
        assert_ne!(draws(p(11), &logits, 200), draws(p(12), &logits, 200));
    }

    fn distinct(mut v: Vec<u32>) -> Vec<u32> {
        v.sort_unstable();
        v.dedup();
        v
    }

    #[test]
    fn top_p_and_min_p_keep_the_specified_sets() {
        let logits = log_probs(&[0.15, 0.5, 0.05, 0.3]);
        let p = |top_p, min_p| SamplingParams {
            top_p,
            min_p,
            seed: Some(5),
            ..SamplingParams::default()
        };
        // top-p: the smallest most-likely set with mass ≥ p.
        assert_eq!(distinct(draws(p(0.45, 0.0), &logits, 500)), vec![1]);
        assert_eq!(distinct(draws(p(0.75, 0.0), &logits, 2000)), vec![1, 3]);
        assert_eq!(distinct(draws(p(0.9, 0.0), &logits, 2000)), vec![0, 1, 3]);
        assert_eq!(distinct(draws(p(1.0, 0.0), &logits, 4000)), vec![0, 1, 2, 3]);
        // min-p: drop tokens below min_p × the top probability (0.5).
        assert_eq!(distinct(draws(p(1.0, 0.2), &logits, 2000)), vec![0, 1, 3]);
        assert_eq!(distinct(draws(p(1.0, 0.5), &logits, 2000)), vec![1, 3]);
        // top-k 2 then top-p: the two largest.
        let k2 = SamplingParams {
            top_k: 2,
            seed: Some(5),
            ..SamplingParams::default()
        };
        assert_eq!(distinct(draws(k2, &logits, 2000)), vec![1, 3]);
        // Top-p over a large vocabulary (past the partial-sort pass).
        let mut big = vec![-10.0f32; 5000];
        big[4321] = 5.0;
        big[17] = 4.0;
        let p_big = SamplingParams {
            top_p: 0.9,
            seed: Some(1),
            ..SamplingParams::default()
        };
        assert_eq!(distinct(draws(p_big, &big, 500)), vec![17, 4321]);
    }

    #[test]
    fn penalties_change_logits_as_specified() {
        let greedy = |rep, presence, freq| SamplingParams {
            temperature: 0.0,
            repetition_penalty: rep,
            presence_penalty: presence,
            frequency_penalty: freq,
            ..SamplingParams::default()
        };
        let history = [0, 1, 1, 99];
        // Repetition (transformers): positive logits divided, negative multiplied.
        let mut logits = vec![2.0, -1.0, 0.5, 3.0];
        sampler(greedy(2.0, 0.0, 0.0)).sample(&mut logits, &history);
        assert_eq!(logits, [1.0, -2.0, 0.5, 3.0]);
        // Presence once per seen token, frequency per occurrence (OpenAI).
        let mut logits = vec![2.0, -1.0, 0.5, 3.0];
        sampler(greedy(1.0, 0.5, 0.25)).sample(&mut logits, &history);
        assert_eq!(logits, [1.25, -2.0, 0.5, 3.0]);
        // A penalty can change the choice.
        assert_eq!(sampler(greedy(1.0, 0.5, 0.0)).sample(&mut [3.0, 2.9], &[0]), 1);
        assert_eq!(sampler(greedy(1.0, 0.0, 0.0)).sample(&mut [3.0, 2.9], &[0]), 0);
        // A bias comes first: a penalty then sees the biased logit.
        let biased = SamplingParams {
            logit_bias: vec![(2, 1.5), (3, -100.0), (77, 5.0)],
            ..greedy(2.0, 0.0, 0.0)
        };
        let mut logits = vec![2.0, -1.0, 0.5, 3.0];
        assert_eq!(sampler(biased).sample(&mut logits, &[2]), 0);
        assert_eq!(logits, [2.0, -1.0, 1.0, -97.0]);
        // After a prompt of 2 tokens: repetition counts all four, presence
        // and frequency only the output [1, 99].
        let mut logits = vec![2.0, -1.0, 0.5, 3.0];
        sampler(greedy(2.0, 0.5, 0.25)).sample_after(&mut logits, &history, 2);
        assert_eq!(logits, [1.0, -2.75, 0.5, 3.0]);
        let bad = SamplingParams {
            top_p: 0.0,
            ..SamplingParams::default()
        };
        assert!(Sampler::new(bad, 4).unwrap_err().to_string().contains("top_p"));
    }

    /// Pearson's chi-square of observed counts against probabilities.
    fn chi_square(samples: &[u32], probs: &[f64]) -> f64 {
        let n = samples.len() as f64;
        let mut counts = vec![0.0; probs.len()];
        for &s in samples {
            counts[s as usize] += 1.0;
        }
        counts
            .iter()
            .zip(probs)
            .map(|(o, p)| (o - n * p).powi(2) / (n * p))
            .sum()
    }

    #[test]
    fn temperature_sampling_follows_the_softmax() {
        let probs = [0.4, 0.25, 0.15, 0.1, 0.06, 0.04];
        let logits = log_probs(&probs);
        let t1 = SamplingParams {
            seed: Some(1234),
            ..SamplingParams::default()
        };
        let samples = draws(t1, &logits, 60_000);
        // 5 degrees of freedom: 20.5 is the 0.1% tail; the seed is fixed, so
        // this cannot flake, and a wrong distribution is far off.
        assert!(chi_square(&samples, &probs) < 20.5, "{}", chi_square(&samples, &probs));
        assert!(chi_square(&samples, &[1.0 / 6.0; 6]) > 1000.0);
        // Temperature 0.5 samples softmax(logits / 0.5) ∝ p².
        let t05 = SamplingParams {
            temperature: 0.5,
            seed: Some(99),
            ..SamplingParams::default()
        };
        let sq: f64 = probs.iter().map(|p| p * p).sum();
        let sharp: Vec<f64> = probs.iter().map(|p| p * p / sq).collect();
        let samples = draws(t05, &logits, 60_000);
        assert!(chi_square(&samples, &sharp) < 20.5, "{}", chi_square(&samples, &sharp));
        assert!(chi_square(&samples, &probs) > 1000.0);
    }
}
