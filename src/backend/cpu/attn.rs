//! RoPE, GQA attention and absorbed MLA attention on the CPU.

use super::delta_conv::{isa, Isa};
use super::kv_cache::CpuCache;
use super::lanes::{self, Lanes, LANES};
use super::vector::dot;
use crate::backend::{AttnArgs, MlaArgs, RopeArgs};
use std::cell::RefCell;

/// RoPE on `n_tokens` rows of x in place: each pair's angle, cosine and
/// sine once per token for all its heads; the tokens in parallel when
/// each one's heads lie within its own row (`token_stride`).
pub fn rope(x: &mut [f32], inv_freq: &[f32], a: RopeArgs) {
    let half = a.rot_dim / 2;
    let token = |t: usize, row: &mut [f32]| {
        let pos = (a.pos0 + t) as f32;
        let cs: Vec<(f32, f32)> = inv_freq[..half]
            .iter()
            .map(|f| {
                let (s, c) = (pos * f).sin_cos();
                (c * a.mscale, s * a.mscale)
            })
            .collect();
        for h in 0..a.n_heads {
            let base = h * a.head_stride + a.rot_off;
            for (j, &(c, s)) in cs.iter().enumerate() {
                let (i0, i1) = if a.interleaved {
                    (2 * j, 2 * j + 1)
                } else {
                    (j, j + half)
                };
                let x0 = row[base + i0];
                let x1 = row[base + i1];
                row[base + i0] = x0 * c - x1 * s;
                row[base + i1] = x1 * c + x0 * s;
            }
        }
    };
    // The elements of a token's heads, from the start of its row.
    let span = a.n_heads.saturating_sub(1) * a.head_stride + a.rot_off + a.rot_dim;
    let rows = a.n_tokens * a.token_stride;
    if a.n_tokens > 1 && a.token_stride >= span && x.len() >= rows {
        crate::parallel::for_each_chunk(&mut x[..rows], a.token_stride, token);
    } else {
        for t in 0..a.n_tokens {
            token(t, &mut x[t * a.token_stride..]);
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

/// GQA attention, causal: `n` queries at `pos0..` over `pos0 + n`
/// cached positions. A task takes one token's queries of one KV head's
/// group of heads, so each key and value row is read from memory once for
/// the group (and from L1 for its other heads); the dot products and the
/// weighted sums run on 16-float registers (`Lanes`).
pub fn attention(q: &[f32], k: &CpuCache, v: &CpuCache, a: AttnArgs, out: &mut [f32]) {
    attention_on(isa(), q, k, v, a, out)
}

/// `attention` on the registers of `isa`, which this CPU must run (the
/// tests run every width the CPU has).
fn attention_on(isa: Isa, q: &[f32], k: &CpuCache, v: &CpuCache, a: AttnArgs, out: &mut [f32]) {
    let group = a.n_heads / a.n_kv_heads;
    crate::parallel::for_each_chunk(&mut out[..a.n * a.n_heads * a.v_dim], group * a.v_dim, |i, o| {
        let (t, kvh) = (i / a.n_kv_heads, i % a.n_kv_heads);
        let len = a.pos0 + t + 1;
        let qs = &q[(t * a.n_heads + kvh * group) * a.head_dim..][..group * a.head_dim];
        SCORES.with(|s| {
            let mut s = s.borrow_mut();
            s.clear();
            s.resize(group * len, 0.0);
            let x = GroupTask { qs, k, v, a, kvh, len };
            // SAFETY: each kernel runs only where `isa` found its
            // instructions; the slices are the sizes `group_task` reads.
            unsafe {
                match isa {
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx512 => group_avx512(&x, &mut s, o),
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 => group_avx2(&x, &mut s, o),
                    _ => group_task::<lanes::Plain>(&x, &mut s, o),
                }
            }
        })
    });
}

thread_local! {
    /// A task's scores `[group, len]`.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// One token's queries of one KV head's group (`qs` `[group, head_dim]`)
/// against keys `0..len` of that head.
struct GroupTask<'a> {
    qs: &'a [f32],
    k: &'a CpuCache,
    v: &'a CpuCache,
    a: AttnArgs,
    kvh: usize,
    len: usize,
}

/// `group_task` on AVX-512 registers.
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn group_avx512(x: &GroupTask, s: &mut [f32], o: &mut [f32]) {
    group_task::<lanes::Avx512>(x, s, o)
}

/// `group_task` on pairs of AVX2 registers.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn group_avx2(x: &GroupTask, s: &mut [f32], o: &mut [f32]) {
    group_task::<lanes::Avx2>(x, s, o)
}

/// Scores into `s` `[group, len]`, their softmax, and `o` `[group, v_dim]`
/// = Σ_j p_j·v_j.
///
/// # Safety
/// The CPU runs `V`'s instructions; `s` holds `group·len` values, `o`
/// `group·v_dim`, `x.qs` `group·head_dim`, and k and v hold `len` rows.
#[inline(always)]
unsafe fn group_task<V: Lanes>(x: &GroupTask, s: &mut [f32], o: &mut [f32]) {
    let a = x.a;
    let (hd, vd, len) = (a.head_dim, a.v_dim, x.len);
    // A row of a 16-bit or q8_0 cache, decoded.
    let mut tmp = Vec::new();
    for j in 0..len {
        let kr = x.k.span((j * a.n_kv_heads + x.kvh) * hd, hd, &mut tmp);
        for (g, qg) in x.qs.chunks_exact(hd).enumerate() {
            // SAFETY: the caller's.
            s[g * len + j] = unsafe { dot_lanes::<V>(qg, kr) } * a.scale;
        }
    }
    for sg in s.chunks_exact_mut(len) {
        softmax(sg);
    }
    o.fill(0.0);
    let whole = vd / LANES * LANES;
    for j in 0..len {
        let vr = x.v.span((j * a.n_kv_heads + x.kvh) * vd, vd, &mut tmp);
        for (g, og) in o.chunks_exact_mut(vd).enumerate() {
            let p = s[g * len + j];
            // SAFETY: the caller's; c + LANES ≤ whole ≤ vd.
            unsafe {
                let pv = V::splat(p);
                for c in (0..whole).step_by(LANES) {
                    let op = og.as_mut_ptr().add(c);
                    V::madd(pv, V::load(vr.as_ptr().add(c)), V::load(op)).store(op);
                }
            }
            for (ov, vv) in og[whole..].iter_mut().zip(&vr[whole..]) {
                *ov += p * vv;
            }
        }
    }
}

/// `a · b` with two registers of sums.
///
/// # Safety
/// The CPU runs `V`'s instructions.
#[inline(always)]
unsafe fn dot_lanes<V: Lanes>(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    // SAFETY: the caller's; every load is within the first n values.
    unsafe {
        let (mut s0, mut s1) = (V::splat(0.0), V::splat(0.0));
        let mut c = 0;
        while c + 2 * LANES <= n {
            s0 = V::madd(V::load(pa.add(c)), V::load(pb.add(c)), s0);
            s1 = V::madd(V::load(pa.add(c + LANES)), V::load(pb.add(c + LANES)), s1);
            c += 2 * LANES;
        }
        if c + LANES <= n {
            s0 = V::madd(V::load(pa.add(c)), V::load(pb.add(c)), s0);
            c += LANES;
        }
        let mut d = V::add(s0, s1).sum();
        for i in c..n {
            d += a[i] * b[i];
        }
        d
    }
}

pub fn mla_attention(q: &[f32], latent: &CpuCache, k_pe: &CpuCache, kv_b: &[f32], a: MlaArgs, out: &mut [f32]) {
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
        let (mut tl, mut tp) = (Vec::new(), Vec::new());
        let mut s: Vec<f32> = (0..len)
            .map(|j| {
                let lj = latent.span(j * r, r, &mut tl);
                (dot(&q_lat, lj) + dot(q_pe, k_pe.span(j * dr, dr, &mut tp))) * a.scale
            })
            .collect();
        softmax(&mut s);
        let mut o_lat = vec![0.0f32; r];
        for (j, p) in s.iter().enumerate() {
            for (l, x) in o_lat.iter_mut().zip(latent.span(j * r, r, &mut tl)) {
                *l += p * x;
            }
        }
        for (ov, row) in o.iter_mut().zip(wv.chunks_exact(r)) {
            *ov = dot(row, &o_lat);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention one query head at a time, straight from the definition.
    fn naive(q: &[f32], k: &[f32], v: &[f32], a: AttnArgs) -> Vec<f32> {
        let group = a.n_heads / a.n_kv_heads;
        let mut out = vec![0.0f32; a.n * a.n_heads * a.v_dim];
        for (i, o) in out.chunks_exact_mut(a.v_dim).enumerate() {
            let (t, h) = (i / a.n_heads, i % a.n_heads);
            let kvh = h / group;
            let qv = &q[(t * a.n_heads + h) * a.head_dim..][..a.head_dim];
            let s: Vec<f64> = (0..a.pos0 + t + 1)
                .map(|j| {
                    let kr = &k[(j * a.n_kv_heads + kvh) * a.head_dim..][..a.head_dim];
                    qv.iter().zip(kr).map(|(x, y)| (x * y) as f64).sum::<f64>() * a.scale as f64
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            for (d, ov) in o.iter_mut().enumerate() {
                let acc: f64 = e
                    .iter()
                    .enumerate()
                    .map(|(j, p)| p / sum * v[(j * a.n_kv_heads + kvh) * a.v_dim + d] as f64)
                    .sum();
                *ov = acc as f32;
            }
        }
        out
    }

    /// Every register width this CPU runs gives the definition's outputs,
    /// for head sizes with and without a tail past whole registers, groups
    /// of 1 to 4 heads and queries after a cached prefix.
    #[test]
    fn every_register_width_matches_the_definition() {
        let mut seed = 0x2545_f491u32;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed as f32 / u32::MAX as f32) - 0.5
        };
        for (n, pos0, heads, kv, hd, vd) in [(3, 0, 4, 1, 64, 64), (5, 7, 4, 2, 40, 24), (2, 3, 3, 3, 16, 48)] {
            let a = AttnArgs {
                n,
                pos0,
                n_heads: heads,
                n_kv_heads: kv,
                head_dim: hd,
                v_dim: vd,
                scale: 1.0 / (hd as f32).sqrt(),
            };
            let len = pos0 + n;
            let q: Vec<f32> = (0..n * heads * hd).map(|_| 2.0 * rnd()).collect();
            let k: Vec<f32> = (0..len * kv * hd).map(|_| 2.0 * rnd()).collect();
            let v: Vec<f32> = (0..len * kv * vd).map(|_| rnd()).collect();
            let want = naive(&q, &k, &v, a);
            let cache = |x: &[f32], w: usize| {
                let mut c = CpuCache::new(crate::backend::KvType::F32, len, kv * w).unwrap();
                c.store(x, 0).unwrap();
                c
            };
            let (kc, vc) = (cache(&k, hd), cache(&v, vd));
            let mut kernels: Vec<(&str, Isa)> = vec![("plain", Isa::Plain)];
            #[cfg(target_arch = "x86_64")]
            {
                if super::super::simd::available() {
                    kernels.push(("avx2", Isa::Avx2));
                }
                if super::super::simd512::available() {
                    kernels.push(("avx512", Isa::Avx512));
                }
            }
            for (name, which) in kernels {
                let mut got = vec![0.0f32; want.len()];
                attention_on(which, &q, &kc, &vc, a, &mut got);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-5,
                        "{name} shape {:?} out[{i}] {g} want {w}",
                        (n, pos0, heads, kv, hd, vd)
                    );
                }
            }
        }
    }
}
