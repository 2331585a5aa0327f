//! `moeflux synth`: the presets have the published shapes, and what synth
//! writes is a packed model the engine's readers accept, with every tensor
//! the model code needs, sane value ranges and routing spread over experts.

use moeflux::config::{Arch, AttnKind, FfnKind, ModelConfig};
use moeflux::experts::{ExpertStore, IoMode};
use moeflux::format::packed::{expert_file_name, Layout, WeightsFile, EXPERTS_DIR, WEIGHTS_FILE};
use moeflux::format::MatrixData;
use moeflux::synth::{preset, Plan, SplitMix64, SynthOptions, PRESETS};
use moeflux::Error;
use serde_json::{json, Value};
use std::path::Path;

#[path = "synth/routing.rs"]
mod routing;
#[path = "synth/text.rs"]
mod text;

/// Set `fields` where the model keeps its text fields (`text_config` if nested).
fn with(mut v: Value, fields: Value) -> Value {
    let target = if v.get("text_config").is_some() {
        &mut v["text_config"]
    } else {
        &mut v
    };
    for (k, x) in fields.as_object().unwrap() {
        target[k] = x.clone();
    }
    v
}

/// Qwen3.5's layer pattern: three linear-attention layers, then a full one.
fn hybrid_layer_types(n: usize) -> Vec<&'static str> {
    (0..n)
        .map(|i| {
            if i % 4 == 3 {
                "full_attention"
            } else {
                "linear_attention"
            }
        })
        .collect()
}

