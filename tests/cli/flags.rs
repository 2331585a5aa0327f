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
            "--hybrid",
        ] {
            assert!(help.contains(want), "`{cmd} --help` lacks `{want}`:\n{help}");
        }
    }
}

/// `logits --device cpu --tokens 1,2 FLAGS --model m`: success, stderr.
fn logits_on_cpu(m: &std::path::Path, flags: &[&str]) -> (bool, String) {
    let out = moeflux()
        .args(["logits", "--device", "cpu", "--tokens", "1,2"])
        .args(flags)
        .arg("--model")
        .arg(m)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn cache_flags_on_the_cpu_say_they_do_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    packed_model(&m);
    let (ok, err) = logits_on_cpu(&m, &["--expert-cache", "0%", "--no-prefetch", "--hybrid", "auto"]);
    assert!(ok, "{err}");
    assert!(err.contains("--expert-cache has no effect on the cpu"), "{err}");
    assert!(err.contains("--no-prefetch has no effect on the cpu"), "{err}");
    // Given, even as its default, --hybrid is named; left out, nothing is.
    assert!(err.contains("--hybrid has no effect on the cpu"), "{err}");
    assert!(!logits_on_cpu(&m, &[]).1.contains("no effect"));
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
    // The tier is capped at the experts' bytes, so 100T asks for all of
    // them: this tiny model fits, and the run says what it kept.
    let (ok, err) = logits_on_cpu(&m, &["--io", "pread", "--ram-cache", "100T"]);
    assert!(ok, "{err}");
    assert!(err.contains("RAM tier of") && err.contains("100% of them"), "{err}");
    let (ok, err) = logits_on_cpu(&m, &["--io", "pread", "--ram-cache", "0"]);
    assert!(ok && !err.contains("RAM tier"), "{err}");
}

#[test]
fn unbounded_numbers_are_refused_naming_the_range() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cases: [(&[&str], &str); 5] = [
        (&["--threads", "100000"], "from 0"),
        (&["--threads", "many"], "from 0"),
        (&["-r", "0"], "1..=1000"),
        (&["--ram-cache", "99999999T"], "from 0 to 1024T"),
        (&["--expert-cache", "2000T"], "from 0 to 1024T"),
    ];
    for (flags, range) in cases {
        let out = moeflux()
            .args(["bench", "--model", "nowhere"])
            .args(flags)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?}");
        assert!(err.contains(flags[0]), "{flags:?}: the flag is not named: {err}");
        assert!(err.contains(range), "{flags:?}: {err}");
    }
    let out = moeflux()
        .args(["bench", "--model", "nowhere", "--threads", &(cpus + 1).to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("to {cpus}")), "{err}");
}
