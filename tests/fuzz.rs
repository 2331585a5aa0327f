//! Every parser of untrusted bytes under a seeded mutation fuzzer (see
//! `fuzz/mod.rs`): safetensors headers, `model_weights.json`,
//! `layout.json`, `config.json`, `generation_config.json`, MFLX snapshots,
//! chat saves, GGUF files, HTTP request bodies, `tokenizer.json`,
//! `tokenizer_config.json`, chat templates and the safetensors index.
//! Required of each case: no panic, no case running past the limit (a
//! watchdog thread ends a case that does), no allocation sized by an
//! unchecked length, a failed load that changes nothing, and what is
//! accepted usable. CI runs `CI_CASES` per parser; the
//! `#[ignore]`d `*_long` tests (`cargo test --release --test fuzz --
//! --ignored`) run the long counts recorded in RELIABILITY.md.

mod common;
#[path = "fuzz/mod.rs"]
mod fuzz;

use common::*;
use fuzz::{mutate_json, mutate_raw, Report, Rng, Target};
use moeflux::chatsave;
use moeflux::format::convert::source::{parse_index, INDEX_FILE};
use moeflux::format::gguf::{self, Array, BlockFormat, GgmlType, GgufWriter, Value as GgufValue};
use moeflux::format::packed::{
    expert_file_name, Layout, Manifest, WeightsFile, EXPERTS_DIR, LAYOUT_FILE, MANIFEST_FILE,
};
use moeflux::format::{safetensors, Region};
use moeflux::server::fuzzing::RequestParser;
use moeflux::server::Text;
use moeflux::text::{ChatRequest, ChatTemplate, GenerationDefaults, SamplingParams, Tokenizer, TokenizerConfig};
use moeflux::{Model, ModelConfig, Session};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[global_allocator]
static ALLOC: fuzz::CountingAlloc = fuzz::CountingAlloc;

/// Cases per parser in CI.
const CI_CASES: u64 = 10_000;
/// The largest single allocation a case may make: far above what the
/// small seeds need, far below what an unchecked length would ask for.
const ALLOC_LIMIT: usize = 64 << 20;

fn target<'a>(name: &'a str, seeds: Vec<Vec<u8>>, mutate: &'a dyn Fn(&[u8], &mut Rng) -> Vec<u8>) -> Target<'a> {
    Target {
        name,
        seeds,
        mutate,
        alloc_limit: ALLOC_LIMIT,
        time_limit: Duration::from_secs(5),
    }
}

/// Half structural JSON mutations, half raw bytes.
fn json_or_raw(b: &[u8], rng: &mut Rng) -> Vec<u8> {
    if rng.chance(2) {
        mutate_json(b, rng)
    } else {
        mutate_raw(b, rng)
    }
}

/// Long runs append their counts here, for RELIABILITY.md.
fn record(r: &Report, name: &str) {
    use std::io::Write;
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-long.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(
            f,
            "{name}\t{}\t{}\t{:.1}\t{:.3}\t{}",
            r.cases,
            r.accepted,
            r.elapsed.as_secs_f64(),
            r.slowest.as_secs_f64() * 1e3,
            r.largest_alloc
        );
    }
}

/// Declare the CI test and the long `#[ignore]`d test of one parser.
macro_rules! fuzz_tests {
    ($ci:ident, $long:ident, $f:ident, $long_cases:expr) => {
        #[test]
        fn $ci() {
            $f(CI_CASES, 1);
        }
        #[test]
        #[ignore = "long run: cargo test --release --test fuzz -- --ignored"]
        fn $long() {
            let r = $f($long_cases, 0x5EED_0000 + $long_cases);
            record(&r, stringify!($f));
        }
    };
}

// ---- safetensors headers ------------------------------------------------

/// A small safetensors file: the dtypes the converter reads and some it
/// does not, an empty shape, metadata.
fn safetensors_seed(entries: &[(&str, &str, Vec<usize>, usize)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut at = 0;
    for (name, dtype, shape, es) in entries {
        let n = shape.iter().product::<usize>() * es;
        header.insert(
            name.to_string(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [at, at + n]}),
        );
        at += n;
    }
    let h = serde_json::to_vec(&header).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend((0..at).map(|i| (i * 7) as u8));
    out
}

/// Mutate the JSON header (keeping the length prefix right) or the bytes.
fn mutate_safetensors(b: &[u8], rng: &mut Rng) -> Vec<u8> {
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    if rng.chance(2) {
        let h = mutate_json(&b[8..8 + n], rng);
        let mut out = (h.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&h);
        out.extend_from_slice(&b[8 + n..]);
        out
    } else {
        mutate_raw(b, rng)
    }
}

