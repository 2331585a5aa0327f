//! GGUF: the reader on the fixtures of `tools/make_gguf_fixtures.py`,
//! every supported block format dequantized bit for bit as gguf-py does,
//! dot products against dequantize-then-f64, and split models.

use moeflux::format::gguf::{parse, BlockFormat, GgmlType, GgufModel, GgufWriter, Value};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf")
        .join(name)
}

/// The reference file: gguf-py's dequantization of every tensor, as F32.
fn reference() -> Vec<u8> {
    let xz = std::fs::read(fixture("blocks_ref.gguf.xz")).unwrap();
    let mut out = Vec::new();
    lzma_rs::xz_decompress(&mut &xz[..], &mut out).unwrap();
    out
}

#[test]
fn every_supported_type_dequantizes_as_gguf_py() {
    let model = GgufModel::open(&fixture("blocks.gguf")).unwrap();
    let ref_bytes = reference();
    let refs = parse(&ref_bytes, Path::new("blocks_ref.gguf")).unwrap();
    let mut seen = vec![];
    for t in &model.tensors {
        let info = &t.info;
        let r = refs.tensors.iter().find(|r| r.name == info.name).unwrap();
        assert_eq!((r.ty, &r.dims), (GgmlType::F32, &info.dims), "{}", info.name);
        assert_eq!(info.row_len(), 2048);
        let want: Vec<f32> = ref_bytes[r.offset..r.offset + r.size]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let f = BlockFormat::new(info.ty).unwrap();
        let data = model.data(t);
        for row in 0..info.rows() {
            let bytes = &data[row * info.row_bytes()..(row + 1) * info.row_bytes()];
            let mut got = vec![0.0f32; 2048];
            f.dequantize_row(bytes, &mut got);
            for (i, (g, w)) in got.iter().zip(&want[row * 2048..]).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{} row {row} value {i}: {g} vs {w}",
                    info.name
                );
            }
        }
        seen.push(info.ty);
    }
    for ty in GgmlType::SUPPORTED {
        assert!(seen.contains(&ty), "no fixture for {ty}");
    }
}

#[test]
fn dot_products_match_dequantize_then_f64() {
    let model = GgufModel::open(&fixture("blocks.gguf")).unwrap();
    for t in &model.tensors {
        let info = &t.info;
        let f = BlockFormat::new(info.ty).unwrap();
        let data = model.data(t);
        let x: Vec<f32> = (0..2048)
            .map(|i| ((i * 7919 % 1001) as f32 / 500.0 - 1.0) * 0.7)
            .collect();
        for row in 0..info.rows() {
            let bytes = &data[row * info.row_bytes()..(row + 1) * info.row_bytes()];
            let mut w = vec![0.0f32; 2048];
            f.dequantize_row(bytes, &mut w);
            let want: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let scale: f64 = w.iter().zip(&x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            let got = f.dot(bytes, &x) as f64;
            assert!(
                (got - want).abs() <= 1e-5 * scale + 1e-30,
                "{} row {row}: {got} vs {want} (scale {scale})",
                info.name
            );
        }
    }
}

#[test]
fn float_rows_of_any_length_dequantize_and_dot() {
    // 13 values: the 8-wide kernel and a tail of 5.
    let vals: Vec<f32> = (0..13).map(|i| i as f32 * 0.25 - 1.0).collect();
    let x: Vec<f32> = (0..13).map(|i| 1.0 + i as f32).collect();
    let want: f32 = vals.iter().zip(&x).map(|(a, b)| a * b).sum();
    for (ty, bytes) in [
        (
            GgmlType::F32,
            vals.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
        ),
        (
            GgmlType::F16,
            vals.iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect(),
        ),
        (
            GgmlType::Bf16,
            vals.iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
        ),
    ] {
        let f = BlockFormat::new(ty).unwrap();
        let mut out = vec![0.0; 13];
        f.dequantize_row(&bytes, &mut out);
        assert_eq!(out, vals, "{ty}");
        assert!((f.dot(&bytes, &x) - want).abs() < 1e-4, "{ty}");
    }
}

#[test]
fn unsupported_types_are_named_with_the_tensor() {
    assert!(BlockFormat::new(GgmlType::Iq2Xxs).is_none());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::Str("qwen3moe".into()));
    w.tensor(
        "blk.0.ffn_down_exps.weight",
        &[256, 2],
        GgmlType::Iq2Xxs,
        vec![0; 2 * 66],
    );
    std::fs::write(&path, w.to_bytes()).unwrap();
    let m = GgufModel::open(&path).unwrap();
    let err = m.supported("blk.0.ffn_down_exps.weight").unwrap_err().to_string();
    for part in ["m.gguf", "blk.0.ffn_down_exps.weight", "IQ2_XXS", "--requantize"] {
        assert!(err.contains(part), "{err}");
    }
}

