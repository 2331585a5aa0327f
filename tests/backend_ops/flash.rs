//! The CUDA attention of prefill chunks on tensor cores (`cuda/flash.rs`:
//! q, k, v and the probabilities split into two bf16 parts, f32 sums)
//! against the f64 reference: one sequence (`attention`) and the rows of
//! several (`attention_seqs`, decode rows beside prefill chunks). Where it
//! runs, its result is not the f32 kernel's bits (so the test knows it
//! ran); sequences of fewer than 16 rows and heads it does not take give
//! the f32 kernel's bits.

use super::reference;
use super::seqs::segs;
use super::util::{close, Rng};
use super::{attn_args, cache, run, up};
use moeflux::backend::cuda::CudaBackend;
use moeflux::backend::{AttnArgs, AttnSeqs, Backend, KvType, Rotary};

/// The op tolerance of the tiled attention (about 2^-16 per product).
const FA_TOL: f64 = 3e-5;

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

pub fn check_attention_tc(b: &CudaBackend, exact: &CudaBackend) {
    let mut rng = Rng::new(31);
    // (rows, first position, heads, KV heads, head_dim, tiled kernel)
    let cases = [
        (64, 0, 4, 2, 128, true),
        (100, 37, 8, 2, 64, true),
        (40, 0, 4, 1, 256, true),
        (17, 300, 2, 2, 128, true),
        (130, 5, 6, 3, 64, true),
        (15, 20, 4, 2, 128, false),
        (48, 0, 4, 2, 32, false),
    ];
    for (n, pos0, h, hkv, d, tiled) in cases {
        let cap = pos0 + n + 3;
        let q = rng.vec(n * h * d, 2.0);
        let k = rng.vec(cap * hkv * d, 2.0);
        let v = rng.vec(cap * hkv * d, 1.0);
        let a = attn_args(n, pos0, (h, hkv), (d, d));
        for t in [KvType::F32, KvType::F16, KvType::Bf16, KvType::Q8_0] {
            let attend = |be: &CudaBackend| {
                let ((kc, kh), (vc, vh)) = (cache(be, t, &k, hkv * d), cache(be, t, &v, hkv * d));
                let mut out = be.alloc(n * h * d).expect("alloc");
                be.attention(&up(be, &q), &kc, &vc, a, &mut out).expect("attention");
                (run(be, &out, n * h * d), kh, vh)
            };
            let ((got, kh, vh), (f32s, _, _)) = (attend(b), attend(exact));
            let what = format!("attention on tensor cores over a {t} cache {a:?}");
            close(&what, &got, &reference::attention(&q, &kh, &vh, a), FA_TOL);
            assert_eq!(!same_bits(&got, &f32s), tiled, "{what}: tiled kernel ran: {}", !tiled);
        }
    }
    check_mixed(b, exact, &mut rng);
}

/// A batched call: two prefill chunks (one of them after cached
/// positions) beside decode rows; the chunks take the tiled kernel, the
/// decode rows the f32 one (their bits equal the exact backend's).
fn check_mixed(b: &CudaBackend, exact: &CudaBackend, rng: &mut Rng) {
    let (h, kv, d) = (8, 2, 128);
    let (ns, pos) = ([1usize, 70, 2, 33], [9usize, 0, 4, 50]);
    let segs = segs(&ns, &pos);
    let n: usize = ns.iter().sum();
    let (qw, kw) = (h * d, kv * d);
    let (q, k, v) = (rng.vec(n * qw, 2.0), rng.vec(n * kw, 2.0), rng.vec(n * kw, 1.0));
    let caches0: Vec<(Vec<f32>, Vec<f32>)> = segs
        .iter()
        .map(|s| {
            let cap = s.pos0 + s.n;
            (rng.vec(cap * kw, 2.0), rng.vec(cap * kw, 1.0))
        })
        .collect();
    let attn = attn_args(n, 0, (h, kv), (d, d));
    let attend = |be: &CudaBackend| {
        let (mut qb, mut kb, vb, fb) = (up(be, &q), up(be, &k), up(be, &v), up(be, &[0.0]));
        let mut bufs: Vec<_> = caches0
            .iter()
            .map(|(kc, vc)| (cache(be, KvType::F32, kc, kw).0, cache(be, KvType::F32, vc, kw).0))
            .collect();
        let mut caches: Vec<_> = bufs.iter_mut().map(|(kc, vc)| (kc, vc)).collect();
        let x = AttnSeqs {
            q: &mut qb,
            k: &mut kb,
            v: &vb,
            inv_freq: &fb,
            rope: Rotary {
                rot_off: 0,
                rot_dim: 0,
                interleaved: false,
                mscale: 1.0,
            },
            attn,
        };
        let mut out = be.alloc(n * qw).expect("alloc");
        be.attention_seqs(x, &mut caches, &segs, &mut out)
            .expect("attention_seqs");
        run(be, &out, n * qw)
    };
    let (got, f32s) = (attend(b), attend(exact));
    let mut want = Vec::with_capacity(n * qw);
    for (s, (kc, vc)) in segs.iter().zip(&caches0) {
        let (mut kc, mut vc) = (kc.clone(), vc.clone());
        kc[s.pos0 * kw..].copy_from_slice(&k[s.off * kw..(s.off + s.n) * kw]);
        vc[s.pos0 * kw..].copy_from_slice(&v[s.off * kw..(s.off + s.n) * kw]);
        let a = AttnArgs {
            n: s.n,
            pos0: s.pos0,
            ..attn
        };
        want.extend(reference::attention(&q[s.off * qw..(s.off + s.n) * qw], &kc, &vc, a));
    }
    close(
        &format!("attention_seqs on tensor cores {ns:?} at {pos:?}"),
        &got,
        &want,
        FA_TOL,
    );
    for s in &segs {
        let rows = s.off * qw..(s.off + s.n) * qw;
        let tiled = s.n >= 16;
        assert_eq!(
            !same_bits(&got[rows.clone()], &f32s[rows]),
            tiled,
            "attention_seqs sequence of {} rows: tiled kernel ran: {}",
            s.n,
            !tiled
        );
    }
}
