//! `moeflux convert FILE.gguf`: a tiny Qwen3-MoE written as GGUF the way
//! llama.cpp's converter writes one (tools/make_gguf_models.py), converted
//! and run on the CPU, against transformers on gguf-py's dequantization of
//! the same file (SPEC.md §6: relative L2 ≤ 1e-4, equal argmax, greedy
//! tokens equal).

mod common;

use common::*;
use moeflux::{Device, Model, Options};
use std::path::Path;

fn convert_gguf(name: &str, dst: &Path, flags: &[&str]) -> std::process::Output {
    moeflux()
        .arg("convert")
        .arg(fixture(&format!("gguf_models/{name}/model.gguf")))
        .arg(dst)
        .args(flags)
        .output()
        .expect("run moeflux convert")
}

fn open(dir: &Path) -> Model {
    let opts = Options {
        device: Device::Cpu,
        exact: true,
        ..Options::default()
    };
    Model::open(dir, &opts).expect("open the converted model")
}

/// Worst relative L2 over the golden positions, after checking argmax.
fn worst_error(model: &Model, name: &str) -> f64 {
    let r = reference(&format!("gguf_models/{name}"));
    let vocab = model.n_vocab();
    let all = model.session().unwrap().eval_all(&r.tokens, 0).unwrap();
    let mut worst = 0.0f64;
    for (pos, want) in r.logits.iter().enumerate() {
        let got = &all[pos * vocab..(pos + 1) * vocab];
        worst = worst.max(rel_l2(got, want));
        assert_eq!(argmax(got), argmax(want), "{name}: argmax differs at position {pos}");
    }
    worst
}

fn exact(name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("packed");
    let out = convert_gguf(name, &dst, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let model = open(&dst);
    let worst = worst_error(&model, name);
    eprintln!("{name}: worst relative L2 {worst:.2e}");
    assert!(worst <= 1e-4, "{name}: relative L2 {worst:.3e}");
    // Greedy tokens of transformers' generate.
    let r = reference(&format!("gguf_models/{name}"));
    let mut s = model.session().unwrap();
    let prompt = &r.greedy_prompt;
    let mut logits = s.eval_all(prompt, 0).unwrap();
    let vocab = model.n_vocab();
    let mut got = Vec::new();
    for pos in prompt.len()..prompt.len() + r.greedy_tokens.len() {
        let last = &logits[logits.len() - vocab..];
        let t = argmax(last) as u32;
        got.push(t);
        logits = s.eval_token(t, pos).unwrap();
    }
    assert_eq!(got, r.greedy_tokens, "{name}: greedy tokens");
    // The tokenizer and chat template came from the file.
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "chat_template.jinja",
    ] {
        assert!(dst.join(f).is_file(), "{name}: no {f}");
    }
}

#[test]
fn q8_0_is_kept_bit_for_bit() {
    exact("qwen3_moe_q8_0");
}

#[test]
fn q4_0_is_kept_bit_for_bit() {
    exact("qwen3_moe_q4_0");
}

/// Q5_0 is refused by name, then converted with `--requantize 8`, which
/// the output says.
#[test]
fn other_block_formats_need_requantize() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("packed");
    let out = convert_gguf("qwen3_moe_q5_0", &dst, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "Q5_0 converted without --requantize");
    assert!(
        err.contains("Q5_0") && err.contains("ffn_") && err.contains("--requantize"),
        "{err}"
    );
    assert!(!dst.exists(), "a refused conversion left {}", dst.display());
    let out = convert_gguf("qwen3_moe_q5_0", &dst, &["--requantize", "8"]);
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("requantized to 8-bit"), "{text}");
    // 8-bit affine weights of 5-bit values: close to the file's own.
    let worst = worst_error(&open(&dst), "qwen3_moe_q5_0");
    eprintln!("qwen3_moe_q5_0 --requantize 8: worst relative L2 {worst:.2e}");
    assert!(worst <= 2e-2, "relative L2 {worst:.3e}");
}

/// `run --model FILE.gguf` says how to convert it, rather than failing on
/// a missing config.json.
#[test]
fn running_a_gguf_file_names_the_conversion() {
    let out = moeflux()
        .args(["run", "--device", "cpu", "-n", "1", "--prompt", "hi", "--model"])
        .arg(fixture("gguf_models/qwen3_moe_q8_0/model.gguf"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("GGUF file") && err.contains("moeflux convert"), "{err}");
}
