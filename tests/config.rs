//! `ModelConfig` accepts what transformers 4.x / 5.x and MLX write, and
//! names the field at fault otherwise.

use moeflux::config::{AttnKind, FfnKind, Routing};
use moeflux::{Error, ModelConfig};
use serde_json::json;

fn qwen3_moe() -> serde_json::Value {
    json!({
        "model_type": "qwen3_moe", "vocab_size": 512, "hidden_size": 128,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 40, "intermediate_size": 192, "moe_intermediate_size": 64,
        "num_experts": 16, "num_experts_per_tok": 4, "rope_theta": 1e6,
        "mlp_only_layers": [1], "decoder_sparse_step": 1, "rms_norm_eps": 1e-6
    })
}

#[test]
fn qwen3_moe_layers_and_defaults() {
    let c = ModelConfig::from_json(&qwen3_moe()).unwrap();
    assert_eq!(c.head_dim, 40);
    assert_eq!(c.rotary_dim(), 40);
    let ffn: Vec<_> = c.layers.iter().map(|l| l.ffn).collect();
    assert_eq!(ffn, [FfnKind::Moe, FfnKind::Dense, FfnKind::Moe, FfnKind::Moe]);
    // norm_topk_prob is false when absent for qwen3_moe.
    assert_eq!(c.routing, Routing::Softmax { norm_topk_prob: false });
    assert_eq!(c.rope_theta, 1e6);
}

#[test]
fn decoder_sparse_step_makes_dense_layers() {
    let mut v = qwen3_moe();
    v["mlp_only_layers"] = json!([]);
    v["decoder_sparse_step"] = json!(2);
    let c = ModelConfig::from_json(&v).unwrap();
    let ffn: Vec<_> = c.layers.iter().map(|l| l.ffn).collect();
    assert_eq!(ffn, [FfnKind::Dense, FfnKind::Moe, FfnKind::Dense, FfnKind::Moe]);
}

#[test]
fn qwen3_5_text_config_and_rope_parameters() {
    let v = json!({
        "model_type": "qwen3_5_moe",
        "text_config": {
            "model_type": "qwen3_5_moe_text", "vocab_size": 512, "hidden_size": 128,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
            "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
            "num_experts": 8, "num_experts_per_tok": 2,
            "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "linear_key_head_dim": 32, "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4,
            "layer_types": ["linear_attention", "full_attention", "linear_attention", "linear_attention"],
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25}
        },
        "vision_config": {"depth": 2}
    });
    let c = ModelConfig::from_json(&v).unwrap();
    assert_eq!(c.rope_theta, 1e7);
    assert_eq!(c.rotary_dim(), 16);
    let attn: Vec<_> = c.layers.iter().map(|l| l.attn).collect();
    assert_eq!(
        attn,
        [AttnKind::Linear, AttnKind::Full, AttnKind::Linear, AttnKind::Linear]
    );
    assert_eq!(c.routing, Routing::Softmax { norm_topk_prob: true });
    assert!(c.moe.shared_gated);
    assert_eq!(c.linear.as_ref().unwrap().conv_dim(), 2 * 2 * 32 + 4 * 32);
}

#[test]
fn full_attention_interval_without_layer_types() {
    let v = json!({
        "model_type": "qwen3_next", "vocab_size": 512, "hidden_size": 128,
        "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "moe_intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 32, "linear_value_head_dim": 32,
        "full_attention_interval": 4, "partial_rotary_factor": 0.25, "rope_theta": 1e6,
        "norm_topk_prob": false
    });
    let c = ModelConfig::from_json(&v).unwrap();
    let full: Vec<usize> = (0..8).filter(|&i| c.layers[i].attn == AttnKind::Full).collect();
    assert_eq!(full, [3, 7]);
    assert_eq!(c.routing, Routing::Softmax { norm_topk_prob: false });
}

fn deepseek() -> serde_json::Value {
    json!({
        "model_type": "deepseek_v3", "vocab_size": 512, "hidden_size": 128,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
        "intermediate_size": 256, "moe_intermediate_size": 64,
        "n_routed_experts": 16, "num_experts_per_tok": 4, "n_shared_experts": 2,
        "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
        "first_k_dense_replace": 1, "q_lora_rank": null, "kv_lora_rank": 64,
        "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
        "rope_theta": 10000,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                          "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 1.0}
    })
}

