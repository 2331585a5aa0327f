//! The MoE step on the CPU: every distinct expert of the chunk is read
//! once and applied to all tokens routed to it. With a few tokens per
//! expert (decode) the gate and up products of all the experts run as one
//! parallel set, then the down products as another (rows of every expert
//! split across all threads); with more (prefill) each expert runs whole
//! on one task. The outputs are combined afterwards in expert order, so
//! the result does not depend on the timing or the number of threads.

use super::matmul::{linear_set_with, Kernel, Product};
use super::profile::{Op, OpProfile};
use super::silu;
use crate::backend::{MoeArgs, Routes};
use crate::error::{Error, Result};
use crate::experts::ExpertStore;
use crate::format::MatrixView;
use crate::parallel::for_each_chunk;

/// The tokens routed to one expert and their weights.
#[derive(Clone)]
pub(crate) struct Routed {
    pub toks: Vec<usize>,
    pub wts: Vec<f32>,
}

/// The tokens of `ids`/`weights` (`[n, k]`) routed to expert `e`.
pub(crate) fn routed_to(e: u32, ids: &[u32], weights: &[f32], n: usize, k: usize) -> Routed {
    let mut r = Routed {
        toks: Vec::new(),
        wts: Vec::new(),
    };
    for t in 0..n {
        for j in 0..k {
            if ids[t * k + j] == e {
                r.toks.push(t);
                r.wts.push(weights[t * k + j]);
            }
        }
    }
    r
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn moe(
    kernel: Kernel,
    prof: &OpProfile,
    x: &[f32],
    routes: &Routes,
    store: &ExpertStore,
    ahead: Option<(usize, Vec<u32>)>,
    a: MoeArgs<'_>,
    out: &mut [f32],
) -> Result<()> {
    let mut ids: Vec<u32> = routes.ids.clone();
    ids.sort_unstable();
    ids.dedup();
    let layout = store.layer_layout(a.layer)?;
    let blobs = prof.time(Op::MoeRead, || store.read(a.layer, &ids))?;
    // Read after this layer's own experts, so that they go first.
    if let Some((layer, guess)) = ahead {
        store.read_ahead(layer, &guess, a.k)?;
    }
    if blobs.len() != ids.len() {
        return Err(Error::Invalid(
            "expert read returned the wrong number of experts".into(),
        ));
    }
    let mats: Vec<[MatrixView; 3]> = blobs
        .iter()
        .map(|b| layout.matrices(b, store.group_size()))
        .collect::<Result<_>>()?;
    let routed: Vec<Routed> = ids
        .iter()
        .map(|&e| routed_to(e, &routes.ids, &routes.weights, a.n, routes.k))
        .collect();
    prof.time(Op::MoeCompute, || {
        apply(kernel, x, a.n, a.hidden, a.inter, &mats, &routed, out)
    })
}

/// `out[t] += Σ w · expert(x[t])` over the experts `mats` and the tokens
/// `routed` to each (x `[n, hidden]`), the products with `kernel`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn apply(
    kernel: Kernel,
    x: &[f32],
    n: usize,
    h: usize,
    inter: usize,
    mats: &[[MatrixView; 3]],
    routed: &[Routed],
    out: &mut [f32],
) -> Result<()> {
    if mats.len() != routed.len() || x.len() < n * h || out.len() < n * h {
        return Err(Error::Invalid(format!(
            "moe: {} experts with {} token lists, x of {} and out of {} for {n} tokens of {h}",
            mats.len(),
            routed.len(),
            x.len(),
            out.len()
        )));
    }
    // Each expert's input rows [m, hidden]: x itself for one token. The
    // copies, the SwiGLU and the combination run in parallel for a chunk
    // (serial, they were a large share of a 16-thread prefill).
    let mut xs: Vec<Vec<f32>> = vec![Vec::new(); if n > 1 { routed.len() } else { 0 }];
    for_each_chunk(&mut xs, 1, |i, xi| {
        let mut v = Vec::with_capacity(routed[i].toks.len() * h);
        for &t in &routed[i].toks {
            v.extend_from_slice(&x[t * h..(t + 1) * h]);
        }
        xi[0] = v;
    });
    let input = |i: usize| -> &[f32] {
        match n {
            1 => x,
            _ => &xs[i],
        }
    };
    let m = |i: usize| routed[i].toks.len();
    let routed_rows: usize = (0..mats.len()).map(m).sum();
    let d = if routed_rows > FLAT_MAX_ROWS * mats.len() {
        by_expert(kernel, &input, m, inter, h, mats)?
    } else {
        flat(kernel, &input, m, inter, h, mats)?
    };
    // Each token adds its experts' rows in expert order, as one pass over
    // the experts would: the same sums, tokens in parallel.
    let mut of_token: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n];
    for (e, r) in routed.iter().enumerate() {
        for (i, &t) in r.toks.iter().enumerate() {
            of_token[t].push((e, i));
        }
    }
    for_each_chunk(&mut out[..n * h], h, |t, o| {
        for &(e, i) in &of_token[t] {
            let w = routed[e].wts[i];
            for (ov, v) in o.iter_mut().zip(&d[e][i * h..(i + 1) * h]) {
                *ov += w * v;
            }
        }
    });
    Ok(())
}

