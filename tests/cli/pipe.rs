//! A reader that goes away (`moeflux inspect DIR | head -1`) ends a
//! command quietly: no panic, no error, status 0.

use super::common::moeflux;
use super::packed_model;
use std::process::Stdio;

/// Run `args` with stdout a pipe whose read end is closed before the
/// command writes anything; returns (status code, stderr).
fn with_closed_stdout(args: &[&std::ffi::OsStr]) -> (Option<i32>, String) {
    let mut child = moeflux()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn moeflux");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait for moeflux");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn no_command_panics_on_a_closed_stdout() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    packed_model(&m);
    let m = m.as_os_str();
    let commands: [&[&str]; 6] = [
        &["inspect", "M"],
        &[
            "logits",
            "--device",
            "cpu",
            "--model",
            "M",
            "--tokens",
            "1,2",
            "--all-positions",
        ],
        &[
            "bench", "--device", "cpu", "--model", "M", "-p", "4", "-n", "4", "-r", "1", "--warmup", "0",
        ],
        &[
            "run", "--device", "cpu", "--model", "M", "-p", "hi", "-n", "8", "--seed", "1",
        ],
        &[
            "run", "--device", "cpu", "--model", "M", "-p", "hi", "-n", "8", "--json",
        ],
        &["inspect", "--help"],
    ];
    for args in commands {
        let args: Vec<&std::ffi::OsStr> = args
            .iter()
            .map(|a| if *a == "M" { m } else { std::ffi::OsStr::new(a) })
            .collect();
        let (code, err) = with_closed_stdout(&args);
        assert!(!err.contains("panicked"), "{args:?} panicked:\n{err}");
        assert!(!err.contains("error"), "{args:?} reported an error:\n{err}");
        assert_eq!(code, Some(0), "{args:?}:\n{err}");
    }
}
