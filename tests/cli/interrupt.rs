//! SIGINT or SIGTERM during `convert` or `synth` removes the temporary
//! directory and exits with 130; the temporary directory of a killed run
//! is removed by the next run to the same destination.

use super::common::{fixture, moeflux};
use super::synthetic::{bf16_t, qwen3_moe_config, qwen3_moe_tensors, write_model, HIDDEN};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A bf16 qwen3_moe checkpoint with a large vocabulary (about 50 MB of
/// embeddings), so that converting it takes long enough to interrupt.
fn big_source(dir: &Path) {
    const VOCAB: usize = 200_000;
    let mut cfg = qwen3_moe_config();
    cfg["vocab_size"] = VOCAB.into();
    let values: Vec<f32> = (0..VOCAB * HIDDEN).map(|i| ((i % 17) as f32 - 8.0) / 64.0).collect();
    let mut ts = qwen3_moe_tensors(1, "model.", false);
    for t in &mut ts {
        if t.name == "model.embed_tokens.weight" || t.name == "lm_head.weight" {
            *t = bf16_t(&t.name, &[VOCAB, HIDDEN], &values);
        }
    }
    write_model(dir, &cfg, &ts, 1);
}

/// A `synth --config` file of about 170 MB of weights.
fn big_synth_config(path: &Path) {
    let mut cfg = moeflux::synth::preset("qwen3-30b-a3b").unwrap();
    for (k, v) in [
        ("hidden_size", 1024),
        ("vocab_size", 65536),
        ("num_experts", 64),
        ("moe_intermediate_size", 512),
        ("num_attention_heads", 8),
        ("num_key_value_heads", 4),
        ("head_dim", 128),
    ] {
        cfg[k] = v.into();
    }
    std::fs::write(path, cfg.to_string()).unwrap();
}

/// Names in `dir` that start with `prefix`.
fn entries(dir: &Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// Wait until the child's `DST.tmp-<pid>` exists (or the child ended).
fn wait_for_temp_dir(child: &mut Child, dst: &Path) {
    let tmp = PathBuf::from(format!("{}.tmp-{}", dst.display(), child.id()));
    let t0 = Instant::now();
    while !tmp.exists() && t0.elapsed() < Duration::from_secs(20) {
        if child.try_wait().unwrap().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Start `args` (a command writing to `dst`), send `signal` once its
/// temporary directory exists, and check that nothing is left; retried
/// when the command finished before the signal arrived.
fn interrupt(args: &[&std::ffi::OsStr], dst_of: impl Fn(usize) -> PathBuf, signal: libc::c_int) {
    for attempt in 0..5 {
        let dst = dst_of(attempt);
        let mut child = moeflux()
            .args(args)
            .arg(&dst)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_temp_dir(&mut child, &dst);
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let parent = dst.parent().unwrap();
        let name = dst.file_name().unwrap().to_string_lossy().into_owned();
        if out.status.success() {
            continue; // finished before the signal: try again
        }
        assert_eq!(out.status.code(), Some(130), "{err}");
        assert!(err.contains("interrupted") && !err.contains("panicked"), "{err}");
        assert!(!dst.exists(), "{} was written", dst.display());
        assert_eq!(
            entries(parent, &format!("{name}.")),
            Vec::<String>::new(),
            "left behind"
        );
        return;
    }
    panic!("the command always finished before the signal");
}

#[test]
fn ctrl_c_during_convert_removes_the_temporary_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    big_source(&src);
    let args = [std::ffi::OsStr::new("convert"), src.as_os_str()];
    interrupt(&args, |i| tmp.path().join(format!("int{i}")), libc::SIGINT);
    interrupt(&args, |i| tmp.path().join(format!("term{i}")), libc::SIGTERM);
}

#[test]
fn sigterm_during_synth_removes_the_temporary_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("config.json");
    big_synth_config(&cfg);
    let args = ["synth", "--layers", "2", "--config"].map(std::ffi::OsStr::new);
    let args = [&args[..], &[cfg.as_os_str(), std::ffi::OsStr::new("--out")]].concat();
    interrupt(&args, |i| tmp.path().join(format!("term{i}")), libc::SIGTERM);
    interrupt(&args, |i| tmp.path().join(format!("int{i}")), libc::SIGINT);
}

/// The id of a process that has ended.
fn dead_pid() -> u32 {
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

/// Plant a stale temporary directory of a dead process and one of a live
/// process (this test) beside `dst`, both marked as moeflux's own;
/// returns them.
fn plant(dst: &Path) -> (PathBuf, PathBuf) {
    let dead = PathBuf::from(format!("{}.tmp-{}", dst.display(), dead_pid()));
    let live = PathBuf::from(format!("{}.tmp-{}", dst.display(), std::process::id()));
    for d in [&dead, &live] {
        std::fs::create_dir_all(d.join("packed_experts")).unwrap();
        std::fs::write(d.join("packed_experts/layer_00.bin"), vec![0u8; 4096]).unwrap();
        std::fs::write(d.join(moeflux::format::outdir::MARKER), "").unwrap();
    }
    (dead, live)
}

fn convert_fixture(dst: &Path, force: bool) -> String {
    let mut cmd = moeflux();
    cmd.arg("convert").arg(fixture("qwen3_moe")).arg(dst);
    if force {
        cmd.arg("--force");
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    err
}

#[test]
fn only_marked_temporary_directories_are_removed_and_files_are_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("m");
    let pid = dead_pid();
    // A user's own directory and file that happen to have such names.
    let mine = PathBuf::from(format!("{}.tmp-{pid}", dst.display()));
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("notes.txt"), "mine").unwrap();
    let file = PathBuf::from(format!("{}.old-{pid}", dst.display()));
    std::fs::write(&file, "also mine").unwrap();
    let err = convert_fixture(&dst, false);
    assert_eq!(std::fs::read_to_string(mine.join("notes.txt")).unwrap(), "mine");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "also mine");
    assert!(
        err.contains("left alone") && err.contains(&mine.display().to_string()),
        "{err}"
    );
    assert!(dst.join("model_weights.bin").is_file());
    assert!(!dst.join(moeflux::format::outdir::MARKER).exists());
}

#[test]
fn a_replaced_model_left_by_a_killed_swap_is_restored_or_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("m");
    convert_fixture(&dst, false);
    let marker = moeflux::format::outdir::MARKER;
    // Killed between the two renames: DST is gone, DST.old-<pid> holds it.
    let old = PathBuf::from(format!("{}.old-{}", dst.display(), dead_pid()));
    std::fs::rename(&dst, &old).unwrap();
    std::fs::write(old.join(marker), "").unwrap();
    // The next run puts it back before it replaces it (--force).
    let err = convert_fixture(&dst, true);
    assert!(
        err.contains("restored") && err.contains(&old.display().to_string()),
        "{err}"
    );
    assert!(!old.exists() && dst.join("model_weights.bin").is_file() && !dst.join(marker).exists());
    // Killed after the new model was in place: the old one is removed.
    let old = PathBuf::from(format!("{}.old-{}", dst.display(), dead_pid()));
    std::fs::create_dir(&old).unwrap();
    std::fs::write(old.join(marker), "").unwrap();
    let err = convert_fixture(&dst, true);
    assert!(!old.exists(), "{err}");
    let names = entries(tmp.path(), "m.");
    assert!(names.is_empty(), "{names:?}");
}

