//! `glm4_moe` (GLM-4.5, GLM-4.5-Air, GLM-4.6, GLM-4.7): GQA with q/k/v
//! biases, optional per-head q/k norms and partial RoPE; the first
//! `first_k_dense_replace` layers dense, then sigmoid routing with a
//! selection bias (`noaux_tc`, as DeepSeek-V3), `routed_scaling_factor`,
//! and unscaled shared experts. The checkpoints carry an MTP layer past
//! `num_hidden_layers`, which is left out. SPEC.md §5.

use super::deepseek_v3::{first_dense_then_moe, shared_experts, skip_mtp};
use super::Family;
use crate::config::fields::{rope_settings, Fields};
use crate::config::{Arch, AttnKind, ModelConfig, QkNorm, Routing};
use crate::error::{Error, Result};

pub const FAMILY: Family = Family {
    arch: Arch::Glm4Moe,
    model_types: &["glm4_moe"],
    formats: "bf16",
    configure,
    renames: &[],
    skip: skip_mtp,
};

fn configure(f: &Fields, cfg: &mut ModelConfig) -> Result<()> {
    super::mixtral::refuse_sliding_window(f, cfg)?;
    // transformers' default for these configs.
    cfg.partial_rotary_factor = rope_settings(f)?.partial_rotary_factor.unwrap_or(0.5);
    cfg.attn.qkv_bias = f.bool_or("attention_bias", false)?;
    if f.bool_or("use_qk_norm", false)? {
        cfg.attn.qk_norm = QkNorm::PerHead;
    }
    // GLM masks the experts of dropped groups to −∞ where DeepSeek-V3
    // masks them to 0; every released GLM checkpoint has one group.
    let n_group = f.usize_or("n_group", 1)?;
    if n_group != 1 {
        return Err(Error::config(
            "n_group",
            format!("{n_group} expert groups are not supported for glm4_moe (released checkpoints use 1)"),
        ));
    }
    cfg.routing = Routing::NoauxTc {
        n_group: 1,
        topk_group: 1,
        routed_scaling_factor: f.f64_opt("routed_scaling_factor")?.unwrap_or(1.0) as f32,
        norm_topk_prob: f.bool_or("norm_topk_prob", true)?,
    };
    cfg.moe.router_bias = true;
    shared_experts(f, cfg)?;
    cfg.layers = first_dense_then_moe(f, cfg.num_hidden_layers, AttnKind::Full)?;
    Ok(())
}
