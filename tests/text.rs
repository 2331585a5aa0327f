//! The text layer against Hugging Face's own code: token ids and decoding
//! against Python `tokenizers`, chat templates byte for byte against
//! `transformers.apply_chat_template(..., tokenize=False)`, on real published
//! tokenizers and templates (tests/fixtures/text/README.md; the reference
//! outputs are made by tools/make_text_fixtures.py). Then streaming
//! detokenisation and stop conditions on those tokenizers (the sampler's
//! tests are unit tests in src/text/sampling.rs).

use moeflux::text::{
    ChatRequest, ChatTemplate, Detokenizer, FinishReason, GenerationDefaults, SamplingParams, StopMatcher, TextStream,
    Tokenizer,
};
use moeflux::Error;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/text")
}

fn cases() -> &'static Value {
    static CASES: OnceLock<Value> = OnceLock::new();
    CASES.get_or_init(|| {
        let text = std::fs::read_to_string(fixtures().join("cases.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    })
}

/// A fixture model directory with `tokenizer.json` decompressed, as a model
/// directory holds it (unpacked once per test run).
fn model_dir(name: &str) -> PathBuf {
    static UNPACKED: OnceLock<PathBuf> = OnceLock::new();
    let root = UNPACKED.get_or_init(|| {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("text-fixtures");
        for entry in std::fs::read_dir(fixtures()).unwrap() {
            let src = entry.unwrap().path();
            if !src.is_dir() || src.ends_with("templates") {
                continue;
            }
            let dst = root.join(src.file_name().unwrap());
            std::fs::create_dir_all(&dst).unwrap();
            for file in std::fs::read_dir(&src).unwrap() {
                let file = file.unwrap().path();
                let name = file.file_name().unwrap().to_str().unwrap().to_string();
                if let Some(plain) = name.strip_suffix(".xz") {
                    let mut input = std::io::BufReader::new(std::fs::File::open(&file).unwrap());
                    let mut out = Vec::new();
                    lzma_rs::xz_decompress(&mut input, &mut out).unwrap();
                    write_atomically(&dst.join(plain), &out);
                } else {
                    write_atomically(&dst.join(&name), &std::fs::read(&file).unwrap());
                }
            }
        }
        root
    });
    root.join(name)
}

/// The fixture tokenizers, loaded once (parsing a 7 MB tokenizer.json takes a while).
fn tokenizer(name: &str) -> Tokenizer {
    static LOADED: OnceLock<Mutex<HashMap<String, Tokenizer>>> = OnceLock::new();
    let mut loaded = LOADED.get_or_init(Default::default).lock().unwrap();
    loaded
        .entry(name.to_string())
        .or_insert_with(|| Tokenizer::from_dir(model_dir(name)).unwrap())
        .clone()
}

/// Write through a temporary file and a rename, so that test processes
/// running at the same time never see a half-written file.
fn write_atomically(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn tokenizer_cases() -> impl Iterator<Item = (&'static str, &'static Value)> {
    cases()["tokenizers"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(name, list)| list.as_array().unwrap().iter().map(move |c| (name.as_str(), c)))
}

// --- tokenizer -------------------------------------------------------------------------------

#[test]
fn token_ids_and_decoding_match_python_tokenizers() {
    let mut n = 0;
    for name in ["qwen2", "deepseek_v3", "byte_fallback"] {
        let tok = tokenizer(name);
        for c in cases()["tokenizers"][name].as_array().unwrap() {
            let text = c["text"].as_str().unwrap();
            let ids = ids_of(&c["ids"]);
            assert_eq!(tok.encode(text, false).unwrap(), ids, "{name}: {text:?}");
            assert_eq!(
                tok.encode(text, true).unwrap(),
                ids_of(&c["ids_with_special"]),
                "{name}: {text:?}"
            );
            assert_eq!(tok.decode(&ids, false).unwrap(), c["decoded"], "{name}: {text:?}");
            assert_eq!(
                tok.decode(&ids, true).unwrap(),
                c["decoded_skip_special"],
                "{name}: {text:?}"
            );
            n += 1;
        }
    }
    assert!(n >= 50, "only {n} cases");
}

#[test]
fn decode_round_trips_byte_level_text() {
    // DeepSeek's byte-level BPE has no normalizer: every text comes back.
    let tok = tokenizer("deepseek_v3");
    for c in cases()["tokenizers"]["deepseek_v3"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        assert_eq!(tok.decode(&tok.encode(text, false).unwrap(), false).unwrap(), text);
    }
    // Qwen normalizes to NFC first: a decomposed é comes back composed.
    let qwen = tokenizer("qwen2");
    let ids = qwen.encode("e\u{301}", false).unwrap();
    assert_eq!(qwen.decode(&ids, false).unwrap(), "\u{e9}");
}

#[test]
fn special_tokens_and_eos_ids() {
    let qwen = tokenizer("qwen2");
    assert_eq!(qwen.token_to_id("<|im_end|>"), Some(151645));
    assert_eq!(qwen.id_to_token(151643).as_deref(), Some("<|endoftext|>"));
    assert_eq!(qwen.vocab_size(), 151646);
    // No generation_config.json: the eos_token of tokenizer_config.json.
    assert_eq!(qwen.eos_token(), Some("<|endoftext|>"));
    assert_eq!(qwen.eos_ids(), &[151643]);
    let ds = tokenizer("deepseek_v3");
    assert_eq!(ds.bos_token(), Some("<｜begin▁of▁sentence｜>"));
    assert_eq!(ds.eos_ids(), &[1]);
    assert!(matches!(
        qwen.decode(&[151646], false),
        Err(Error::TokenOutOfRange {
            token: 151646,
            vocab: 151646
        })
    ));
}

/// A temporary model directory holding qwen2's tokenizer files plus `extra`.
fn qwen_dir_with(extra: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(model_dir("qwen2").join(f), dir.path().join(f)).unwrap();
    }
    for (name, text) in extra {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

#[test]
fn generation_config_gives_eos_ids_and_sampling_defaults() {
    // In the form of Qwen3's generation_config.json.
    let qwen3 = r#"{"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
        "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95}"#;
    let dir = qwen_dir_with(&[("generation_config.json", qwen3)]);
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.eos_ids(), &[151645, 151643]);
    let g = GenerationDefaults::from_dir(dir.path()).unwrap();
    let p = SamplingParams::from_defaults(&g);
    assert_eq!((p.temperature, p.top_k, p.top_p, p.min_p), (0.6, 20, 0.95, 0.0));
    assert_eq!(p.repetition_penalty, 1.0);

    // An int eos_token_id, and do_sample false: greedy.
    let greedy = r#"{"eos_token_id": 7, "do_sample": false, "temperature": 0.6, "repetition_penalty": 1.1}"#;
    let dir = qwen_dir_with(&[("generation_config.json", greedy)]);
    assert_eq!(Tokenizer::from_dir(dir.path()).unwrap().eos_ids(), &[7]);
    let p = SamplingParams::from_defaults(&GenerationDefaults::from_dir(dir.path()).unwrap());
    assert_eq!((p.temperature, p.repetition_penalty), (0.0, 1.1));

    // config.json's eos_token_id comes before tokenizer_config.json's eos_token.
    let dir = qwen_dir_with(&[("config.json", r#"{"text_config": {"eos_token_id": 151645}}"#)]);
    assert_eq!(Tokenizer::from_dir(dir.path()).unwrap().eos_ids(), &[151645]);

    // No generation_config.json: everything unset.
    assert_eq!(
        GenerationDefaults::from_dir(&model_dir("qwen2")).unwrap(),
        GenerationDefaults::default()
    );

    let bad = qwen_dir_with(&[("generation_config.json", r#"{"eos_token_id": "x"}"#)]);
    let err = Tokenizer::from_dir(bad.path()).unwrap_err().to_string();
    assert!(
        err.contains("generation_config.json") && err.contains("eos_token_id"),
        "{err}"
    );
}

#[test]
fn missing_or_corrupt_files_are_named() {
    let empty = tempfile::tempdir().unwrap();
    let err = Tokenizer::from_dir(empty.path()).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
    std::fs::write(empty.path().join("tokenizer.json"), "{\"version\": ").unwrap();
    let err = Tokenizer::from_dir(empty.path()).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
    let dir = qwen_dir_with(&[("tokenizer_config.json", "[1, 2")]);
    let err = Tokenizer::from_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("tokenizer_config.json"), "{err}");
    let err = ChatTemplate::from_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("tokenizer_config.json"), "{err}");
    let dir = qwen_dir_with(&[("chat_template.jinja", "{% if %}")]);
    let err = ChatTemplate::from_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("chat_template.jinja"), "{err}");
    // A directory without any template.
    assert!(ChatTemplate::from_dir(empty.path()).unwrap().is_none());
}

// --- streaming detokenisation ----------------------------------------------------------------

#[test]
fn streamed_text_equals_full_decode_and_never_splits_a_character() {
    let mut held_back = 0;
    for (name, c) in tokenizer_cases() {
        let tok = tokenizer(name);
        let ids = ids_of(&c["ids"]);
        for skip in [false, true] {
            let full = tok.decode(&ids, skip).unwrap();
            let mut detok = Detokenizer::new(tok.clone(), skip);
            let mut streamed = String::new();
            for &id in &ids {
                match detok.push(id).unwrap() {
                    Some(piece) => {
                        assert!(!piece.contains('\u{FFFD}'), "{name}: broken character in {piece:?}");
                        streamed.push_str(&piece);
                    }
                    None => held_back += 1,
                }
            }
            streamed.push_str(&detok.finish().unwrap());
            assert_eq!(streamed, full, "{name} skip_special={skip}");
        }
    }
    // Multi-token characters (emoji, CJK, byte-fallback bytes) were held back.
    assert!(held_back > 20, "held back only {held_back} times");
}

#[test]
fn byte_fallback_tokens_make_one_character() {
    let tok = tokenizer("byte_fallback");
    let ids = tok.encode("hello € world", false).unwrap();
    let bytes: Vec<u32> = ["<0xE2>", "<0x82>", "<0xAC>"]
        .iter()
        .map(|t| tok.token_to_id(t).unwrap())
        .collect();
    assert!(ids.windows(3).any(|w| w == bytes.as_slice()), "{ids:?}");
    let mut detok = Detokenizer::new(tok.clone(), true);
    let pieces: Vec<Option<String>> = ids.iter().map(|&id| detok.push(id).unwrap()).collect();
    assert_eq!(pieces.iter().filter(|p| p.is_none()).count(), 2, "{pieces:?}");
    assert!(pieces.iter().flatten().any(|p| p.contains('€')), "{pieces:?}");
    // A stream that ends inside a character shows it as U+FFFD, as a full decode does.
    let mut detok = Detokenizer::new(tok.clone(), true);
    assert_eq!(detok.push(bytes[0]).unwrap(), None);
    assert_eq!(detok.finish().unwrap(), tok.decode(&bytes[..1], true).unwrap());
}

// --- stop conditions -------------------------------------------------------------------------

fn stops(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn stop_strings_across_pieces() {
    let mut m = StopMatcher::new(&stops(&["###", "STOP"]));
    assert_eq!(m.push("ab#").text, "ab"); // "#" could start "###"
    let out = m.push("#");
    assert_eq!((out.text.as_str(), out.stop.as_deref()), ("", None));
    let out = m.push("#cd");
    assert_eq!((out.text.as_str(), out.stop.as_deref()), ("", Some("###")));
    assert_eq!(m.push("more").text, "");

    // Held text is released once it can no longer match.
    let mut m = StopMatcher::new(&stops(&["STOP"]));
    assert_eq!(m.push("go ST").text, "go ");
    assert_eq!(m.push("OCK ").text, "STOCK ");
    assert_eq!(m.push("S").text, "");
    assert_eq!(m.finish(), "S");

    // The earliest stop string wins; multi-byte text is never cut.
    let mut m = StopMatcher::new(&stops(&["é!", "b"]));
    assert_eq!(m.push("café").text, "caf");
    let out = m.push("! ab");
    assert_eq!((out.text.as_str(), out.stop.as_deref()), ("", Some("é!")));
    let mut m = StopMatcher::new(&stops(&["bc", "abcd", "c"]));
    let out = m.push("xabcd");
    assert_eq!((out.text.as_str(), out.stop.as_deref()), ("x", Some("abcd")));
}

#[test]
fn text_stream_stops_on_stop_string_eos_and_max_tokens() {
    let tok = tokenizer("qwen2");
    let ids = tok
        .encode("Hello world! The answer is 42.\nSTOP and more text", false)
        .unwrap();
    let params = SamplingParams {
        stop: stops(&["\nSTOP"]),
        ..SamplingParams::default()
    };
    let mut stream = TextStream::new(&tok, &params);
    let mut text = String::new();
    let mut finish = None;
    for &id in &ids {
        let step = stream.push(id).unwrap();
        text.push_str(&step.text);
        if step.finish.is_some() {
            finish = step.finish;
            break;
        }
    }
    assert_eq!(text, "Hello world! The answer is 42.");
    assert_eq!(finish, Some(FinishReason::Stop("\nSTOP".into())));

    let params = SamplingParams {
        max_tokens: Some(3),
        ..SamplingParams::default()
    };
    let mut stream = TextStream::new(&tok, &params);
    let steps: Vec<_> = ids[..3].iter().map(|&id| stream.push(id).unwrap()).collect();
    assert_eq!(steps[2].finish, Some(FinishReason::Length));
    let text: String = steps.iter().map(|s| s.text.as_str()).collect();
    assert_eq!(text, tok.decode(&ids[..3], true).unwrap());

    let mut stream = TextStream::new(&tok, &SamplingParams::default());
    assert_eq!(stream.push(ids[0]).unwrap().finish, None);
    let step = stream.push(tok.eos_ids()[0]).unwrap();
    assert_eq!((step.text.as_str(), step.finish), ("", Some(FinishReason::Eos)));
    assert_eq!(FinishReason::Eos.as_openai(), "stop");
}

// --- chat templates --------------------------------------------------------------------------

/// The chat template of one fixture set: from the tokenizer directory's own
/// files, or a `.jinja` file placed as `chat_template.jinja` beside them.
fn template_for(set: &Value) -> ChatTemplate {
    let tok_dir = model_dir(set["tokenizer"].as_str().unwrap());
    match set["template"].as_str() {
        None => ChatTemplate::from_dir(&tok_dir).unwrap().unwrap(),
        Some(rel) => {
            let dir = tempfile::tempdir().unwrap();
            std::fs::copy(
                tok_dir.join("tokenizer_config.json"),
                dir.path().join("tokenizer_config.json"),
            )
            .unwrap();
            std::fs::copy(fixtures().join(rel), dir.path().join("chat_template.jinja")).unwrap();
            ChatTemplate::from_dir(dir.path()).unwrap().unwrap()
        }
    }
}

fn request(c: &Value) -> ChatRequest {
    ChatRequest {
        messages: c["messages"].as_array().unwrap().clone(),
        tools: c["tools"].as_array().cloned(),
        add_generation_prompt: c["add_generation_prompt"].as_bool().unwrap(),
        extra: c["kwargs"].as_object().unwrap().clone(),
    }
}

#[test]
fn chat_templates_render_byte_for_byte_like_transformers() {
    let mut rendered = 0;
    for set in cases()["templates"].as_array().unwrap() {
        let name = set["name"].as_str().unwrap();
        let template = template_for(set);
        let tok = tokenizer(set["tokenizer"].as_str().unwrap());
        for c in set["cases"].as_array().unwrap() {
            let label = c["label"].as_str().unwrap();
            let got = template.render(&request(c));
            match c.get("rendered") {
                Some(want) => {
                    let got = got.unwrap_or_else(|e| panic!("{name}/{label}: {e}"));
                    assert_eq!(got, want.as_str().unwrap(), "{name}/{label}");
                    assert_eq!(tok.encode(&got, false).unwrap(), ids_of(&c["ids"]), "{name}/{label}");
                    rendered += 1;
                }
                None => {
                    let err = got
                        .expect_err(&format!("{name}/{label} rendered, Python raised"))
                        .to_string();
                    let python = c["error"].as_str().unwrap();
                    if !python.contains("has no attribute") {
                        assert!(err.contains(python), "{name}/{label}: {err}");
                    }
                }
            }
        }
    }
    assert!(rendered >= 40, "only {rendered} renderings");
}

#[test]
fn template_snippets_behave_like_jinja2() {
    for c in cases()["snippets"].as_array().unwrap() {
        let source = c["template"].as_str().unwrap();
        let t = ChatTemplate::new(source, Path::new("snippet"), Vec::new()).unwrap();
        let req = ChatRequest {
            extra: c["vars"].as_object().unwrap().clone(),
            ..ChatRequest::default()
        };
        match (t.render(&req), c.get("rendered")) {
            (Ok(got), Some(want)) => assert_eq!(got, want.as_str().unwrap(), "{source}"),
            (Err(e), None) => {
                let python = c["error"].as_str().unwrap();
                if python.starts_with("bad input") {
                    assert!(e.to_string().contains(python), "{source}: {e}");
                }
            }
            (got, _) => panic!("{source}: {got:?}, Python: {c}"),
        }
    }
}

#[test]
fn template_lists_pick_tool_use_when_tools_are_given() {
    let config = json!({
        "eos_token": "<e>",
        "chat_template": [
            {"name": "default", "template": "D{{ eos_token }}"},
            {"name": "tool_use", "template": "T{{ tools | length }}{{ messages[0].content }}"}
        ]
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    let t = ChatTemplate::from_dir(dir.path()).unwrap().unwrap();
    let mut req = ChatRequest {
        messages: vec![json!({"role": "user", "content": "hi"})],
        ..ChatRequest::default()
    };
    assert_eq!(t.render(&req).unwrap(), "D<e>");
    req.tools = Some(vec![json!({"type": "function"})]);
    assert_eq!(t.render(&req).unwrap(), "T1hi");
    // Variables the renderer owns cannot come in through `extra`.
    req.extra = Map::from_iter([("messages".to_string(), json!([]))]);
    assert!(t.render(&req).is_err());
}

#[test]
fn a_template_that_runs_away_is_stopped_with_an_error() {
    let req = ChatRequest {
        messages: vec![json!({"role": "user", "content": "hi"})],
        ..ChatRequest::default()
    };
    let render = |source: &str| {
        let t = ChatTemplate::new(source, Path::new("runaway.jinja"), Vec::new()).unwrap();
        t.render(&req).unwrap_err().to_string()
    };
    // A string doubled and written in a loop: over the output limit.
    let err = render(
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{{ ns.s }}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    );
    assert!(err.contains("runaway.jinja") && err.contains("output is over"), "{err}");
    // Loops of loops: out of steps.
    let err = render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
    assert!(err.contains("steps"), "{err}");
}
