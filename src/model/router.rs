//! Routers, on the host: the router logits decide which experts stream.

use crate::backend::Routes;
use crate::config::Routing;

/// Indices of the `k` largest values (ties → lower index first), in
/// descending order of value; NaN ranks as −∞. One pass
/// that keeps the best `k` in order (a full sort of every token's 256
/// scores was a visible share of a CPU prefill).
fn top_k(v: &[f32], k: usize) -> Vec<usize> {
    let key = |i: usize| if v[i].is_nan() { f32::NEG_INFINITY } else { v[i] };
    let mut best: Vec<usize> = Vec::with_capacity(k + 1);
    for i in 0..v.len() {
        let x = key(i);
        if best.len() == k && best.last().is_none_or(|&j| x <= key(j)) {
            continue;
        }
        // After every kept index with a value at least x (an equal value
        // seen earlier keeps its place).
        let at = best.partition_point(|&j| key(j) >= x);
        best.insert(at, i);
        best.truncate(k);
    }
    best
}

/// The softmax of a router's logits, in f32.
fn softmax(logits: &[f32]) -> Vec<f32> {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = logits.iter().map(|x| (x - m).exp()).collect();
    let sum: f32 = e.iter().sum();
    e.iter().map(|x| x / sum).collect()
}

/// softmax over all experts → top-k → renormalize if asked.
fn softmax_topk(logits: &[f32], k: usize, norm: bool) -> (Vec<u32>, Vec<f32>) {
    let p = softmax(logits);
    let idx = top_k(&p, k);
    let mut w: Vec<f32> = idx.iter().map(|&i| p[i]).collect();
    if norm {
        let s: f32 = w.iter().sum();
        w.iter_mut().for_each(|x| *x /= s);
    }
    (idx.into_iter().map(|i| i as u32).collect(), w)
}

/// DeepSeek `noaux_tc`: sigmoid scores; selection on score + bias by
/// groups (group score = sum of its top 2), keep `topk_group` groups,
/// top-k among their experts (others masked to 0, as transformers does);
/// weights are the unbiased scores.
fn noaux_tc(
    logits: &[f32],
    bias: &[f32],
    k: usize,
    n_group: usize,
    topk_group: usize,
    scale: f32,
    norm: bool,
) -> (Vec<u32>, Vec<f32>) {
    let s: Vec<f32> = logits.iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect();
    let choice: Vec<f32> = s.iter().zip(bias).map(|(a, b)| a + b).collect();
    let per = s.len() / n_group;
    let group_scores: Vec<f32> = choice
        .chunks_exact(per)
        .map(|g| top_k(g, 2).iter().map(|&i| g[i]).sum())
        .collect();
    let keep = top_k(&group_scores, topk_group);
    let masked: Vec<f32> = choice
        .iter()
        .enumerate()
        .map(|(i, &c)| if keep.contains(&(i / per)) { c } else { 0.0 })
        .collect();
    let idx = top_k(&masked, k);
    let mut w: Vec<f32> = idx.iter().map(|&i| s[i]).collect();
    if norm {
        let d: f32 = w.iter().sum::<f32>() + 1e-20;
        w.iter_mut().for_each(|x| *x /= d);
    }
    w.iter_mut().for_each(|x| *x *= scale);
    (idx.into_iter().map(|i| i as u32).collect(), w)
}

/// DeepSeek-V2: softmax; groups scored by their largest probability, the
/// best `topk_group` kept (others masked to 0, as transformers does);
/// top-k; weights the probabilities times `scale`.
fn softmax_groups(logits: &[f32], k: usize, n_group: usize, topk_group: usize, scale: f32) -> (Vec<u32>, Vec<f32>) {
    let p = softmax(logits);
    let per = p.len() / n_group;
    let group_scores: Vec<f32> = p
        .chunks_exact(per)
        .map(|g| g.iter().cloned().fold(f32::NEG_INFINITY, f32::max))
        .collect();
    let keep = top_k(&group_scores, topk_group);
    let masked: Vec<f32> = p
        .iter()
        .enumerate()
        .map(|(i, &x)| if keep.contains(&(i / per)) { x } else { 0.0 })
        .collect();
    let idx = top_k(&masked, k);
    let w: Vec<f32> = idx.iter().map(|&i| p[i] * scale).collect();
    (idx.into_iter().map(|i| i as u32).collect(), w)
}

