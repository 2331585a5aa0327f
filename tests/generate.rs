//! Generation: `moeflux run` against transformers' greedy generate on every
//! golden fixture, seeded sampling, stop strings and limits, Ctrl-C, the
//! prefix reuse of the library's generator, and `moeflux chat` end to end.

mod common;

use common::*;
use moeflux::generate::{Finish, Generation, Generator, Request};
use moeflux::text::{SamplingParams, Tokenizer};
use moeflux::{Device, Model, Options, Session};
use serde_json::Value;
use std::io::Read;
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

fn run(dir: &Path, args: &[&str]) -> Output {
    moeflux()
        .arg("run")
        .arg("--model")
        .arg(dir)
        .args(["--device", "cpu"])
        .args(args)
        .output()
        .expect("run moeflux run")
}

/// `moeflux run --json ARGS`, parsed; panics with stderr on failure.
fn run_json(dir: &Path, args: &[&str]) -> Value {
    let out = run(dir, &[&["--json"], args].concat());
    assert!(
        out.status.success(),
        "run failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object on stdout")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn csv(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// Greedy decoding from `greedy.prompt` gives transformers' `greedy.tokens`
/// (greedy and without penalties, whatever the fixture's
/// generation_config.json says: the trained demo model's samples), and the
/// streamed text is the decode of them.
fn greedy(name: &str, flags: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("packed");
    convert(name, &dst, flags);
    let r = reference(name);
    let n = r.greedy_tokens.len().to_string();
    let greedy = ["--temperature", "0", "--repeat-penalty", "1"];
    let j = run_json(
        &dst,
        &[&greedy[..], &["--prompt-ids", &csv(&r.greedy_prompt), "-n", &n]].concat(),
    );
    assert_eq!(ids(&j["prompt_tokens"]), r.greedy_prompt, "{name}: prompt echoed");
    assert_eq!(
        ids(&j["tokens"]),
        r.greedy_tokens,
        "{name}: greedy tokens differ from transformers"
    );
    assert_eq!(j["stats"]["finish"], "length", "{name}");
    assert_eq!(j["stats"]["generated_tokens"], r.greedy_tokens.len(), "{name}");
    let tok = Tokenizer::from_dir(fixture(name)).unwrap();
    assert_eq!(
        j["text"].as_str().unwrap(),
        tok.decode(&r.greedy_tokens, true).unwrap(),
        "{name}: streamed text is not the decode of the tokens"
    );
}

mod greedy_matches_transformers {
    crate::golden_fixture_tests!(super::greedy);
}

const DEMO: &str = "qwen3_5_moe_mlx4";

#[test]
fn seeded_sampling_is_reproducible_and_streams_what_json_reports() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("packed");
    convert(DEMO, &dst, &[]);
    let sample = |seed: &str| {
        let flags = ["-p", "Hello", "-n", "24", "--temperature", "0.9", "--top-p", "0.95"];
        run_json(&dst, &[&flags[..], &["--seed", seed]].concat())
    };
    let (a, b, c) = (sample("42"), sample("42"), sample("43"));
    assert_eq!(a["tokens"], b["tokens"]);
    assert_eq!(a["text"], b["text"]);
    assert_eq!(a["stats"]["seed"], 42);
    assert_ne!(a["tokens"], c["tokens"], "another seed, another sample");
    assert_eq!(ids(&a["tokens"]).len(), 24);

    // Streaming prints the same text, and the summary goes to stderr.
    let out = run(
        &dst,
        &[
            "-p",
            "Hello",
            "-n",
            "24",
            "--temperature",
            "0.9",
            "--top-p",
            "0.95",
            "--seed",
            "42",
            "--timing",
        ],
    );
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let text = a["text"].as_str().unwrap();
    assert!(
        stdout == text || stdout == format!("{text}\n"),
        "stdout {stdout:?} vs json {text:?}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    for want in [
        "prompt ",
        "generated 24 tokens (token limit)",
        "seed 42",
        "prefill ",
        "decode ",
        "first token",
        "MB/token",
        "hit rate",
        "expert I/O wait",
        "expert compute",
        "dense FFN",
        "lm head",
    ] {
        assert!(stderr.contains(want), "summary lacks {want:?}:\n{stderr}");
    }
}

#[test]
fn stop_strings_context_end_and_bad_prompts() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("packed");
    convert(DEMO, &dst, &[]);
    let prompt = csv(&reference(DEMO).greedy_prompt);

    // A stop string ends the text before it.
    let full = run_json(&dst, &["--prompt-ids", &prompt, "-n", "24"]);
    let text = full["text"].as_str().unwrap();
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() > 10, "greedy text too short: {text:?}");
    let stop: String = chars[6..9].iter().collect();
    let stopped = run_json(&dst, &["--prompt-ids", &prompt, "-n", "24", "--stop", &stop]);
    assert_eq!(stopped["text"].as_str().unwrap(), &text[..text.find(&stop).unwrap()]);
    assert_eq!(stopped["stats"]["finish"], "stop");
    assert_eq!(stopped["stats"]["stop"], stop.as_str());
    let n_stop = ids(&stopped["tokens"]).len();
    assert!(n_stop < 24);
    assert_eq!(ids(&stopped["tokens"]), ids(&full["tokens"])[..n_stop]);

    // A 12-position context: -n 0 generates until it is full (the last
    // token is sampled after position 11 and never evaluated).
    let config = dst.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    let key = if c["text_config"].is_object() {
        &mut c["text_config"]
    } else {
        &mut c
    };
    key["max_position_embeddings"] = 12.into();
    std::fs::write(&config, serde_json::to_string(&c).unwrap()).unwrap();
    let to_end = run_json(&dst, &["--prompt-ids", &prompt, "-n", "0"]);
    assert_eq!(to_end["stats"]["finish"], "context_full");
    assert_eq!(ids(&to_end["tokens"]), ids(&full["tokens"])[..12 - 5 + 1]);

    let twelve = csv(&[7; 12]);
    let one = run_json(&dst, &["--prompt-ids", &twelve, "-n", "0"]);
    assert_eq!(ids(&one["tokens"]).len(), 1);

    // Too long for the context, empty, out of the vocabulary: clear errors.
    let out = run(&dst, &["--prompt-ids", &csv(&[7; 13])]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("13 tokens") && err.contains("context of 12"), "{err}");
    let out = run(&dst, &["--prompt-ids", "3,99999"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("99999"));
    let out = run(&dst, &["-p", "hi", "--chat"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--chat-template"));
}

#[test]
fn ctrl_c_stops_the_generation_and_prints_the_summary() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("packed");
    convert(DEMO, &dst, &[]);
    let mut child = moeflux()
        .args(["run", "--device", "cpu", "-p", "Hello", "-n", "0", "--model"])
        .arg(&dst)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).expect("some text before the interrupt");
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("(cancelled)") && stderr.contains("decode "), "{stderr}");
}

