//! The `config.json` of real models, by preset name: the architecture
//! values as published (vision settings left out: a synthetic model has no
//! vision tower; token ids too: they are those of the tokenizer synth
//! writes, in its `generation_config.json`).

use crate::error::{Error, Result};
use serde_json::{json, Value};

/// Preset names, as `--preset` takes them.
pub const PRESETS: [&str; 9] = [
    "qwen3.6-35b-a3b",
    "qwen3.5-397b-a17b",
    "qwen3-30b-a3b",
    "deepseek-v3",
    "deepseek-v2-lite",
    "glm-4.5-air",
    "minimax-m2",
    "mixtral-8x7b",
    "qwen2-57b-a14b",
];

/// The `config.json` of preset `name`.
pub fn preset(name: &str) -> Result<Value> {
    Ok(match name {
        "qwen3.6-35b-a3b" => qwen3_5_moe(Qwen35Shape {
            hidden: 2048,
            layers: 40,
            q_heads: 16,
            value_heads: 32,
            experts: 256,
            top_k: 8,
            moe_inter: 512,
        }),
        "qwen3.5-397b-a17b" => qwen3_5_moe(Qwen35Shape {
            hidden: 4096,
            layers: 60,
            q_heads: 32,
            value_heads: 64,
            experts: 512,
            top_k: 10,
            moe_inter: 1024,
        }),
        "qwen3-30b-a3b" => qwen3_30b_a3b(),
        "deepseek-v3" => deepseek_v3(),
        "deepseek-v2-lite" => deepseek_v2_lite(),
        "glm-4.5-air" => glm_4_5_air(),
        "minimax-m2" => minimax_m2(),
        "mixtral-8x7b" => mixtral_8x7b(),
        "qwen2-57b-a14b" => qwen2_57b_a14b(),
        other => {
            return Err(Error::Invalid(format!(
                "unknown preset `{other}`; known presets: {}",
                PRESETS.join(", ")
            )))
        }
    })
}

/// What differs between the Qwen3.5/3.6 MoE sizes.
struct Qwen35Shape {
    hidden: usize,
    layers: usize,
    q_heads: usize,
    value_heads: usize,
    experts: usize,
    top_k: usize,
    moe_inter: usize,
}

/// Qwen3.5 / Qwen3.6 MoE (`qwen3_5_moe`): the text model's fields nested
/// under `text_config`, as the official repositories ship them.
fn qwen3_5_moe(s: Qwen35Shape) -> Value {
    let layer_types: Vec<&str> = (0..s.layers)
        .map(|i| {
            if (i + 1) % 4 == 0 {
                "full_attention"
            } else {
                "linear_attention"
            }
        })
        .collect();
    json!({
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "tie_word_embeddings": false,
        "text_config": {
            "model_type": "qwen3_5_moe_text",
            "attention_bias": false,
            "attention_dropout": 0.0,
            "attn_output_gate": true,
            "dtype": "bfloat16",
            "full_attention_interval": 4,
            "head_dim": 256,
            "hidden_act": "silu",
            "hidden_size": s.hidden,
            "initializer_range": 0.02,
            "layer_types": layer_types,
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": s.value_heads,
            "linear_value_head_dim": 128,
            "mamba_ssm_dtype": "float32",
            "max_position_embeddings": 262144,
            "mlp_only_layers": [],
            "moe_intermediate_size": s.moe_inter,
            "mtp_num_hidden_layers": 1,
            "num_attention_heads": s.q_heads,
            "num_experts": s.experts,
            "num_experts_per_tok": s.top_k,
            "num_hidden_layers": s.layers,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "mrope_interleaved": true,
                "mrope_section": [11, 11, 10],
                "rope_type": "default",
                "rope_theta": 10000000,
                "partial_rotary_factor": 0.25
            },
            "router_aux_loss_coef": 0.001,
            "shared_expert_intermediate_size": s.moe_inter,
            "use_cache": true,
            "vocab_size": 248320
        }
    })
}

fn qwen3_30b_a3b() -> Value {
    json!({
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "attention_bias": false,
        "attention_dropout": 0.0,
        "decoder_sparse_step": 1,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 6144,
        "max_position_embeddings": 40960,
        "max_window_layers": 48,
        "mlp_only_layers": [],
        "moe_intermediate_size": 768,
        "norm_topk_prob": true,
        "num_attention_heads": 32,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 48,
        "num_key_value_heads": 4,
        "output_router_logits": false,
        "rms_norm_eps": 1e-6,
        "rope_scaling": null,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001,
        "sliding_window": null,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "use_cache": true,
        "use_sliding_window": false,
        "vocab_size": 151936
    })
}

/// DeepSeek-V3 (671B), without its fp8 `quantization_config`: a packed
/// model holds no fp8.
fn deepseek_v3() -> Value {
    json!({
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "attention_bias": false,
        "attention_dropout": 0.0,
        "ep_size": 1,
        "first_k_dense_replace": 3,
        "hidden_act": "silu",
        "hidden_size": 7168,
        "initializer_range": 0.02,
        "intermediate_size": 18432,
        "kv_lora_rank": 512,
        "max_position_embeddings": 163840,
        "moe_intermediate_size": 2048,
        "moe_layer_freq": 1,
        "n_group": 8,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "norm_topk_prob": true,
        "num_attention_heads": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 61,
        "num_key_value_heads": 128,
        "num_nextn_predict_layers": 1,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-6,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 40,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
            "type": "yarn"
        },
        "rope_theta": 10000,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "tie_word_embeddings": false,
        "topk_group": 4,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "use_cache": true,
        "v_head_dim": 128,
        "vocab_size": 129280
    })
}

