//! The session rules of SPEC.md §3–4, each with a test: explicit positions,
//! snapshots that validate before they change anything, checkpoints with
//! their eviction rules, truncation that is correct for recurrent layers,
//! and several sessions over one model.

mod common;

use common::*;
use moeflux::{Device, Error, Model, Options};
use std::path::PathBuf;
use std::sync::OnceLock;

/// Convert each fixture once per test binary.
fn packed(name: &'static str) -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let root = DIR.get_or_init(|| tempfile::tempdir().unwrap());
    let dst = root.path().join(name);
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap();
    if !dst.exists() {
        convert(name, &dst, &["--bits", "16"]);
    }
    dst
}

fn open(name: &'static str) -> Model {
    let opts = Options {
        device: Device::Cpu,
        ..Options::default()
    };
    Model::open(&packed(name), &opts).unwrap()
}

const TOKENS: [u32; 10] = [3, 101, 57, 402, 260, 19, 333, 0, 488, 150];

fn snapshot(s: &moeflux::Session) -> Vec<u8> {
    let mut b = Vec::new();
    s.save_state(&mut b).unwrap();
    b
}

#[test]
fn positions_must_be_contiguous_and_tokens_in_vocab() {
    let m = open("qwen3_moe");
    let mut s = m.session().unwrap();
    assert!(matches!(
        s.eval_token(5, 1),
        Err(Error::Position { expected: 0, got: 1 })
    ));
    s.eval_prompt(&TOKENS[..3], 0).unwrap();
    assert!(matches!(
        s.eval_token(5, 2),
        Err(Error::Position { expected: 3, got: 2 })
    ));
    let e = s.eval_token(512, 3).unwrap_err();
    assert!(matches!(e, Error::TokenOutOfRange { token: 512, vocab: 512 }), "{e}");
    assert_eq!(s.pos(), 3);
}

fn roundtrip_continues_identically(name: &'static str) {
    let m = open(name);
    let mut a = m.session().unwrap();
    a.eval_prompt(&TOKENS[..6], 0).unwrap();
    let snap = snapshot(&a);
    assert_eq!(snap.len(), a.state_size());
    let want = a.eval_prompt(&TOKENS[6..], 6).unwrap();

    let mut b = m.session().unwrap();
    b.load_state(&snap).unwrap();
    assert_eq!(b.pos(), 6);
    let got = b.eval_prompt(&TOKENS[6..], 6).unwrap();
    assert!(rel_l2(&got, &want) <= 1e-5, "{name}: {}", rel_l2(&got, &want));
}

#[test]
fn save_load_roundtrip_gqa_and_recurrent() {
    roundtrip_continues_identically("qwen3_next");
}

#[test]
fn save_load_roundtrip_mla() {
    roundtrip_continues_identically("deepseek_v3");
}

#[test]
fn corrupt_or_truncated_snapshot_leaves_the_session_unchanged() {
    let m = open("qwen3_next");
    let mut donor = m.session().unwrap();
    donor.eval_prompt(&TOKENS[..5], 0).unwrap();
    let good = snapshot(&donor);

    let mut s = m.session().unwrap();
    s.eval_prompt(&TOKENS[..3], 0).unwrap();
    let before = snapshot(&s);

    let mut bad_magic = good.clone();
    bad_magic[0] ^= 0xFF;
    let mut bad_field = good.clone();
    bad_field[8] ^= 1; // num_layers
    let mut trailing = good.clone();
    trailing.push(0);
    let mut bad_len = good.clone();
    // The first full-attention layer's length (layer 1 of [L,F,L,L,F]) is
    // after the header and layer 0's recurrent record.
    let h = |i: usize| u32::from_le_bytes(good[8 + 4 * i..12 + 4 * i].try_into().unwrap()) as usize;
    let off = 40 + h(4) + h(5);
    bad_len[off..off + 4].copy_from_slice(&99999i32.to_le_bytes());
    for (what, buf) in [
        ("truncated", &good[..good.len() - 7]),
        ("empty", &good[..0]),
        ("bad magic", &bad_magic[..]),
        ("header field", &bad_field[..]),
        ("trailing bytes", &trailing[..]),
        ("length past the end", &bad_len[..]),
    ] {
        let e = s.load_state(buf).unwrap_err();
        assert_eq!(
            snapshot(&s),
            before,
            "{what}: the session changed after a failed load ({e})"
        );
        assert_eq!(s.pos(), 3);
    }
    let e = s.load_state(&bad_field).unwrap_err().to_string();
    assert!(e.contains("num_layers"), "{e}");
    // And the session still works.
    s.eval_token(TOKENS[3], 3).unwrap();
}

