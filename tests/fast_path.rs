//! The CPU fast path (SPEC §6): one-token quantized products with the
//! activations rounded to 16-bit integers (AVX-512 VNNI) against the exact
//! f32 products, on every golden fixture — as the golden test converts it,
//! and float fixtures also quantized at 2, 4 and 8 bits. Token by token
//! (decode) and as one chunk (prefill), the logits stay within 2e-3
//! (relative L2) of the exact path's and of transformers' (where the
//! weights are the reference's), the argmax agrees at every position, and
//! greedy decoding gives transformers' tokens. On a CPU without VNNI the
//! fast path is the exact one, and the test says so.

mod common;

use common::*;
use moeflux::backend::cpu::matmul::Kernel;
use moeflux::{Device, Model, Options};

const FAST_TOL: f64 = 2e-3;

fn open(dir: &std::path::Path, exact: bool) -> Model {
    let opts = Options {
        device: Device::Cpu,
        exact,
        ..Options::default()
    };
    Model::open(dir, &opts).expect("open converted model")
}

/// Greedy tokens after `prompt`, `n` of them, one token per step.
fn greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = model.session().unwrap();
    let mut logits = s.eval_prompt(prompt, 0).unwrap();
    let mut out = Vec::new();
    for i in 0..n {
        let t = argmax(&logits) as u32;
        out.push(t);
        if i + 1 < n {
            logits = s.eval_token(t, prompt.len() + i).unwrap();
        }
    }
    out
}

fn check(name: &str, flags: &[&str]) {
    let fast_kernel = Kernel::detect_fast();
    if fast_kernel.is_exact() {
        eprintln!(
            "{name}: this CPU has no fast kernel ({}); the fast path is the exact one",
            fast_kernel.name()
        );
    }
    let r = reference(name);
    let float_source = flags == ["--bits", "16"];
    let mut variants: Vec<Vec<&str>> = vec![flags.to_vec()];
    if float_source {
        variants.extend([
            vec!["--bits", "4"],
            vec!["--bits", "8"],
            vec!["--bits", "2"],
            vec!["--bits", "2", "--group-size", "128"],
        ]);
    }
    for v in variants {
        let what = format!("{name} {}", v.join(" "));
        let dir = packed_with(name, &v);
        let (exact, fast) = (open(&dir, true), open(&dir, false));
        assert_eq!(fast.cpu_kernel(), Some(fast_kernel), "{what}: the kernel opened");
        // The reference's weights: the golden conversion.
        let is_reference = v == flags;
        let (mut se, mut sf) = (exact.session().unwrap(), fast.session().unwrap());
        let (mut worst, mut differs) = (0.0f64, false);
        for (pos, &t) in r.tokens.iter().enumerate() {
            let e = se.eval_token(t, pos).unwrap();
            let f = sf.eval_token(t, pos).unwrap();
            let err = rel_l2(&f, &e);
            worst = worst.max(err);
            assert!(
                err <= FAST_TOL,
                "{what}: position {pos}: fast vs exact relative L2 {err:.3e}"
            );
            assert_eq!(
                argmax(&f),
                argmax(&e),
                "{what}: argmax differs from the exact path at {pos}"
            );
            if is_reference {
                let want = &r.logits[pos];
                let err = rel_l2(&f, want);
                assert!(
                    err <= FAST_TOL,
                    "{what}: position {pos}: fast vs transformers {err:.3e}"
                );
                assert_eq!(
                    argmax(&f),
                    argmax(want),
                    "{what}: argmax differs from transformers at {pos}"
                );
            }
            differs |= f != e;
        }
        // The whole sequence as one chunk (the multi-token fast kernel).
        let all_e = exact.session().unwrap().eval_all(&r.tokens, 0).unwrap();
        let all_f = fast.session().unwrap().eval_all(&r.tokens, 0).unwrap();
        let vocab = fast.n_vocab();
        for (pos, (f, e)) in all_f.chunks_exact(vocab).zip(all_e.chunks_exact(vocab)).enumerate() {
            let err = rel_l2(f, e);
            worst = worst.max(err);
            assert!(
                err <= FAST_TOL,
                "{what}: chunk position {pos}: fast vs exact relative L2 {err:.3e}"
            );
            assert_eq!(
                argmax(f),
                argmax(e),
                "{what}: chunk argmax differs from the exact path at {pos}"
            );
            if is_reference {
                let err = rel_l2(f, &r.logits[pos]);
                assert!(
                    err <= FAST_TOL,
                    "{what}: chunk position {pos}: fast vs transformers {err:.3e}"
                );
            }
            differs |= f != e;
        }
        eprintln!("{what}: fast vs exact, worst relative L2 {worst:.2e}");
        // Quantized weights of whole 32-byte groups go through the fast
        // kernel where the CPU has one: its logits are not the exact ones.
        if !fast_kernel.is_exact() && v != ["--bits", "16"] {
            assert!(
                differs,
                "{what}: the fast path gave the exact logits (did its kernel run?)"
            );
        }
        let n = r.greedy_tokens.len();
        let got = greedy(&fast, &r.greedy_prompt, n);
        if is_reference {
            assert_eq!(got, r.greedy_tokens, "{what}: greedy tokens differ from transformers");
        } else {
            assert_eq!(
                got,
                greedy(&exact, &r.greedy_prompt, n),
                "{what}: greedy tokens differ from the exact path"
            );
        }
    }
}

golden_fixture_tests!(check);