fn tiny_qwen35() -> Value {
    let types = hybrid_layer_types(8);
    with(
        preset("qwen3.6-35b-a3b").unwrap(),
        json!({"hidden_size": 128, "num_hidden_layers": 8, "layer_types": types, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
               "linear_key_head_dim": 32, "linear_value_head_dim": 32, "num_experts": 16, "num_experts_per_tok": 4,
               "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "vocab_size": 512}),
    )
}

fn tiny_qwen3() -> Value {
    with(
        preset("qwen3-30b-a3b").unwrap(),
        json!({"hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 32, "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 64,
               "intermediate_size": 256, "mlp_only_layers": [1], "vocab_size": 512}),
    )
}

/// Preset `name` at a tiny size: 3 layers of width 128, 4 query and 2 KV
/// heads, 4 experts a token of width 64, 512 tokens; then `more`.
fn tiny(name: &str, more: Value) -> Value {
    let small = with(
        preset(name).unwrap(),
        json!({"hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
               "num_experts_per_tok": 4, "moe_intermediate_size": 64, "intermediate_size": 256,
               "vocab_size": 512, "attn_type_list": [1, 1, 1]}),
    );
    with(small, more)
}

fn tiny_deepseek(q_lora: Option<usize>) -> Value {
    with(
        preset("deepseek-v3").unwrap(),
        json!({"hidden_size": 128, "num_hidden_layers": 3, "first_k_dense_replace": 1, "num_attention_heads": 4,
               "num_key_value_heads": 4, "q_lora_rank": q_lora, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
               "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 16, "n_group": 4, "topk_group": 2,
               "num_experts_per_tok": 4, "moe_intermediate_size": 64, "intermediate_size": 256, "vocab_size": 512}),
    )
}

fn write(config: Value, dir: &Path, opts: &SynthOptions) -> Plan {
    let plan = Plan::new("tiny", config, opts).unwrap();
    let summary = plan.write(dir, false, &|_| {}, None).unwrap();
    assert_eq!(summary.bytes, plan.total_bytes());
    plan
}

#[test]
fn presets_have_the_published_shapes() {
    let four_bit = SynthOptions::default();
    let expect = [
        // name, layers, hidden, experts, top-k, vocab, moe layers, expert bytes at 4 bits
        ("qwen3.6-35b-a3b", 40, 2048, 256, 8, 248320, 40, 1_769_472),
        ("qwen3.5-397b-a17b", 60, 4096, 512, 10, 248320, 60, 7_077_888),
        ("qwen3-30b-a3b", 48, 2048, 128, 8, 151936, 48, 2_654_208),
        ("deepseek-v3", 61, 7168, 256, 8, 129280, 58, 24_772_608),
        ("deepseek-v2-lite", 27, 2048, 64, 6, 102400, 26, 4_866_048),
        ("glm-4.5-air", 46, 4096, 128, 8, 151552, 45, 9_732_096),
        ("minimax-m2", 62, 3072, 256, 8, 200064, 62, 7_962_624),
        ("mixtral-8x7b", 32, 4096, 8, 2, 32000, 32, 99_090_432),
        ("qwen2-57b-a14b", 28, 3584, 64, 8, 151936, 28, 15_482_880),
    ];
    assert_eq!(PRESETS.len(), expect.len());
    for (name, layers, hidden, experts, k, vocab, moe, esize) in expect {
        let plan = Plan::new(name, preset(name).unwrap(), &four_bit).unwrap();
        let c = &plan.config;
        assert_eq!(
            (
                c.num_hidden_layers,
                c.hidden_size,
                c.num_experts,
                c.num_experts_per_tok,
                c.vocab_size
            ),
            (layers, hidden, experts, k, vocab),
            "{name}"
        );
        assert_eq!(plan.moe_layers().len(), moe, "{name}");
        assert_eq!(plan.expert_size(), esize, "{name}");
        assert!(!c.tie_word_embeddings, "{name}");
    }
    let q36 = ModelConfig::from_json(&preset("qwen3.6-35b-a3b").unwrap()).unwrap();
    assert_eq!(q36.arch, Arch::Qwen35Moe);
    assert_eq!(
        (q36.num_attention_heads, q36.num_key_value_heads, q36.head_dim),
        (16, 2, 256)
    );
    assert_eq!(
        (q36.rope_theta, q36.partial_rotary_factor, q36.rms_norm_eps),
        (1e7, 0.25, 1e-6)
    );
    assert_eq!(
        (q36.moe_intermediate_size, q36.shared_expert_intermediate_size),
        (512, 512)
    );
    let l = q36.linear.as_ref().unwrap();
    assert_eq!(
        (
            l.num_key_heads,
            l.num_value_heads,
            l.key_head_dim,
            l.value_head_dim,
            l.conv_kernel
        ),
        (16, 32, 128, 128, 4)
    );
    let full: Vec<usize> = (0..40).filter(|&i| q36.layers[i].attn == AttnKind::Full).collect();
    assert_eq!(full, (0..10).map(|j| 4 * j + 3).collect::<Vec<_>>());
    let q397 = ModelConfig::from_json(&preset("qwen3.5-397b-a17b").unwrap()).unwrap();
    assert_eq!(
        (
            q397.num_attention_heads,
            q397.moe_intermediate_size,
            q397.linear.unwrap().num_value_heads
        ),
        (32, 1024, 64)
    );
    let q3 = ModelConfig::from_json(&preset("qwen3-30b-a3b").unwrap()).unwrap();
    assert_eq!(
        (q3.arch, q3.num_attention_heads, q3.num_key_value_heads, q3.head_dim),
        (Arch::Qwen3Moe, 32, 4, 128)
    );
    assert_eq!(q3.moe_intermediate_size, 768);
    let ds = ModelConfig::from_json(&preset("deepseek-v3").unwrap()).unwrap();
    let m = ds.mla.as_ref().unwrap();
    assert_eq!(
        (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim),
        (Some(1536), 512, 128, 64)
    );
    assert_eq!(ds.yarn.as_ref().unwrap().factor, 40.0);
    assert_eq!(ds.shared_expert_intermediate_size, 2048);
    assert!(ds.layers[..3].iter().all(|l| l.ffn == FfnKind::Dense) && ds.layers[3].ffn == FfnKind::Moe);
}

#[test]
fn layers_are_trimmed_consistently() {
    let opts = |n| SynthOptions {
        layers: Some(n),
        ..SynthOptions::default()
    };
    let q = Plan::new("q", preset("qwen3.6-35b-a3b").unwrap(), &opts(4)).unwrap();
    assert_eq!(q.config.num_hidden_layers, 4);
    assert_eq!(q.config_json["text_config"]["layer_types"].as_array().unwrap().len(), 4);
    assert_eq!(q.config.layers[3].attn, AttnKind::Full);
    assert_eq!(q.moe_layers(), &[0, 1, 2, 3]);
    let d = Plan::new("d", preset("deepseek-v3").unwrap(), &opts(4)).unwrap();
    assert_eq!(d.moe_layers(), &[3]);
    for n in [0, 41] {
        let err = Plan::new("q", preset("qwen3.6-35b-a3b").unwrap(), &opts(n))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("40 layers"), "{err}");
    }
}

#[test]
fn bad_requests_are_refused_by_name() {
    let err = preset("llama-4").unwrap_err().to_string();
    assert!(err.contains("llama-4") && err.contains("qwen3.6-35b-a3b"), "{err}");
    let bits = SynthOptions {
        bits: 3,
        ..SynthOptions::default()
    };
    assert!(Plan::new("q", tiny_qwen3(), &bits)
        .err()
        .unwrap()
        .to_string()
        .contains("--bits 3"));
    let odd = with(tiny_qwen3(), json!({"moe_intermediate_size": 100}));
    let err = Plan::new("q", odd, &SynthOptions::default()).err().unwrap().to_string();
    assert!(err.contains("moe_intermediate_size"), "{err}");
}

/// Every tensor the model code reads, with its logical shape: matrices as
/// `(base, rows, cols)`, vectors as `(name, len, 0)`.
fn needed(c: &ModelConfig) -> Vec<(String, usize, usize)> {
    let (h, mut t) = (c.hidden_size, vec![]);
    let mut m = |n: String, r: usize, k: usize| t.push((n, r, k));
    m("model.embed_tokens".into(), c.vocab_size, h);
    m("model.norm.weight".into(), h, 0);
    m("lm_head".into(), c.vocab_size, h);
    for (i, l) in c.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        m(format!("{p}.input_layernorm.weight"), h, 0);
        m(format!("{p}.post_attention_layernorm.weight"), h, 0);
        let (nq, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        match l.attn {
            AttnKind::Full => {
                let gate = if c.attn.output_gate { 2 } else { 1 };
                m(format!("{p}.self_attn.q_proj"), gate * nq * hd, h);
                m(format!("{p}.self_attn.k_proj"), nkv * hd, h);
                m(format!("{p}.self_attn.v_proj"), nkv * hd, h);
                m(format!("{p}.self_attn.o_proj"), h, nq * hd);
                m(format!("{p}.self_attn.q_norm.weight"), hd, 0);
                m(format!("{p}.self_attn.k_norm.weight"), hd, 0);
            }
            AttnKind::Linear => {
                let la = c.linear.as_ref().unwrap();
                let (hv, vd) = (la.num_value_heads, la.num_value_heads * la.value_head_dim);
                let a = format!("{p}.linear_attn");
                m(format!("{a}.in_proj_qkv"), la.conv_dim(), h);
                m(format!("{a}.in_proj_z"), vd, h);
                m(format!("{a}.in_proj_b"), hv, h);
                m(format!("{a}.in_proj_a"), hv, h);
                m(format!("{a}.out_proj"), h, vd);
                m(format!("{a}.conv1d"), la.conv_dim(), la.conv_kernel);
                m(format!("{a}.A_log"), hv, 0);
                m(format!("{a}.dt_bias"), hv, 0);
                m(format!("{a}.norm.weight"), la.value_head_dim, 0);
            }
            AttnKind::Mla => {
                let ml = c.mla.as_ref().unwrap();
                let a = format!("{p}.self_attn");
                let qd = ml.qk_nope_head_dim + ml.qk_rope_head_dim;
                if let Some(r) = ml.q_lora_rank {
                    m(format!("{a}.q_a_proj"), r, h);
                    m(format!("{a}.q_a_layernorm.weight"), r, 0);
                    m(format!("{a}.q_b_proj"), nq * qd, r);
                } else {
                    m(format!("{a}.q_proj"), nq * qd, h);
                }
                m(
                    format!("{a}.kv_a_proj_with_mqa"),
                    ml.kv_lora_rank + ml.qk_rope_head_dim,
                    h,
                );
                m(format!("{a}.kv_a_layernorm.weight"), ml.kv_lora_rank, 0);
                m(
                    format!("{a}.kv_b_proj"),
                    nq * (ml.qk_nope_head_dim + ml.v_head_dim),
                    ml.kv_lora_rank,
                );
                m(format!("{a}.o_proj"), h, nq * ml.v_head_dim);
            }
        }
        let s = c.shared_expert_intermediate_size;
        match l.ffn {
            FfnKind::Dense => {
                m(format!("{p}.mlp.gate_proj"), c.intermediate_size, h);
                m(format!("{p}.mlp.up_proj"), c.intermediate_size, h);
                m(format!("{p}.mlp.down_proj"), h, c.intermediate_size);
            }
            FfnKind::Moe => {
                m(format!("{p}.mlp.gate"), c.num_experts, h);
                let shared = if c.arch == Arch::DeepseekV3 {
                    m(format!("{p}.mlp.gate.e_score_correction_bias"), c.num_experts, 0);
                    "shared_experts"
                } else {
                    "shared_expert"
                };
                if s > 0 {
                    m(format!("{p}.mlp.{shared}.gate_proj"), s, h);
                    m(format!("{p}.mlp.{shared}.up_proj"), s, h);
                    m(format!("{p}.mlp.{shared}.down_proj"), h, s);
                }
                if s > 0 && c.moe.shared_gated {
                    m(format!("{p}.mlp.shared_expert_gate"), 1, h);
                }
            }
        }
    }
    t
}

/// Mean and standard deviation.
fn moments(x: &[f32]) -> (f32, f32) {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean as f32, var.sqrt() as f32)
}

