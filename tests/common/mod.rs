//! Helpers shared by the integration tests: fixtures, conversion through
//! the `moeflux` binary, comparisons.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

pub fn moeflux() -> Command {
    Command::new(env!("CARGO_BIN_EXE_moeflux"))
}

/// `moeflux chat` on the CPU over `dst`, answering `n` tokens a turn with
/// the text template `template` (of `tests/fixtures/text/templates`), with
/// `input` on stdin; (stdout, stderr). Panics with stderr when it fails or
/// panics.
pub fn chat(dst: &Path, template: &str, n: usize, input: &str) -> (String, String) {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = moeflux()
        .args(["chat", "--device", "cpu", "-n", &n.to_string(), "--model"])
        .arg(dst)
        .arg("--chat-template")
        .arg(fixture("text/templates").join(template))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let e = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success() && !e.contains("panicked"), "chat failed:\n{e}");
    let o = String::from_utf8(out.stdout).expect("chat's stdout is UTF-8");
    (o, e)
}

/// Convert fixture `name` into `dst` with extra convert flags; panics with
/// the converter's stderr on failure.
pub fn convert(name: &str, dst: &Path, flags: &[&str]) {
    let out = moeflux()
        .arg("convert")
        .arg(fixture(name))
        .arg(dst)
        .args(flags)
        .output()
        .expect("run moeflux convert");
    assert!(
        out.status.success(),
        "convert {name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The reference recorded by tools/make_fixtures.py.
pub struct Reference {
    pub tokens: Vec<u32>,
    /// `[positions][vocab]`
    pub logits: Vec<Vec<f32>>,
    pub greedy_prompt: Vec<u32>,
    pub greedy_tokens: Vec<u32>,
}

pub fn reference(name: &str) -> Reference {
    let p = fixture(name).join("reference.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).expect("read reference.json")).expect("parse reference.json");
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    };
    Reference {
        tokens: ids(&v["tokens"]),
        logits: v["logits"]
            .as_array()
            .expect("logits")
            .iter()
            .map(|row| {
                row.as_array()
                    .expect("row")
                    .iter()
                    .map(|x| x.as_f64().expect("f") as f32)
                    .collect()
            })
            .collect(),
        greedy_prompt: ids(&v["greedy"]["prompt"]),
        greedy_tokens: ids(&v["greedy"]["tokens"]),
    }
}

/// ‖a − b‖ / ‖b‖.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        num += ((x - y) as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

pub mod kv;
pub mod trials;

/// Calls `$m!(ARGS name, fixture, flags)` for every golden fixture: bf16
/// and fp8 sources are converted with `--bits 16` (the reference ran on
/// exactly those weights), MLX ones repacked as they are.
#[macro_export]
macro_rules! for_each_golden_fixture {
    ($($m:ident)::+ !($($args:tt)*)) => {
        $($m)::+!($($args)* qwen3_moe_bf16, "qwen3_moe", &["--bits", "16"]);
        $($m)::+!($($args)* qwen3_moe_mlx_4bit, "qwen3_moe_mlx4", &[]);
        $($m)::+!($($args)* qwen3_next_bf16_sharded, "qwen3_next", &["--bits", "16"]);
        $($m)::+!($($args)* qwen3_5_moe_bf16_nested, "qwen3_5_moe", &["--bits", "16"]);
        $($m)::+!($($args)* qwen3_5_moe_mlx_4bit, "qwen3_5_moe_mlx4", &[]);
        $($m)::+!($($args)* deepseek_v3_bf16, "deepseek_v3", &["--bits", "16"]);
        $($m)::+!($($args)* deepseek_v3_fp8, "deepseek_v3_fp8", &["--bits", "16"]);
        $($m)::+!($($args)* demo_kjv_trained_bf16, "demo_kjv", &["--bits", "16"]);
        $($m)::+!($($args)* mixtral_bf16, "mixtral", &["--bits", "16"]);
        $($m)::+!($($args)* qwen2_moe_bf16, "qwen2_moe", &["--bits", "16"]);
        $($m)::+!($($args)* glm4_moe_bf16, "glm4_moe", &["--bits", "16"]);
        $($m)::+!($($args)* minimax_m2_fp8, "minimax_m2_fp8", &["--bits", "16"]);
        $($m)::+!($($args)* deepseek_v2_bf16, "deepseek_v2", &["--bits", "16"]);
        $($m)::+!($($args)* qwen3_moe_yarn_bf16, "qwen3_moe_yarn", &["--bits", "16"]);
    };
}

/// One `#[test]` per golden fixture, each calling `$check(fixture, flags)`.
#[macro_export]
macro_rules! golden_fixture_tests {
    ($check:path) => {
        $crate::for_each_golden_fixture!($crate::golden_test!($check,));
    };
}

/// A `#[test]` named `$name` calling `$check($fixture, $flags)`.
#[macro_export]
macro_rules! golden_test {
    ($check:path, $name:ident, $fixture:expr, $flags:expr) => {
        #[test]
        fn $name() {
            $check($fixture, $flags);
        }
    };
}

/// Fixture `name` converted with `--bits 16`, once per test binary.
pub fn packed(name: &str) -> PathBuf {
    packed_with(name, &["--bits", "16"])
}

/// Fixture `name` converted with `flags`, once per test binary.
pub fn packed_with(name: &str, flags: &[&str]) -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let dst = packed_root().join(format!("{name}{}", flags.concat()));
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if !dst.exists() {
        convert(name, &dst, flags);
    }
    dst
}

/// Where this run of this test binary converts fixtures: a directory of
/// Cargo's target tmpdir named by the binary and the process id. (A
/// `TempDir` in a static is never dropped, so the conversions of every
/// run stayed in /tmp, 3.6 GB after a day's runs.) First the directories
/// of earlier runs (of any test binary) whose process is gone are
/// removed, and one left with this process's id by an earlier process
/// (ids are reused) is emptied, so that no conversion of another run is
/// taken for this one's.
fn packed_root() -> &'static Path {
    static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let exe = std::env::current_exe().expect("the test binary's path");
        let stem = exe.file_stem().and_then(|s| s.to_str()).unwrap_or("test");
        let me = std::process::id();
        // A process's liveness is read from /proc (Linux); elsewhere only
        // this process's own leftover is removed.
        let gone = |pid: u32| Path::new("/proc/self").exists() && !Path::new(&format!("/proc/{pid}")).exists();
        if let Ok(entries) = std::fs::read_dir(base) {
            for e in entries.flatten() {
                let name = e.file_name();
                let pid = name
                    .to_str()
                    .filter(|n| n.starts_with("fixtures-"))
                    .and_then(|n| n.rsplit('-').next())
                    .and_then(|p| p.parse::<u32>().ok());
                if pid.is_some_and(|p| p == me || gone(p)) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let dir = base.join(format!("fixtures-{stem}-{me}"));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        dir
    })
}

/// Open a packed model on the CPU, with exact (f32) products.
pub fn open_cpu(dir: &Path) -> moeflux::Model {
    let opts = moeflux::Options {
        device: moeflux::Device::Cpu,
        exact: true,
        ..moeflux::Options::default()
    };
    moeflux::Model::open(dir, &opts).unwrap()
}

/// An expert cache of three experts' slots: every step misses.
pub fn three_slots(model: &moeflux::Model) -> moeflux::experts::CacheSize {
    slots(model, 3)
}

/// An expert cache of `n` slots of the model's largest expert.
pub fn slots(model: &moeflux::Model, n: u64) -> moeflux::experts::CacheSize {
    let store = model.expert_store();
    let size = (0..model.config().num_hidden_layers)
        .filter_map(|l| store.layer_layout(l).ok())
        .map(|l| l.expert_size)
        .max()
        .expect("a MoE layer");
    moeflux::experts::CacheSize::Bytes(n * size.div_ceil(256) as u64 * 256)
}
