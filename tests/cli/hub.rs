//! `pull`, `list` and `--model ORG/NAME` through the binary, against the
//! mock Hub (`tests/hub/mock.rs`), with the environment a user sets.

use super::common::moeflux;
use super::mock::{MockHub, DEMO, GATED, GGUF};
use std::path::Path;
use std::process::{Command, Output};

/// `moeflux ARGS` with the Hub at `hub` and every cache under `root`.
fn hub_cmd(hub: &MockHub, root: &Path, args: &[&str]) -> Command {
    let mut c = moeflux();
    c.args(args)
        .env("HF_ENDPOINT", &hub.url)
        .env("HF_HOME", root.join("hf"))
        .env("MOEFLUX_MODELS", root.join("packed"))
        .env_remove("HF_HUB_CACHE")
        .env_remove("HUGGINGFACE_HUB_CACHE")
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("MOEFLUX_ARG_MODEL")
        .env_remove("LLAMA_ARG_MODEL");
    c
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn run_model_org_name_pulls_converts_and_runs_then_works_offline() {
    let hub = MockHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let run = [
        "run",
        "--device",
        "cpu",
        "-n",
        "4",
        "--seed",
        "1",
        "-p",
        "And it came to pass",
    ];
    let o = hub_cmd(&hub, tmp.path(), &run)
        .args(["--model", DEMO])
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("getting it from the Hugging Face Hub"), "{err}");
    assert!(
        err.contains("converting") && err.contains("removed the downloaded weights"),
        "{err}"
    );
    assert!(!out.trim().is_empty());
    // Offline, the conversion is found; llama.cpp's spellings of the flags work.
    let o = hub_cmd(&hub, tmp.path(), &["run", "--device", "cpu", "-n", "3", "-p", "hi"])
        .env("HF_HUB_OFFLINE", "1")
        .args(["-m", DEMO, "-s", "7", "--temp", "0.7", "--top-k", "5", "--top-p", "0.9"])
        .args([
            "--min-p",
            "0.05",
            "-t",
            "1",
            "--chat",
            "--chat-template",
            "chatml",
            "--jinja",
        ])
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("converted already") && err.contains("seed 7"), "{err}");
    // Offline, a model never pulled.
    let o = hub_cmd(&hub, tmp.path(), &["run", "-p", "hi", "-m", "test/elsewhere"])
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("HF_HUB_OFFLINE is set"), "{err}");
    // list shows it converted; --remove deletes it.
    let o = hub_cmd(&hub, tmp.path(), &["list"]).output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with(DEMO))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("packed") && line.contains("yes"), "{out}");
    let o = hub_cmd(&hub, tmp.path(), &["list", "--remove", DEMO]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o).1);
    let o = hub_cmd(&hub, tmp.path(), &["pull", "--list"]).output().unwrap();
    assert!(!text(&o).0.contains(DEMO));
}

