//! GGUF metadata → a Hugging Face `config.json` value that
//! `ModelConfig::from_json` reads: `general.architecture` names the family
//! and the `<arch>.*` keys (as llama.cpp's `convert_hf_to_gguf.py` writes
//! them) give the fields. What GGUF does not record is taken from the
//! tensor table (tied embeddings, dense layers) or from the defaults
//! llama.cpp builds the family with (e.g. Qwen3-MoE normalizes its top-k
//! weights).

use super::file::GgufModel;
use super::meta::Metadata;
use crate::error::Result;
use serde_json::{json, Map, Value};

/// The `general.architecture` values mapped, and their `model_type`s.
pub const ARCHITECTURES: [(&str, &str); 9] = [
    ("qwen3moe", "qwen3_moe"),
    ("qwen3next", "qwen3_next"),
    ("qwen35moe", "qwen3_5_moe"),
    ("deepseek2", "deepseek_v3"),
    ("qwen2moe", "qwen2_moe"),
    ("gpt-oss", "gpt_oss"),
    ("glm4moe", "glm4_moe"),
    ("minimax-m2", "minimax_m2"),
    ("llama", "mixtral"),
];

/// For error messages.
pub const SUPPORTED: &str =
    "qwen3moe, qwen3next, qwen35moe, deepseek2, qwen2moe, gpt-oss, glm4moe, minimax-m2, llama (with experts: Mixtral)";

/// Layers a config may have (as `config.json`'s counts, SPEC §2); the
/// per-layer tables below are built from it.
const MAX_LAYERS: usize = 1 << 16;

/// Reads `<arch>.KEY`s.
struct Keys<'a> {
    meta: &'a Metadata,
    arch: &'a str,
}

impl Keys<'_> {
    fn k(&self, key: &str) -> String {
        format!("{}.{key}", self.arch)
    }
    fn uint(&self, key: &str) -> Result<usize> {
        self.meta.uint(&self.k(key))
    }
    fn uint_opt(&self, key: &str) -> Result<Option<usize>> {
        self.meta.uint_opt(&self.k(key))
    }
    fn uniform(&self, key: &str) -> Result<Option<usize>> {
        self.meta.uniform_uint_opt(&self.k(key))
    }
    fn num_opt(&self, key: &str) -> Result<Option<f64>> {
        self.meta.num_opt(&self.k(key))
    }
    fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        self.meta.bool_opt(&self.k(key))
    }
}

/// An f32 read from the file, printed as the shortest decimal that reads
/// back to it (1e-6, not 9.999999974752427e-7).
fn f32_json(x: f64) -> Value {
    let s = format!("{}", x as f32);
    s.parse::<f64>().map(|v| json!(v)).unwrap_or(json!(x))
}

fn set(m: &mut Map<String, Value>, key: &str, v: Option<Value>) {
    if let Some(v) = v {
        m.insert(key.to_string(), v);
    }
}