fn open(dir: &Path) -> Model {
    let opts = Options {
        device: Device::Cpu,
        exact: true,
        ..Options::default()
    };
    Model::open(dir, &opts).unwrap()
}

fn greedy_params(n: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens: Some(n),
        ..SamplingParams::default()
    }
}

fn generate(s: &mut Session<'_>, tok: &Tokenizer, req: Request<'_>) -> Generation {
    let mut g = Generator::start(s, tok, req).unwrap();
    let mut text = String::new();
    while let Some(piece) = g.next_piece().unwrap() {
        assert!(!piece.is_empty());
        text.push_str(&piece);
    }
    let out = g.finish().unwrap();
    assert_eq!(out.text, text);
    out
}

/// A second request evaluated after a first on the same session (rewound
/// to the common prefix) generates what a fresh session does.
fn prefix_reuse(name: &str, recurrent: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("packed");
    convert(name, &dst, &[]);
    let model = open(&dst);
    let tok = Tokenizer::from_dir(&dst).unwrap();
    let fresh = |prompt: &[u32]| {
        let mut s = model.session().unwrap();
        generate(&mut s, &tok, Request::new(prompt, greedy_params(6))).tokens
    };
    let req = |prompt| Request {
        checkpoints: true,
        checkpoint_at: Some(3),
        ..Request::new(prompt, greedy_params(6))
    };
    let mut s = model.session().unwrap();
    let p1 = reference(name).greedy_prompt;
    let t1 = generate(&mut s, &tok, req(&p1));
    assert_eq!(t1.stats.reused_tokens, 0);
    assert_eq!(s.pos(), 5 + 5, "prompt and all but the last token held");
    assert_eq!(t1.session_tokens, [&p1[..], &t1.tokens[..5]].concat());

    // Diverges at position 8, inside what the session holds.
    let p2 = [&p1[..], &t1.tokens[..3], &[100, 200, 300]].concat();
    let t2 = generate(&mut s, &tok, req(&p2));
    assert_eq!(t2.tokens, fresh(&p2), "{name}: rewound session vs fresh");
    // A recurrent model replays from its checkpoint at 3; attention caches cut.
    assert_eq!(t2.stats.reused_tokens, if recurrent { 3 } else { 8 }, "{name}");

    // Extends exactly what the session holds: nothing is evaluated again.
    let p3 = [&t2.session_tokens[..], &[t2.tokens[5], 42]].concat();
    let t3 = generate(&mut s, &tok, req(&p3));
    assert_eq!(t3.stats.reused_tokens, t2.session_tokens.len());
    assert_eq!(t3.tokens, fresh(&p3), "{name}: extended session vs fresh");

    // After a reload the session does not know its tokens: `held` says them.
    let mut snap = Vec::new();
    s.save_state(&mut snap).unwrap();
    let mut loaded = model.session().unwrap();
    loaded.load_state(&snap).unwrap();
    loaded.checkpoint(loaded.pos()).unwrap();
    let p4 = [&t3.session_tokens[..], &[t3.tokens[5], 9]].concat();
    let t4 = generate(
        &mut loaded,
        &tok,
        Request {
            held: Some(&t3.session_tokens),
            ..req(&p4)
        },
    );
    assert_eq!(t4.stats.reused_tokens, t3.session_tokens.len());
    assert_eq!(t4.tokens, fresh(&p4), "{name}: reloaded session vs fresh");
}

