//! The MoE step on the CPU: every distinct expert of the chunk is read
//! once and applied to all tokens routed to it. The gate and up products
//! of all the experts run as one parallel set, then the down products as
//! another (rows of every expert split across all threads); the outputs
//! are combined afterwards in expert order, so the result does not depend
//! on the timing or the number of threads.

use super::matmul::{linear_set_with, Kernel, Product};
use super::profile::{Op, OpProfile};
use super::silu;
use crate::backend::{MoeArgs, Routes};
use crate::error::{Error, Result};
use crate::experts::ExpertStore;
use crate::format::MatrixView;
use rayon::prelude::*;

/// The tokens routed to one expert and their weights.
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
    a: MoeArgs<'_>,
    out: &mut [f32],
) -> Result<()> {
    let mut ids: Vec<u32> = routes.ids.clone();
    ids.sort_unstable();
    ids.dedup();
    let layout = store.layer_layout(a.layer)?;
    let blobs = prof.time(Op::MoeRead, || store.read(a.layer, &ids))?;
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
    let xs: Vec<Vec<f32>> = routed
        .par_iter()
        .map(|r| match n {
            1 => Vec::new(),
            _ => r
                .toks
                .iter()
                .flat_map(|&t| x[t * h..(t + 1) * h].iter().copied())
                .collect(),
        })
        .collect();
    let input = |i: usize| -> &[f32] {
        match n {
            1 => x,
            _ => &xs[i],
        }
    };
    // [m, inter] each.
    // Each expert on its own: gate and up, SwiGLU, down ([m, hidden]).
    // The experts run in parallel and each one's products split their
    // rows among the threads, so a thread done with one expert's rows
    // takes another's instead of waiting at a barrier between the gate/up
    // products of all experts and their down products.
    let d: Vec<Vec<f32>> = (0..mats.len())
        .into_par_iter()
        .map(|i| -> Result<Vec<f32>> {
            let m = routed[i].toks.len();
            let [gate, up, down] = &mats[i];
            let (mut g, mut u) = (vec![0.0f32; m * inter], vec![0.0f32; m * inter]);
            linear_set_with(
                kernel,
                &mut [
                    Product {
                        w: gate,
                        x: input(i),
                        n: m,
                        y: &mut g,
                    },
                    Product {
                        w: up,
                        x: input(i),
                        n: m,
                        y: &mut u,
                    },
                ],
            )?;
            for (gv, uv) in g.iter_mut().zip(&u) {
                *gv = silu(*gv) * uv;
            }
            let mut d = vec![0.0f32; m * h];
            linear_set_with(
                kernel,
                &mut [Product {
                    w: down,
                    x: &g,
                    n: m,
                    y: &mut d,
                }],
            )?;
            Ok(d)
        })
        .collect::<Result<_>>()?;
    // Each token adds its experts' rows in expert order, as one pass over
    // the experts would: the same sums, tokens in parallel.
    let mut of_token: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n];
    for (e, r) in routed.iter().enumerate() {
        for (i, &t) in r.toks.iter().enumerate() {
            of_token[t].push((e, i));
        }
    }
    out[..n * h].par_chunks_mut(h).zip(&of_token).for_each(|(o, rows)| {
        for &(e, i) in rows {
            let w = routed[e].wts[i];
            for (ov, v) in o.iter_mut().zip(&d[e][i * h..(i + 1) * h]) {
                *ov += w * v;
            }
        }
    });
    Ok(())
}
