//! Naive reference implementations of the backend ops, written from
//! SPEC.md with plain loops and f64 accumulation. Nothing here is shared
//! with the code under test.

use moeflux::backend::{AttnArgs, DeltaArgs, MlaArgs, RopeArgs};

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn softplus(x: f64) -> f64 {
    x.exp().ln_1p()
}

/// MLX affine dequantization (SPEC.md §2): value n of word w is
/// `(w >> bits·n) & mask`, input column `per_word·word_index + n`.
/// words `[rows, cols·bits/32]`, scales/biases `[rows, cols/gs]`.
pub fn dequant(
    words: &[u32],
    scales: &[f32],
    biases: &[f32],
    rows: usize,
    cols: usize,
    bits: usize,
    gs: usize,
) -> Vec<f64> {
    let per_word = 32 / bits;
    let mask = (1u32 << bits) - 1;
    let wpr = cols / per_word;
    let mut out = vec![0.0f64; rows * cols]; // [rows, cols]
    for r in 0..rows {
        for wi in 0..wpr {
            let word = words[r * wpr + wi];
            for k in 0..per_word {
                let c = per_word * wi + k;
                let q = (word >> (bits * k)) & mask;
                let g = r * (cols / gs) + c / gs;
                out[r * cols + c] = q as f64 * scales[g] as f64 + biases[g] as f64;
            }
        }
    }
    out
}

/// `y[n, rows] = x[n, cols] · Wᵀ` with w `[rows, cols]`.
pub fn linear(w: &[f64], rows: usize, cols: usize, x: &[f32], n: usize) -> Vec<f64> {
    let mut y = vec![0.0f64; n * rows];
    for t in 0..n {
        for r in 0..rows {
            y[t * rows + r] = (0..cols).map(|c| w[r * cols + c] * x[t * cols + c] as f64).sum();
        }
    }
    y
}

/// `y[n, rows] = (silu(gate) ⊙ up) · Wᵀ` with gate, up `[n, cols]`.
pub fn swiglu_linear(w: &[f64], rows: usize, cols: usize, gate: &[f32], up: &[f32], n: usize) -> Vec<f64> {
    let h = swiglu(gate, up); // [n, cols]
    let mut y = vec![0.0f64; n * rows];
    for t in 0..n {
        for r in 0..rows {
            y[t * rows + r] = (0..cols).map(|c| w[r * cols + c] * h[t * cols + c]).sum();
        }
    }
    y
}

pub fn rms_norm(x: &[f32], w: &[f32], rows: usize, dim: usize, eps: f32) -> Vec<f64> {
    let mut y = vec![0.0f64; rows * dim];
    for r in 0..rows {
        let xr = &x[r * dim..(r + 1) * dim];
        let ms = xr.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / dim as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for i in 0..dim {
            y[r * dim + i] = xr[i] as f64 * inv * w[i] as f64;
        }
    }
    y
}

pub fn gated_rms_norm(x: &[f32], z: &[f32], w: &[f32], rows: usize, dim: usize, eps: f32) -> Vec<f64> {
    let mut y = rms_norm(x, w, rows, dim, eps);
    for (v, &g) in y.iter_mut().zip(z) {
        *v *= silu(g as f64);
    }
    y
}

pub fn swiglu(gate: &[f32], up: &[f32]) -> Vec<f64> {
    gate.iter().zip(up).map(|(&g, &u)| silu(g as f64) * u as f64).collect()
}

pub fn sigmoid_mul(x: &[f32], gate: &[f32]) -> Vec<f64> {
    x.iter()
        .zip(gate)
        .map(|(&v, &g)| v as f64 * sigmoid(g as f64))
        .collect()
}

pub fn add_scaled_rows(y: &[f32], x: &[f32], scale: &[f32], dim: usize, sig: bool) -> Vec<f64> {
    let mut out: Vec<f64> = y.iter().map(|&v| v as f64).collect();
    for (i, o) in out.iter_mut().enumerate() {
        let s = scale[i / dim] as f64;
        let s = if sig { sigmoid(s) } else { s };
        *o += s * x[i] as f64;
    }
    out
}

