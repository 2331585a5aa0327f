//! The MoE step on the CPU: every distinct expert of the chunk is read
//! once and applied to all tokens routed to it.

use super::matmul::linear;
use super::silu;
use crate::backend::{MoeArgs, Routes};
use crate::error::{Error, Result};
use crate::experts::ExpertStore;
use crate::format::MatrixView;
use rayon::prelude::*;

pub fn moe(x: &[f32], routes: &Routes, store: &ExpertStore, a: MoeArgs<'_>, out: &mut [f32]) -> Result<()> {
    let h = a.hidden;
    let mut ids: Vec<u32> = routes.ids.clone();
    ids.sort_unstable();
    ids.dedup();
    let layout = store.layer_layout(a.layer)?;
    // Experts are read and computed in parallel, each as soon as its own
    // read completes; their outputs are combined afterwards in expert order,
    // so the result does not depend on the timing.
    let outs: Vec<(Vec<usize>, Vec<f32>, Vec<f32>)> = ids
        .par_iter()
        .map(|&e| {
            let blob = store
                .read(a.layer, &[e])?
                .pop()
                .ok_or_else(|| Error::Invalid("empty expert read".into()))?;
            // Tokens routed to expert e, and their weights.
            let mut toks = Vec::new();
            let mut wts = Vec::new();
            for t in 0..a.n {
                for k in 0..routes.k {
                    if routes.ids[t * routes.k + k] == e {
                        toks.push(t);
                        wts.push(routes.weights[t * routes.k + k]);
                    }
                }
            }
            let d = expert_forward(x, &toks, &layout.matrices(&blob, store.group_size())?, h, a.inter)?;
            Ok((toks, wts, d))
        })
        .collect::<Result<_>>()?;
    for (toks, wts, d) in &outs {
        for (i, &t) in toks.iter().enumerate() {
            for (o, v) in out[t * h..(t + 1) * h].iter_mut().zip(&d[i * h..(i + 1) * h]) {
                *o += wts[i] * v;
            }
        }
    }
    Ok(())
}

/// SwiGLU expert on the rows `toks` of x `[n, hidden]` → `[toks.len(), hidden]`.
fn expert_forward(x: &[f32], toks: &[usize], m3: &[MatrixView; 3], h: usize, inter: usize) -> Result<Vec<f32>> {
    let [gate, up, down] = m3;
    let m = toks.len();
    let xs: Vec<f32> = toks
        .iter()
        .flat_map(|&t| x[t * h..(t + 1) * h].iter().copied())
        .collect();
    let mut g = vec![0.0f32; m * inter];
    let mut u = vec![0.0f32; m * inter];
    linear(gate, &xs, m, &mut g)?;
    linear(up, &xs, m, &mut u)?;
    for (gv, uv) in g.iter_mut().zip(&u) {
        *gv = silu(*gv) * uv;
    }
    let mut d = vec![0.0f32; m * h];
    linear(down, &g, m, &mut d)?;
    Ok(d)
}