/// Open what synth wrote with the engine's readers and check every tensor.
fn check_model(dir: &Path, bits: u32) {
    let cfg = ModelConfig::from_dir(dir).unwrap();
    let wf = WeightsFile::open(dir).unwrap();
    let want = needed(&cfg);
    let mut stored = 0;
    for (name, rows, cols) in &want {
        if *cols == 0 {
            let v = wf.vector(name, *rows).unwrap();
            assert_eq!(wf.entry(name).unwrap().dtype, "F32", "{name}");
            stored += 1;
            if name.ends_with("norm.weight") {
                assert!(
                    v.iter().all(|x| (0.9..=1.1).contains(x)),
                    "{name}: norms are multipliers near 1"
                );
            } else if name.ends_with("A_log") {
                assert!(v.iter().all(|x| (0.0..16f32.ln()).contains(x)), "{name}");
            }
            continue;
        }
        let mat = wf.matrix(name, *rows, *cols).unwrap();
        let router = name.ends_with("mlp.gate") || name.ends_with("shared_expert_gate");
        match &mat.data {
            MatrixData::Quant {
                bits: b, group_size, ..
            } => {
                stored += 3;
                assert_eq!(*group_size, 64, "{name}");
                assert_eq!(*b, if router { 8 } else { bits }, "{name}");
                assert!(
                    !(router && cfg.arch == Arch::DeepseekV3),
                    "{name}: DeepSeek's router stays BF16"
                );
            }
            MatrixData::Float { dtype, .. } => {
                stored += 1;
                assert_eq!(dtype.name(), "BF16", "{name}");
                let unquantized = name.ends_with("conv1d") || (router && cfg.arch == Arch::DeepseekV3);
                assert!(unquantized, "{name} should be quantized");
            }
        }
        // Values centred on zero, std 1/sqrt(cols) (routers ×2, embeddings 1).
        if !name.ends_with("conv1d") && *rows >= 16 {
            let (mean, std) = moments(&mat.to_f32());
            let scale = if name == "model.embed_tokens" {
                1.0
            } else if router {
                2.0 / (*cols as f32).sqrt()
            } else {
                1.0 / (*cols as f32).sqrt()
            };
            assert!((std / scale - 1.0).abs() < 0.06, "{name}: std {std}, want {scale}");
            assert!(mean.abs() < 0.05 * scale, "{name}: mean {mean}");
        }
    }
    assert_eq!(
        stored, wf.manifest.num_tensors,
        "tensors the model does not read were written"
    );
    assert_eq!(wf.manifest.tensors.len(), wf.manifest.num_tensors);
    for t in wf.manifest.tensors.values() {
        assert_eq!(t.offset % 64, 0, "offsets are 64-byte aligned");
    }
    // The experts: every MoE layer has a file the store opens and validates.
    let layout = Layout::read(dir).unwrap();
    let moe: Vec<usize> = (0..cfg.num_hidden_layers)
        .filter(|&i| cfg.layers[i].ffn == FfnKind::Moe)
        .collect();
    assert_eq!(layout.layers.len(), moe.len());
    for mode in [IoMode::Pread, IoMode::Mmap, IoMode::Direct] {
        let store = ExpertStore::open(dir, cfg.num_hidden_layers, mode, 2).unwrap();
        for &i in &moe {
            let ll = store.layer_layout(i).unwrap();
            ll.validate(i, cfg.hidden_size, cfg.moe_intermediate_size, 64).unwrap();
            assert_eq!(ll.bits, bits);
            let blob = &store.read(i, &[cfg.num_experts as u32 - 1]).unwrap()[0];
            for (k, mat) in ll.matrices(blob, store.group_size()).unwrap().iter().enumerate() {
                let (mean, std) = moments(&mat.to_f32());
                let scale = 1.0 / (mat.cols as f32).sqrt();
                assert!(
                    (std / scale - 1.0).abs() < 0.06,
                    "layer {i} matrix {k}: std {std}, want {scale}"
                );
                assert!(mean.abs() < 0.05 * scale, "layer {i} matrix {k}: mean {mean}");
            }
        }
    }
}

