//! `moeflux run` on a `synth` model, with a text prompt and without a
//! tokenizer (`--prompt-ids`), and on a terminal (control characters
//! shown, not sent).

use super::common::moeflux;
use super::packed_model;
use moeflux::synth::{preset, Plan, SynthOptions};
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;

/// A tiny random-weight model as `synth` writes it (with its tokenizer).
pub fn synth_model(dir: &Path) {
    let mut cfg = preset("qwen3-30b-a3b").unwrap();
    for (k, v) in [
        ("hidden_size", 128),
        ("num_hidden_layers", 2),
        ("num_attention_heads", 4),
        ("num_key_value_heads", 2),
        ("head_dim", 32),
        ("num_experts", 8),
        ("moe_intermediate_size", 64),
        ("vocab_size", 512),
    ] {
        cfg[k] = v.into();
    }
    let plan = Plan::new("tiny", cfg, &SynthOptions::default()).unwrap();
    plan.write(dir, false, &|_| {}, None).unwrap();
}

#[test]
fn prompt_ids_run_a_model_without_a_tokenizer() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    synth_model(&m);
    std::fs::remove_file(m.join("tokenizer.json")).unwrap();
    let run = |extra: &[&str]| {
        moeflux()
            .args(["run", "--device", "cpu", "-n", "5", "--seed", "1", "--model"])
            .arg(&m)
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&["--prompt-ids", "1,2,3"]);
    let (text, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{err}");
    let ids: Vec<&str> = text.trim_end().split_terminator('>').collect();
    assert_eq!(ids.len(), 5, "{text}");
    assert!(
        ids.iter()
            .all(|p| p.strip_prefix('<').is_some_and(|n| n.parse::<u32>().is_ok())),
        "{text}"
    );
    assert!(err.contains("no tokenizer.json"), "{err}");
    // A text prompt still needs the tokenizer, and says how to do without.
    let out = run(&["-p", "hello"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("tokenizer.json") && err.contains("--prompt-ids"), "{err}");
}

#[test]
fn text_prompts_run_a_synthetic_model() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    synth_model(&m);
    let out = moeflux()
        .args([
            "run",
            "--device",
            "cpu",
            "-n",
            "8",
            "--chat",
            "-p",
            "Say something.",
            "--model",
        ])
        .arg(&m)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!out.stdout.is_empty() || err.contains("end of sequence"), "{err}");
    assert!(std::str::from_utf8(&out.stdout).is_ok());
}

/// Run `args` with stdout a pseudo-terminal; returns what it wrote there.
fn on_a_terminal(args: &[&std::ffi::OsStr]) -> Vec<u8> {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty fills in two new descriptors, owned below.
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors are fresh and owned by nobody else.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut child = moeflux()
        .args(args)
        .stdout(slave)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut reader = std::fs::File::from(master);
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    // Reading the master ends with EIO once the child has closed the terminal.
    while let Ok(n) = reader.read(&mut buf) {
        if n == 0 {
            break;
        }
        bytes.extend_from_slice(&buf[..n]);
    }
    assert!(child.wait().unwrap().success());
    bytes
}

#[test]
fn run_on_a_terminal_shows_control_characters_instead_of_sending_them() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    packed_model(&m);
    let args = [
        "run",
        "--device",
        "cpu",
        "-p",
        "hi",
        "-n",
        "64",
        "--seed",
        "1",
        "--temperature",
        "1.5",
        "--model",
    ];
    let mut args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    args.push(m.as_os_str());
    // The model writes control characters (seen through --json)...
    let json = moeflux().args(&args).arg("--json").output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let text = v["text"].as_str().unwrap();
    let control = |c: char| c.is_control() && !matches!(c, '\n' | '\t' | '\r');
    assert!(
        text.chars().any(control),
        "the sample has no control character: {text:?}"
    );
    // ...which reach a terminal only as pictures.
    let shown = on_a_terminal(&args);
    let shown = String::from_utf8_lossy(&shown);
    assert!(
        !shown.chars().any(control),
        "raw control characters on the terminal: {shown:?}"
    );
    assert!(
        shown.chars().any(|c| ('\u{2400}'..='\u{2421}').contains(&c)),
        "{shown:?}"
    );
}