fn fuzz_safetensors(cases: u64, seed: u64) -> Report {
    let seeds = vec![
        safetensors_seed(&[
            ("a.weight", "BF16", vec![2, 3], 2),
            ("b", "F32", vec![4], 4),
            ("c.weight", "U32", vec![2, 2], 4),
            ("d", "F8_E4M3", vec![3], 1),
            ("e", "I64", vec![], 8),
        ]),
        safetensors_seed(&[("x", "F16", vec![0, 5], 2), ("y", "F64", vec![1, 1, 2], 8)]),
    ];
    let t = target("safetensors", seeds, &mutate_safetensors);
    fuzz::run(&t, cases, seed, &mut |_, b| {
        let Ok(tensors) = safetensors::parse_header(b, Path::new("x.safetensors")) else {
            return false;
        };
        for info in tensors.values() {
            assert!(info.start <= info.end && info.end <= b.len());
            let _ = &b[info.start..info.end];
        }
        true
    })
}
fuzz_tests!(safetensors_header, safetensors_header_long, fuzz_safetensors, 2_000_000);

// ---- model_weights.json -------------------------------------------------

/// The packed models whose files seed the model-directory parsers: bf16
/// experts, and MLX 4-bit (packed U32 entries) as converted.
fn model_dirs() -> Vec<PathBuf> {
    vec![packed("qwen3_moe"), packed_with("qwen3_moe_mlx4", &[])]
}

fn fuzz_manifest(cases: u64, seed: u64) -> Report {
    let dirs = model_dirs();
    let seeds: Vec<Vec<u8>> = dirs
        .iter()
        .map(|d| std::fs::read(d.join(MANIFEST_FILE)).unwrap())
        .collect();
    let weights: Vec<Arc<Vec<u8>>> = dirs
        .iter()
        .map(|d| Arc::new(std::fs::read(d.join("model_weights.bin")).unwrap()))
        .collect();
    let originals: Vec<Manifest> = seeds
        .iter()
        .map(|s| Manifest::parse(s, Path::new("m")).unwrap())
        .collect();
    let t = target("model_weights.json", seeds, &json_or_raw);
    let mpath = Path::new(MANIFEST_FILE);
    fuzz::run(&t, cases, seed, &mut |i, b| {
        let Ok(m) = Manifest::parse(b, mpath) else {
            return false;
        };
        let Ok(wf) = WeightsFile::new("w.bin".into(), m, weights[i].clone(), mpath) else {
            return false;
        };
        // Every lookup the accepted manifest lists serves, with its own shape.
        for (name, e) in &wf.manifest.tensors {
            if name.ends_with(".scales") || name.ends_with(".biases") {
                continue;
            }
            if let (Some(base), [rows, c]) = (name.strip_suffix(".weight"), e.shape.as_slice()) {
                let cols = match e.bits {
                    Some(bits) if e.dtype == "U32" => c * 32 / bits as usize,
                    _ => *c,
                };
                let v = wf
                    .matrix(base, *rows, cols)
                    .unwrap_or_else(|err| panic!("accepted `{name}` {e:?} does not serve its matrix: {err}"));
                if v.rows > 0 && v.cols > 0 {
                    let mut row = vec![0.0; v.cols];
                    v.row_f32(v.rows - 1, &mut row);
                }
            } else {
                assert!(e.dtype != "U32", "accepted packed `{name}` that no lookup reads");
                wf.vector(name, e.shape.iter().product())
                    .unwrap_or_else(|err| panic!("accepted `{name}` {e:?} does not serve its vector: {err}"));
            }
        }
        // The lookups the model makes refuse or serve; they never panic.
        for (name, e) in &originals[i].tensors {
            if let Some(base) = name.strip_suffix(".weight").filter(|_| e.shape.len() == 2) {
                let cols = match e.bits {
                    Some(bits) => e.shape[1] * 32 / bits as usize,
                    None => e.shape[1],
                };
                if let Ok(v) = wf.matrix(base, e.shape[0], cols) {
                    let mut row = vec![0.0; v.cols];
                    v.row_f32(v.rows - 1, &mut row);
                }
            } else if !name.ends_with(".scales") && !name.ends_with(".biases") {
                let _ = wf.vector(name, e.shape.iter().product());
            }
        }
        true
    })
}
fuzz_tests!(model_weights_json, model_weights_json_long, fuzz_manifest, 1_000_000);

// ---- layout.json --------------------------------------------------------

