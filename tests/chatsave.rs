//! The chat save (`/save`, `/load`): a failed load leaves the session and
//! the conversation exactly as they were; corrupt saves, token lists that
//! do not match the state and token ids outside the vocabulary are refused;
//! version 1 saves are still read.

mod common;

use common::*;
use moeflux::chatsave;
use moeflux::{Model, Session};
use serde_json::{json, Value};
use std::path::Path;

const TOKENS: [u32; 8] = [3, 101, 57, 402, 260, 19, 333, 7];

/// Everything a failed load must not change.
#[derive(Debug, PartialEq)]
struct Observed {
    pos: usize,
    tokens: Option<Vec<u32>>,
    checkpoints: Vec<usize>,
    snapshot: Vec<u8>,
}

fn observe(s: &Session<'_>) -> Observed {
    let mut snapshot = Vec::new();
    s.save_state(&mut snapshot).unwrap();
    Observed {
        pos: s.pos(),
        tokens: s.tokens().map(<[u32]>::to_vec),
        checkpoints: s.checkpoints(),
        snapshot,
    }
}

fn messages() -> Vec<Value> {
    vec![
        json!({"role": "user", "content": "hi"}),
        json!({"role": "assistant", "content": "hello"}),
    ]
}

/// A save of `TOKENS[..n]` from a session over `m`.
fn save_of(m: &Model, n: usize) -> Vec<u8> {
    let mut s = m.session().unwrap();
    s.eval_prompt(&TOKENS[..n], 0).unwrap();
    chatsave::encode(&s, &messages(), &TOKENS[..n]).unwrap()
}

/// Rewrite a save's JSON with `edit` (keeping its version; a version 2
/// save gets a fresh checksum).
fn edit_json(buf: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let version = u32::from_le_bytes(buf[8..12].try_into().unwrap());
    let body = if version >= 2 { &buf[..buf.len() - 4] } else { buf };
    let n = u64::from_le_bytes(body[12..20].try_into().unwrap()) as usize;
    let mut meta: Value = serde_json::from_slice(&body[20..20 + n]).unwrap();
    edit(&mut meta);
    let meta = serde_json::to_vec(&meta).unwrap();
    let mut out = body[..12].to_vec();
    out.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    out.extend_from_slice(&meta);
    out.extend_from_slice(&body[20 + n..]);
    if version >= 2 {
        let crc = moeflux::checksum::crc32(&out);
        out.extend_from_slice(&crc.to_le_bytes());
    }
    out
}

/// A session holding some state of its own, and what it looks like.
fn busy_session(m: &Model) -> (Session<'_>, Observed) {
    let mut s = m.session().unwrap();
    s.eval_prompt(&[9, 8, 7, 6, 5], 0).unwrap();
    s.checkpoint(5).unwrap();
    s.eval_prompt(&[4, 3], 5).unwrap();
    let o = observe(&s);
    (s, o)
}

fn refused_without_change(m: &Model, bad: &[u8], what: &str) -> String {
    let (mut s, before) = busy_session(m);
    let e = chatsave::load(&mut s, bad, Path::new("bad.chat"))
        .map(|_| ())
        .expect_err(what)
        .to_string();
    assert_eq!(observe(&s), before, "{what}: the session changed");
    assert!(e.contains("bad.chat"), "{what}: {e}");
    e
}

#[test]
fn round_trip_continues_identically() {
    for name in ["qwen3_moe", "qwen3_next"] {
        let m = open_cpu(&packed(name));
        let buf = save_of(&m, 6);
        let mut a = m.session().unwrap();
        a.eval_prompt(&TOKENS[..6], 0).unwrap();
        let want = a.eval_prompt(&TOKENS[6..], 6).unwrap();

        let (mut s, _) = busy_session(&m);
        let save = chatsave::load(&mut s, &buf, Path::new("x")).unwrap();
        assert_eq!(save.version, chatsave::VERSION);
        assert_eq!((save.messages, save.tokens.as_slice()), (messages(), &TOKENS[..6]));
        assert_eq!(s.tokens(), Some(&TOKENS[..6]));
        let got = s.eval_prompt(&TOKENS[6..], 6).unwrap();
        assert!(rel_l2(&got, &want) <= 1e-5, "{name}");
        // The recurrent model keeps the loaded state as a checkpoint, so
        // that it can rewind to it.
        if name == "qwen3_next" {
            s.truncate(6).unwrap();
            assert_eq!(s.pos(), 6);
        }
    }
}