#[test]
fn pull_prints_the_path_and_refuses_clearly() {
    let hub = MockHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let o = hub_cmd(&hub, tmp.path(), &["pull", &format!("{GGUF}:Q8_0")])
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    // The GGUF is converted (Q8_0 kept exactly) and the packed model runs.
    let path = out.lines().last().unwrap();
    assert!(
        path.ends_with("tiny-Q8_0") && Path::new(path).join("model_weights.json").is_file(),
        "{out}"
    );
    let o = hub_cmd(
        &hub,
        tmp.path(),
        &["run", "--device", "cpu", "-n", "2", "-p", "Hi", "--model", path],
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", text(&o).1);
    // A second pull finds the conversion and downloads nothing.
    hub.clear_counts();
    let o = hub_cmd(&hub, tmp.path(), &["pull", &format!("{GGUF}:Q8_0")])
        .output()
        .unwrap();
    assert!(text(&o).1.contains("converted already"), "{}", text(&o).1);
    assert_eq!(hub.served("tiny-Q8_0.gguf"), 0);
    let o = hub_cmd(&hub, tmp.path(), &["pull", GATED]).output().unwrap();
    let (_, err) = text(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("access denied") && err.contains(&format!("{}/{GATED}", hub.url)),
        "{err}"
    );
    let o = hub_cmd(&hub, tmp.path(), &["pull", "test/missing"]).output().unwrap();
    assert!(text(&o).1.contains("not found on the Hub"), "{}", text(&o).1);
}

/// A disk that fills mid-download (a 4 MiB tmpfs in a mount namespace of
/// its own, where the test runs as root): an error that says so, and no
/// half file under the final name.
#[test]
fn a_full_disk_leaves_no_half_file() {
    let hub = MockHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let small = tmp.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let script = format!(
        "mount -t tmpfs -o size=4m none {d} || exit 77; \"$0\" pull {DEMO} --keep-source; echo rc=$?; \
         ls {d}/hf/hub/models--test--demo-kjv/blobs {d}/hf/hub/models--test--demo-kjv/snapshots/*",
        d = small.display()
    );
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .arg(env!("CARGO_BIN_EXE_moeflux"))
        .env("HF_ENDPOINT", &hub.url)
        .env("HF_HOME", small.join("hf"))
        .env("MOEFLUX_MODELS", small.join("packed"))
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_HUB_OFFLINE")
        .output();
    let Ok(out) = out else {
        eprintln!("skipped: no unshare");
        return;
    };
    if out.status.code() == Some(77) || !out.status.success() && text(&out).0.is_empty() {
        eprintln!("skipped: cannot mount a tmpfs here: {}", text(&out).1);
        return;
    }
    let (listing, err) = text(&out);
    assert!(listing.contains("rc=1"), "{listing}\n{err}");
    assert!(
        err.contains("No space left") && err.contains("pull again to resume"),
        "{err}"
    );
    let (_, _, blob) = hub.file(DEMO, "model.safetensors");
    let names: Vec<&str> = listing.lines().collect();
    assert!(!names.contains(&blob.as_str()), "{listing}");
    assert!(!names.contains(&"model.safetensors"), "{listing}");
}

#[test]
fn llama_cpp_flags_are_taken_or_refused_with_what_to_use() {
    let help = |cmd: &str| text(&moeflux().args([cmd, "--help"]).output().unwrap()).0;
    let run = help("run");
    for want in [
        "-m, --model",
        "--hf-repo",
        "--temp",
        "-s, --seed",
        "-t, --threads",
        "chat-template-file",
    ] {
        assert!(run.contains(want), "run --help lacks {want}:\n{run}");
    }
    let serve = help("serve");
    for want in [
        "-c, --ctx",
        "ctx-size",
        "MOEFLUX_ARG_PORT",
        "MOEFLUX_ARG_HOST",
        "MOEFLUX_ARG_N_PARALLEL",
    ] {
        assert!(serve.contains(want), "serve --help lacks {want}:\n{serve}");
    }
    for (flags, want) in [
        (&["-ngl", "99"][..], "--expert-cache"),
        (&["-ot", "exps=CPU"][..], "--expert-cache"),
        (&["--n-cpu-moe", "10"][..], "--hybrid cpu"),
        (&["-np", "0"][..], "--parallel"),
    ] {
        let o = moeflux().args(["serve", "-m", "nowhere"]).args(flags).output().unwrap();
        let (_, err) = text(&o);
        assert!(!o.status.success() && err.contains(want), "{flags:?}: {err}");
    }
    // llama.cpp's environment variables reach the server's flags.
    let o = moeflux()
        .args(["serve", "-m", "nowhere"])
        .env("LLAMA_ARG_PORT", "port")
        .output()
        .unwrap();
    assert!(text(&o).1.contains("'port' for '--port"), "{}", text(&o).1);
}

#[test]
fn bench_takes_lists_as_llama_bench() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    super::packed_model(&m);
    let o = moeflux()
        .args([
            "bench", "--device", "cpu", "-p", "4,8", "-n", "2", "-d", "0,4", "-r", "1", "--warmup", "0", "--json", "-m",
        ])
        .arg(&m)
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let tests: Vec<&str> = j["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["test"].as_str().unwrap())
        .collect();
    assert_eq!(tests, ["pp4", "pp8", "tg2", "tg2 @ d4"], "{out}");
}