fn fuzz_layout(cases: u64, seed: u64) -> Report {
    let dirs = model_dirs();
    let lpath = |d: &Path| d.join(EXPERTS_DIR).join(LAYOUT_FILE);
    let seeds: Vec<Vec<u8>> = dirs.iter().map(|d| std::fs::read(lpath(d)).unwrap()).collect();
    let configs: Vec<ModelConfig> = dirs.iter().map(|d| ModelConfig::from_dir(d).unwrap()).collect();
    // The size of each layer file, as the store checks it.
    let file_len =
        |d: &Path, layer: usize| std::fs::metadata(d.join(EXPERTS_DIR).join(expert_file_name(layer))).map(|m| m.len());
    let lens: Vec<Vec<Option<u64>>> = dirs
        .iter()
        .zip(&configs)
        .map(|(d, c)| (0..c.num_hidden_layers).map(|l| file_len(d, l).ok()).collect())
        .collect();
    let t = target("layout.json", seeds, &json_or_raw);
    fuzz::run(&t, cases, seed, &mut |i, b| {
        let path = Path::new(LAYOUT_FILE);
        let Ok(layout) = Layout::parse(b, path) else {
            return false;
        };
        if layout.validate_model(&configs[i], path).is_err() {
            return false;
        }
        for (l, len) in lens[i].iter().enumerate() {
            let (Some(ll), Some(len)) = (layout.layer(l), len) else {
                continue;
            };
            if layout.num_experts.checked_mul(ll.expert_size).map(|n| n as u64) != Some(*len) {
                return false;
            }
            let blob = Region::whole(Arc::new(vec![0u8; ll.expert_size]));
            let mats = ll
                .matrices(&blob, layout.group_size)
                .expect("a validated layout gives matrices");
            for m in mats {
                let mut row = vec![0.0; m.cols];
                m.row_f32(m.rows - 1, &mut row);
            }
        }
        true
    })
}
fuzz_tests!(layout_json, layout_json_long, fuzz_layout, 1_000_000);

// ---- config.json --------------------------------------------------------

const CONFIG_FIXTURES: [&str; 6] = [
    "qwen3_moe",
    "qwen3_next",
    "qwen3_5_moe",
    "qwen3_5_moe_mlx4",
    "deepseek_v3",
    "deepseek_v3_fp8",
];

fn fuzz_config(cases: u64, seed: u64) -> Report {
    let seeds = CONFIG_FIXTURES
        .iter()
        .map(|f| std::fs::read(fixture(f).join("config.json")).unwrap())
        .collect();
    let t = target("config.json", seeds, &json_or_raw);
    fuzz::run(&t, cases, seed, &mut |_, b| {
        let Ok(v) = serde_json::from_slice::<Value>(b) else {
            return false;
        };
        let Ok(c) = ModelConfig::from_json(&v) else {
            return false;
        };
        assert_eq!(c.layers.len(), c.num_hidden_layers);
        if c.mla.is_none() {
            assert!(c.rotary_dim() <= c.head_dim);
        }
        true
    })
}
fuzz_tests!(config_json, config_json_long, fuzz_config, 2_000_000);

// ---- generation_config.json ---------------------------------------------

fn fuzz_generation_config(cases: u64, seed: u64) -> Report {
    let mut seeds: Vec<Vec<u8>> = CONFIG_FIXTURES
        .iter()
        .filter_map(|f| std::fs::read(fixture(f).join("generation_config.json")).ok())
        .collect();
    seeds.push(
        serde_json::to_vec(&json!({
            "do_sample": true, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "min_p": 0.0,
            "repetition_penalty": 1.05, "max_new_tokens": 512, "eos_token_id": [1, 2]
        }))
        .unwrap(),
    );
    let t = target("generation_config.json", seeds, &json_or_raw);
    fuzz::run(&t, cases, seed, &mut |_, b| {
        let Ok(g) = GenerationDefaults::parse(b, Path::new("generation_config.json")) else {
            return false;
        };
        // What the file gives, sampling accepts.
        SamplingParams::from_defaults(&g)
            .validate()
            .expect("accepted defaults are valid sampling parameters");
        true
    })
}
fuzz_tests!(
    generation_config_json,
    generation_config_json_long,
    fuzz_generation_config,
    2_000_000
);

// ---- MFLX snapshots and chat saves ----------------------------------------

const TOKENS: [u32; 7] = [3, 101, 57, 402, 260, 19, 333];

/// A GQA, a recurrent and an MLA model.
fn session_models() -> Vec<Model> {
    ["qwen3_moe", "qwen3_next", "deepseek_v3"]
        .iter()
        .map(|n| open_cpu(&packed(n)))
        .collect()
}

/// Everything a failed load must leave as it was.
fn observe(s: &Session<'_>) -> (usize, Option<Vec<u32>>, Vec<usize>, Vec<u8>) {
    let mut snap = Vec::new();
    s.save_state(&mut snap).unwrap();
    (s.pos(), s.tokens().map(<[u32]>::to_vec), s.checkpoints(), snap)
}

fn snapshot_after(m: &Model, n: usize) -> Vec<u8> {
    let mut s = m.session().unwrap();
    if n > 0 {
        s.eval_prompt(&TOKENS[..n], 0).unwrap();
    }
    let mut b = Vec::new();
    s.save_state(&mut b).unwrap();
    b
}

/// The CRC-32 trailer recomputed, so that mutations reach the checks
/// behind the checksum.
fn reseal(b: &mut [u8]) {
    if let Some(n) = b.len().checked_sub(4) {
        let crc = moeflux::checksum::crc32(&b[..n]);
        b[n..].copy_from_slice(&crc.to_le_bytes());
    }
}