/// The `config.json` of a GGUF model.
pub fn hf_config(meta: &Metadata, has_tensor: &dyn Fn(&str) -> bool) -> Result<Value> {
    let arch = meta.str("general.architecture")?;
    let Some(&(_, model_type)) = ARCHITECTURES.iter().find(|a| a.0 == arch) else {
        return Err(meta.error(
            "general.architecture",
            format!("`{arch}` is not a GGUF architecture moeflux runs; supported: {SUPPORTED}"),
        ));
    };
    let k = Keys { meta, arch };
    let mut c = Map::new();

    let blocks = k.uint("block_count")?;
    if blocks > MAX_LAYERS {
        return Err(meta.error(&k.k("block_count"), format!("{blocks} exceeds {MAX_LAYERS}")));
    }
    let mtp = k.uint_opt("nextn_predict_layers")?.unwrap_or(0);
    let layers = blocks.checked_sub(mtp).filter(|&n| n > 0).ok_or_else(|| {
        meta.error(
            &k.k("nextn_predict_layers"),
            format!("{mtp} is not below block_count {blocks}"),
        )
    })?;
    let heads = k
        .uniform("attention.head_count")?
        .ok_or_else(|| meta.error(&k.k("attention.head_count"), "missing"))?;
    let hidden = k.uint("embedding_length")?;
    let vocab = match k.uint_opt("vocab_size")? {
        Some(v) => v,
        None => meta
            .array_opt("tokenizer.ggml.tokens")?
            .map(|a| a.len())
            .ok_or_else(|| meta.error(&k.k("vocab_size"), "missing, and there is no tokenizer.ggml.tokens"))?,
    };
    let head_dim = k.uint_opt("attention.key_length")?;

    c.insert("model_type".into(), json!(model_type));
    c.insert("architectures".into(), json!([arch_class(model_type)]));
    c.insert("vocab_size".into(), json!(vocab));
    c.insert("hidden_size".into(), json!(hidden));
    c.insert("num_hidden_layers".into(), json!(layers));
    c.insert("num_attention_heads".into(), json!(heads));
    set(
        &mut c,
        "num_key_value_heads",
        k.uniform("attention.head_count_kv")?.map(|v| json!(v)),
    );
    set(
        &mut c,
        "max_position_embeddings",
        k.uint_opt("context_length")?.map(|v| json!(v)),
    );
    set(
        &mut c,
        "rms_norm_eps",
        k.num_opt("attention.layer_norm_rms_epsilon")?.map(f32_json),
    );
    set(&mut c, "rope_theta", k.num_opt("rope.freq_base")?.map(f32_json));
    set(&mut c, "head_dim", head_dim.map(|v| json!(v)));
    set(
        &mut c,
        "intermediate_size",
        k.uint_opt("feed_forward_length")?.map(|v| json!(v)),
    );
    set(
        &mut c,
        "moe_intermediate_size",
        k.uint_opt("expert_feed_forward_length")?.map(|v| json!(v)),
    );
    set(
        &mut c,
        "num_experts_per_tok",
        k.uint_opt("expert_used_count")?.map(|v| json!(v)),
    );
    c.insert("tie_word_embeddings".into(), json!(!has_tensor("output.weight")));
    set(
        &mut c,
        "bos_token_id",
        meta.uint_opt("tokenizer.ggml.bos_token_id")?.map(|v| json!(v)),
    );
    set(
        &mut c,
        "eos_token_id",
        meta.uint_opt("tokenizer.ggml.eos_token_id")?.map(|v| json!(v)),
    );
    if let Some(rs) = rope_scaling(&k)? {
        c.insert("rope_scaling".into(), rs);
    }
    let experts = k.uint_opt("expert_count")?;
    let norm = k.bool_opt("expert_weights_norm")?;
    let rotary = k.uint_opt("rope.dimension_count")?;
    let partial = |c: &mut Map<String, Value>| {
        if let (Some(r), Some(h)) = (rotary, head_dim.filter(|&h| h > 0)) {
            c.insert("partial_rotary_factor".into(), json!(r as f64 / h as f64));
        }
    };
    let shared_ff = k.uint_opt("expert_shared_feed_forward_length")?;
    // Layers without a router are dense (`mlp_only_layers`); a file without
    // any router (metadata only) says nothing.
    let routed = |i: usize| has_tensor(&format!("blk.{i}.ffn_gate_inp.weight"));
    let dense_layers: Vec<usize> = if (0..layers).any(routed) {
        (0..layers).filter(|&i| !routed(i)).collect()
    } else {
        vec![]
    };

    match arch {
        "qwen3moe" | "qwen2moe" => {
            c.insert("num_experts".into(), json!(experts));
            // llama.cpp normalizes Qwen3-MoE's top-k weights, not Qwen2-MoE's.
            c.insert("norm_topk_prob".into(), json!(norm.unwrap_or(arch == "qwen3moe")));
            c.insert("mlp_only_layers".into(), json!(dense_layers));
            set(&mut c, "shared_expert_intermediate_size", shared_ff.map(|v| json!(v)));
        }
        "qwen3next" | "qwen35moe" => {
            c.insert("num_experts".into(), json!(experts));
            c.insert("norm_topk_prob".into(), json!(norm.unwrap_or(true)));
            set(&mut c, "shared_expert_intermediate_size", shared_ff.map(|v| json!(v)));
            partial(&mut c);
            let v_heads = k.uint("ssm.time_step_rank")?;
            let inner = k.uint("ssm.inner_size")?;
            if v_heads == 0 || !inner.is_multiple_of(v_heads) {
                return Err(meta.error(
                    &k.k("ssm.inner_size"),
                    format!("{inner} is not a multiple of ssm.time_step_rank {v_heads}"),
                ));
            }
            c.insert("linear_num_value_heads".into(), json!(v_heads));
            c.insert("linear_value_head_dim".into(), json!(inner / v_heads));
            c.insert("linear_num_key_heads".into(), json!(k.uint("ssm.group_count")?));
            c.insert("linear_key_head_dim".into(), json!(k.uint("ssm.state_size")?));
            c.insert("linear_conv_kernel_dim".into(), json!(k.uint("ssm.conv_kernel")?));
            c.insert(
                "full_attention_interval".into(),
                json!(k.uint_opt("full_attention_interval")?.unwrap_or(4)),
            );
            // The tensors say which layers are linear (`ssm_a`) where the
            // interval cannot.
            let linear = |i: usize| has_tensor(&format!("blk.{i}.ssm_a"));
            if (0..layers).any(linear) {
                let types: Vec<&str> = (0..layers)
                    .map(|i| {
                        if linear(i) {
                            "linear_attention"
                        } else {
                            "full_attention"
                        }
                    })
                    .collect();
                c.insert("layer_types".into(), json!(types));
            }
            c.insert("mlp_only_layers".into(), json!(dense_layers));
        }
        "deepseek2" => deepseek(&k, &mut c, experts, heads, norm, has_tensor)?,
        "glm4moe" => {
            c.insert("n_routed_experts".into(), json!(experts));
            c.insert(
                "first_k_dense_replace".into(),
                json!(k.uint_opt("leading_dense_block_count")?.unwrap_or(0)),
            );
            c.insert(
                "n_shared_experts".into(),
                json!(k.uint_opt("expert_shared_count")?.unwrap_or(0)),
            );
            c.insert(
                "routed_scaling_factor".into(),
                k.num_opt("expert_weights_scale")?.map(f32_json).unwrap_or(json!(1.0)),
            );
            c.insert("norm_topk_prob".into(), json!(norm.unwrap_or(true)));
            c.insert("n_group".into(), json!(k.uint_opt("expert_group_count")?.unwrap_or(1)));
            c.insert(
                "topk_group".into(),
                json!(k.uint_opt("expert_group_used_count")?.unwrap_or(1)),
            );
            c.insert("use_qk_norm".into(), json!(has_tensor("blk.0.attn_q_norm.weight")));
            c.insert("attention_bias".into(), json!(has_tensor("blk.0.attn_q.bias")));
            c.insert("num_nextn_predict_layers".into(), json!(mtp));
            partial(&mut c);
        }
        "gpt-oss" => {
            c.insert("num_local_experts".into(), json!(experts));
            c.insert("experts_per_token".into(), c["num_experts_per_tok"].clone());
            c.insert("intermediate_size".into(), json!(k.uint("expert_feed_forward_length")?));
            let window = k.uint_opt("attention.sliding_window")?;
            set(&mut c, "sliding_window", window.map(|v| json!(v)));
            // llama.cpp: even layers slide, odd layers see everything.
            let types: Vec<&str> = (0..layers)
                .map(|i| {
                    if i % 2 == 0 {
                        "sliding_attention"
                    } else {
                        "full_attention"
                    }
                })
                .collect();
            c.insert("layer_types".into(), json!(types));
            c.insert("attention_bias".into(), json!(true));
            c.insert("swiglu_limit".into(), json!(7.0));
        }
        "minimax-m2" => {
            c.insert("num_local_experts".into(), json!(experts));
            c.insert("intermediate_size".into(), json!(k.uint("expert_feed_forward_length")?));
            c.insert("scoring_func".into(), json!(gating(&k)?.unwrap_or("sigmoid")));
            c.insert("use_routing_bias".into(), json!(has_tensor("blk.0.exp_probs_b.bias")));
            c.insert("use_qk_norm".into(), json!(has_tensor("blk.0.attn_q_norm.weight")));
            c.insert("qk_norm_type".into(), json!("per_layer"));
            set(&mut c, "rotary_dim", rotary.map(|v| json!(v)));
            partial(&mut c);
        }
        _ => {
            // llama: Mixtral when it has experts; dense Llama is not an MoE.
            let Some(e) = experts.filter(|&e| e > 0) else {
                return Err(meta.error(
                    "llama.expert_count",
                    "missing: a llama model without experts is dense, and moeflux runs MoE models",
                ));
            };
            c.insert("num_local_experts".into(), json!(e));
            set(&mut c, "sliding_window", Some(Value::Null));
        }
    }
    Ok(Value::Object(c))
}

