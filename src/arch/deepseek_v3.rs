//! `deepseek_v3` (DeepSeek-V3/R1, Kimi K2 as `kimi_k2`, Cogito-V2):
//! multi-head latent attention, dense first layers, sigmoid routing with a
//! selection bias over groups (`noaux_tc`), unscaled shared experts. The
//! checkpoints carry an MTP layer past `num_hidden_layers`, which is left
//! out. SPEC.md §5.

use super::Family;
use crate::config::fields::{Fields, MAX_DIM};
use crate::config::{Arch, AttnKind, FfnKind, LayerSpec, MlaConfig, ModelConfig, Routing};
use crate::error::{Error, Result};
use crate::format::convert::names::layer_index;

pub const FAMILY: Family = Family {
    arch: Arch::DeepseekV3,
    model_types: &["deepseek_v3", "kimi_k2"],
    formats: "bf16, fp8 (128×128 blocks), MLX 2/4/8-bit",
    configure,
    renames: &[],
    skip: skip_mtp,
};

fn configure(f: &Fields, cfg: &mut ModelConfig) -> Result<()> {
    super::refuse_attention_bias(f)?;
    let topk_method = f.get("topk_method").and_then(|v| v.as_str()).unwrap_or("noaux_tc");
    if topk_method != "noaux_tc" {
        return Err(Error::config(
            "topk_method",
            format!("`{topk_method}` is not supported (only noaux_tc)"),
        ));
    }
    let scoring = f.get("scoring_func").and_then(|v| v.as_str()).unwrap_or("sigmoid");
    if scoring != "sigmoid" {
        return Err(Error::config(
            "scoring_func",
            format!("`{scoring}` is not supported (only sigmoid)"),
        ));
    }
    cfg.routing = Routing::NoauxTc {
        n_group: f.usize_or("n_group", 1)?,
        topk_group: f.usize_or("topk_group", 1)?,
        routed_scaling_factor: f.f64_opt("routed_scaling_factor")?.unwrap_or(1.0) as f32,
        norm_topk_prob: f.bool_or("norm_topk_prob", true)?,
    };
    cfg.moe.router_bias = true;
    shared_experts(f, cfg)?;
    cfg.mla = Some(mla(f)?);
    cfg.layers = first_dense_then_moe(f, cfg.num_hidden_layers, AttnKind::Mla)?;
    Ok(())
}

/// DeepSeek's shared experts: `n_shared_experts` of `moe_intermediate_size`
/// as one MLP `mlp.shared_experts`, added without a gate.
pub(super) fn shared_experts(f: &Fields, cfg: &mut ModelConfig) -> Result<()> {
    let n_shared = f.usize_or("n_shared_experts", 0)?;
    cfg.shared_expert_intermediate_size = n_shared
        .checked_mul(cfg.moe_intermediate_size)
        .filter(|&n| n <= MAX_DIM)
        .ok_or_else(|| Error::config("n_shared_experts", format!("{n_shared} is too large")))?;
    cfg.moe.shared_name = "shared_experts";
    Ok(())
}

/// The MLA shape.
pub(super) fn mla(f: &Fields) -> Result<MlaConfig> {
    Ok(MlaConfig {
        q_lora_rank: f.usize_opt("q_lora_rank")?,
        kv_lora_rank: f.usize("kv_lora_rank")?,
        qk_nope_head_dim: f.usize("qk_nope_head_dim")?,
        qk_rope_head_dim: f.usize("qk_rope_head_dim")?,
        v_head_dim: f.usize("v_head_dim")?,
        rope_interleave: f.bool_or("rope_interleave", true)?,
    })
}

/// As transformers: layer `i` is MoE iff `i >= first_k_dense_replace`
/// (`moe_layer_freq` is 1 in every released checkpoint).
pub(super) fn first_dense_then_moe(f: &Fields, n: usize, attn: AttnKind) -> Result<Vec<LayerSpec>> {
    let first_dense = f.usize_or("first_k_dense_replace", 0)?;
    Ok((0..n)
        .map(|i| LayerSpec {
            attn,
            ffn: if i >= first_dense { FfnKind::Moe } else { FfnKind::Dense },
        })
        .collect())
}

/// The MTP layers are stored as `model.layers.{i ≥ num_hidden_layers}`.
pub(super) fn skip_mtp(name: &str, cfg: &ModelConfig) -> Option<&'static str> {
    layer_index(name)
        .filter(|&i| i >= cfg.num_hidden_layers)
        .map(|_| "multi-token prediction layer")
}