#[test]
fn tiny_models_of_every_architecture_are_complete_and_readable() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        ("qwen35", tiny_qwen35(), 4),
        ("qwen3", tiny_qwen3(), 4),
        ("deepseek", tiny_deepseek(Some(64)), 4),
        ("deepseek-noqlora", tiny_deepseek(None), 4),
        ("qwen35-2bit", tiny_qwen35(), 2),
        ("qwen3-8bit", tiny_qwen3(), 8),
    ];
    for (name, config, bits) in cases {
        let dir = tmp.path().join(name);
        let opts = SynthOptions {
            bits,
            ..SynthOptions::default()
        };
        write(config, &dir, &opts);
        check_model(&dir, bits);
    }
}

#[test]
fn the_router_spreads_tokens_over_the_experts() {
    let tmp = tempfile::tempdir().unwrap();
    // 128 experts, top 8, at a realistic hidden size.
    let config = with(
        tiny_qwen3(),
        json!({"hidden_size": 1024, "num_hidden_layers": 1, "mlp_only_layers": [], "num_experts": 128,
               "num_experts_per_tok": 8, "moe_intermediate_size": 64}),
    );
    write(config, tmp.path(), &SynthOptions::default());
    let wf = WeightsFile::open(tmp.path()).unwrap();
    let (h, e, k, tokens) = (1024, 128, 8, 200);
    let router = wf.matrix("model.layers.0.mlp.gate", e, h).unwrap().to_f32(); // [E, hidden]
    let embed = wf.matrix("model.embed_tokens", 512, h).unwrap();
    let mut rng = SplitMix64::new(1);
    let mut uses = vec![0usize; e];
    let mut logit_sq = 0.0f64;
    let mut x = vec![0.0f32; h];
    for _ in 0..tokens {
        // The normed embedding of a random token, as the first layer sees it.
        embed.row_f32((rng.next_u64() % 512) as usize, &mut x);
        let rms = (x.iter().map(|v| v * v).sum::<f32>() / h as f32).sqrt();
        let logits: Vec<f32> = router
            .chunks_exact(h)
            .map(|r| r.iter().zip(&x).map(|(a, b)| a * b).sum::<f32>() / rms)
            .collect();
        logit_sq += logits.iter().map(|&l| (l as f64).powi(2)).sum::<f64>();
        let mut order: Vec<usize> = (0..e).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        for &i in &order[..k] {
            uses[i] += 1;
        }
    }
    let logit_std = (logit_sq / (tokens * e) as f64).sqrt();
    assert!(
        (1.5..2.5).contains(&logit_std),
        "router logits std {logit_std}, want ≈ 2"
    );
    let used = uses.iter().filter(|&&u| u > 0).count();
    assert!(
        used >= e * 95 / 100,
        "only {used} of {e} experts picked over {tokens} tokens"
    );
    let busiest = *uses.iter().max().unwrap();
    assert!(
        busiest < tokens / 4,
        "expert picked by {busiest} of {tokens} tokens: routing is not spread"
    );
}

