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
            "--ram-cache",
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
    for flag in ["--expert-cache", "--ram-cache"] {
        for bad in ["200%", "-5%"] {
            let out = moeflux()
                .args(["bench", "--model", "nowhere", &format!("{flag}={bad}")])
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success());
            assert!(err.contains("0%") && err.contains("100%"), "{flag} {bad}: {err}");
            assert!(err.contains(flag), "{flag} {bad}: the flag is not named: {err}");
        }
    }
}

#[test]
fn a_ram_tier_is_capped_at_the_experts_and_said() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    packed_model(&m);
    let run = |size: &str| {
        moeflux()
            .args([
                "logits",
                "--device",
                "cpu",
                "--tokens",
                "1,2",
                "--io",
                "pread",
                "--ram-cache",
                size,
                "--model",
            ])
            .arg(&m)
            .output()
            .unwrap()
    };
    let out = run("100T");
    let err = String::from_utf8_lossy(&out.stderr);
    // The tier is capped at the experts' bytes, so 100T asks for all of
    // them: this tiny model fits, and the run says what it kept.
    assert!(out.status.success(), "{err}");
    assert!(err.contains("RAM tier of") && err.contains("100% of them"), "{err}");
    let out = run("0");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("RAM tier"));
}