/// A split model: three parts beside each other, one table.
#[test]
fn split_models_open_from_the_first_part() {
    let dir = tempfile::tempdir().unwrap();
    let part = |no: u16, names: &[&str]| {
        let mut w = GgufWriter::new();
        w.kv("general.architecture", Value::Str("qwen3moe".into()));
        w.kv("split.no", Value::U16(no));
        w.kv("split.count", Value::U16(3));
        w.kv("split.tensors.count", Value::I32(4));
        for (i, n) in names.iter().enumerate() {
            w.tensor(n, &[32, 1], GgmlType::Q8_0, vec![no as u8 + i as u8; 34]);
        }
        std::fs::write(dir.path().join(format!("m-{:05}-of-00003.gguf", no + 1)), w.to_bytes()).unwrap();
    };
    part(0, &["a", "b"]);
    part(1, &["c"]);
    part(2, &["d"]);
    let m = GgufModel::open(&dir.path().join("m-00001-of-00003.gguf")).unwrap();
    assert_eq!(m.parts.len(), 3);
    let names: Vec<&str> = m.tensors.iter().map(|t| t.info.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "d"]);
    assert_eq!(m.data(m.get("c").unwrap())[0], 1);
    assert_eq!(m.region(m.get("d").unwrap()).bytes()[5], 2);
    // Not the first part, a missing part, a duplicate across parts.
    let err = GgufModel::open(&dir.path().join("m-00002-of-00003.gguf"))
        .err()
        .unwrap();
    assert!(err.to_string().contains("split.no"), "{err}");
    part(2, &["a"]);
    let err = GgufModel::open(&dir.path().join("m-00001-of-00003.gguf"))
        .err()
        .unwrap();
    assert!(err.to_string().contains("`a`"), "{err}");
    std::fs::remove_file(dir.path().join("m-00003-of-00003.gguf")).unwrap();
    let err = GgufModel::open(&dir.path().join("m-00001-of-00003.gguf"))
        .err()
        .unwrap();
    assert!(err.to_string().contains("m-00003-of-00003.gguf"), "{err}");
}

/// Each malformed header is refused with a message naming what is wrong.
#[test]
fn malformed_headers_are_refused_by_name() {
    let good = || {
        let mut w = GgufWriter::new();
        w.kv("general.architecture", Value::Str("x".into()));
        w.tensor("t", &[32, 2], GgmlType::Q4_0, vec![0; 36]);
        w
    };
    let p = Path::new("bad.gguf");
    let err = |b: &[u8]| parse(b, p).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(parse(&good().to_bytes(), p).is_ok());

    let mut b = good().to_bytes();
    b[0] = b'X';
    assert!(err(&b).contains("not a GGUF file"));
    let mut b = good().to_bytes();
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(err(&b).contains("version 1"));
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(err(&b).contains("big-endian"));
    let b = good().to_bytes();
    assert!(err(&b[..b.len() - 40]).contains("tensor `t`"));
    let mut w = good();
    w.kv("general.architecture", Value::Str("y".into()));
    assert!(err(&w.to_bytes()).contains("`general.architecture` appears twice"));
    let mut w = good();
    w.tensor("t", &[32], GgmlType::Q4_0, vec![0; 18]);
    assert!(err(&w.to_bytes()).contains("tensor `t` appears twice"));
    let mut w = good();
    w.tensor("u", &[33], GgmlType::Q4_0, vec![0; 18]);
    assert!(err(&w.to_bytes()).contains("whole Q4_0 blocks"));
    let mut w = good();
    w.kv("general.alignment", Value::U32(24));
    assert!(err(&w.to_bytes()).contains("general.alignment"));
    // An unknown value type: patch the type of the only key.
    let mut b = good().to_bytes();
    let at = 24 + 8 + "general.architecture".len();
    b[at..at + 4].copy_from_slice(&13u32.to_le_bytes());
    assert!(err(&b).contains("unknown value type 13"));
    // A huge string length.
    let mut b = good().to_bytes();
    b[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err(&b).contains("exceeds the limit"));
}