/// Route `n` tokens from their router logits `[n, n_experts]`; the tokens
/// of a prefill chunk in parallel (one after the other, a 256-token chunk
/// spent milliseconds per layer here on the CPU).
pub fn route(routing: &Routing, logits: &[f32], n: usize, k: usize, bias: Option<&[f32]>) -> Routes {
    let e = logits.len() / n;
    let zeros = match (routing, bias) {
        (Routing::NoauxTc { .. }, None) => vec![0.0; e],
        _ => Vec::new(),
    };
    let one = |row: &[f32]| match *routing {
        Routing::Softmax { norm_topk_prob } => softmax_topk(row, k, norm_topk_prob),
        Routing::NoauxTc {
            n_group,
            topk_group,
            routed_scaling_factor,
            norm_topk_prob,
        } => noaux_tc(
            row,
            bias.unwrap_or(&zeros),
            k,
            n_group,
            topk_group,
            routed_scaling_factor,
            norm_topk_prob,
        ),
        Routing::SoftmaxGroups {
            n_group,
            topk_group,
            routed_scaling_factor,
        } => softmax_groups(row, k, n_group, topk_group, routed_scaling_factor),
    };
    let per_token: Vec<(Vec<u32>, Vec<f32>)> = if n >= PARALLEL_TOKENS {
        let mut v = vec![(Vec::new(), Vec::new()); n];
        crate::parallel::for_each_chunk(&mut v, 1, |t, o| o[0] = one(&logits[t * e..(t + 1) * e]));
        v
    } else {
        logits.chunks_exact(e).map(one).collect()
    };
    let mut ids = Vec::with_capacity(n * k);
    let mut weights = Vec::with_capacity(n * k);
    for (i, w) in per_token {
        ids.extend(i);
        weights.extend(w);
    }
    Routes { k, ids, weights }
}

/// Tokens from which `route` runs them in parallel.
const PARALLEL_TOKENS: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition: every index sorted by value (NaN last), ties by
    /// index, the first k.
    fn top_k_by_sorting(v: &[f32], k: usize) -> Vec<usize> {
        let key = |i: usize| if v[i].is_nan() { f32::NEG_INFINITY } else { v[i] };
        let mut idx: Vec<usize> = (0..v.len()).collect();
        idx.sort_by(|&a, &b| key(b).partial_cmp(&key(a)).unwrap().then(a.cmp(&b)));
        idx.truncate(k);
        idx
    }

    /// Random rows with ties, zeros of both signs, infinities and NaN,
    /// every k up to past their length.
    #[test]
    fn top_k_is_the_first_k_of_the_sorted_order() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let pool = [0.0, -0.0, 1.0, -1.0, 2.5, f32::NAN, f32::NEG_INFINITY, f32::INFINITY];
        for _ in 0..2000 {
            let len = (next() % 40) as usize;
            let v: Vec<f32> = (0..len)
                .map(|_| match next() % 3 {
                    0 => pool[(next() % pool.len() as u64) as usize],
                    _ => (next() % 1000) as f32 / 100.0 - 5.0,
                })
                .collect();
            for k in 0..len + 2 {
                assert_eq!(top_k(&v, k), top_k_by_sorting(&v, k), "{v:?}, k = {k}");
            }
        }
    }

    #[test]
    fn softmax_topk_picks_largest_and_normalizes() {
        let r = route(
            &Routing::Softmax { norm_topk_prob: true },
            &[0.0, 3.0, 1.0, 2.0],
            1,
            2,
            None,
        );
        assert_eq!(r.ids, vec![1, 3]);
        assert!((r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let r = route(
            &Routing::Softmax { norm_topk_prob: false },
            &[0.0, 3.0, 1.0, 2.0],
            1,
            2,
            None,
        );
        assert!(r.weights.iter().sum::<f32>() < 0.95);
    }

    #[test]
    fn softmax_groups_keeps_the_groups_of_the_largest_probabilities() {
        // Two groups of 4: group 0 holds the single largest logit, group 1
        // the larger sum; V2 scores a group by its maximum, so group 0 wins.
        let logits = [3.0, -4.0, -4.0, -4.0, 2.0, 2.0, 2.0, 2.0];
        let routing = Routing::SoftmaxGroups {
            n_group: 2,
            topk_group: 1,
            routed_scaling_factor: 16.0,
        };
        let r = route(&routing, &logits, 1, 2, None);
        assert_eq!(r.ids, vec![0, 1]);
        let z: f32 = logits.iter().map(|x| x.exp()).sum();
        assert!((r.weights[0] - 16.0 * 3f32.exp() / z).abs() < 1e-4, "{:?}", r.weights);
        // One group: plain greedy top-k, not renormalized.
        let greedy = Routing::SoftmaxGroups {
            n_group: 1,
            topk_group: 1,
            routed_scaling_factor: 1.0,
        };
        let r = route(&greedy, &logits, 1, 2, None);
        assert_eq!(r.ids, vec![0, 4]);
        assert!(r.weights.iter().sum::<f32>() < 0.9);
    }

    #[test]
    fn noaux_tc_restricts_to_best_groups_and_uses_unbiased_weights() {
        // Two groups of 4; the bias makes group 1 win although group 0 has the largest raw score.
        let logits = [4.0, -4.0, -4.0, -4.0, 0.0, 0.5, 0.2, 0.1];
        let bias = [0.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0];
        let routing = Routing::NoauxTc {
            n_group: 2,
            topk_group: 1,
            routed_scaling_factor: 2.0,
            norm_topk_prob: true,
        };
        let r = route(&routing, &logits, 1, 2, Some(&bias));
        assert_eq!(r.ids, vec![5, 6]);
        let (a, b) = (1.0 / (1.0 + (-0.5f32).exp()), 1.0 / (1.0 + (-0.2f32).exp()));
        assert!((r.weights[0] - 2.0 * a / (a + b)).abs() < 1e-6);
    }
}