/// DeepSeek-V2-Lite (16B-A2.4B).
fn deepseek_v2_lite() -> Value {
    json!({
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "attention_bias": false,
        "attention_dropout": 0.0,
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 10944,
        "kv_lora_rank": 512,
        "max_position_embeddings": 163840,
        "moe_intermediate_size": 1408,
        "moe_layer_freq": 1,
        "n_group": 1,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "norm_topk_prob": false,
        "num_attention_heads": 16,
        "num_experts_per_tok": 6,
        "num_hidden_layers": 27,
        "num_key_value_heads": 16,
        "q_lora_rank": null,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-6,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 40,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 4096,
            "type": "yarn"
        },
        "rope_theta": 10000,
        "routed_scaling_factor": 1.0,
        "scoring_func": "softmax",
        "tie_word_embeddings": false,
        "topk_group": 1,
        "topk_method": "greedy",
        "torch_dtype": "bfloat16",
        "use_cache": true,
        "v_head_dim": 128,
        "vocab_size": 102400
    })
}

/// GLM-4.5-Air (106B-A12B), without its MTP layer's count mattering: the
/// packed model has none.
fn glm_4_5_air() -> Value {
    json!({
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "attention_bias": true,
        "attention_dropout": 0.0,
        "first_k_dense_replace": 1,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 10944,
        "max_position_embeddings": 131072,
        "moe_intermediate_size": 1408,
        "n_group": 1,
        "n_routed_experts": 128,
        "n_shared_experts": 1,
        "norm_topk_prob": true,
        "num_attention_heads": 96,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 46,
        "num_key_value_heads": 8,
        "num_nextn_predict_layers": 1,
        "partial_rotary_factor": 0.5,
        "rms_norm_eps": 1e-5,
        "rope_scaling": null,
        "rope_theta": 1000000,
        "routed_scaling_factor": 1.0,
        "tie_word_embeddings": false,
        "topk_group": 1,
        "torch_dtype": "bfloat16",
        "use_cache": true,
        "use_qk_norm": false,
        "vocab_size": 151552
    })
}

/// MiniMax-M2 (230B-A10B).
fn minimax_m2() -> Value {
    json!({
        "architectures": ["MiniMaxM2ForCausalLM"],
        "model_type": "minimax_m2",
        "attention_dropout": 0.0,
        "attn_type_list": vec![1; 62],
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 3072,
        "intermediate_size": 1536,
        "max_position_embeddings": 196608,
        "num_attention_heads": 48,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 62,
        "num_key_value_heads": 8,
        "num_local_experts": 256,
        "qk_norm_type": "per_layer",
        "rms_norm_eps": 1e-6,
        "rope_theta": 5000000,
        "rotary_dim": 64,
        "scoring_func": "sigmoid",
        "shared_intermediate_size": 0,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "use_cache": true,
        "use_qk_norm": true,
        "use_routing_bias": true,
        "vocab_size": 200064
    })
}

/// Mixtral-8x7B (47B-A13B).
fn mixtral_8x7b() -> Value {
    json!({
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "num_attention_heads": 32,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "output_router_logits": false,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.02,
        "sliding_window": null,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "use_cache": true,
        "vocab_size": 32000
    })
}

/// Qwen2-57B-A14B.
fn qwen2_57b_a14b() -> Value {
    json!({
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "attention_dropout": 0.0,
        "decoder_sparse_step": 1,
        "hidden_act": "silu",
        "hidden_size": 3584,
        "initializer_range": 0.02,
        "intermediate_size": 18944,
        "max_position_embeddings": 32768,
        "max_window_layers": 28,
        "moe_intermediate_size": 2560,
        "norm_topk_prob": false,
        "num_attention_heads": 28,
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": 20480,
        "sliding_window": 32768,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "use_cache": true,
        "use_sliding_window": false,
        "vocab_size": 151936
    })
}

/// Keep the first `n` layers: `num_hidden_layers`, `layer_types` and
/// `mlp_only_layers` are cut consistently (in `text_config` where the
/// model nests its fields there).
pub fn trim_layers(config: &mut Value, n: usize) -> Result<()> {
    let root = config
        .as_object_mut()
        .ok_or_else(|| Error::config("(root)", "config.json is not a JSON object"))?;
    let nested = root
        .get("text_config")
        .and_then(|t| t.as_object())
        .is_some_and(|t| t.contains_key("num_hidden_layers"));
    let fields = if nested {
        root.get_mut("text_config").and_then(|t| t.as_object_mut())
    } else {
        Some(root)
    }
    .ok_or_else(|| Error::config("text_config", "not a JSON object"))?;
    let total = fields
        .get("num_hidden_layers")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| Error::config("num_hidden_layers", "missing"))? as usize;
    if n == 0 || n > total {
        return Err(Error::Invalid(format!(
            "--layers {n}: the model has {total} layers; give 1..={total}"
        )));
    }
    fields.insert("num_hidden_layers".into(), json!(n));
    if let Some(Value::Array(types)) = fields.get_mut("layer_types") {
        types.truncate(n);
    }
    if let Some(Value::Array(only)) = fields.get_mut("mlp_only_layers") {
        only.retain(|v| v.as_u64().is_some_and(|i| (i as usize) < n));
    }
    Ok(())
}