#[test]
fn alignment_and_metadata_types_round_trip() {
    let mut w = GgufWriter::new();
    w.kv("general.alignment", Value::U32(64));
    w.kv("a.list", Value::Array(moeflux::format::gguf::Array::I32(vec![3, 3, 3])));
    w.kv("a.f", Value::F32(0.5));
    w.tensor("x", &[8, 3], GgmlType::F32, vec![1; 96]);
    w.tensor("y", &[64], GgmlType::F16, vec![2; 128]);
    let h = parse(&w.to_bytes(), Path::new("a.gguf")).unwrap();
    assert_eq!(h.alignment, 64);
    assert!(h.tensors.iter().all(|t| t.offset % 64 == 0));
    assert_eq!(h.tensors[0].shape(), [3, 8]);
    assert_eq!(h.meta.uniform_uint_opt("a.list").unwrap(), Some(3));
    assert_eq!(h.meta.num_opt("a.f").unwrap(), Some(0.5));
}

// ---- metadata → config.json -------------------------------------------

/// The `<arch>.*` keys llama.cpp's convert_hf_to_gguf.py writes for a
/// fixture's `config.json`, and the tensors that tell dense layers and
/// tied embeddings apart.
fn converted(arch: &str, c: &serde_json::Value) -> GgufWriter {
    let c = c.get("text_config").unwrap_or(c);
    let u = |k: &str| c[k].as_u64().unwrap() as u32;
    let f = |k: &str| c[k].as_f64().unwrap() as f32;
    let key = |k: &str| format!("{arch}.{k}");
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::Str(arch.into()));
    let mut blocks = u("num_hidden_layers");
    if arch == "qwen35moe" {
        blocks += u("mtp_num_hidden_layers");
        w.kv(&key("nextn_predict_layers"), Value::U32(u("mtp_num_hidden_layers")));
    }
    w.kv(&key("block_count"), Value::U32(blocks));
    w.kv(&key("context_length"), Value::U32(u("max_position_embeddings")));
    w.kv(&key("embedding_length"), Value::U32(u("hidden_size")));
    if c.get("intermediate_size").is_some() {
        w.kv(&key("feed_forward_length"), Value::U32(u("intermediate_size")));
    }
    w.kv(&key("attention.head_count"), Value::U32(u("num_attention_heads")));
    w.kv(&key("attention.head_count_kv"), Value::U32(u("num_key_value_heads")));
    let theta = c
        .get("rope_theta")
        .or(c.get("rope_parameters").and_then(|p| p.get("rope_theta")));
    w.kv(
        &key("rope.freq_base"),
        Value::F32(theta.unwrap().as_f64().unwrap() as f32),
    );
    w.kv(&key("attention.layer_norm_rms_epsilon"), Value::F32(f("rms_norm_eps")));
    w.kv(&key("vocab_size"), Value::U32(u("vocab_size")));
    w.kv(&key("expert_used_count"), Value::U32(u("num_experts_per_tok")));
    w.kv(
        &key("expert_feed_forward_length"),
        Value::U32(u("moe_intermediate_size")),
    );
    if c.get("head_dim").is_some() {
        w.kv(&key("attention.key_length"), Value::U32(u("head_dim")));
        w.kv(&key("attention.value_length"), Value::U32(u("head_dim")));
    }
    let n = u("num_hidden_layers") as usize;
    let dense: Vec<usize> = match arch {
        "deepseek2" => (0..u("first_k_dense_replace") as usize).collect(),
        _ => c.get("mlp_only_layers").map_or(vec![], |l| {
            l.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect()
        }),
    };
    for i in (0..n).filter(|i| !dense.contains(i)) {
        w.tensor(
            &format!("blk.{i}.ffn_gate_inp.weight"),
            &[32, 1],
            GgmlType::F32,
            vec![0; 128],
        );
    }
    if let Some(types) = c.get("layer_types").and_then(|t| t.as_array()) {
        for (i, t) in types.iter().enumerate() {
            if t == "linear_attention" {
                w.tensor(&format!("blk.{i}.ssm_a"), &[4], GgmlType::F32, vec![0; 16]);
            }
        }
    }
    if !c["tie_word_embeddings"].as_bool().unwrap_or(false) {
        w.tensor("output.weight", &[32, 1], GgmlType::F32, vec![0; 128]);
    }
    match arch {
        "qwen3moe" => {
            w.kv(&key("expert_count"), Value::U32(u("num_experts")));
        }
        "qwen3next" | "qwen35moe" => {
            w.kv(&key("expert_count"), Value::U32(u("num_experts")));
            w.kv(
                &key("expert_shared_feed_forward_length"),
                Value::U32(u("shared_expert_intermediate_size")),
            );
            w.kv(&key("ssm.conv_kernel"), Value::U32(u("linear_conv_kernel_dim")));
            w.kv(&key("ssm.state_size"), Value::U32(u("linear_key_head_dim")));
            w.kv(&key("ssm.group_count"), Value::U32(u("linear_num_key_heads")));
            w.kv(&key("ssm.time_step_rank"), Value::U32(u("linear_num_value_heads")));
            w.kv(
                &key("ssm.inner_size"),
                Value::U32(u("linear_value_head_dim") * u("linear_num_value_heads")),
            );
            w.kv(
                &key("full_attention_interval"),
                Value::U32(c["full_attention_interval"].as_u64().unwrap_or(4) as u32),
            );
            w.kv(
                &key("rope.dimension_count"),
                Value::U32((u("head_dim") as f32 * f("partial_rotary_factor")) as u32),
            );
        }
        _ => {
            // deepseek2, as its converter writes it today (MLA as MQA).
            let (rope, nope, v, kv) = (
                u("qk_rope_head_dim"),
                u("qk_nope_head_dim"),
                u("v_head_dim"),
                u("kv_lora_rank"),
            );
            w.kv(&key("expert_count"), Value::U32(u("n_routed_experts")));
            w.kv(
                &key("leading_dense_block_count"),
                Value::U32(u("first_k_dense_replace")),
            );
            w.kv(&key("attention.q_lora_rank"), Value::U32(u("q_lora_rank")));
            w.kv(&key("attention.kv_lora_rank"), Value::U32(kv));
            w.kv(&key("attention.key_length"), Value::U32(kv + rope));
            w.kv(&key("attention.value_length"), Value::U32(kv));
            w.kv(&key("attention.key_length_mla"), Value::U32(nope + rope));
            w.kv(&key("attention.value_length_mla"), Value::U32(v));
            w.kv(&key("rope.dimension_count"), Value::U32(rope));
            w.kv(&key("expert_shared_count"), Value::U32(u("n_shared_experts")));
            w.kv(&key("expert_weights_scale"), Value::F32(f("routed_scaling_factor")));
            w.kv(
                &key("expert_weights_norm"),
                Value::Bool(c["norm_topk_prob"].as_bool().unwrap()),
            );
            w.kv(&key("expert_gating_func"), Value::U32(2));
            w.kv(&key("expert_group_count"), Value::U32(u("n_group")));
            w.kv(&key("expert_group_used_count"), Value::U32(u("topk_group")));
            let rs = &c["rope_scaling"];
            w.kv(&key("rope.scaling.type"), Value::Str("yarn".into()));
            w.kv(
                &key("rope.scaling.factor"),
                Value::F32(rs["factor"].as_f64().unwrap() as f32),
            );
            w.kv(
                &key("rope.scaling.original_context_length"),
                Value::U32(rs["original_max_position_embeddings"].as_u64().unwrap() as u32),
            );
            w.kv(
                &key("rope.scaling.yarn_log_multiplier"),
                Value::F32(0.1 * rs["mscale_all_dim"].as_f64().unwrap() as f32),
            );
        }
    }
    w
}

