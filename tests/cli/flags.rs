//! The model, device, I/O, cache and prefetch flags are the same on every
//! command that opens a model, and a flag that does nothing on the chosen
//! device says so.

use super::common::moeflux;
use super::packed_model;

#[test]
fn every_command_that_opens_a_model_has_the_same_flags() {
    for cmd in ["run", "chat", "bench", "logits"] {
        let out = moeflux().args([cmd, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success());
        for want in [
            "--model",
            "--device",
            "cuda:N",
            "--io",
            "direct",
            "--expert-cache",
            "0%",
            "--no-prefetch",
        ] {
            assert!(help.contains(want), "`{cmd} --help` lacks `{want}`:\n{help}");
        }
    }
}

#[test]
fn cache_flags_on_the_cpu_say_they_do_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    packed_model(&m);
    let out = moeflux()
        .args([
            "logits",
            "--device",
            "cpu",
            "--tokens",
            "1,2",
            "--expert-cache",
            "0%",
            "--no-prefetch",
            "--model",
        ])
        .arg(&m)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("--expert-cache has no effect on the cpu"), "{err}");
    assert!(err.contains("--no-prefetch has no effect on the cpu"), "{err}");
    let out = moeflux()
        .args(["logits", "--device", "cpu", "--tokens", "1", "--model"])
        .arg(&m)
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("no effect"));
}

#[test]
fn an_out_of_range_cache_share_states_the_range() {
    for bad in ["200%", "-5%"] {
        let out = moeflux()
            .args(["bench", "--model", "nowhere", &format!("--expert-cache={bad}")])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains("0%") && err.contains("100%"), "{bad}: {err}");
    }
}