#[test]
fn a_token_list_that_does_not_match_the_state_changes_nothing() {
    let m = open_cpu(&packed("qwen3_moe"));
    let buf = save_of(&m, 6);
    let short = edit_json(&buf, |v| {
        v["tokens"].as_array_mut().unwrap().pop();
    });
    let e = refused_without_change(&m, &short, "fewer tokens than positions");
    assert!(e.contains("6 positions") && e.contains("5 tokens"), "{e}");
    let long = edit_json(&buf, |v| v["tokens"].as_array_mut().unwrap().push(json!(1)));
    refused_without_change(&m, &long, "more tokens than positions");
}

#[test]
fn token_ids_outside_the_vocabulary_are_refused() {
    let m = open_cpu(&packed("qwen3_moe"));
    let buf = save_of(&m, 6);
    let bad = edit_json(&buf, |v| v["tokens"][2] = json!(m.n_vocab()));
    let e = refused_without_change(&m, &bad, "token id = vocab size");
    assert!(e.contains("512") && e.contains("vocabulary"), "{e}");
    for t in [json!(-1), json!(1.5), json!("7"), json!(1u64 << 40)] {
        let bad = edit_json(&buf, |v| v["tokens"][0] = t.clone());
        let e = refused_without_change(&m, &bad, &format!("token {t}"));
        assert!(e.contains("tokens[0]"), "{e}");
    }
}

#[test]
fn flipped_bytes_are_caught_by_the_checksum() {
    let m = open_cpu(&packed("qwen3_moe"));
    let buf = save_of(&m, 6);
    // A byte of the state, of the JSON, of the checksum itself.
    for at in [buf.len() - 100, 30, buf.len() - 1] {
        let mut bad = buf.clone();
        bad[at] ^= 0x10;
        let e = refused_without_change(&m, &bad, &format!("flip at {at}"));
        assert!(e.contains("checksum"), "{e}");
    }
    refused_without_change(&m, &buf[..buf.len() - 3], "truncated");
}

/// A version 1 save: no checksum after the state.
fn as_version_1(buf: &[u8]) -> Vec<u8> {
    let mut out = buf[..buf.len() - 4].to_vec();
    out[8..12].copy_from_slice(&1u32.to_le_bytes());
    out
}

#[test]
fn version_1_saves_are_still_read() {
    let m = open_cpu(&packed("qwen3_moe"));
    let v1 = as_version_1(&save_of(&m, 6));
    let mut s = m.session().unwrap();
    let save = chatsave::load(&mut s, &v1, Path::new("old.chat")).unwrap();
    assert_eq!((save.version, s.pos()), (1, 6));
    // Without a checksum, the checks behind it still hold.
    let short = edit_json(&v1, |v| {
        v["tokens"].as_array_mut().unwrap().pop();
    });
    refused_without_change(&m, &short, "version 1, fewer tokens");
}

/// Regression: `/load` of a save whose token list is shorter than its
/// state wiped the live session (34 → 0 positions).
#[test]
fn chat_load_of_a_bad_save_keeps_the_live_session() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("packed");
    convert("qwen3_moe_mlx4", &dst, &[]);
    let good = tmp.path().join("good.chat");
    let (_, stderr) = chat(
        &dst,
        "qwen3.jinja",
        4,
        &format!("hello\n/save {}\n/stats\n", good.display()),
    );
    let held = positions(&stderr);
    assert!(held[0] > 0, "{stderr}");
    let bad = tmp.path().join("bad.chat");
    let buf = std::fs::read(&good).unwrap();
    std::fs::write(
        &bad,
        edit_json(&buf, |v| {
            v["tokens"].as_array_mut().unwrap().pop();
        }),
    )
    .unwrap();
    let (_, stderr) = chat(
        &dst,
        "qwen3.jinja",
        4,
        &format!("hello\n/stats\n/load {}\n/stats\n", bad.display()),
    );
    let p = positions(&stderr);
    assert!(p.len() == 2 && p[0] > 0 && p[1] == p[0], "{p:?}\n{stderr}");
    assert!(stderr.contains("bad.chat"), "{stderr}");
}

/// The positions of each `/stats` line (`session: N of M positions`).
fn positions(stderr: &str) -> Vec<usize> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("session: ")?.split_whitespace().next()?.parse().ok())
        .collect()
}

