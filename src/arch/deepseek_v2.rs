//! `deepseek_v2` (DeepSeek-V2, V2-Lite, V2.5, DeepSeek-Coder-V2):
//! DeepSeek-V3's multi-head latent attention, dense first layers and
//! unscaled shared experts, with V2's routing: softmax scores, top-k over
//! all experts (`greedy`) or over the best groups by their largest score
//! (`group_limited_greedy`), weights times `routed_scaling_factor` and not
//! renormalized (transformers ignores `norm_topk_prob` here). SPEC.md §5.

use super::deepseek_v3::{first_dense_then_moe, mla, shared_experts, skip_mtp};
use super::Family;
use crate::config::fields::Fields;
use crate::config::{Arch, AttnKind, ModelConfig, Routing};
use crate::error::{Error, Result};

pub const FAMILY: Family = Family {
    arch: Arch::DeepseekV2,
    model_types: &["deepseek_v2"],
    formats: "bf16",
    configure,
    renames: &[],
    skip: skip_mtp,
};

fn configure(f: &Fields, cfg: &mut ModelConfig) -> Result<()> {
    super::refuse_attention_bias(f)?;
    let scoring = f.get("scoring_func").and_then(|v| v.as_str()).unwrap_or("softmax");
    if scoring != "softmax" {
        return Err(Error::config(
            "scoring_func",
            format!("`{scoring}` is not supported for deepseek_v2 (only softmax)"),
        ));
    }
    let scale = f.f64_opt("routed_scaling_factor")?.unwrap_or(1.0) as f32;
    let method = f.get("topk_method").and_then(|v| v.as_str()).unwrap_or("greedy");
    cfg.routing = match method {
        "greedy" => Routing::SoftmaxGroups {
            n_group: 1,
            topk_group: 1,
            routed_scaling_factor: scale,
        },
        "group_limited_greedy" => Routing::SoftmaxGroups {
            n_group: f.usize("n_group")?,
            topk_group: f.usize("topk_group")?,
            routed_scaling_factor: scale,
        },
        other => {
            return Err(Error::config(
                "topk_method",
                format!("`{other}` is not supported (greedy or group_limited_greedy)"),
            ))
        }
    };
    shared_experts(f, cfg)?;
    cfg.mla = Some(mla(f)?);
    cfg.layers = first_dense_then_moe(f, cfg.num_hidden_layers, AttnKind::Mla)?;
    Ok(())
}