/// Raw mutations; half of them resealed when the seed has a checksum.
fn mutate_sealed(b: &[u8], rng: &mut Rng, sealed: bool) -> Vec<u8> {
    let mut out = mutate_raw(b, rng);
    if sealed && rng.chance(2) {
        reseal(&mut out);
    }
    out
}

fn fuzz_snapshot(cases: u64, seed: u64) -> Report {
    let models = session_models();
    let mut seeds = Vec::new();
    let mut owner = Vec::new();
    for (mi, m) in models.iter().enumerate() {
        for n in [0, 3, 6] {
            let v3 = snapshot_after(m, n);
            let mut v2 = v3[..v3.len() - 4].to_vec();
            v2[4..8].copy_from_slice(&2u32.to_le_bytes());
            seeds.extend([v3, v2]);
            owner.extend([mi, mi]);
        }
    }
    let mutate = |b: &[u8], rng: &mut Rng| mutate_sealed(b, rng, b.get(4) == Some(&3));
    let t = target("MFLX snapshot", seeds, &mutate);
    let baseline: Vec<Vec<u8>> = models.iter().map(|m| snapshot_after(m, 2)).collect();
    let mut sessions: Vec<Session<'_>> = models.iter().map(|m| m.session().unwrap()).collect();
    for (s, b) in sessions.iter_mut().zip(&baseline) {
        s.load_state(b).unwrap();
    }
    let before: Vec<_> = sessions.iter().map(observe).collect();
    fuzz::run(&t, cases, seed, &mut |i, b| {
        let mi = owner[i];
        let s = &mut sessions[mi];
        if s.load_state(b).is_err() {
            assert!(observe(s) == before[mi], "a failed load changed the session");
            return false;
        }
        s.load_state(&baseline[mi]).unwrap();
        true
    })
}
fuzz_tests!(mflx_snapshot, mflx_snapshot_long, fuzz_snapshot, 1_000_000);

/// Mutate a chat save: its JSON (length kept right), or its bytes; half of
/// the version 2 mutants resealed.
fn mutate_chat(b: &[u8], rng: &mut Rng) -> Vec<u8> {
    let sealed = b[8] == 2;
    let n = u64::from_le_bytes(b[12..20].try_into().unwrap()) as usize;
    if !rng.chance(3) {
        return mutate_sealed(b, rng, sealed);
    }
    let meta = mutate_json(&b[20..20 + n], rng);
    let mut out = b[..12].to_vec();
    out.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    out.extend_from_slice(&meta);
    out.extend_from_slice(&b[20 + n..]);
    if sealed && !rng.chance(4) {
        reseal(&mut out);
    }
    out
}

fn fuzz_chat_save(cases: u64, seed: u64) -> Report {
    let models: Vec<Model> = session_models().into_iter().take(2).collect();
    let messages = [
        json!({"role": "user", "content": "hi"}),
        json!({"role": "assistant", "content": "yo"}),
    ];
    let save = |m: &Model, n: usize| {
        let mut s = m.session().unwrap();
        s.eval_prompt(&TOKENS[..n], 0).unwrap();
        chatsave::encode(&s, &messages, &TOKENS[..n]).unwrap()
    };
    let mut seeds = Vec::new();
    let mut owner = Vec::new();
    for (mi, m) in models.iter().enumerate() {
        let v2 = save(m, 5);
        let mut v1 = v2[..v2.len() - 4].to_vec();
        v1[8..12].copy_from_slice(&1u32.to_le_bytes());
        seeds.extend([v2, v1, save(m, 1)]);
        owner.extend([mi; 3]);
    }
    let t = target("chat save", seeds, &mutate_chat);
    let baseline: Vec<Vec<u8>> = models.iter().map(|m| save(m, 3)).collect();
    let mut sessions: Vec<Session<'_>> = models.iter().map(|m| m.session().unwrap()).collect();
    let path = Path::new("fuzz.chat");
    for (s, b) in sessions.iter_mut().zip(&baseline) {
        chatsave::load(s, b, path).unwrap();
    }
    let before: Vec<_> = sessions.iter().map(observe).collect();
    fuzz::run(&t, cases, seed, &mut |i, b| {
        let mi = owner[i];
        let s = &mut sessions[mi];
        match chatsave::load(s, b, path) {
            Err(e) => {
                assert!(e.to_string().contains("fuzz.chat"), "the error names the file: {e}");
                assert!(observe(s) == before[mi], "a failed load changed the session");
                false
            }
            Ok(save) => {
                assert!(save.tokens.iter().all(|&t| (t as usize) < s.model().n_vocab()));
                assert_eq!(save.tokens.len(), s.pos());
                chatsave::load(s, &baseline[mi], path).unwrap();
                true
            }
        }
    })
}
fuzz_tests!(chat_save, chat_save_long, fuzz_chat_save, 1_000_000);

