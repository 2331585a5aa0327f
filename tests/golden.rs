//! Golden tests: each fixture (a tiny random model saved by transformers or
//! mlx-lm, see tests/fixtures/README.md) is converted, evaluated on the CPU,
//! and compared with the logits transformers computed on the same weights
//! (SPEC.md §6: relative L2 ≤ 1e-4 and equal argmax at every position).

mod common;

use common::*;
use moeflux::{Device, Model, Options};

const CPU_TOL: f64 = 1e-4;

fn open(dir: &std::path::Path) -> Model {
    let opts = Options {
        device: Device::Cpu,
        exact: true,
        ..Options::default()
    };
    Model::open(dir, &opts).expect("open converted model")
}

fn check(name: &str, flags: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("packed");
    convert(name, &dst, flags);
    let r = reference(name);
    let model = open(&dst);
    let vocab = model.n_vocab();

    // The whole sequence as one chunk.
    let mut s = model.session().unwrap();
    let all = s.eval_all(&r.tokens, 0).unwrap();
    assert_eq!(
        all.len(),
        r.logits.len() * vocab,
        "{name}: one row of logits per position"
    );
    let mut worst = 0.0f64;
    for (pos, want) in r.logits.iter().enumerate() {
        let got = &all[pos * vocab..(pos + 1) * vocab];
        let e = rel_l2(got, want);
        worst = worst.max(e);
        assert!(
            e <= CPU_TOL,
            "{name}: position {pos}: relative L2 {e:.3e} > {CPU_TOL:e}"
        );
        assert_eq!(argmax(got), argmax(want), "{name}: argmax differs at position {pos}");
    }

    eprintln!(
        "{name}: worst relative L2 over {} positions: {worst:.2e}",
        r.logits.len()
    );

    // Token by token gives the same logits as the chunk.
    let mut s = model.session().unwrap();
    for (pos, &t) in r.tokens.iter().enumerate() {
        let got = s.eval_token(t, pos).unwrap();
        let chunk = &all[pos * vocab..(pos + 1) * vocab];
        let e = rel_l2(&got, chunk);
        assert!(e <= 1e-5, "{name}: token-by-token vs chunk at position {pos}: {e:.3e}");
    }
}

golden_fixture_tests!(check);

/// Experts read with O_DIRECT through a RAM tier that holds 60% of
/// them, and read ahead of need in prompts and in decode, give the logits
/// of the default reads, bit for bit, and the tier serves some of them.
#[test]
fn a_ram_tier_over_direct_reads_changes_no_logit() {
    use moeflux::experts::{CacheSize, IoMode};
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("packed");
    convert("qwen3_moe_mlx4", &dst, &[]);
    let r = reference("qwen3_moe_mlx4");
    let want = open(&dst).session().unwrap().eval_all(&r.tokens, 0).unwrap();
    let opts = Options {
        device: Device::Cpu,
        exact: true,
        io_mode: IoMode::Direct,
        ram_cache: CacheSize::Percent(60.0),
        ..Options::default()
    };
    let tiered = Model::open(&dst, &opts).expect("open with a RAM tier");
    for round in 0..2 {
        let got = tiered.session().unwrap().eval_all(&r.tokens, 0).unwrap();
        let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same && got.len() == want.len(), "round {round}: logits differ");
    }
    let ram = tiered.ram_stats().expect("a RAM tier");
    assert!(ram.hits > 0 && ram.misses > 0, "{ram:?}");
    // Those were prompts (one pass of every token): each MoE layer read the
    // next one's guesses for all of them ahead (where the filesystem takes
    // O_DIRECT), and some were used.
    let store = tiered.expert_store();
    if store.mode() == IoMode::Direct && store.layout().layers.len() >= 2 {
        let ahead = store.ahead_stats().expect("reads ahead are on with O_DIRECT");
        assert!(
            ahead.read > 0 && ahead.used > 0,
            "a prompt read nothing ahead: {ahead:?}"
        );
    }
    // Token by token, the next layer's guesses are read ahead (where the
    // filesystem takes O_DIRECT): the same bits as the default reads.
    let plain = open(&dst);
    let (mut a, mut b) = (plain.session().unwrap(), tiered.session().unwrap());
    for (pos, &t) in r.tokens.iter().enumerate() {
        let (x, y) = (a.eval_token(t, pos).unwrap(), b.eval_token(t, pos).unwrap());
        assert!(
            x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
            "position {pos}: logits differ"
        );
    }
    if store.mode() == IoMode::Direct {
        let ahead = store.ahead_stats().expect("reads ahead are on with O_DIRECT");
        // (Whether the tiny fixture's guesses are right is its routers'
        // business; tests/experts.rs checks that used ones are taken.)
        assert!(ahead.read > 0, "{ahead:?}");
    }
}
