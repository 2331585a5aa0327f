//! `qwen3_moe` (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder): GQA with
//! per-head q/k norms and full RoPE, softmax top-k routing, no shared
//! expert. SPEC.md §5.

use super::{skip_nothing, Family};
use crate::config::fields::{qwen_moe_layers, Fields};
use crate::config::{Arch, ModelConfig, QkNorm, Routing};
use crate::error::Result;

pub const FAMILY: Family = Family {
    arch: Arch::Qwen3Moe,
    model_types: &["qwen3_moe"],
    formats: "bf16, MLX 2/4/8-bit",
    configure,
    renames: &[],
    skip: skip_nothing,
};

fn configure(f: &Fields, cfg: &mut ModelConfig) -> Result<()> {
    super::refuse_use_sliding_window(f, "qwen3_moe")?;
    super::refuse_attention_bias(f)?;
    cfg.attn.qk_norm = QkNorm::PerHead;
    cfg.routing = Routing::Softmax {
        norm_topk_prob: f.bool_or("norm_topk_prob", false)?,
    };
    cfg.layers = super::gqa_layers(qwen_moe_layers(f, cfg.num_hidden_layers)?);
    Ok(())
}
