//! The logits over each KV cache type against transformers' on a golden
//! fixture: shared by tests/kv_types.rs (CPU) and tests/cuda_golden.rs.

use super::*;
use moeflux::backend::KvType;
use moeflux::{Device, Model, Options};

/// Relative L2 of the logits: f16 at every position, the others at the
/// median position.
pub fn kv_tolerance(t: KvType) -> f64 {
    match t {
        KvType::F32 => 1e-4,
        KvType::F16 => 2e-3,
        KvType::Bf16 => 1e-2,
        KvType::Q8_0 => 2e-2,
    }
}

fn open(dir: &std::path::Path, t: KvType, device: Device) -> moeflux::Result<Model> {
    let opts = Options {
        device,
        exact: true,
        cache_type_k: Some(t),
        cache_type_v: Some(t),
        ..Options::default()
    };
    Model::open(dir, &opts)
}

/// Fixture `name` converted with `flags`, on `device`, over each cache
/// type: see tests/kv_types.rs.
pub fn check_kv_types(name: &str, flags: &[&str], device: Device) {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("packed");
    convert(name, &dst, flags);
    let r = reference(name);
    for t in [KvType::F16, KvType::Bf16, KvType::Q8_0] {
        let model = match open(&dst, t, device) {
            Ok(m) => m,
            // q8_0 needs heads of whole blocks of 32: the open says so.
            Err(e) => {
                assert!(
                    t == KvType::Q8_0 && e.to_string().contains("blocks of 32"),
                    "{name} {t}: {e}"
                );
                eprintln!("{name}: {t} refused: {e}");
                continue;
            }
        };
        let vocab = model.n_vocab();
        let mut s = model.session().unwrap();
        let all = s.eval_all(&r.tokens, 0).unwrap();
        let mut t_by_t = model.session().unwrap();
        let mut worst = 0.0f64;
        let mut errs = Vec::new();
        for (pos, want) in r.logits.iter().enumerate() {
            let got = &all[pos * vocab..(pos + 1) * vocab];
            let step = t_by_t.eval_token(r.tokens[pos], pos).unwrap();
            for (how, g) in [("chunk", got), ("token by token", &step[..])] {
                let e = rel_l2(g, want);
                worst = worst.max(e);
                errs.push(e);
                if t == KvType::F16 {
                    assert!(
                        e <= kv_tolerance(t),
                        "{name} {t} ({how}): position {pos}: relative L2 {e:.3e} > {:e}",
                        kv_tolerance(t)
                    );
                    assert_eq!(argmax(g), argmax(want), "{name} {t} ({how}): argmax differs at {pos}");
                }
            }
        }
        errs.sort_by(f64::total_cmp);
        let median = errs[errs.len() / 2];
        eprintln!(
            "{name}: {t} cache, relative L2 over {} positions: median {median:.2e}, worst {worst:.2e}",
            r.logits.len()
        );
        assert!(median <= kv_tolerance(t), "{name} {t}: median relative L2 {median:.3e}");
    }
}
