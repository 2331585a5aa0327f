//! `moeflux inspect` runs the checks `run` does and reports every problem
//! with a nonzero exit; `run` and `bench` on a checkpoint as downloaded
//! say to convert it first.

use super::common::{fixture, moeflux};
use super::packed_model;
use std::path::Path;

/// `moeflux inspect DIR`: (success, stdout, stderr).
fn inspect(dir: &Path) -> (bool, String, String) {
    let out = moeflux().arg("inspect").arg(dir).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        err,
    )
}

fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

#[test]
fn a_healthy_model_passes() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    packed_model(&m);
    let (ok, out, err) = inspect(&m);
    assert!(ok, "{err}");
    assert!(
        out.contains("packed moeflux model") && !err.contains("problem"),
        "{out}\n{err}"
    );
}

#[test]
fn every_problem_is_reported_with_a_nonzero_exit() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    packed_model(&m);
    let experts = m.join("packed_experts");
    let layers: Vec<_> = std::fs::read_dir(&experts)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .collect();
    assert!(layers.len() >= 2, "{layers:?}");
    let len = std::fs::metadata(&layers[0]).unwrap().len();
    truncate(&layers[0], len - 100);
    truncate(&layers[1], 0);
    std::fs::remove_file(m.join("config.json")).unwrap();
    let (ok, out, err) = inspect(&m);
    assert!(!ok, "inspect passed a broken model:\n{out}\n{err}");
    for want in [
        layers[0].file_name().unwrap().to_str().unwrap(),
        layers[1].file_name().unwrap().to_str().unwrap(),
        "truncated",
        "config.json",
        "3 problems",
    ] {
        assert!(err.contains(want), "`{want}` missing from:\n{err}");
    }
}

#[test]
fn an_unknown_model_type_is_a_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    packed_model(&m);
    let c = m.join("config.json");
    let text = std::fs::read_to_string(&c)
        .unwrap()
        .replace("\"qwen3_moe\"", "\"no_such_moe\"");
    std::fs::write(&c, text).unwrap();
    let (ok, _, err) = inspect(&m);
    assert!(!ok && err.contains("no_such_moe") && err.contains("problem"), "{err}");
}

#[test]
fn run_and_bench_on_a_source_checkpoint_say_to_convert_it() {
    let src = fixture("qwen3_moe");
    for args in [
        &["run", "--device", "cpu", "-p", "hi", "--model"][..],
        &["bench", "--device", "cpu", "--model"][..],
        &["logits", "--device", "cpu", "--tokens", "1", "--model"][..],
    ] {
        let out = moeflux().args(args).arg(&src).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("convert it first") && err.contains(&format!("moeflux convert {}", src.display())),
            "{args:?}: {err}"
        );
        assert!(!err.contains("No such file"), "{err}");
    }
}