/// RoPE on channels `[rot_off, rot_off + rot_dim)` of
/// `[n_tokens, n_heads, head_stride]` (token stride `token_stride`); the
/// angle is the f32 product `pos·inv_freq[j]`.
pub fn rope(x: &[f32], inv_freq: &[f32], a: RopeArgs) -> Vec<f64> {
    let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let half = a.rot_dim / 2;
    for t in 0..a.n_tokens {
        let pos = (a.pos0 + t) as f32;
        for h in 0..a.n_heads {
            let base = t * a.token_stride + h * a.head_stride + a.rot_off;
            for (j, &f) in inv_freq.iter().enumerate().take(half) {
                let ang = (pos * f) as f64;
                let (c, s) = (ang.cos() * a.mscale as f64, ang.sin() * a.mscale as f64);
                let (i0, i1) = if a.interleaved {
                    (2 * j, 2 * j + 1)
                } else {
                    (j, j + half)
                };
                let (x0, x1) = (x[base + i0] as f64, x[base + i1] as f64);
                y[base + i0] = x0 * c - x1 * s;
                y[base + i1] = x1 * c + x0 * s;
            }
        }
    }
    y
}

fn softmax(s: &mut [f64]) {
    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = s
        .iter_mut()
        .map(|v| {
            *v = (*v - m).exp();
            *v
        })
        .sum();
    s.iter_mut().for_each(|v| *v /= sum);
}

/// Causal attention of one query over keys/values given as f64 rows.
fn attend(q: &[f64], keys: &[Vec<f64>], vals: &[Vec<f64>], scale: f64) -> Vec<f64> {
    let mut s: Vec<f64> = keys
        .iter()
        .map(|k| q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() * scale)
        .collect();
    softmax(&mut s);
    let mut o = vec![0.0f64; vals[0].len()];
    for (p, v) in s.iter().zip(vals) {
        for (ov, x) in o.iter_mut().zip(v) {
            *ov += p * x;
        }
    }
    o
}

/// GQA attention: KV head of query head h is `h / (H/Hkv)`.
pub fn attention(q: &[f32], k: &[f32], v: &[f32], a: AttnArgs) -> Vec<f64> {
    let (hd, vd) = (a.head_dim, a.v_dim);
    let group = a.n_heads / a.n_kv_heads;
    let mut out = Vec::with_capacity(a.n * a.n_heads * vd);
    for t in 0..a.n {
        for h in 0..a.n_heads {
            let kvh = h / group;
            let len = a.pos0 + t + 1;
            let qv: Vec<f64> = q[(t * a.n_heads + h) * hd..][..hd].iter().map(|&x| x as f64).collect();
            let keys: Vec<Vec<f64>> = (0..len)
                .map(|j| {
                    k[(j * a.n_kv_heads + kvh) * hd..][..hd]
                        .iter()
                        .map(|&x| x as f64)
                        .collect()
                })
                .collect();
            let vals: Vec<Vec<f64>> = (0..len)
                .map(|j| {
                    v[(j * a.n_kv_heads + kvh) * vd..][..vd]
                        .iter()
                        .map(|&x| x as f64)
                        .collect()
                })
                .collect();
            out.extend(attend(&qv, &keys, &vals, a.scale as f64));
        }
    }
    out
}

/// MLA the naive way: expand `kv_b` into per-head keys `[W_kb·latent | k_pe]`
/// and values `W_vb·latent`, then plain attention.
pub fn mla_attention(q: &[f32], latent: &[f32], k_pe: &[f32], kv_b: &[f32], a: MlaArgs) -> Vec<f64> {
    let (dn, dr, dv, r) = (a.nope, a.rope, a.v_dim, a.kv_lora_rank);
    let mut out = Vec::with_capacity(a.n * a.n_heads * dv);
    let proj = |row0: usize, rows: usize, j: usize| -> Vec<f64> {
        (0..rows)
            .map(|i| {
                (0..r)
                    .map(|c| kv_b[(row0 + i) * r + c] as f64 * latent[j * r + c] as f64)
                    .sum()
            })
            .collect()
    };
    for t in 0..a.n {
        let len = a.pos0 + t + 1;
        for h in 0..a.n_heads {
            let qv: Vec<f64> = q[(t * a.n_heads + h) * (dn + dr)..][..dn + dr]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let keys: Vec<Vec<f64>> = (0..len)
                .map(|j| {
                    let mut key = proj(h * (dn + dv), dn, j);
                    key.extend(k_pe[j * dr..(j + 1) * dr].iter().map(|&x| x as f64));
                    key
                })
                .collect();
            let vals: Vec<Vec<f64>> = (0..len).map(|j| proj(h * (dn + dv) + dn, dv, j)).collect();
            out.extend(attend(&qv, &keys, &vals, a.scale as f64));
        }
    }
    out
}

