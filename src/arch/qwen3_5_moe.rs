//! `qwen3_5_moe` (Qwen3.5 / Qwen3.6 MoE) and `qwen3_next` (Qwen3-Next):
//! GatedDeltaNet layers between gated full-attention layers with partial
//! RoPE, zero-centred norms, softmax top-k routing and a shared expert
//! with a sigmoid gate. Qwen3-Next's checkpoints fuse the GatedDeltaNet's
//! input projections (`in_proj_qkvz`, `in_proj_ba`); `convert` splits them
//! (SPEC.md §5).

use super::{skip_nothing, Family};
use crate::config::fields::{hybrid_attn_kinds, qwen_moe_layers, rope_settings, Fields};
use crate::config::{Arch, LayerSpec, LinearAttnConfig, ModelConfig, QkNorm, Routing};
use crate::error::Result;

pub const FAMILY: Family = Family {
    arch: Arch::Qwen35Moe,
    model_types: &["qwen3_5_moe", "qwen3_5_moe_text"],
    formats: "bf16, MLX 2/4/8-bit",
    configure,
    renames: &[],
    skip: skip_nothing,
};

pub const NEXT: Family = Family {
    arch: Arch::Qwen3Next,
    model_types: &["qwen3_next"],
    formats: "bf16 (fused projections), MLX 2/4/8-bit",
    configure,
    renames: &[],
    skip: skip_nothing,
};

fn configure(f: &Fields, cfg: &mut ModelConfig) -> Result<()> {
    super::refuse_attention_bias(f)?;
    // transformers' defaults for these configs.
    cfg.head_dim = f.usize_or("head_dim", 256)?;
    cfg.partial_rotary_factor = rope_settings(f)?.partial_rotary_factor.unwrap_or(0.25);
    cfg.attn.output_gate = true;
    cfg.attn.qk_norm = QkNorm::PerHead;
    cfg.zero_centred_norms = true;
    cfg.routing = Routing::Softmax {
        norm_topk_prob: cfg.arch == Arch::Qwen35Moe || f.bool_or("norm_topk_prob", true)?,
    };
    cfg.shared_expert_intermediate_size = f.usize_or("shared_expert_intermediate_size", 0)?;
    cfg.moe.shared_gated = true;
    cfg.linear = Some(LinearAttnConfig {
        num_key_heads: f.usize("linear_num_key_heads")?,
        num_value_heads: f.usize("linear_num_value_heads")?,
        key_head_dim: f.usize("linear_key_head_dim")?,
        value_head_dim: f.usize("linear_value_head_dim")?,
        conv_kernel: f.usize_or("linear_conv_kernel_dim", 4)?,
    });
    let attn = hybrid_attn_kinds(f, cfg.num_hidden_layers)?;
    let ffn = qwen_moe_layers(f, cfg.num_hidden_layers)?;
    cfg.layers = attn
        .into_iter()
        .zip(ffn)
        .map(|(attn, ffn)| LayerSpec { attn, ffn })
        .collect();
    Ok(())
}
