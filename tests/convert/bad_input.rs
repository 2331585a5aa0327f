//! Bad input: a clear message naming the file, tensor or field, and
//! nothing written (no `DST`, no temp dir; an existing `DST` untouched).

use super::synthetic::*;
use super::{builders, fixture};
use moeflux::format::convert::{convert, ConvertOptions};
use std::path::Path;

/// No `DST` and no `DST.tmp-*` beside it.
fn assert_nothing_written(dst: &Path) {
    assert!(!dst.exists(), "{} was written", dst.display());
    let name = dst.file_name().unwrap().to_string_lossy().into_owned();
    for e in std::fs::read_dir(dst.parent().unwrap()).unwrap() {
        let n = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!n.starts_with(&format!("{name}.")), "left behind: {n}");
    }
}

fn convert_err(src: &Path, dst: &Path, opts: &ConvertOptions) -> String {
    match convert(src, dst, opts) {
        Ok(_) => panic!("converting {} should fail", src.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unknown_model_type_is_named_with_the_supported_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    let mut cfg = qwen3_moe_config();
    cfg["model_type"] = "llama".into();
    write_model(&src, &cfg, &qwen3_moe_tensors(1, "model.", false), 1);
    let msg = convert_err(&src, &dst, &ConvertOptions::default());
    assert!(
        msg.contains("`llama`") && msg.contains("qwen3_moe") && msg.contains("deepseek_v3"),
        "{msg}"
    );
    assert_nothing_written(&dst);
    // The binary: non-zero exit, the message, no panic.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_moeflux"))
        .arg("convert")
        .arg(&src)
        .arg(&dst)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("llama") && !err.contains("panicked"), "{err}");
    assert_nothing_written(&dst);
}

#[test]
fn missing_shard_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    write_model(&src, &qwen3_moe_config(), &qwen3_moe_tensors(1, "model.", false), 2);
    std::fs::remove_file(src.join("model-00002-of-00002.safetensors")).unwrap();
    let msg = convert_err(&src, &dst, &ConvertOptions::default());
    assert!(
        msg.contains("model-00002-of-00002.safetensors") && msg.contains("missing"),
        "{msg}"
    );
    assert_nothing_written(&dst);
}

#[test]
fn truncated_shard_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    write_model(&src, &qwen3_moe_config(), &qwen3_moe_tensors(1, "model.", false), 1);
    let f = src.join("model.safetensors");
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    let msg = convert_err(&src, &dst, &ConvertOptions::default());
    assert!(msg.contains("model.safetensors") && msg.contains("truncated"), "{msg}");
    assert_nothing_written(&dst);
}

#[test]
fn wrong_shape_names_the_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    let mut ts = qwen3_moe_tensors(1, "model.", false);
    let q = ts
        .iter_mut()
        .find(|t| t.name == "model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    q.shape = vec![32, HIDDEN];
    q.data.truncate(32 * HIDDEN * 2);
    write_model(&src, &qwen3_moe_config(), &ts, 1);
    let msg = convert_err(&src, &dst, &ConvertOptions::default());
    assert!(
        msg.contains("`model.layers.0.self_attn.q_proj.weight`") && msg.contains("[64, 64]"),
        "{msg}"
    );
    assert_nothing_written(&dst);
}

#[test]
fn mlx_width_that_contradicts_the_config_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    let (mut cfg, ts) = builders::mlx_qwen3_moe(5);
    cfg["quantization"]["model.layers.0.mlp.gate"]["bits"] = 4.into();
    write_model(&src, &cfg, &ts, 1);
    let msg = convert_err(&src, &dst, &ConvertOptions::default());
    assert!(
        msg.contains("`model.layers.0.mlp.gate.weight`") && msg.contains("8-bit"),
        "{msg}"
    );
    cfg["quantization"]["bits"] = 3.into();
    write_model(&src, &cfg, &ts, 1);
    let msg = convert_err(&src, &dst, &ConvertOptions::default());
    assert!(msg.contains("quantization.bits") && msg.contains("3-bit"), "{msg}");
    assert_nothing_written(&dst);
}

#[test]
fn mlx_absorbed_mla_is_refused_by_name() {
    let src = fixture("deepseek_v3_mlx4");
    if !src.is_dir() {
        eprintln!("note: fixture deepseek_v3_mlx4 absent; skipped");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("dst");
    let msg = convert_err(&src, &dst, &ConvertOptions::default());
    assert!(
        msg.contains("embed_q") && msg.contains("unembed_out") && msg.contains("self_attn"),
        "{msg}"
    );
    assert_nothing_written(&dst);
}

#[test]
fn existing_destination_needs_force_and_survives_a_failed_run() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, bad, dst) = (tmp.path().join("src"), tmp.path().join("bad"), tmp.path().join("dst"));
    write_model(&src, &qwen3_moe_config(), &qwen3_moe_tensors(1, "model.", false), 1);
    convert(&src, &dst, &ConvertOptions::default()).unwrap();
    let before = std::fs::read(dst.join("model_weights.bin")).unwrap();
    let msg = convert_err(&src, &dst, &ConvertOptions::default());
    assert!(msg.contains("already exists") && msg.contains("--force"), "{msg}");
    // A failing forced run leaves the old destination as it was.
    let mut ts = qwen3_moe_tensors(1, "model.", false);
    ts.retain(|t| t.name != "model.norm.weight");
    write_model(&bad, &qwen3_moe_config(), &ts, 1);
    let force = ConvertOptions {
        force: true,
        ..ConvertOptions::default()
    };
    let msg = convert_err(&bad, &dst, &force);
    assert!(msg.contains("`model.norm.weight` not found"), "{msg}");
    assert_eq!(std::fs::read(dst.join("model_weights.bin")).unwrap(), before);
    let bits8 = ConvertOptions {
        bits: Some(8),
        ..force.clone()
    };
    convert(&src, &dst, &bits8).unwrap();
    assert_ne!(std::fs::read(dst.join("model_weights.bin")).unwrap(), before);
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.contains(".tmp-") && !n.contains(".old-")),
        "{names:?}"
    );
}

#[test]
fn force_never_replaces_a_directory_that_is_not_a_packed_model() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    write_model(&src, &qwen3_moe_config(), &qwen3_moe_tensors(1, "model.", false), 1);
    std::fs::create_dir(&dst).unwrap();
    std::fs::write(dst.join("keep.txt"), "mine").unwrap();
    let force = ConvertOptions {
        force: true,
        ..ConvertOptions::default()
    };
    let msg = convert_err(&src, &dst, &force);
    assert!(msg.contains("not a packed model"), "{msg}");
    assert_eq!(std::fs::read_to_string(dst.join("keep.txt")).unwrap(), "mine");
    // An empty directory is not anybody's data: it is replaced.
    std::fs::remove_file(dst.join("keep.txt")).unwrap();
    convert(&src, &dst, &ConvertOptions::default()).unwrap();
    assert!(dst.join("model_weights.bin").is_file());
}