#[test]
fn convert_removes_what_a_killed_run_left() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("m");
    let (dead, live) = plant(&dst);
    let out = moeflux()
        .arg("convert")
        .arg(fixture("qwen3_moe"))
        .arg(&dst)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!dead.exists(), "{} was not removed", dead.display());
    assert!(
        err.contains("removed") && err.contains(&dead.display().to_string()),
        "{err}"
    );
    assert!(live.exists() && err.contains("still running"), "{err}");
}

#[test]
fn synth_removes_what_a_killed_run_left() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("config.json");
    let mut v = moeflux::synth::preset("qwen3-30b-a3b").unwrap();
    for (k, x) in [
        ("hidden_size", 128),
        ("vocab_size", 512),
        ("num_experts", 8),
        ("moe_intermediate_size", 64),
    ] {
        v[k] = x.into();
    }
    std::fs::write(&cfg, v.to_string()).unwrap();
    let dst = tmp.path().join("m");
    let (dead, live) = plant(&dst);
    // The hidden temporary directory of earlier versions.
    let legacy = tmp.path().join(".m.synth-tmp");
    std::fs::create_dir(&legacy).unwrap();
    let out = moeflux()
        .args(["synth", "--layers", "2", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&dst)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!dead.exists() && !legacy.exists(), "{err}");
    assert!(err.contains(&dead.display().to_string()), "{err}");
    assert!(live.exists() && err.contains("still running"), "{err}");
}
