//! `minimax_m2` (MiniMax-M2, M2.1): GQA with one q norm and one k norm
//! over all of a layer's heads (`qk_norm_type` `per_layer`), partial RoPE
//! (`rotary_dim`), sigmoid routing with a selection bias and no groups,
//! weights renormalized, no shared expert; the experts are as wide as
//! `intermediate_size`. Checkpoints name the MoE `block_sparse_moe`, the
//! experts' projections `w1`/`w3`/`w2`, and keep the selection bias beside
//! the router. SPEC.md §5.

use super::{skip_nothing, Family};
use crate::config::fields::Fields;
use crate::config::{Arch, FfnKind, ModelConfig, QkNorm, Routing};
use crate::error::{Error, Result};

pub const FAMILY: Family = Family {
    arch: Arch::MinimaxM2,
    model_types: &["minimax_m2"],
    formats: "bf16, fp8 (128×128 blocks)",
    configure,
    renames: &[
        (".block_sparse_moe.", ".mlp."),
        (".mlp.e_score_correction_bias", ".mlp.gate.e_score_correction_bias"),
        (".w1.", ".gate_proj."),
        (".w3.", ".up_proj."),
        (".w2.", ".down_proj."),
    ],
    skip: skip_nothing,
};

fn configure(f: &Fields, cfg: &mut ModelConfig) -> Result<()> {
    super::refuse_attention_bias(f)?;
    super::mixtral::refuse_sliding_window(f, cfg)?;
    if let Some(rd) = f.usize_opt("rotary_dim")? {
        if f.get("partial_rotary_factor").is_none() {
            cfg.partial_rotary_factor = rd as f64 / cfg.head_dim.max(1) as f64;
        }
    }
    if f.bool_or("use_qk_norm", true)? {
        match f.get("qk_norm_type").and_then(|v| v.as_str()).unwrap_or("per_layer") {
            "per_layer" => cfg.attn.qk_norm = QkNorm::PerLayer,
            other => {
                return Err(Error::config(
                    "qk_norm_type",
                    format!("`{other}` is not supported (only per_layer)"),
                ))
            }
        }
    }
    let scoring = f.get("scoring_func").and_then(|v| v.as_str()).unwrap_or("sigmoid");
    if scoring != "sigmoid" {
        return Err(Error::config(
            "scoring_func",
            format!("`{scoring}` is not supported for minimax_m2 (only sigmoid)"),
        ));
    }
    if f.usize_or("shared_intermediate_size", 0)? > 0 {
        return Err(Error::config(
            "shared_intermediate_size",
            "a shared expert is not supported for minimax_m2 (released checkpoints have none)",
        ));
    }
    cfg.moe_intermediate_size = f.usize("intermediate_size")?;
    cfg.routing = Routing::NoauxTc {
        n_group: 1,
        topk_group: 1,
        routed_scaling_factor: 1.0,
        norm_topk_prob: true,
    };
    cfg.moe.router_bias = true;
    cfg.layers = super::gqa_layers(vec![FfnKind::Moe; cfg.num_hidden_layers]);
    Ok(())
}
