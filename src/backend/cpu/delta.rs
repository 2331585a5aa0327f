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

/// Channel steps (channels × tokens) of the conv per parallel task. A
/// channel step is scalar work (taps, SiLU, the window's shift), tens of
/// nanoseconds: one token's 8192 channels on one thread took 0.6 ms per
/// layer on the 16-core device host, so even a decode step is split.
const CONV_TASK: usize = 1 << 10;

/// A pointer that parallel tasks write through, each to its own elements.
struct SharedMut(*mut f32);
// SAFETY: the tasks that share it write disjoint elements (see its uses).
unsafe impl Sync for SharedMut {}

/// One token of one value head: state `s` [Dv, Dk], row i = value channel
/// i, S ← g·S; δ = β(v − S k); S ← S + δ kᵀ; o = S q — computed from two
/// dot products of the old row and one update, all vectorized:
/// `sk = g·(S_i·k)`, `o_i = g·(S_i·q) + δ·(k·q)`, `S_i ← g·S_i + δ·k`.
fn step(s: &mut [f32], q: &[f32], k: &[f32], v: &[f32], g: f32, beta: f32, o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::available() {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { step_avx2(s, q, k, v, g, beta, o) };
    }
    step_body(s, q, k, v, g, beta, o)
}

/// `step` compiled for AVX2 (eight lanes where the baseline has four).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn step_avx2(s: &mut [f32], q: &[f32], k: &[f32], v: &[f32], g: f32, beta: f32, o: &mut [f32]) {
    step_body(s, q, k, v, g, beta, o)
}

#[inline(always)]
fn step_body(s: &mut [f32], q: &[f32], k: &[f32], v: &[f32], g: f32, beta: f32, o: &mut [f32]) {
    let dk = k.len();
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
    // 1. Conv + SiLU, channels in parallel blocks (a channel's window of
    //    the last kernel−1 inputs carries from one token to the next), then
    //    q/k normalization per token: xs [n, conv_dim].
    let mut xs = vec![0.0f32; a.n * conv_dim];
    let (xs_p, conv_p) = (SharedMut(xs.as_mut_ptr()), SharedMut(st.conv.as_mut_ptr()));
    let block = (CONV_TASK / a.n.max(1)).clamp(64, conv_dim.max(64));
    (0..conv_dim.div_ceil(block)).into_par_iter().for_each(|blk| {
        let (xs_p, conv_p) = (&xs_p, &conv_p);
        let mut win = vec![0.0f32; kern - 1];
        for c in blk * block..((blk + 1) * block).min(conv_dim) {
            let wc = &w.conv_w[c * kern..(c + 1) * kern];
            // SAFETY: this task alone touches channel c: column c of the
            // state [kernel−1, conv_dim] and of xs [n, conv_dim], both
            // sized for it above; nothing else uses them meanwhile.
            unsafe {
                for (j, v) in win.iter_mut().enumerate() {
                    *v = *conv_p.0.add(j * conv_dim + c);
                }
                for t in 0..a.n {
                    let cur = qkv[t * conv_dim + c];
                    let mut acc = wc[kern - 1] * cur;
                    for (wj, v) in wc.iter().zip(&win) {
                        acc += wj * v;
                    }
                    *xs_p.0.add(t * conv_dim + c) = silu(acc);
                    if kern > 1 {
                        win.copy_within(1.., 0);
                        win[kern - 2] = cur;
                    }
                }
                for (j, v) in win.iter().enumerate() {
                    *conv_p.0.add(j * conv_dim + c) = *v;
                }
            }
        }
    });
    xs.par_chunks_mut(conv_dim).for_each(|x| {
        let (q_all, rest) = x.split_at_mut(hk * dk);
        let k_all = &mut rest[..hk * dk];
        for (qh, kh) in q_all.chunks_exact_mut(dk).zip(k_all.chunks_exact_mut(dk)) {
            let qn = 1.0 / (dot(qh, qh) + 1e-6).sqrt();
            let kn = 1.0 / (dot(kh, kh) + 1e-6).sqrt();
            qh.iter_mut().for_each(|v| *v *= qn * q_scale);
            kh.iter_mut().for_each(|v| *v *= kn);
        }
    });
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
                step(s, q, k, v, g, beta, o);
            }
        });
    // [Hv, n, Dv] → out [n, Hv·Dv]
    for (h, oh) in o_heads.chunks_exact(a.n * dv).enumerate() {
        for (t, o) in oh.chunks_exact(dv).enumerate() {
            out[(t * hv + h) * dv..(t * hv + h + 1) * dv].copy_from_slice(o);
        }
    }
}