/// `expert_gating_func`: 1 softmax, 2 sigmoid (llama.cpp's numbering).
fn gating(k: &Keys) -> Result<Option<&'static str>> {
    Ok(match k.uint_opt("expert_gating_func")? {
        None => None,
        Some(1) => Some("softmax"),
        Some(2) => Some("sigmoid"),
        Some(n) => {
            return Err(k.meta.error(
                &k.k("expert_gating_func"),
                format!("{n}: not softmax (1) or sigmoid (2)"),
            ))
        }
    })
}

/// DeepSeek V2/V3 (MLA): V3 routes with a sigmoid and a selection bias
/// (`noaux_tc`); V2 with a softmax.
fn deepseek(
    k: &Keys,
    c: &mut Map<String, Value>,
    experts: Option<usize>,
    heads: usize,
    norm: Option<bool>,
    has_tensor: &dyn Fn(&str) -> bool,
) -> Result<()> {
    let sigmoid = gating(k)? == Some("sigmoid") || has_tensor(&format!("blk.{}.exp_probs_b.bias", first_moe(k)?));
    if !sigmoid {
        c.insert("model_type".into(), json!("deepseek_v2"));
        c.insert("architectures".into(), json!(["DeepseekV2ForCausalLM"]));
    }
    c.insert("n_routed_experts".into(), json!(experts));
    c.insert(
        "first_k_dense_replace".into(),
        json!(k.uint_opt("leading_dense_block_count")?.unwrap_or(0)),
    );
    c.insert(
        "n_shared_experts".into(),
        json!(k.uint_opt("expert_shared_count")?.unwrap_or(0)),
    );
    c.insert(
        "routed_scaling_factor".into(),
        k.num_opt("expert_weights_scale")?.map(f32_json).unwrap_or(json!(1.0)),
    );
    c.insert("norm_topk_prob".into(), json!(norm.unwrap_or(false)));
    c.insert("n_group".into(), json!(k.uint_opt("expert_group_count")?.unwrap_or(1)));
    c.insert(
        "topk_group".into(),
        json!(k.uint_opt("expert_group_used_count")?.unwrap_or(1)),
    );
    c.insert("topk_method".into(), json!(if sigmoid { "noaux_tc" } else { "greedy" }));
    c.insert(
        "scoring_func".into(),
        json!(if sigmoid { "sigmoid" } else { "softmax" }),
    );
    // GGUF stores MLA as MQA over the latent (head_count_kv 1); the HF
    // config counts the decompressed heads.
    c.insert("num_key_value_heads".into(), json!(heads));
    let q_lora = k.uint_opt("attention.q_lora_rank")?.filter(|&r| r > 0);
    c.insert("q_lora_rank".into(), json!(q_lora));
    c.insert("kv_lora_rank".into(), json!(k.uint("attention.kv_lora_rank")?));
    let rope = k.uint("rope.dimension_count")?;
    // Current files: the per-head widths under `*_mla`; older ones (with
    // `attn_kv_b`) under the plain keys.
    let (qk, v) = match k.uint_opt("attention.key_length_mla")? {
        Some(qk) => (qk, k.uint("attention.value_length_mla")?),
        None => (k.uint("attention.key_length")?, k.uint("attention.value_length")?),
    };
    let nope = qk.checked_sub(rope).ok_or_else(|| {
        k.meta.error(
            &k.k("rope.dimension_count"),
            format!("{rope} exceeds the key length {qk}"),
        )
    })?;
    c.insert("qk_rope_head_dim".into(), json!(rope));
    c.insert("qk_nope_head_dim".into(), json!(nope));
    c.insert("v_head_dim".into(), json!(v));
    c.remove("head_dim");
    c.insert("rope_interleave".into(), json!(true));
    Ok(())
}