/// The runner itself: a parser that panics on some input fails the run.
#[test]
#[should_panic(expected = "panicked")]
fn the_runner_reports_a_panicking_parser() {
    let t = target("self-check", vec![b"{\"a\": [1, 2, 3]}".to_vec()], &json_or_raw);
    fuzz::run(&t, 1000, 7, &mut |_, b| {
        assert!(b.len() != 16 || b[0] == b'{', "not JSON any more");
        true
    });
}

// ---- GGUF files -----------------------------------------------------------

/// A small GGUF file: every metadata value type (arrays and a nested
/// array), a qwen3moe config, a vocabulary, and one block of each
/// supported tensor type.
fn gguf_seed() -> Vec<u8> {
    let mut w = GgufWriter::new();
    let a = "qwen3moe";
    w.kv("general.architecture", GgufValue::Str(a.into()));
    w.kv("general.alignment", GgufValue::U32(32));
    for (k, v) in [
        ("block_count", 2u32),
        ("embedding_length", 64),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
        ("attention.key_length", 16),
        ("expert_count", 4),
        ("expert_used_count", 2),
        ("expert_feed_forward_length", 32),
        ("context_length", 128),
    ] {
        w.kv(&format!("{a}.{k}"), GgufValue::U32(v));
    }
    w.kv(&format!("{a}.rope.freq_base"), GgufValue::F32(1e6));
    w.kv(&format!("{a}.attention.layer_norm_rms_epsilon"), GgufValue::F32(1e-6));
    w.kv("x.u8", GgufValue::U8(1));
    w.kv("x.i8", GgufValue::I8(-1));
    w.kv("x.u16", GgufValue::U16(2));
    w.kv("x.i16", GgufValue::I16(-2));
    w.kv("x.i32", GgufValue::I32(-3));
    w.kv("x.u64", GgufValue::U64(4));
    w.kv("x.i64", GgufValue::I64(-4));
    w.kv("x.f64", GgufValue::F64(0.5));
    w.kv("x.bool", GgufValue::Bool(true));
    w.kv(
        "x.nested",
        GgufValue::Array(Array::Arr(vec![Array::U16(vec![1, 2]), Array::F32(vec![0.5])])),
    );
    let toks = ["a", "b", "c", "ab", "Ġ", "Ġa", "<|im_end|>"];
    w.kv("tokenizer.ggml.model", GgufValue::Str("gpt2".into()));
    w.kv("tokenizer.ggml.pre", GgufValue::Str("qwen2".into()));
    w.kv(
        "tokenizer.ggml.tokens",
        GgufValue::Array(Array::Str(toks.iter().map(|t| t.to_string()).collect())),
    );
    w.kv(
        "tokenizer.ggml.token_type",
        GgufValue::Array(Array::I32(vec![1, 1, 1, 1, 1, 1, 3])),
    );
    w.kv(
        "tokenizer.ggml.merges",
        GgufValue::Array(Array::Str(vec!["a b".into(), "Ġ a".into()])),
    );
    w.kv("tokenizer.ggml.eos_token_id", GgufValue::U32(6));
    w.kv("tokenizer.chat_template", GgufValue::Str("{{ messages }}".into()));
    for (i, ty) in GgmlType::SUPPORTED.iter().enumerate() {
        let (elems, bytes) = ty.block().unwrap();
        let n = elems.max(8);
        let data: Vec<u8> = (0..n / elems * bytes).map(|j| (j * 31 + i) as u8 & 0x3F).collect();
        w.tensor(&format!("blk.{}.t{i}.weight", i % 2), &[n, 1], *ty, data);
    }
    w.tensor("blk.0.ffn_gate_inp.weight", &[8, 4], GgmlType::F32, vec![0; 128]);
    w.to_bytes()
}

fn fuzz_gguf(cases: u64, seed: u64) -> Report {
    let vocab =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/vocab_gpt2.gguf")).unwrap();
    let seeds = vec![gguf_seed(), vocab];
    let t = target("gguf", seeds, &mutate_raw);
    fuzz::run(&t, cases, seed, &mut |_, b| {
        let Ok(h) = gguf::parse(b, Path::new("x.gguf")) else {
            return false;
        };
        // Every tensor lies in the file, and reads as its type says.
        for info in &h.tensors {
            let data = &b[info.offset..info.offset + info.size];
            if let Some(f) = BlockFormat::new(info.ty).filter(|_| info.rows() > 0) {
                let row = &data[..info.row_bytes()];
                let mut out = vec![0.0f32; info.row_len()];
                f.dequantize_row(row, &mut out);
                let _ = f.dot(row, &out);
            }
        }
        // The metadata readers refuse or answer; they never panic.
        let names: std::collections::HashSet<&str> = h.tensors.iter().map(|t| t.name.as_str()).collect();
        let _ = gguf::hf_config(&h.meta, &|n| names.contains(n));
        let _ = gguf::tokenizer_json(&h.meta);
        let _ = gguf::tokenizer_config(&h.meta);
        let _ = gguf::generation_config(&h.meta);
        true
    })
}
fuzz_tests!(gguf_file, gguf_file_long, fuzz_gguf, 1_000_000);

