//! The token mixers over the rows of several sequences at once
//! (`attention_seqs`, `gated_delta_seqs`), against the references run
//! one sequence at a time on each sequence's own state: decode rows and
//! prefill chunks mixed, and more sequences than one launch takes.

use super::reference;
use super::util::{close, Rng};
use super::{attn_args, cache, cache_rows, held, run, up};
use moeflux::backend::{AttnArgs, AttnSeqs, Backend, DeltaArgs, DeltaWeights, KvType, RopeArgs, Rotary, Seg};

/// Segments of `ns` tokens, in row order, at the given positions.
pub fn segs(ns: &[usize], pos: &[usize]) -> Vec<Seg> {
    let mut off = 0;
    ns.iter()
        .zip(pos)
        .map(|(&n, &pos0)| {
            let s = Seg { off, n, pos0 };
            off += n;
            s
        })
        .collect()
}

fn as_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// Each cache type: f32 (exact) and q8_0, whose blocks the append rounds.
pub fn check_attention_seqs<B: Backend>(b: &B) {
    for t in [KvType::F32, KvType::F16, KvType::Q8_0] {
        attention_seqs_of(b, t);
    }
}

fn attention_seqs_of<B: Backend>(b: &B, t: KvType) {
    let mut rng = Rng::new(21);
    let many_n: Vec<usize> = (0..18).map(|i| 1 + i % 2).collect();
    let many_p: Vec<usize> = (0..18).map(|i| (i * 7) % 11).collect();
    // (tokens per sequence, positions, heads, KV heads, head_dim,
    // (first rotated dim, rotated dims, interleaved))
    type Case = (Vec<usize>, Vec<usize>, usize, usize, usize, (usize, usize, bool));
    let cases: [Case; 3] = [
        (vec![1, 3, 1, 2], vec![5, 0, 9, 2], 4, 2, 32, (0, 32, false)),
        (vec![2, 1], vec![0, 4], 6, 3, 64, (16, 16, true)),
        (many_n, many_p, 4, 1, 16, (0, 8, false)),
    ];
    for (ns, pos, h, kv, hd, (rot_off, rot, il)) in cases {
        if t == KvType::Q8_0 && (kv * hd) % 32 != 0 {
            continue;
        }
        let sg = segs(&ns, &pos);
        let n: usize = ns.iter().sum();
        let (qw, kw) = (h * hd, kv * hd);
        let q = rng.vec(n * qw, 2.0);
        let k = rng.vec(n * kw, 2.0);
        let v = rng.vec(n * kw, 1.0);
        let inv_freq: Vec<f32> = (0..rot / 2)
            .map(|j| 10000f32.powf(-2.0 * j as f32 / rot as f32))
            .collect();
        // Each sequence's caches: random old positions, room for the new.
        let caps: Vec<usize> = sg.iter().map(|s| s.pos0 + s.n + 1).collect();
        let kc0: Vec<Vec<f32>> = caps.iter().map(|&c| rng.vec(c * kw, 2.0)).collect();
        let vc0: Vec<Vec<f32>> = caps.iter().map(|&c| rng.vec(c * kw, 1.0)).collect();
        let (mut kcs, kc0): (Vec<B::Cache>, Vec<Vec<f32>>) = kc0.iter().map(|c| cache(b, t, c, kw)).unzip();
        let (mut vcs, vc0): (Vec<B::Cache>, Vec<Vec<f32>>) = vc0.iter().map(|c| cache(b, t, c, kw)).unzip();
        let rope = Rotary {
            rot_off,
            rot_dim: rot,
            interleaved: il,
            mscale: 1.0,
        };
        let attn = attn_args(n, 0, (h, kv), (hd, hd));
        let (mut qb, mut kb, vb, fb) = (up(b, &q), up(b, &k), up(b, &v), up(b, &inv_freq));
        let mut out = b.alloc(n * qw).expect("alloc");
        let x = AttnSeqs {
            q: &mut qb,
            k: &mut kb,
            v: &vb,
            inv_freq: &fb,
            rope,
            attn,
        };
        let mut caches: Vec<_> = kcs.iter_mut().zip(vcs.iter_mut()).collect();
        b.attention_seqs(x, &mut caches, &sg, &mut out).expect("attention_seqs");
        drop(caches);
        let got = run(b, &out, n * qw);
        let mut want = Vec::with_capacity(n * qw);
        for (i, s) in sg.iter().enumerate() {
            let one = |heads: usize| RopeArgs {
                n_tokens: s.n,
                n_heads: heads,
                head_stride: hd,
                token_stride: heads * hd,
                rot_off,
                rot_dim: rot,
                pos0: s.pos0,
                interleaved: il,
                mscale: 1.0,
            };
            let qs = as_f32(&reference::rope(&q[s.off * qw..(s.off + s.n) * qw], &inv_freq, one(h)));
            let ks = as_f32(&reference::rope(&k[s.off * kw..(s.off + s.n) * kw], &inv_freq, one(kv)));
            let (mut kc, mut vc) = (kc0[i].clone(), vc0[i].clone());
            kc[s.pos0 * kw..(s.pos0 + s.n) * kw].copy_from_slice(&held(t, &ks, kw));
            vc[s.pos0 * kw..(s.pos0 + s.n) * kw].copy_from_slice(&held(t, &v[s.off * kw..(s.off + s.n) * kw], kw));
            let a = AttnArgs {
                n: s.n,
                pos0: s.pos0,
                ..attn
            };
            want.extend(reference::attention(&qs, &kc, &vc, a));
            let kref: Vec<f64> = kc.iter().map(|&x| x as f64).collect();
            // The rotation's rounding can move a value across a rounding
            // boundary of the cache type: a step of it at most.
            let ktol = match t {
                KvType::F32 => 2e-6,
                KvType::F16 => 1e-3,
                _ => 1e-2,
            };
            close(
                &format!("attention_seqs {t} K cache of sequence {i}"),
                &cache_rows(b, &kcs[i], caps[i], kw),
                &kref,
                ktol,
            );
            let vref: Vec<f64> = vc.iter().map(|&x| x as f64).collect();
            close(
                &format!("attention_seqs {t} V cache of sequence {i}"),
                &cache_rows(b, &vcs[i], caps[i], kw),
                &vref,
                0.0,
            );
        }
        close(
            &format!("attention_seqs {t} {ns:?} at {pos:?}, {h}/{kv} heads of {hd}, rope {rot_off}+{rot} il={il}"),
            &got,
            &want,
            if t == KvType::F32 { 5e-6 } else { 2e-3 },
        );
    }
}

