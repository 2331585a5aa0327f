//! The GatedDeltaNet conv + recurrence on the CPU (SPEC.md §5).

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
    let mut x = vec![0.0f32; conv_dim];
    for t in 0..a.n {
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
        let (k_all, v_all) = rest.split_at_mut(hk * dk);
        for (qh, kh) in q_all.chunks_exact_mut(dk).zip(k_all.chunks_exact_mut(dk)) {
            let qn = 1.0 / (qh.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
            let kn = 1.0 / (kh.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
            qh.iter_mut().for_each(|v| *v *= qn * q_scale);
            kh.iter_mut().for_each(|v| *v *= kn);
        }
        let (q_all, k_all, v_all) = (&*q_all, &*k_all, &*v_all);
        let o_t = &mut out[t * hv * dv..(t + 1) * hv * dv];
        st.ssm
            .par_chunks_mut(dv * dk)
            .zip(o_t.par_chunks_mut(dv))
            .enumerate()
            .for_each(|(h, (s, o))| {
                let kh = h / ratio;
                let q = &q_all[kh * dk..(kh + 1) * dk];
                let k = &k_all[kh * dk..(kh + 1) * dk];
                let v = &v_all[h * dv..(h + 1) * dv];
                let g = (-(w.a_log[h].exp()) * softplus(a_in[t * hv + h] + w.dt_bias[h])).exp();
                let beta = sigmoid(b_in[t * hv + h]);
                for (i, row) in s.chunks_exact_mut(dk).enumerate() {
                    // row i = value channel i: S ← g·S; δ = β(v − S k); S ← S + δ kᵀ; o = S q
                    let mut sk = 0.0;
                    for (sv, kv) in row.iter_mut().zip(k) {
                        *sv *= g;
                        sk += *sv * kv;
                    }
                    let delta = beta * (v[i] - sk);
                    let mut acc = 0.0;
                    for ((sv, kv), qv) in row.iter_mut().zip(k).zip(q) {
                        *sv += delta * kv;
                        acc += *sv * qv;
                    }
                    o[i] = acc;
                }
            });
    }
}