// ---- HTTP request bodies ----------------------------------------------------

/// The demo model's text files: tokenizer, template, defaults.
fn demo_text() -> Text {
    let dir = fixture("demo_kjv");
    Text {
        tokenizer: Tokenizer::from_dir(&dir).unwrap(),
        template: ChatTemplate::from_dir(&dir).unwrap(),
        defaults: moeflux::check::sampling_defaults(&dir).unwrap(),
    }
}

fn request_seeds() -> Vec<Vec<u8>> {
    let tool = json!({"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}});
    [
        json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who made the heaven?"}],
            "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "seed": 3,
            "stop": ["\n\n", "END"], "stream": true, "stream_options": {"include_usage": true},
            "presence_penalty": 0.5, "frequency_penalty": 0.1, "logit_bias": {"5": -100}, "logprobs": true, "top_logprobs": 3}),
        json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
              "function": {"name": "get_weather", "arguments": "{\"city\": \"Ur\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
            "tools": [tool], "tool_choice": "auto", "chat_template_kwargs": {"enable_thinking": false}}),
        json!({"messages": [{"role": "user", "content": "list"}], "max_completion_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":
              {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "string"}}}}}}}),
        json!({"prompt": "And God said", "max_tokens": 4, "logprobs": 2, "echo": false, "stop": "."}),
        json!({"prompt": [[1, 2, 3]], "max_tokens": 2, "response_format": {"type": "json_object"}}),
    ]
    .iter()
    .map(|v| serde_json::to_vec(v).unwrap())
    .collect()
}

fn fuzz_request_body(cases: u64, seed: u64) -> Report {
    let parser = RequestParser::new(demo_text(), 2048);
    let vocab = demo_text().tokenizer.vocab_size();
    let seeds = request_seeds();
    for (i, s) in seeds.iter().enumerate() {
        let r = if i < 3 { parser.chat(s) } else { parser.completion(s) };
        r.unwrap_or_else(|e| panic!("seed {i} refused: {e:?}"));
    }
    let t = target("HTTP request body", seeds, &json_or_raw);
    fuzz::run(&t, cases, seed, &mut |_, b| {
        let mut accepted = false;
        for (endpoint, r) in [("chat", parser.chat(b)), ("completion", parser.completion(b))] {
            match r {
                Ok(ids) => {
                    // What is accepted can be queued: token ids in the vocabulary.
                    assert!(
                        ids.iter().all(|&t| (t as usize) < vocab),
                        "{endpoint}: id outside the vocabulary"
                    );
                    accepted = true;
                }
                Err((status, msg)) => {
                    // Refused with a client error that says why (a 500
                    // would be the server's fault; none is expected here).
                    assert!((400..500).contains(&status), "{endpoint}: status {status}: {msg}");
                    assert!(!msg.is_empty());
                }
            }
        }
        accepted
    })
}
fuzz_tests!(http_request_body, http_request_body_long, fuzz_request_body, 200_000);

// ---- tokenizer.json and tokenizer_config.json ----------------------------------

const SAMPLE: &str = "In the beginning God created the heaven and the earth. <|im_end|>\n\u{fffd}é";

/// Small `tokenizer.json` files of each kind of model, with normalizers,
/// pre-tokenizers, post-processors, decoders and added tokens.
fn tokenizer_seeds() -> Vec<Value> {
    let added = json!([
        {"id": 0, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
        {"id": 1, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
    ]);
    let post = json!({"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}});
    vec![
        json!({"version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Replace",
                "pattern": {"String": " "}, "content": "\u{2581}"}]},
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Isolated", "invert": false},
            "post_processor": post,
            "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]},
            "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                "vocab": {"<s>": 0, "</s>": 1, "<unk>": 2, "<0x41>": 3, "I": 4, "n": 5, "t": 6, "h": 7, "e": 8, "In": 9, "th": 10, "the": 11, "\u{2581}": 12},
                "merges": ["I n", "t h", "th e"]}}),
        json!({"version": "1.0", "added_tokens": added,
            "normalizer": {"type": "Lowercase"},
            "pre_tokenizer": {"type": "Whitespace"},
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
            "model": {"type": "WordLevel", "vocab": {"<s>": 0, "</s>": 1, "[UNK]": 2, "in": 3, "the": 4, "beginning": 5, "god": 6},
                "unk_token": "[UNK]"}}),
        json!({"version": "1.0", "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "always", "split": true},
            "decoder": {"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "always", "split": true},
            "model": {"type": "Unigram", "unk_id": 2, "byte_fallback": false,
                "vocab": [["<s>", 0.0], ["</s>", 0.0], ["<unk>", 0.0], ["\u{2581}In", -1.0], ["\u{2581}the", -1.5], ["e", -3.0], ["\u{2581}", -2.0]]}}),
        json!({"version": "1.0", "added_tokens": [],
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
            "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
                "vocab": {"[UNK]": 0, "In": 1, "##n": 2, "the": 3, "I": 4}}}),
    ]
}