#[test]
fn metadata_maps_to_the_fixtures_configs() {
    use moeflux::ModelConfig;
    let dir = tempfile::tempdir().unwrap();
    for (fixture_dir, arch) in [
        ("qwen3_moe", "qwen3moe"),
        ("qwen3_next", "qwen3next"),
        ("qwen3_5_moe", "qwen35moe"),
        ("deepseek_v3", "deepseek2"),
    ] {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures")
                .join(fixture_dir)
                .join("config.json"),
        )
        .unwrap();
        let mut hf: serde_json::Value = serde_json::from_str(&text).unwrap();
        let path = dir.path().join(format!("{arch}.gguf"));
        std::fs::write(&path, converted(arch, &hf).to_bytes()).unwrap();
        let model = GgufModel::open(&path).unwrap();
        let got = ModelConfig::from_json(&model.hf_config().unwrap()).unwrap();
        // What GGUF cannot say: Qwen3-MoE's norm_topk_prob (llama.cpp
        // always normalizes), and DeepSeek's mscale apart from
        // mscale_all_dim (llama.cpp takes them equal).
        let t = hf.get_mut("text_config").map(|t| t.take()).unwrap_or(hf);
        let mut t = t;
        if arch == "qwen3moe" {
            t["norm_topk_prob"] = true.into();
        }
        if arch == "deepseek2" {
            t["rope_scaling"]["mscale"] = t["rope_scaling"]["mscale_all_dim"].clone();
        }
        let mut want = ModelConfig::from_json(&t).unwrap();
        want.model_type = got.model_type.clone();
        assert_eq!(format!("{got:?}"), format!("{want:?}"), "{arch}");
    }
}

