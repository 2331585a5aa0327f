//! RoPE, GQA attention and absorbed MLA attention on the CPU.

use super::vector::dot;
use crate::backend::{AttnArgs, MlaArgs, RopeArgs};

pub fn rope(x: &mut [f32], inv_freq: &[f32], a: RopeArgs) {
    let half = a.rot_dim / 2;
    for t in 0..a.n_tokens {
        let pos = (a.pos0 + t) as f32;
        for h in 0..a.n_heads {
            let base = t * a.token_stride + h * a.head_stride + a.rot_off;
            for (j, f) in inv_freq[..half].iter().enumerate() {
                let ang = pos * f;
                let (s, c) = ang.sin_cos();
                let (c, s) = (c * a.mscale, s * a.mscale);
                let (i0, i1) = if a.interleaved {
                    (2 * j, 2 * j + 1)
                } else {
                    (j, j + half)
                };
                let x0 = x[base + i0];
                let x1 = x[base + i1];
                x[base + i0] = x0 * c - x1 * s;
                x[base + i1] = x1 * c + x0 * s;
            }
        }
    }
}

/// Numerically stable in-place softmax.
fn softmax(s: &mut [f32]) {
    let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in s.iter_mut() {
        *v = super::vector::exp(*v - m);
        sum += *v;
    }
    for v in s.iter_mut() {
        *v /= sum;
    }
}

pub fn attention(q: &[f32], k: &[f32], v: &[f32], a: AttnArgs, out: &mut [f32]) {
    let group = a.n_heads / a.n_kv_heads;
    let (hd, vd) = (a.head_dim, a.v_dim);
    crate::parallel::for_each_chunk(&mut out[..a.n * a.n_heads * vd], vd, |i, o| {
        let (t, h) = (i / a.n_heads, i % a.n_heads);
        let kvh = h / group;
        let len = a.pos0 + t + 1;
        let qv = &q[(t * a.n_heads + h) * hd..][..hd];
        let mut s: Vec<f32> = (0..len)
            .map(|j| dot(qv, &k[(j * a.n_kv_heads + kvh) * hd..][..hd]) * a.scale)
            .collect();
        softmax(&mut s);
        o.fill(0.0);
        for (j, p) in s.iter().enumerate() {
            let vv = &v[(j * a.n_kv_heads + kvh) * vd..][..vd];
            for (ov, x) in o.iter_mut().zip(vv) {
                *ov += p * x;
            }
        }
    });
}

pub fn mla_attention(q: &[f32], latent: &[f32], k_pe: &[f32], kv_b: &[f32], a: MlaArgs, out: &mut [f32]) {
    let (dn, dr, dv, r) = (a.nope, a.rope, a.v_dim, a.kv_lora_rank);
    let qd = dn + dr;
    crate::parallel::for_each_chunk(&mut out[..a.n * a.n_heads * dv], dv, |i, o| {
        let (t, h) = (i / a.n_heads, i % a.n_heads);
        let len = a.pos0 + t + 1;
        let qh = &q[(t * a.n_heads + h) * qd..][..qd];
        let wk = &kv_b[h * (dn + dv) * r..][..dn * r]; // [dn, r]
        let wv = &kv_b[(h * (dn + dv) + dn) * r..][..dv * r]; // [dv, r]
                                                              // q absorbed into the latent space: q_lat[c] = Σ_i q_nope[i]·Wk[i, c]
        let mut q_lat = vec![0.0f32; r];
        for (qi, row) in qh[..dn].iter().zip(wk.chunks_exact(r)) {
            for (l, w) in q_lat.iter_mut().zip(row) {
                *l += qi * w;
            }
        }
        let q_pe = &qh[dn..];
        let mut s: Vec<f32> = (0..len)
            .map(|j| (dot(&q_lat, &latent[j * r..][..r]) + dot(q_pe, &k_pe[j * dr..][..dr])) * a.scale)
            .collect();
        softmax(&mut s);
        let mut o_lat = vec![0.0f32; r];
        for (j, p) in s.iter().enumerate() {
            for (l, x) in o_lat.iter_mut().zip(&latent[j * r..][..r]) {
                *l += p * x;
            }
        }
        for (ov, row) in o.iter_mut().zip(wv.chunks_exact(r)) {
            *ov = dot(row, &o_lat);
        }
    });
}