fn fuzz_tokenizer_json(cases: u64, seed: u64) -> Report {
    let dir = fixture("demo_kjv");
    let mut seeds: Vec<Vec<u8>> = tokenizer_seeds()
        .iter()
        .map(|v| serde_json::to_vec(v).unwrap())
        .collect();
    // The demo model's byte-level BPE (22 KB, 4,092 tokens) costs far more
    // per case than the small ones: in the long runs only.
    if cases > CI_CASES {
        seeds.push(std::fs::read(dir.join("tokenizer.json")).unwrap());
    }
    for (i, s) in seeds.iter().enumerate() {
        let cfg = TokenizerConfig::default();
        Tokenizer::from_bytes(s, Path::new("seed"), cfg, None).unwrap_or_else(|e| panic!("seed {i}: {e}"));
    }
    let config = TokenizerConfig::from_dir(&dir).unwrap();
    let t = target("tokenizer.json", seeds, &json_or_raw);
    let path = Path::new("tokenizer.json");
    fuzz::run(&t, cases, seed, &mut |_, b| {
        let Ok(tok) = Tokenizer::from_bytes(b, path, config.clone(), None) else {
            return false;
        };
        // What loads, tokenizes: ids inside its vocabulary, which decode.
        if let Ok(ids) = tok.encode(SAMPLE, true) {
            assert!(
                ids.iter().all(|&t| (t as usize) < tok.vocab_size()),
                "id outside the vocabulary"
            );
            let _ = tok.decode(&ids, false);
        }
        let _ = tok.token_bytes();
        true
    })
}
fuzz_tests!(tokenizer_json, tokenizer_json_long, fuzz_tokenizer_json, 100_000);

fn fuzz_tokenizer_config(cases: u64, seed: u64) -> Report {
    let mut seeds: Vec<Vec<u8>> = ["demo_kjv", "qwen3_moe", "deepseek_v3"]
        .iter()
        .filter_map(|f| std::fs::read(fixture(f).join("tokenizer_config.json")).ok())
        .collect();
    let template = std::fs::read_to_string(fixture("text/templates/qwen3.jinja")).unwrap();
    seeds.push(
        serde_json::to_vec(&json!({
            "bos_token": {"content": "<s>", "__type": "AddedToken"}, "eos_token": "<|im_end|>",
            "pad_token": null, "unk_token": "<unk>",
            "chat_template": [{"name": "default", "template": template}, {"name": "tool_use", "template": "{{ tools | tojson }}"}]
        }))
        .unwrap(),
    );
    let tok = Tokenizer::from_dir(fixture("demo_kjv")).unwrap();
    let t = target("tokenizer_config.json", seeds, &json_or_raw);
    let path = Path::new("tokenizer_config.json");
    fuzz::run(&t, cases, seed, &mut |_, b| {
        let Ok(config) = TokenizerConfig::parse(b, path) else {
            return false;
        };
        // Its special tokens name tokens or nothing; its template (as a
        // model directory gives it) compiles and renders, or is refused
        // with an error naming the file.
        for t in [&config.bos_token, &config.eos_token].into_iter().flatten() {
            if let Some(id) = tok.token_to_id(t) {
                assert!((id as usize) < tok.vocab_size());
            }
        }
        match ChatTemplate::from_config(&config) {
            Ok(Some(template)) => {
                if let Err(e) = template.render(&chat_request()) {
                    assert!(e.to_string().contains("tokenizer_config.json"), "{e}");
                }
            }
            Ok(None) => {}
            Err(e) => assert!(e.to_string().contains("tokenizer_config.json"), "{e}"),
        }
        true
    })
}
fuzz_tests!(
    tokenizer_config_json,
    tokenizer_config_json_long,
    fuzz_tokenizer_config,
    100_000
);

// ---- chat templates -------------------------------------------------------------

fn chat_request() -> ChatRequest {
    ChatRequest {
        messages: vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "Weather in Ur?"}),
            json!({"role": "assistant", "content": "", "reasoning_content": "Look it up.",
                "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Ur"}}}]}),
            json!({"role": "tool", "content": "sunny"}),
        ],
        tools: Some(vec![json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})]),
        add_generation_prompt: true,
        extra: serde_json::Map::new(),
    }
}