#[test]
fn prefix_reuse_recurrent() {
    prefix_reuse("qwen3_5_moe_mlx4", true);
}

#[test]
fn prefix_reuse_attention() {
    prefix_reuse("qwen3_moe_mlx4", false);
}

#[test]
fn cancel_flag_ends_the_generation() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("packed");
    convert(DEMO, &dst, &[]);
    let model = open(&dst);
    let tok = Tokenizer::from_dir(&dst).unwrap();
    let prompt = reference(DEMO).greedy_prompt;
    let cancel = AtomicBool::new(true);
    let mut s = model.session().unwrap();
    let req = |cancel| Request {
        cancel: Some(cancel),
        ..Request::new(&prompt, greedy_params(50))
    };
    let before = generate(&mut s, &tok, req(&cancel));
    assert_eq!(before.finish, Finish::Cancelled);
    assert!(before.tokens.is_empty());

    cancel.store(false, Ordering::Relaxed);
    let mut g = Generator::start(&mut s, &tok, req(&cancel)).unwrap();
    g.next_piece().unwrap().expect("a first piece");
    let n = g.tokens().len();
    cancel.store(true, Ordering::Relaxed);
    while g.next_piece().unwrap().is_some() {}
    let out = g.finish().unwrap();
    assert_eq!(out.finish, Finish::Cancelled);
    assert_eq!(out.tokens.len(), n, "no token after the flag");
}