pub fn check_gated_delta_seqs<B: Backend>(b: &B) {
    let mut rng = Rng::new(22);
    let many: Vec<usize> = (0..18).map(|i| 1 + i % 3).collect();
    // A prefill chunk of 40 tokens takes the scan path on CUDA; one token
    // of each of 6 sequences (a batched decode step), with conv channels
    // in two of the CPU's blocks, takes the CPU's all-at-once passes.
    for (ns, (hk, hv, dk, dv, kern)) in [
        (vec![1, 3, 40, 1], (2, 4, 16, 8, 4)),
        (many, (1, 2, 32, 16, 3)),
        (vec![1; 6], (2, 4, 64, 128, 4)),
    ] {
        let sg = segs(&ns, &vec![0; ns.len()]);
        let n: usize = ns.iter().sum();
        let cd = 2 * hk * dk + hv * dv;
        let conv_w = rng.vec(cd * kern, 0.6);
        let a_log = rng.vec(hv, 1.0);
        let dt_bias = rng.vec(hv, 1.0);
        let qkv = rng.vec(n * cd, 2.0);
        let (av, bv) = (rng.vec(n * hv, 2.0), rng.vec(n * hv, 2.0));
        let conv0: Vec<Vec<f32>> = sg.iter().map(|_| rng.vec((kern - 1) * cd, 1.0)).collect();
        let ssm0: Vec<Vec<f32>> = sg.iter().map(|_| rng.vec(hv * dv * dk, 0.5)).collect();
        let mut convs: Vec<B::Buf> = conv0.iter().map(|c| up(b, c)).collect();
        let mut ssms: Vec<B::Buf> = ssm0.iter().map(|c| up(b, c)).collect();
        let (cw, al, dtb) = (up(b, &conv_w), up(b, &a_log), up(b, &dt_bias));
        let args = DeltaArgs {
            n,
            k_heads: hk,
            v_heads: hv,
            k_dim: dk,
            v_dim: dv,
            kernel: kern,
        };
        let w = DeltaWeights::<B> {
            conv_w: &cw,
            a_log: &al,
            dt_bias: &dtb,
        };
        let (mut qb, mut ab, mut bb) = (up(b, &qkv), up(b, &av), up(b, &bv));
        let mut out = b.alloc(n * hv * dv).expect("alloc");
        let mut states: Vec<_> = convs.iter_mut().zip(ssms.iter_mut()).collect();
        b.gated_delta_seqs(&mut qb, &mut ab, &mut bb, w, &mut states, &sg, args, &mut out)
            .expect("gated_delta_seqs");
        drop(states);
        let got = run(b, &out, n * hv * dv);
        let mut want = Vec::with_capacity(n * hv * dv);
        for (i, s) in sg.iter().enumerate() {
            let (r0, r1) = (s.off, s.off + s.n);
            let din = reference::DeltaIn {
                qkv: &qkv[r0 * cd..r1 * cd],
                a: &av[r0 * hv..r1 * hv],
                b: &bv[r0 * hv..r1 * hv],
                conv_w: &conv_w,
                a_log: &a_log,
                dt_bias: &dt_bias,
            };
            let mut conv: Vec<f64> = conv0[i].iter().map(|&x| x as f64).collect();
            let mut ssm: Vec<f64> = ssm0[i].iter().map(|&x| x as f64).collect();
            want.extend(reference::gated_delta(
                &din,
                &mut conv,
                &mut ssm,
                DeltaArgs { n: s.n, ..args },
            ));
            close(
                &format!("gated_delta_seqs conv state of sequence {i}"),
                &run(b, &convs[i], conv.len()),
                &conv,
                0.0,
            );
            close(
                &format!("gated_delta_seqs ssm state of sequence {i}"),
                &run(b, &ssms[i], ssm.len()),
                &ssm,
                5e-6,
            );
        }
        close(&format!("gated_delta_seqs {ns:?}"), &got, &want, 5e-6);
    }
}