/// Jinja pieces spliced into a template: tags, loops, filters, strings.
const JINJA: [&str; 16] = [
    "{% for m in messages %}{{ m.content }}{% endfor %}",
    "{% for i in range(100000) %}x{% endfor %}",
    "{% set ns = namespace(s='ab') %}{% for i in range(8) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "{{ messages | tojson }}",
    "{{ '' ~ messages[0]['content'] * 100000 }}",
    "{% if %}",
    "{{",
    "{% endfor %}",
    "{{ raise_exception('no') }}",
    "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}",
    "{{ tools[0].function.name | upper }}",
    "{% for m in messages | reverse %}{{ loop.index }}{% endfor %}",
    "{{ messages[99999] }}",
    "{{ 1 / 0 }}",
    "{{ 'a' | replace('a', 'aa') }}",
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}",
];

fn mutate_template(b: &[u8], rng: &mut Rng) -> Vec<u8> {
    if rng.chance(2) {
        return mutate_raw(b, rng);
    }
    let mut out = b.to_vec();
    let at = rng.below(out.len() + 1);
    out.splice(at..at, rng.pick(&JINJA).bytes());
    out
}

fn fuzz_chat_template(cases: u64, seed: u64) -> Report {
    let dir = fixture("text/templates");
    let mut seeds: Vec<Vec<u8>> = ["qwen3.jinja", "qwen3_5.jinja", "deepseek_v3_1.jinja"]
        .iter()
        .map(|f| std::fs::read(dir.join(f)).unwrap())
        .collect();
    seeds.push(std::fs::read(fixture("demo_kjv").join("chat_template.jinja")).unwrap());
    let mut t = target("chat template", seeds, &mutate_template);
    // A template that runs to its step limit takes a while in debug builds.
    t.time_limit = Duration::from_secs(10);
    let special = vec![("bos_token", "<s>".to_string()), ("eos_token", "</s>".to_string())];
    let req = chat_request();
    fuzz::run(&t, cases, seed, &mut |_, b| {
        let Ok(text) = std::str::from_utf8(b) else {
            return false;
        };
        let Ok(template) = ChatTemplate::new(text, Path::new("chat_template.jinja"), special.clone()) else {
            return false;
        };
        match template.render(&req) {
            Ok(out) => {
                // The output limit holds.
                assert!(out.len() <= 64 << 20);
                true
            }
            Err(e) => {
                assert!(
                    e.to_string().contains("chat_template.jinja"),
                    "the error names the template: {e}"
                );
                false
            }
        }
    })
}
fuzz_tests!(chat_template, chat_template_long, fuzz_chat_template, 100_000);

// ---- the safetensors index ------------------------------------------------------

fn fuzz_safetensors_index(cases: u64, seed: u64) -> Report {
    let mut seeds: Vec<Vec<u8>> = ["qwen3_moe_mlx4", "qwen3_5_moe_mlx4", "qwen3_next"]
        .iter()
        .map(|f| std::fs::read(fixture(f).join(INDEX_FILE)).unwrap())
        .collect();
    seeds.push(
        serde_json::to_vec(&json!({"metadata": {"total_size": 1234},
            "weight_map": {"a.weight": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
        .unwrap(),
    );
    let t = target("safetensors index", seeds, &json_or_raw);
    fuzz::run(&t, cases, seed, &mut |_, b| {
        let Ok(map) = parse_index(b, Path::new(INDEX_FILE)) else {
            return false;
        };
        // Every shard it names is a plain file of the checkpoint's directory.
        for f in map.values() {
            let p = Path::new(f);
            assert!(
                p.components().count() == 1 && p.file_name().is_some_and(|n| n.len() == f.len()),
                "`{f}` is not a plain file name"
            );
            assert_eq!(Path::new("/ckpt").join(p).parent(), Some(Path::new("/ckpt")));
        }
        true
    })
}
fuzz_tests!(
    safetensors_index,
    safetensors_index_long,
    fuzz_safetensors_index,
    1_000_000
);

// ---- the watchdog ---------------------------------------------------------------

/// A case that never returns is failed while it runs: the watchdog ends
/// the process, naming the case and writing its input out. Run in a child
/// test process (`hanging_case`), since it ends the process.
#[test]
fn the_watchdog_fails_a_case_that_hangs() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "hanging_case", "--nocapture"])
        .env("MOEFLUX_FUZZ_HANG", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(101), "{err}");
    assert!(
        err.contains("hang-check: case") && err.contains("still running after"),
        "{err}"
    );
}

#[test]
#[ignore = "run by the_watchdog_fails_a_case_that_hangs"]
fn hanging_case() {
    if std::env::var_os("MOEFLUX_FUZZ_HANG").is_none() {
        return;
    }
    let mut t = target("hang-check", vec![b"{}".to_vec()], &json_or_raw);
    t.time_limit = Duration::from_millis(200);
    fuzz::run(&t, 10, 1, &mut |_, _| loop {
        std::thread::sleep(Duration::from_millis(10));
    });
}