#[test]
fn every_family_has_a_config_and_unknown_architectures_are_listed() {
    let meta = |arch: &str, extra: &[(&str, Value)]| {
        let mut m = moeflux::format::gguf::Metadata::new(Path::new("m.gguf"));
        let k = |s: &str| format!("{arch}.{s}");
        m.kv.insert("general.architecture".into(), Value::Str(arch.into()));
        for (key, v) in [
            ("block_count", Value::U32(4)),
            ("embedding_length", Value::U32(64)),
            ("attention.head_count", Value::U32(4)),
            ("attention.key_length", Value::U32(16)),
            ("vocab_size", Value::U32(100)),
            ("expert_count", Value::U32(8)),
            ("expert_used_count", Value::U32(2)),
            ("expert_feed_forward_length", Value::U32(32)),
            ("rope.dimension_count", Value::U32(8)),
        ] {
            m.kv.insert(k(key), v);
        }
        for (key, v) in extra {
            m.kv.insert(k(key), v.clone());
        }
        m
    };
    let none = |_: &str| false;
    for (arch, model_type) in [
        ("qwen2moe", "qwen2_moe"),
        ("gpt-oss", "gpt_oss"),
        ("glm4moe", "glm4_moe"),
        ("minimax-m2", "minimax_m2"),
        ("llama", "mixtral"),
    ] {
        let c = moeflux::format::gguf::hf_config(&meta(arch, &[]), &none).unwrap();
        assert_eq!(c["model_type"], model_type);
        assert_eq!(c["num_hidden_layers"], 4);
    }
    let c =
        moeflux::format::gguf::hf_config(&meta("glm4moe", &[("nextn_predict_layers", Value::U32(1))]), &none).unwrap();
    assert_eq!(
        (c["num_hidden_layers"].as_u64(), c["partial_rotary_factor"].as_f64()),
        (Some(3), Some(0.5))
    );
    let mut dense = meta("llama", &[]);
    dense.kv.remove("llama.expert_count");
    let err = moeflux::format::gguf::hf_config(&dense, &none).unwrap_err().to_string();
    assert!(err.contains("llama.expert_count"), "{err}");
    let err = moeflux::format::gguf::hf_config(&meta("gemma3", &[]), &none)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`gemma3`") && err.contains("qwen3moe") && err.contains("m.gguf"),
        "{err}"
    );
}

// ---- tokenizer ----------------------------------------------------------