#[test]
fn deepseek_dense_first_layers_mla_and_yarn() {
    let c = ModelConfig::from_json(&deepseek()).unwrap();
    let ffn: Vec<_> = c.layers.iter().map(|l| l.ffn).collect();
    assert_eq!(ffn, [FfnKind::Dense, FfnKind::Moe, FfnKind::Moe]);
    assert!(c.layers.iter().all(|l| l.attn == AttnKind::Mla));
    let m = c.mla.as_ref().unwrap();
    assert_eq!(m.q_lora_rank, None);
    assert!(m.rope_interleave);
    assert_eq!(c.shared_expert_intermediate_size, 128);
    let y = c.yarn.as_ref().unwrap();
    assert_eq!((y.factor, y.mscale, y.mscale_all_dim), (4.0, Some(0.707), Some(1.0)));
    assert!(matches!(
        c.routing,
        Routing::NoauxTc {
            n_group: 4,
            topk_group: 2,
            ..
        }
    ));
}

#[test]
fn unknown_model_type_is_named() {
    let mut v = qwen3_moe();
    v["model_type"] = json!("llama4");
    let e = ModelConfig::from_json(&v).unwrap_err();
    assert!(matches!(e, Error::UnsupportedArch { .. }));
    let msg = e.to_string();
    assert!(
        msg.contains("llama4") && msg.contains("qwen3_moe") && msg.contains("deepseek_v3"),
        "{msg}"
    );
}

#[test]
fn errors_name_the_field() {
    let mut v = qwen3_moe();
    v.as_object_mut().unwrap().remove("num_experts_per_tok");
    assert!(ModelConfig::from_json(&v)
        .unwrap_err()
        .to_string()
        .contains("num_experts_per_tok"));

    let mut v = qwen3_moe();
    v["num_key_value_heads"] = json!(3);
    assert!(ModelConfig::from_json(&v)
        .unwrap_err()
        .to_string()
        .contains("num_key_value_heads"));

    let mut v = qwen3_moe();
    v["hidden_size"] = json!("wide");
    assert!(ModelConfig::from_json(&v)
        .unwrap_err()
        .to_string()
        .contains("hidden_size"));

    let mut v = deepseek();
    v["n_group"] = json!(3);
    assert!(ModelConfig::from_json(&v).unwrap_err().to_string().contains("n_group"));

    let mut v = qwen3_moe();
    v["use_sliding_window"] = json!(true);
    assert!(ModelConfig::from_json(&v).unwrap_err().to_string().contains("sliding"));
}

#[test]
fn num_local_experts_is_accepted() {
    let mut v = qwen3_moe();
    let n = v.as_object_mut().unwrap().remove("num_experts").unwrap();
    v["num_local_experts"] = n;
    assert_eq!(ModelConfig::from_json(&v).unwrap().num_experts, 16);
}

/// Values that parse but cannot be right: a typed error naming the field,
/// before anything is sized from them.
#[test]
fn impossible_values_name_the_field() {
    let cases = [
        ("num_hidden_layers", json!(1u64 << 40)),
        ("num_attention_heads", json!(1u64 << 40)),
        ("hidden_size", json!(u64::MAX)),
        ("rms_norm_eps", json!(-1e-6)),
        ("rms_norm_eps", json!(1e300)),
        ("rope_theta", json!(-5.0)),
        ("partial_rotary_factor", json!(7.5)),
        ("max_position_embeddings", json!(0)),
        ("max_position_embeddings", json!(1u64 << 40)),
        ("mlp_only_layers", json!([1000])),
        ("vocab_size", json!(1u64 << 33)),
    ];
    for (field, value) in cases {
        let mut v = qwen3_moe();
        v[field] = value.clone();
        let e = ModelConfig::from_json(&v).unwrap_err().to_string();
        assert!(e.contains(field), "{field} = {value}: {e}");
    }
    let mut v = deepseek();
    v["n_shared_experts"] = json!(u64::MAX);
    let e = ModelConfig::from_json(&v).unwrap_err().to_string();
    assert!(e.contains("n_shared_experts"), "{e}");
}