/// One token's MoE step as the CPU backend's decode and `--hybrid`'s CPU
/// share run it (`apply`, on spinning workers of its own), for
/// `examples/moe_step_bench.rs`; not an interface of the engine.
#[doc(hidden)]
pub struct MoeStep {
    pool: crate::parallel::SpinPool,
    kernel: Kernel,
}

impl MoeStep {
    /// `threads` workers (the caller of `step` is one of them), the
    /// fastest kernel (`exact`: the exact one).
    pub fn new(threads: usize, exact: bool) -> Result<MoeStep> {
        let pool = crate::parallel::SpinPool::new(threads.max(1))
            .map_err(|e| Error::Invalid(format!("cannot start {threads} threads: {e}")))?;
        Ok(MoeStep {
            pool,
            kernel: Kernel::choose(exact),
        })
    }

    /// `out [hidden] += Σ_i weights[i] · expert_i(x)`, experts `mats`
    /// (`[gate, up, down]`).
    pub fn step(
        &self,
        x: &[f32],
        inter: usize,
        mats: &[[MatrixView; 3]],
        weights: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let routed: Vec<Routed> = weights
            .iter()
            .map(|&w| Routed {
                toks: vec![0],
                wts: vec![w],
            })
            .collect();
        self.pool
            .install(|| apply(self.kernel, x, 1, x.len(), inter, mats, &routed, out))
    }
}

/// Experts with at most this many tokens on average (decode, batched
/// decode) run as two flat sets; more (prefill) one expert per task.
const FLAT_MAX_ROWS: usize = 4;

/// Gate and up of every expert as one set ([m, inter] each), the SwiGLU,
/// then every down product as another ([m, hidden]): the rows of all the
/// experts split across the threads, two loops per layer.
fn flat<'a>(
    kernel: Kernel,
    input: &(dyn Fn(usize) -> &'a [f32] + Sync),
    m: impl Fn(usize) -> usize,
    inter: usize,
    h: usize,
    mats: &[[MatrixView; 3]],
) -> Result<Vec<Vec<f32>>> {
    let mut g: Vec<Vec<f32>> = (0..mats.len()).map(|i| crate::parallel::zeros(m(i) * inter)).collect();
    let mut u = g.clone();
    let mut ps: Vec<Product> = Vec::with_capacity(2 * mats.len());
    for (i, (gi, ui)) in g.iter_mut().zip(u.iter_mut()).enumerate() {
        let [gate, up, _] = &mats[i];
        for (w, y) in [(gate, gi), (up, ui)] {
            ps.push(Product {
                w,
                x: input(i),
                n: m(i),
                y,
            });
        }
    }
    linear_set_with(kernel, &mut ps)?;
    drop(ps);
    for_each_chunk(&mut g, 1, |i, gi| {
        for (gv, uv) in gi[0].iter_mut().zip(&u[i]) {
            *gv = silu(*gv) * uv;
        }
    });
    let mut d: Vec<Vec<f32>> = (0..mats.len()).map(|i| crate::parallel::zeros(m(i) * h)).collect();
    let mut ps: Vec<Product> = d
        .iter_mut()
        .enumerate()
        .map(|(i, di)| Product {
            w: &mats[i][2],
            x: &g[i],
            n: m(i),
            y: di,
        })
        .collect();
    linear_set_with(kernel, &mut ps)?;
    Ok(d)
}

/// Each expert whole on one task (`flat` over that expert alone: its
/// input prepared once, gate, up, SwiGLU and down while they are in the
/// task's cache): with many tokens per expert, the flat sets' inputs and
/// intermediates of every expert at once would not stay in cache.
fn by_expert<'a>(
    kernel: Kernel,
    input: &(dyn Fn(usize) -> &'a [f32] + Sync),
    m: impl Fn(usize) -> usize + Sync,
    inter: usize,
    h: usize,
    mats: &[[MatrixView; 3]],
) -> Result<Vec<Vec<f32>>> {
    // The experts with the most tokens first, so that the threads'
    // last tasks are short ones (the loop hands tasks out in order).
    let mut order: Vec<usize> = (0..mats.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(m(i)));
    let mut d: Vec<Result<Vec<f32>>> = (0..mats.len()).map(|_| Ok(Vec::new())).collect();
    for_each_chunk(&mut d, 1, |k, dk| {
        let i = order[k];
        let x = input(i);
        dk[0] = flat(kernel, &|_| x, |_| m(i), inter, h, &mats[i..i + 1]).map(|mut one| one.remove(0));
    });
    // Back in expert order.
    let mut out: Vec<Vec<f32>> = vec![Vec::new(); mats.len()];
    for (k, dk) in d.into_iter().enumerate() {
        out[order[k]] = dk?;
    }
    Ok(out)
}