const CORPUS: &[&str] = &[
    "Hello, world! It's a test; we'll see what they've done.",
    "<|im_start|>user\nWhat is 12345 + 678?<|im_end|>\n<|im_start|>assistant\n",
    "  leading spaces,\ttabs\tand\n\n\nnewlines   \n",
    "Ünïcödé naïve café — “quotes” 日本語のテキスト 中文 한국어 🦀🚀",
    "CAPS and MiXeD cAsE, I'M SHOUTING, don't",
    "code: fn main() { println!(\"{}\", x[0] >= 3.14); } // ok",
    "<|endoftext|><|video_pad|>trailing",
    "",
];

fn check_tokenizer(vocab: &str, reference: &Path) {
    let model = GgufModel::open(&fixture(vocab)).unwrap();
    let json = moeflux::format::gguf::tokenizer_json(model.meta()).unwrap();
    let ours = tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&json).unwrap()).unwrap();
    let theirs = tokenizers::Tokenizer::from_file(reference).unwrap();
    for text in CORPUS {
        for special in [false, true] {
            let a = ours.encode(*text, special).unwrap();
            let b = theirs.encode(*text, special).unwrap();
            assert_eq!(a.get_ids(), b.get_ids(), "{vocab}: {text:?}");
            assert_eq!(
                ours.decode(a.get_ids(), false).unwrap(),
                theirs.decode(b.get_ids(), false).unwrap(),
                "{vocab}: {text:?}"
            );
        }
    }
    assert_eq!(ours.get_vocab_size(true), theirs.get_vocab_size(true));
}

#[test]
fn the_vocabulary_tokenizes_as_its_tokenizer_json() {
    let qwen3 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3_moe/tokenizer.json");
    check_tokenizer("vocab_gpt2.gguf", &qwen3);
    check_tokenizer("vocab_qwen2.gguf", &fixture("tokenizer_qwen2.json"));
}

#[test]
fn special_tokens_template_and_generation_defaults() {
    let model = GgufModel::open(&fixture("vocab_qwen2.gguf")).unwrap();
    let meta = model.meta();
    let tc = moeflux::format::gguf::tokenizer_config(meta).unwrap();
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert_eq!(tc["pad_token"], "<|endoftext|>");
    assert_eq!(tc["bos_token"], "<|endoftext|>");
    assert!(tc["chat_template"].as_str().unwrap().contains("<|im_start|>"));
    let gc = moeflux::format::gguf::generation_config(meta).unwrap();
    assert_eq!(gc["eos_token_id"], 507);
    assert_eq!(gc["pad_token_id"], 505);
    let t = moeflux::format::gguf::chat_template(meta).unwrap().unwrap();
    assert!(t.contains("add_generation_prompt"));
    // Both files' JSON parse as the text layer reads them.
    moeflux::text::GenerationDefaults::parse(&serde_json::to_vec(&gc).unwrap(), Path::new("g.json")).unwrap();
}

#[test]
fn every_known_pre_tokenizer_compiles_and_unknown_ones_are_refused() {
    let model = GgufModel::open(&fixture("vocab_qwen2.gguf")).unwrap();
    for pre in [
        "default",
        "gpt-2",
        "llama-bpe",
        "qwen2",
        "qwen35",
        "deepseek-v3",
        "gpt-4o",
        "minimax-m2",
        "glm4",
    ] {
        let mut meta = model.meta().clone();
        meta.kv.insert("tokenizer.ggml.pre".into(), Value::Str(pre.into()));
        let json = moeflux::format::gguf::tokenizer_json(&meta).unwrap();
        let tok = tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&json).unwrap()).unwrap();
        let ids = tok.encode("It's 2025: 日本語 text, ok?", false).unwrap();
        assert_eq!(
            tok.decode(ids.get_ids(), false).unwrap(),
            "It's 2025: 日本語 text, ok?",
            "{pre}"
        );
    }
    let mut meta = model.meta().clone();
    meta.kv
        .insert("tokenizer.ggml.pre".into(), Value::Str("kimi-k2".into()));
    let err = moeflux::format::gguf::tokenizer_json(&meta).unwrap_err().to_string();
    assert!(err.contains("kimi-k2") && err.contains("tokenizer.ggml.pre"), "{err}");
}