#[test]
fn the_same_seed_gives_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let seeded = |s| SynthOptions {
        seed: s,
        ..SynthOptions::default()
    };
    write(tiny_qwen3(), &tmp.path().join("a"), &seeded(5));
    write(tiny_qwen3(), &tmp.path().join("b"), &seeded(5));
    write(tiny_qwen3(), &tmp.path().join("c"), &seeded(6));
    for f in [
        WEIGHTS_FILE.to_string(),
        format!("{EXPERTS_DIR}/{}", expert_file_name(2)),
    ] {
        let read = |d: &str| std::fs::read(tmp.path().join(d).join(&f)).unwrap();
        assert_eq!(read("a"), read("b"), "{f}");
        assert_ne!(read("a"), read("c"), "{f}");
    }
}

#[test]
fn an_existing_output_is_replaced_only_with_force() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("model");
    let plan = Plan::new("tiny", tiny_qwen3(), &SynthOptions::default()).unwrap();
    plan.write(&out, false, &|_| {}, None).unwrap();
    let before = std::fs::read(out.join(WEIGHTS_FILE)).unwrap();
    let err = plan.write(&out, false, &|_| {}, None).unwrap_err();
    assert!(matches!(err, Error::Exists(_)), "{err}");
    assert!(err.to_string().contains("--force"));
    let other = Plan::new(
        "tiny",
        tiny_qwen3(),
        &SynthOptions {
            seed: 9,
            ..SynthOptions::default()
        },
    )
    .unwrap();
    other.write(&out, true, &|_| {}, None).unwrap();
    assert_ne!(std::fs::read(out.join(WEIGHTS_FILE)).unwrap(), before);
    // A directory that is not a packed model is never replaced.
    let precious = tmp.path().join("precious");
    std::fs::create_dir(&precious).unwrap();
    std::fs::write(precious.join("notes.txt"), "keep me").unwrap();
    let err = plan.write(&precious, true, &|_| {}, None).unwrap_err().to_string();
    assert!(err.contains("not a packed model"), "{err}");
    assert!(precious.join("notes.txt").exists());
    // No temporary directory is left behind.
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains("tmp")), "{names:?}");
}

