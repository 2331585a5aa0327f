//! The MoE step on the CPU: every distinct expert of the chunk is read
//! once and applied to all tokens routed to it.

use super::matmul::linear;
use super::silu;
use crate::backend::{MoeArgs, Routes};
use crate::error::Result;
use crate::experts::ExpertStore;

pub fn moe(x: &[f32], routes: &Routes, store: &ExpertStore, a: MoeArgs<'_>, out: &mut [f32]) -> Result<()> {
    let (h, inter) = (a.hidden, a.inter);
    let mut ids: Vec<u32> = routes.ids.clone();
    ids.sort_unstable();
    ids.dedup();
    let layout = store.layer_layout(a.layer)?;
    let blobs = store.read(a.layer, &ids)?;
    for (e, blob) in ids.iter().zip(&blobs) {
        // Tokens routed to expert e, and their weights.
        let mut toks = Vec::new();
        let mut wts = Vec::new();
        for t in 0..a.n {
            for k in 0..routes.k {
                if routes.ids[t * routes.k + k] == *e {
                    toks.push(t);
                    wts.push(routes.weights[t * routes.k + k]);
                }
            }
        }
        let m = toks.len();
        let xs: Vec<f32> = toks
            .iter()
            .flat_map(|&t| x[t * h..(t + 1) * h].iter().copied())
            .collect();
        let [gate, up, down] = layout.matrices(blob, store.group_size())?;
        let mut g = vec![0.0f32; m * inter];
        let mut u = vec![0.0f32; m * inter];
        linear(&gate, &xs, m, &mut g)?;
        linear(&up, &xs, m, &mut u)?;
        for (gv, uv) in g.iter_mut().zip(&u) {
            *gv = silu(*gv) * uv;
        }
        let mut d = vec![0.0f32; m * h];
        linear(&down, &g, m, &mut d)?;
        for (i, &t) in toks.iter().enumerate() {
            for (o, v) in out[t * h..(t + 1) * h].iter_mut().zip(&d[i * h..(i + 1) * h]) {
                *o += wts[i] * v;
            }
        }
    }
    Ok(())
}