/// Inputs of one GatedDeltaNet step.
pub struct DeltaIn<'a> {
    /// `[n, conv_dim]`.
    pub qkv: &'a [f32],
    /// `[n, v_heads]`.
    pub a: &'a [f32],
    pub b: &'a [f32],
    /// `[conv_dim, kernel]`.
    pub conv_w: &'a [f32],
    pub a_log: &'a [f32],
    pub dt_bias: &'a [f32],
}

/// GatedDeltaNet per token (SPEC.md §5). `conv` `[kernel−1, conv_dim]`
/// (oldest first) and `ssm` `[v_heads, v_dim, k_dim]` are updated in
/// place; returns out `[n, v_heads·v_dim]`.
pub fn gated_delta(d: &DeltaIn, conv: &mut [f64], ssm: &mut [f64], args: DeltaArgs) -> Vec<f64> {
    let (hk, hv, dk, dv, kern) = (args.k_heads, args.v_heads, args.k_dim, args.v_dim, args.kernel);
    let cd = 2 * hk * dk + hv * dv;
    let mut out = Vec::with_capacity(args.n * hv * dv);
    for t in 0..args.n {
        let cur: Vec<f64> = d.qkv[t * cd..(t + 1) * cd].iter().map(|&v| v as f64).collect();
        // x[t−K+1+j] for j < K: the state rows, then the current token.
        let x: Vec<f64> = (0..cd)
            .map(|c| {
                let mut acc = d.conv_w[c * kern + kern - 1] as f64 * cur[c];
                for j in 0..kern - 1 {
                    acc += d.conv_w[c * kern + j] as f64 * conv[j * cd + c];
                }
                silu(acc)
            })
            .collect();
        if kern > 1 {
            conv.copy_within(cd.., 0);
            conv[(kern - 2) * cd..].copy_from_slice(&cur);
        }
        let l2 = |v: &[f64]| -> Vec<f64> {
            let inv = 1.0 / (v.iter().map(|a| a * a).sum::<f64>() + 1e-6).sqrt();
            v.iter().map(|a| a * inv).collect()
        };
        for h in 0..hv {
            let kh = h / (hv / hk);
            let q: Vec<f64> = l2(&x[kh * dk..(kh + 1) * dk])
                .iter()
                .map(|v| v / (dk as f64).sqrt())
                .collect();
            let k = l2(&x[hk * dk + kh * dk..hk * dk + (kh + 1) * dk]);
            let v = &x[2 * hk * dk + h * dv..2 * hk * dk + (h + 1) * dv];
            let g = (-(d.a_log[h] as f64).exp() * softplus(d.a[t * hv + h] as f64 + d.dt_bias[h] as f64)).exp();
            let beta = sigmoid(d.b[t * hv + h] as f64);
            let s = &mut ssm[h * dv * dk..(h + 1) * dv * dk]; // [dv, dk]
            s.iter_mut().for_each(|e| *e *= g);
            for i in 0..dv {
                let row = &mut s[i * dk..(i + 1) * dk];
                let sk: f64 = row.iter().zip(&k).map(|(a, b)| a * b).sum();
                let delta = beta * (v[i] - sk);
                row.iter_mut().zip(&k).for_each(|(e, kj)| *e += delta * kj);
                out.push(row.iter().zip(&q).map(|(a, b)| a * b).sum());
            }
        }
    }
    out
}