#[test]
fn the_engine_runs_the_synthetic_models() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, config) in [
        ("qwen35", tiny_qwen35()),
        ("qwen3", tiny_qwen3()),
        ("deepseek", tiny_deepseek(Some(64))),
        (
            "glm",
            tiny("glm-4.5-air", json!({"n_routed_experts": 16, "head_dim": 48})),
        ),
        (
            "minimax",
            tiny(
                "minimax-m2",
                json!({"num_local_experts": 16, "head_dim": 48, "rotary_dim": 24}),
            ),
        ),
        (
            "mixtral",
            tiny("mixtral-8x7b", json!({"num_local_experts": 8, "intermediate_size": 64})),
        ),
        (
            "qwen2",
            tiny(
                "qwen2-57b-a14b",
                json!({"num_experts": 16, "shared_expert_intermediate_size": 64}),
            ),
        ),
    ] {
        let dir = tmp.path().join(name);
        write(config, &dir, &SynthOptions::default());
        let model = moeflux::Model::open(&dir, &moeflux::Options::default()).unwrap();
        let mut session = model.session().unwrap();
        let tokens: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 512).collect();
        let logits = session.eval_all(&tokens, 0).unwrap(); // [n, vocab]
        let mut argmaxes = std::collections::BTreeSet::new();
        for row in logits.chunks_exact(512) {
            assert!(row.iter().all(|x| x.is_finite()), "{name}: non-finite logits");
            let (_, std) = moments(row);
            assert!((0.3..3.0).contains(&std), "{name}: logits std {std}");
            argmaxes.insert(row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0);
        }
        assert!(argmaxes.len() > 3, "{name}: the output does not depend on the input");
        assert!(model.expert_store().stats().experts_read > 0);
    }
}