/// Regression: `/load /dev/zero` read until memory ran out. The header
/// is checked first, the declared length bounded, and no more is read
/// than a save of the model can hold.
#[test]
fn loads_read_a_bounded_number_of_bytes() {
    let m = open_cpu(&packed("qwen3_moe"));
    let e = chatsave::read_file(&m, Path::new("/dev/zero")).unwrap_err().to_string();
    assert!(e.contains("/dev/zero") && e.contains("MFLXCHAT"), "{e}");
    let tmp = tempfile::tempdir().unwrap();
    let good = save_of(&m, 4);
    // A conversation "length" of 2^40 bytes.
    let mut huge = good.clone();
    huge[12..20].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let p = tmp.path().join("huge.chat");
    std::fs::write(&p, &huge).unwrap();
    let e = chatsave::read_file(&m, &p).unwrap_err().to_string();
    assert!(e.contains("over the limit"), "{e}");
    // A valid header followed by an endless stream (a FIFO).
    let fifo = tmp.path().join("endless.chat");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let head = good[..20].to_vec();
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
            f.write_all(&head).unwrap();
            let zeros = vec![0u8; 1 << 16];
            // Until the reader has had enough and closes its end.
            while f.write_all(&zeros).is_ok() {}
        })
    };
    let e = chatsave::read_file(&m, &fifo).unwrap_err().to_string();
    assert!(e.contains("longer than a save of this model"), "{e}");
    writer.join().unwrap();
    // A good save still reads, and loads.
    let p = tmp.path().join("good.chat");
    std::fs::write(&p, &good).unwrap();
    let buf = chatsave::read_file(&m, &p).unwrap();
    let mut s = m.session().unwrap();
    chatsave::load(&mut s, &buf, &p).unwrap();
    assert_eq!(s.pos(), 4);
}

#[test]
fn chat_load_of_dev_zero_is_an_error_and_the_chat_goes_on() {
    let dst = packed("qwen3_moe");
    let (_, stderr) = chat(&dst, "qwen3.jinja", 2, "hello\n/load /dev/zero\n/stats\n");
    assert!(stderr.contains("/dev/zero") && stderr.contains("MFLXCHAT"), "{stderr}");
    assert!(positions(&stderr)[0] > 0, "{stderr}");
}

/// A save made by one model is refused by another of the same shape,
/// naming both; one made before saves recorded the model still loads.
#[test]
fn a_save_of_another_model_is_refused_naming_both() {
    let a = open_cpu(&packed("qwen3_moe"));
    let b = open_cpu(&packed_with("qwen3_moe", &["--bits", "8"]));
    assert_ne!(a.identity(), b.identity());
    let buf = save_of(&a, 5);
    let (_, before) = busy_session(&b);
    let mut s = busy_session(&b).0;
    let e = chatsave::load(&mut s, &buf, Path::new("a.chat"))
        .unwrap_err()
        .to_string();
    assert!(e.contains(a.identity()) && e.contains(b.identity()), "{e}");
    assert_eq!(observe(&s), before);
    let anonymous = edit_json(&buf, |v| {
        v.as_object_mut().unwrap().remove("identity");
    });
    chatsave::load(&mut s, &anonymous, Path::new("old.chat")).unwrap();
    assert_eq!(s.pos(), 5);
}

/// No file beside the save but the save: a temporary name nobody can
/// plant a link at, and nothing left when the write fails.
#[test]
fn saves_never_write_through_links_or_leave_temporary_files() {
    let m = open_cpu(&packed("qwen3_moe"));
    let buf = save_of(&m, 3);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("saves");
    std::fs::create_dir(&dir).unwrap();
    let victim = tmp.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let path = dir.join("s.chat");
    // Links at the names earlier versions wrote through.
    std::os::unix::fs::symlink(&victim, dir.join(format!("s.chat.tmp{}", std::process::id()))).unwrap();
    std::os::unix::fs::symlink(&victim, &path).unwrap();
    chatsave::write_file(&path, &buf).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(!path.symlink_metadata().unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read(&path).unwrap(), buf);
    std::fs::remove_file(dir.join(format!("s.chat.tmp{}", std::process::id()))).unwrap();
    // A save that cannot be renamed into place (a directory is there).
    std::fs::create_dir(dir.join("d.chat")).unwrap();
    std::fs::write(dir.join("d.chat/x"), "").unwrap();
    assert!(chatsave::write_file(&dir.join("d.chat"), &buf).is_err());
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

/// Regression: a `/save` that failed part-way (a full disk; here a file
/// size limit, its signal ignored) left `FILE.tmp<pid>` behind.
#[test]
fn a_save_that_fails_part_way_leaves_nothing() {
    use std::io::Write;
    use std::process::Stdio;
    let dst = packed("qwen3_moe");
    let tmp = tempfile::tempdir().unwrap();
    let save = tmp.path().join("s.chat");
    let script = format!(
        "trap '' XFSZ; ulimit -f 2; exec '{}' chat --device cpu -n 8 --model '{}' --chat-template '{}'",
        env!("CARGO_BIN_EXE_moeflux"),
        dst.display(),
        fixture("text/templates/qwen3.jinja").display()
    );
    let mut child = std::process::Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let input = format!(
        "hello there, a longer prompt to fill the state\n/save {}\n",
        save.display()
    );
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("s.chat") && err.contains("too large") && !err.contains("panicked"),
        "{err}"
    );
    let names: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.is_empty(), "{names:?}\n{err}");
}