/// The first layer with routed experts (DeepSeek's dense layers come first).
fn first_moe(k: &Keys) -> Result<usize> {
    Ok(k.uint_opt("leading_dense_block_count")?.unwrap_or(0))
}

/// `rope.scaling.*` → `rope_scaling` (YaRN and linear).
fn rope_scaling(k: &Keys) -> Result<Option<Value>> {
    let Some(kind) = k.meta.str_opt(&k.k("rope.scaling.type"))? else {
        return Ok(None);
    };
    let factor = k.num_opt("rope.scaling.factor")?;
    Ok(match kind {
        "none" => None,
        "linear" => Some(json!({"type": "linear", "rope_type": "linear", "factor": factor.map(f32_json)})),
        "yarn" => {
            let mut m = Map::new();
            m.insert("type".into(), json!("yarn"));
            m.insert("rope_type".into(), json!("yarn"));
            m.insert("factor".into(), factor.map(f32_json).unwrap_or(json!(1.0)));
            set(
                &mut m,
                "original_max_position_embeddings",
                k.uint_opt("rope.scaling.original_context_length")?.map(|v| json!(v)),
            );
            set(
                &mut m,
                "beta_fast",
                k.num_opt("rope.scaling.yarn_beta_fast")?.map(f32_json),
            );
            set(
                &mut m,
                "beta_slow",
                k.num_opt("rope.scaling.yarn_beta_slow")?.map(f32_json),
            );
            // convert_hf_to_gguf writes 0.1·mscale_all_dim for DeepSeek.
            if let Some(mul) = k.num_opt("rope.scaling.yarn_log_multiplier")? {
                let m_all = f32_json(((mul / 0.1) as f32) as f64);
                m.insert("mscale".into(), m_all.clone());
                m.insert("mscale_all_dim".into(), m_all);
            }
            Some(Value::Object(m))
        }
        other => {
            return Err(k.meta.error(
                &k.k("rope.scaling.type"),
                format!("`{other}` is not supported (yarn, linear)"),
            ));
        }
    })
}

fn arch_class(model_type: &str) -> &'static str {
    match model_type {
        "qwen3_moe" => "Qwen3MoeForCausalLM",
        "qwen3_next" => "Qwen3NextForCausalLM",
        "qwen3_5_moe" => "Qwen3_5MoeForCausalLM",
        "deepseek_v3" => "DeepseekV3ForCausalLM",
        "qwen2_moe" => "Qwen2MoeForCausalLM",
        "gpt_oss" => "GptOssForCausalLM",
        "glm4_moe" => "Glm4MoeForCausalLM",
        "minimax_m2" => "MiniMaxM2ForCausalLM",
        _ => "MixtralForCausalLM",
    }
}

impl GgufModel {
    /// The model's `config.json` (see [`hf_config`]).
    pub fn hf_config(&self) -> Result<Value> {
        hf_config(self.meta(), &|n| self.get(n).is_some())
    }
}