#[test]
fn version_1_snapshot_is_accepted_without_mla_and_refused_with_it() {
    let m = open("qwen3_next");
    let mut s = m.session().unwrap();
    s.eval_prompt(&TOKENS[..4], 0).unwrap();
    let v2 = snapshot(&s);
    // Version 1: eight-word header (no MLA fields), same records.
    let mut v1 = v2[..8].to_vec();
    v1[4..8].copy_from_slice(&1u32.to_le_bytes());
    v1.extend_from_slice(&v2[8..32]);
    v1.extend_from_slice(&v2[40..]);
    let want = s.eval_token(TOKENS[4], 4).unwrap();
    let mut t = m.session().unwrap();
    t.load_state(&v1).unwrap();
    let got = t.eval_token(TOKENS[4], 4).unwrap();
    assert!(rel_l2(&got, &want) <= 1e-6);

    let ds = open("deepseek_v3");
    let mut d = ds.session().unwrap();
    assert!(d.load_state(&v1).is_err());
    d.eval_prompt(&TOKENS[..2], 0).unwrap();
    let mut v1d = snapshot(&d)[..8].to_vec();
    v1d[4..8].copy_from_slice(&1u32.to_le_bytes());
    let e = d.load_state(&v1d).unwrap_err().to_string();
    assert!(e.contains("version 1") && e.contains("MLA"), "{e}");
}

#[test]
fn checkpoints_follow_the_lru_rules() {
    let m = open("qwen3_moe");
    let mut s = m.session().unwrap();
    s.set_max_checkpoints(3);
    s.checkpoint(0).unwrap();
    for (p, &t) in TOKENS[..5].iter().enumerate() {
        s.eval_token(t, p).unwrap();
        s.checkpoint(p + 1).unwrap();
    }
    // Stored 0,1,2,3,4,5 with cap 3: 0 is never evicted; the oldest others go.
    assert_eq!(s.checkpoints(), vec![0, 4, 5]);
    // Storing an existing position refreshes it instead of adding one.
    s.checkpoint(5).unwrap();
    assert_eq!(s.checkpoints(), vec![0, 4, 5]);
    // Truncation drops the checkpoints above the cut; the next one fits.
    s.truncate(4).unwrap();
    assert_eq!(s.checkpoints(), vec![0, 4]);
    s.eval_token(TOKENS[4], 4).unwrap();
    s.eval_token(TOKENS[5], 5).unwrap();
    s.checkpoint(6).unwrap();
    assert_eq!(s.checkpoints(), vec![0, 4, 6]);
    // Past the cap the least recently stored other than 0 and the new one goes.
    s.eval_token(TOKENS[6], 6).unwrap();
    s.checkpoint(7).unwrap();
    assert_eq!(s.checkpoints(), vec![0, 6, 7]);
    // Storing at a position other than the current one is an error.
    assert!(matches!(s.checkpoint(3), Err(Error::Position { .. })));
    // restore needs an exact key and drops the checkpoints above it.
    assert!(matches!(s.restore(5), Err(Error::CheckpointMissing(5))));
    s.restore(6).unwrap();
    assert_eq!(s.pos(), 6);
    assert_eq!(s.checkpoints(), vec![0, 6]);
    s.forget(6).unwrap();
    assert_eq!(s.checkpoints(), vec![0]);
    assert!(s.forget(6).is_err());
}