/// `(new, reused)` prompt tokens of each turn's stats line.
fn turns(stderr: &str) -> Vec<(usize, usize)> {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.split("| prompt ").nth(1)?;
            let mut w = rest.split_whitespace();
            let new = w.next()?.parse().ok()?;
            w.next(); // "new"
            w.next(); // "+"
            Some((new, w.next()?.parse().ok()?))
        })
        .collect()
}

#[test]
fn chat_keeps_the_conversation_saves_and_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("packed");
    // An attention-only model: the session cuts back to any prefix (the
    // answers of a random model need not re-tokenize to the same ids).
    convert("qwen3_moe_mlx4", &dst, &[]);
    let save = tmp.path().join("conv.mflx");
    let input = format!(
        "hello\nline one\\\nline two\n/save {s}\n/reset\n/load {s}\n\"\"\"\nblock\nof text\n\"\"\"\n/stats\n/load {bad}\n/nope\n",
        s = save.display(),
        bad = dst.join("config.json").display()
    );
    let (stdout, stderr) = chat(&dst, "qwen3.jinja", 6, &input);
    let t = turns(&stderr);
    assert_eq!(
        t.len(),
        3,
        "three messages (a continued line and a block are one each):\n{stderr}"
    );
    assert_eq!(t[0].1, 0);
    // Each later turn evaluates only the new message, also after /load.
    assert!(t[1].1 >= t[0].0 && t[2].1 >= t[1].0 + t[1].1, "{t:?}");
    assert!(
        stderr.contains("saved 4 messages") && stderr.contains("loaded 4 messages"),
        "{stderr}"
    );
    assert!(stderr.contains("not a moeflux chat save"), "{stderr}");
    assert!(stderr.contains("unknown command /nope"));
    assert!(stderr.contains("session: ") && stderr.contains("last answer:"));
    assert!(!stdout.contains('\x1b'), "no colours when stdout is not a terminal");
    let names: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "no temporary file left: {names:?}");
    assert!(save.exists());

    // A template that opens a thought: the answer is shown as thinking.
    // A recurrent model: the second turn resumes from a checkpoint.
    let dst = tmp.path().join("recurrent");
    convert(DEMO, &dst, &[]);
    let (stdout, stderr) = chat(&dst, "qwen3_5.jinja", 6, "hi\nagain\n");
    let t = turns(&stderr);
    assert!(t.len() == 2 && t[1].1 > 0, "{t:?}");
    assert!(stdout.starts_with("<think>"), "{stdout}");
    assert_eq!(stdout.matches("<think>").count(), 2, "{stdout}");
}

/// `--timing`'s phases cover the prefill and the decode without counting
/// any time twice: their sum is at most the time measured around them,
/// and the experts phase splits into I/O wait and compute, neither
/// negative (parallel reads once summed to more than the phase lasted).
#[test]
fn timing_phases_add_up_to_the_time_they_cover() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("packed");
    convert("demo_kjv", &dst, &[]);
    let model = open(&dst);
    model.set_timing(true);
    let tok = Tokenizer::from_dir(&dst).unwrap();
    let prompt = tok
        .encode(
            "And it came to pass in those days, that the king sent unto all the people",
            false,
        )
        .unwrap();
    let mut s = model.session().unwrap();
    let req = Request {
        timing: true,
        ..Request::new(&prompt, greedy_params(16))
    };
    let out = generate(&mut s, &tok, req);
    let st = &out.stats;
    for (name, p, wall) in [
        ("prefill", st.prefill_phases.expect("prefill phases"), st.prefill_s),
        ("decode", st.decode_phases.expect("decode phases"), st.decode_s),
    ] {
        assert!(
            p.total() <= wall + 1e-6,
            "{name}: phases add up to {} s of {wall} s",
            p.total()
        );
        assert!(p.expert_io_wait >= 0.0 && p.expert_compute > 0.0, "{name}: {p:?}");
        assert!(p.attention > 0.0 && p.lm_head > 0.0, "{name}: {p:?}");
    }
}
