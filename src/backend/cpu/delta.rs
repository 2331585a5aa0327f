//! The GatedDeltaNet conv + recurrence on the CPU (SPEC.md §5).

use super::vector::dot;
use super::CpuBackend;
use super::{sigmoid, silu};
use crate::backend::{DeltaArgs, DeltaState, DeltaWeights};
use rayon::prelude::*;

fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

pub fn gated_delta(
    qkv: &[f32],
    a_in: &[f32],
    b_in: &[f32],
    w: DeltaWeights<'_, CpuBackend>,
    st: DeltaState<'_, CpuBackend>,
    a: DeltaArgs,
    out: &mut [f32],
) {
    let (hk, hv, dk, dv, kern) = (a.k_heads, a.v_heads, a.k_dim, a.v_dim, a.kernel);
    let conv_dim = 2 * hk * dk + hv * dv;
    let ratio = hv / hk;
    let q_scale = 1.0 / (dk as f32).sqrt();
    // 1. Conv + SiLU + q/k normalization for every token, in order (the
    //    conv state carries from one token to the next): xs [n, conv_dim].
    let mut xs = vec![0.0f32; a.n * conv_dim];
    for (t, x) in xs.chunks_exact_mut(conv_dim).enumerate() {
        let cur = &qkv[t * conv_dim..(t + 1) * conv_dim];
        // Causal depthwise conv over [state (kernel−1 rows) | current], then SiLU.
        for c in 0..conv_dim {
            let wc = &w.conv_w[c * kern..(c + 1) * kern];
            let mut acc = wc[kern - 1] * cur[c];
            for (j, w) in wc[..kern - 1].iter().enumerate() {
                acc += w * st.conv[j * conv_dim + c];
            }
            x[c] = silu(acc);
        }
        if kern > 1 {
            st.conv.copy_within(conv_dim.., 0);
            st.conv[(kern - 2) * conv_dim..(kern - 1) * conv_dim].copy_from_slice(cur);
        }
        let (q_all, rest) = x.split_at_mut(hk * dk);
        let k_all = &mut rest[..hk * dk];
        for (qh, kh) in q_all.chunks_exact_mut(dk).zip(k_all.chunks_exact_mut(dk)) {
            let qn = 1.0 / (qh.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
            let kn = 1.0 / (kh.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
            qh.iter_mut().for_each(|v| *v *= qn * q_scale);
            kh.iter_mut().for_each(|v| *v *= kn);
        }
    }
    // 2. The recurrence: value heads are independent, so each head runs all
    //    the tokens on one thread with its state [Dv, Dk] kept hot.
    let mut o_heads = vec![0.0f32; hv * a.n * dv]; // [Hv, n, Dv]
    st.ssm
        .par_chunks_mut(dv * dk)
        .zip(o_heads.par_chunks_mut(a.n * dv))
        .enumerate()
        .for_each(|(h, (s, oh))| {
            let kh = h / ratio;
            for (t, o) in oh.chunks_exact_mut(dv).enumerate() {
                let x = &xs[t * conv_dim..(t + 1) * conv_dim];
                let q = &x[kh * dk..(kh + 1) * dk];
                let k = &x[hk * dk + kh * dk..hk * dk + (kh + 1) * dk];
                let v = &x[2 * hk * dk + h * dv..2 * hk * dk + (h + 1) * dv];
                let g = (-(w.a_log[h].exp()) * softplus(a_in[t * hv + h] + w.dt_bias[h])).exp();
                let beta = sigmoid(b_in[t * hv + h]);
                // Row i = value channel i of S ← g·S; δ = β(v − S k);
                // S ← S + δ kᵀ; o = S q, from two dot products of the old
                // row (S_i·k, S_i·q) and one update, all of them vectorized:
                //   sk = g·(S_i·k), o_i = g·(S_i·q) + δ·(k·q), S_i ← g·S_i + δ·k.
                let kq = dot(k, q);
                for (i, row) in s.chunks_exact_mut(dk).enumerate() {
                    let sk = g * dot(row, k);
                    let delta = beta * (v[i] - sk);
                    o[i] = g * dot(row, q) + delta * kq;
                    for (sv, kv) in row.iter_mut().zip(k) {
                        *sv = g * *sv + delta * kv;
                    }
                }
            }
        });
    // [Hv, n, Dv] → out [n, Hv·Dv]
    for (h, oh) in o_heads.chunks_exact(a.n * dv).enumerate() {
        for (t, o) in oh.chunks_exact(dv).enumerate() {
            out[(t * hv + h) * dv..(t * hv + h + 1) * dv].copy_from_slice(o);
        }
    }
}
