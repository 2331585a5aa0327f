//! Bad input at run time: a clear message naming the thing at fault, a
//! non-zero exit, no panic. (Converter-side bad input is in convert.rs.)

mod common;

use common::*;
use moeflux::{Device, Model, Options};
use std::path::Path;

fn packed_copy(dst: &Path) {
    convert("qwen3_moe", dst, &["--bits", "16"]);
}

fn open_err(dir: &Path) -> String {
    let opts = Options {
        device: Device::Cpu,
        ..Options::default()
    };
    match Model::open(dir, &opts) {
        Ok(_) => panic!("opening {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// Run `moeflux logits` and return (success, stderr).
fn logits(dir: &Path, tokens: &str) -> (bool, String) {
    let out = moeflux()
        .args(["logits", "--device", "cpu", "--model"])
        .arg(dir)
        .args(["--tokens", tokens])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!err.contains("panicked"), "the binary panicked: {err}");
    (out.status.success(), err)
}

#[test]
fn truncated_expert_file_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    packed_copy(&dir);
    let f = dir.join("packed_experts/layer_02.bin");
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    let e = open_err(&dir);
    assert!(e.contains("layer_02.bin") && e.contains("truncated"), "{e}");
    let (ok, err) = logits(&dir, "1,2");
    assert!(!ok && err.contains("layer_02.bin"), "{err}");
}

#[test]
fn manifest_entry_past_the_end_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    packed_copy(&dir);
    let mpath = dir.join("model_weights.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&mpath).unwrap()).unwrap();
    let size = std::fs::metadata(dir.join("model_weights.bin")).unwrap().len();
    v["tensors"]["model.norm.weight"]["offset"] = serde_json::json!(size);
    std::fs::write(&mpath, serde_json::to_string(&v).unwrap()).unwrap();
    let e = open_err(&dir);
    assert!(e.contains("model.norm.weight") && e.contains("past the end"), "{e}");
}

#[test]
fn wrong_shape_in_manifest_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    packed_copy(&dir);
    let mpath = dir.join("model_weights.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&mpath).unwrap()).unwrap();
    // Same byte count, wrong shape.
    let t = &mut v["tensors"]["model.layers.0.self_attn.o_proj.weight"];
    let shape: Vec<u64> = t["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    t["shape"] = serde_json::json!([shape[1], shape[0]]);
    std::fs::write(&mpath, serde_json::to_string(&v).unwrap()).unwrap();
    let e = open_err(&dir);
    assert!(e.contains("model.layers.0.self_attn.o_proj.weight"), "{e}");
}

#[test]
fn unknown_model_type_in_packed_dir_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    packed_copy(&dir);
    let cpath = dir.join("config.json");
    let text = std::fs::read_to_string(&cpath)
        .unwrap()
        .replace("\"qwen3_moe\"", "\"no_such_moe\"");
    std::fs::write(&cpath, text).unwrap();
    let e = open_err(&dir);
    assert!(e.contains("no_such_moe") && e.contains("supported"), "{e}");
}

#[test]
fn token_outside_the_vocabulary_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    packed_copy(&dir);
    let (ok, err) = logits(&dir, "1,512");
    assert!(!ok && err.contains("512") && err.contains("vocabulary"), "{err}");
    let (ok, _) = logits(&dir, "1,511");
    assert!(ok);
}

#[test]
fn missing_model_dir_is_named() {
    let (ok, err) = logits(Path::new("/nonexistent/model"), "1");
    assert!(!ok && err.contains("/nonexistent/model"), "{err}");
}

/// Edit `packed_experts/layout.json` of a packed copy with `edit`.
fn edit_layout(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let lpath = dir.join("packed_experts/layout.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&lpath).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&lpath, serde_json::to_string(&v).unwrap()).unwrap();
}

/// Regression: `up_proj.weight` with shape `[]` passed the layout check
/// and panicked when the first expert was read (exit 101).
#[test]
fn empty_shape_in_layout_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    packed_copy(&dir);
    edit_layout(&dir, |v| {
        let layers = v["layers"].as_object_mut().unwrap();
        for l in layers.values_mut() {
            l["components"][3]["shape"] = serde_json::json!([]);
        }
    });
    let e = open_err(&dir);
    assert!(e.contains("layout.json") && e.contains("up_proj.weight"), "{e}");
    let (ok, err) = logits(&dir, "1,2");
    assert!(!ok && err.contains("up_proj.weight"), "{err}");
}

#[test]
fn layout_values_that_do_not_fit_the_model_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("m");
    packed_copy(&base);
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit); 6] = [
        ("num_experts", |v| v["num_experts"] = serde_json::json!(3)),
        ("num_layers", |v| v["num_layers"] = serde_json::json!(99)),
        ("expert_size", |v| {
            for l in v["layers"].as_object_mut().unwrap().values_mut() {
                l["expert_size"] = serde_json::json!(u64::MAX);
            }
        }),
        ("down_proj.biases", |v| {
            for l in v["layers"].as_object_mut().unwrap().values_mut() {
                l["components"][8]["size"] = serde_json::json!(4);
            }
        }),
        ("`bits`", |v| {
            for l in v["layers"].as_object_mut().unwrap().values_mut() {
                l["components"][0]["dtype"] = serde_json::json!("U32");
                l["bits"] = serde_json::json!(3);
            }
        }),
        ("`layers` key", |v| {
            let l = v["layers"].as_object().unwrap().values().next().unwrap().clone();
            v["layers"]["x"] = l;
        }),
    ];
    for (i, (key, edit)) in cases.into_iter().enumerate() {
        let dir = tmp.path().join(format!("c{i}"));
        copy_dir(&base, &dir);
        edit_layout(&dir, edit);
        let e = open_err(&dir);
        assert!(e.contains("layout.json") && e.contains(key), "{key}: {e}");
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// Regression: an invalid `generation_config.json` was reported as a
/// problem with the tokenizer. The file (and the key) at fault is named.
#[test]
fn invalid_generation_config_is_named_not_the_tokenizer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    packed_copy(&dir);
    for (text, key) in [
        ("{\"temperature\": ", "invalid JSON"),
        ("{\"do_sample\": true, \"temperature\": -1}", "`temperature`"),
        ("{\"top_p\": 3}", "`top_p`"),
        ("{\"max_new_tokens\": -4}", "`max_new_tokens`"),
        ("[1, 2]", "object"),
    ] {
        std::fs::write(dir.join("generation_config.json"), text).unwrap();
        let out = moeflux()
            .args(["run", "--device", "cpu", "-p", "hi", "-n", "1", "--model"])
            .arg(&dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && !err.contains("panicked"), "{text}: {err}");
        assert!(
            err.contains("generation_config.json") && err.contains(key) && !err.contains("tokenizer"),
            "{text}: {err}"
        );
    }
}
