//! Integrity of weights (issue 49, item 11): convert and synth record
//! checksums, `inspect --verify` names the first bad file and expert, and
//! a step whose logits are all NaN stops `run` with an error (naming the
//! layer with `--check-nan`).

use super::common::moeflux;
use super::packed_model;
use moeflux::format::packed::Manifest;
use std::path::Path;

/// `moeflux inspect --verify DIR`: (success, stdout, stderr).
fn verify(dir: &Path) -> (bool, String, String) {
    let out = moeflux().args(["inspect", "--verify"]).arg(dir).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        err,
    )
}

/// Overwrite `len` bytes of `path` at `at` with `byte`.
fn fill(path: &Path, at: u64, len: usize, byte: u8) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&vec![byte; len], at).unwrap();
}

/// Flip the bits of the byte of `path` at `at`.
fn flip(path: &Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[!b[0]], at).unwrap();
}

/// Where tensor `name` lies in `model_weights.bin`: (offset, size).
fn tensor(dir: &Path, name: &str) -> (u64, usize) {
    let m: Manifest = serde_json::from_slice(&std::fs::read(dir.join("model_weights.json")).unwrap()).unwrap();
    let t = &m.tensors[name];
    (t.offset, t.size as usize)
}

#[test]
fn inspect_verify_names_the_first_bad_file_and_expert() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    packed_model(&m);
    let (ok, out, err) = verify(&m);
    assert!(ok && out.contains("verified"), "{out}\n{err}");
    let layout = moeflux::format::packed::Layout::read(&m).unwrap();
    let size = layout.layers["0"].expert_size as u64;
    // One byte of expert 5 of layer 0.
    let layer = m.join("packed_experts/layer_00.bin");
    let before = std::fs::read(&layer).unwrap();
    flip(&layer, 5 * size + 17);
    let (ok, _, err) = verify(&m);
    assert!(!ok && err.contains("layer_00.bin") && err.contains("expert 5"), "{err}");
    std::fs::write(&layer, before).unwrap();
    // A dense tensor.
    let (at, _) = tensor(&m, "model.norm.weight");
    flip(&m.join("model_weights.bin"), at);
    let (ok, _, err) = verify(&m);
    assert!(
        !ok && err.contains("model_weights.bin") && err.contains("checksum"),
        "{err}"
    );
    // Without inspect's --verify, nothing is read: it still passes.
    let out = moeflux().arg("inspect").arg(&m).output().unwrap();
    assert!(out.status.success());
    // A model packed before checksums: it says it has none.
    std::fs::remove_file(m.join("checksums.json")).unwrap();
    let (ok, out, err) = verify(&m);
    assert!(ok && out.contains("none"), "{out}\n{err}");
}

#[test]
fn synth_records_checksums() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    super::run::synth_model(&m);
    let (ok, out, err) = verify(&m);
    assert!(ok && out.contains("verified"), "{out}\n{err}");
    flip(&m.join("packed_experts/layer_01.bin"), 100);
    let (ok, _, err) = verify(&m);
    assert!(!ok && err.contains("layer_01.bin") && err.contains("expert 0"), "{err}");
}

/// Regression: an all-NaN layer printed `!!!!!!!!` with exit 0.
#[test]
fn nan_logits_stop_run_and_check_nan_names_the_layer() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    packed_model(&m);
    let (at, size) = tensor(&m, "model.layers.1.input_layernorm.weight");
    fill(&m.join("model_weights.bin"), at, size, 0xff);
    let run = |extra: &[&str]| {
        let out = moeflux()
            .args(["run", "--device", "cpu", "-n", "4", "--prompt-ids", "1,2,3", "--model"])
            .arg(&m)
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(out.status.code(), Some(1), "{err}");
        err
    };
    let err = run(&[]);
    assert!(err.contains("all NaN") && err.contains("--check-nan"), "{err}");
    let err = run(&["--check-nan"]);
    assert!(err.contains("NaN in the output of layer 1"), "{err}");
}
