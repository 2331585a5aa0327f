//! `qwen2_moe` (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): GQA with q/k/v biases
//! and no q/k norms, full RoPE, softmax top-k routing, and a shared
//! expert scaled by `sigmoid(shared_expert_gate·x)`. SPEC.md §5.

use super::{skip_nothing, Family};
use crate::config::fields::{qwen_moe_layers, Fields};
use crate::config::{Arch, ModelConfig, Routing};
use crate::error::Result;

pub const FAMILY: Family = Family {
    arch: Arch::Qwen2Moe,
    model_types: &["qwen2_moe"],
    formats: "bf16",
    configure,
    renames: &[],
    skip: skip_nothing,
};

fn configure(f: &Fields, cfg: &mut ModelConfig) -> Result<()> {
    super::refuse_use_sliding_window(f, "qwen2_moe")?;
    // Qwen2's q, k and v projections always have biases, o_proj never.
    cfg.attn.qkv_bias = f.bool_or("qkv_bias", true)?;
    cfg.routing = Routing::Softmax {
        norm_topk_prob: f.bool_or("norm_topk_prob", false)?,
    };
    cfg.shared_expert_intermediate_size = f.usize_or("shared_expert_intermediate_size", 0)?;
    cfg.moe.shared_gated = true;
    cfg.layers = super::gqa_layers(qwen_moe_layers(f, cfg.num_hidden_layers)?);
    Ok(())
}