#[test]
fn restore_then_continue_equals_never_leaving() {
    let m = open("qwen3_next");
    let mut s = m.session().unwrap();
    s.eval_prompt(&TOKENS[..4], 0).unwrap();
    s.checkpoint(4).unwrap();
    let want = s.eval_prompt(&TOKENS[4..], 4).unwrap();
    s.restore(4).unwrap();
    let got = s.eval_prompt(&TOKENS[4..], 4).unwrap();
    assert_eq!(got, want);
}

#[test]
fn truncate_with_recurrent_layers_re_evaluates_from_a_checkpoint() {
    let m = open("qwen3_next");
    // Reference: the prefix [0,5) then a different continuation.
    let alt = [7u32, 8, 9];
    let mut r = m.session().unwrap();
    r.eval_prompt(&TOKENS[..5], 0).unwrap();
    let want = r.eval_prompt(&alt, 5).unwrap();

    // With a checkpoint at 3 the gap [3,5) is re-evaluated.
    let mut s = m.session().unwrap();
    s.eval_prompt(&TOKENS[..3], 0).unwrap();
    s.checkpoint(3).unwrap();
    s.eval_prompt(&TOKENS[3..], 3).unwrap();
    s.truncate(5).unwrap();
    assert_eq!(s.pos(), 5);
    let got = s.eval_prompt(&alt, 5).unwrap();
    assert!(rel_l2(&got, &want) <= 1e-5, "{}", rel_l2(&got, &want));

    // Without checkpoints, from the remembered tokens.
    let mut s = m.session().unwrap();
    s.eval_prompt(&TOKENS, 0).unwrap();
    s.truncate(5).unwrap();
    let got = s.eval_prompt(&alt, 5).unwrap();
    assert!(rel_l2(&got, &want) <= 1e-5);

    // After load_state the tokens are unknown: no checkpoint → typed error.
    let mut donor = m.session().unwrap();
    donor.eval_prompt(&TOKENS, 0).unwrap();
    let mut s = m.session().unwrap();
    s.load_state(&snapshot(&donor)).unwrap();
    assert!(matches!(s.truncate(5), Err(Error::NoCheckpoint { pos: 5 })));
    assert_eq!(s.pos(), TOKENS.len());
}

#[test]
fn truncate_attention_only_cuts_the_cache() {
    let m = open("deepseek_v3");
    let mut r = m.session().unwrap();
    r.eval_prompt(&TOKENS[..4], 0).unwrap();
    let want = r.eval_token(42, 4).unwrap();
    let mut s = m.session().unwrap();
    s.eval_prompt(&TOKENS, 0).unwrap();
    s.truncate(4).unwrap();
    let got = s.eval_token(42, 4).unwrap();
    assert!(rel_l2(&got, &want) <= 1e-6);
}

#[test]
fn sessions_share_a_model() {
    let m = open("qwen3_next");
    let mut a = m.session().unwrap();
    let mut b = m.session().unwrap();
    let mut solo = m.session().unwrap();
    let want: Vec<Vec<f32>> = TOKENS
        .iter()
        .enumerate()
        .map(|(p, &t)| solo.eval_token(t, p).unwrap())
        .collect();
    for (p, &t) in TOKENS.iter().enumerate() {
        let la = a.eval_token(t, p).unwrap();
        // b runs a different sequence in between.
        b.eval_token((t + 1) % 512, p).unwrap();
        assert_eq!(la, want[p]);
    }
}

#[test]
fn chunked_prefill_matches_token_by_token() {
    for name in ["qwen3_next", "deepseek_v3", "qwen3_moe"] {
        let m = open(name);
        let mut one = m.session().unwrap();
        let mut last = Vec::new();
        for (p, &t) in TOKENS.iter().enumerate() {
            last = one.eval_token(t, p).unwrap();
        }
        for chunk in [3, 4, 100] {
            let mut s = m.session().unwrap();
            s.set_chunk_size(chunk);
            let got = s.eval_prompt(&TOKENS, 0).unwrap();
            assert!(
                rel_l2(&got, &last) <= 1e-5,
                "{name} chunk {chunk}: {}",
                rel_l2(&got, &last)
            );
        }
    }
}
