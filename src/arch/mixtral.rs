//! `mixtral` (Mixtral-8x7B, 8x22B): GQA without q/k norms, full RoPE,
//! softmax top-k routing always renormalized, no shared expert; the
//! experts are as wide as `intermediate_size`. Checkpoints name the MoE
//! `block_sparse_moe` and the experts' projections `w1` (gate), `w3` (up)
//! and `w2` (down). SPEC.md §5.

use super::{skip_nothing, Family};
use crate::config::fields::Fields;
use crate::config::{Arch, FfnKind, ModelConfig, Routing};
use crate::error::{Error, Result};

pub const FAMILY: Family = Family {
    arch: Arch::Mixtral,
    model_types: &["mixtral"],
    formats: "bf16",
    configure,
    renames: &[
        (".block_sparse_moe.", ".mlp."),
        (".w1.", ".gate_proj."),
        (".w3.", ".up_proj."),
        (".w2.", ".down_proj."),
    ],
    skip: skip_nothing,
};

fn configure(f: &Fields, cfg: &mut ModelConfig) -> Result<()> {
    super::refuse_attention_bias(f)?;
    refuse_sliding_window(f, cfg)?;
    cfg.moe_intermediate_size = f.usize("intermediate_size")?;
    cfg.routing = Routing::Softmax { norm_topk_prob: true };
    cfg.layers = super::gqa_layers(vec![FfnKind::Moe; cfg.num_hidden_layers]);
    Ok(())
}

/// A window shorter than the context would change attention, which
/// moeflux does not do for these families; one at least as long as the
/// context changes nothing.
pub(super) fn refuse_sliding_window(f: &Fields, cfg: &ModelConfig) -> Result<()> {
    match f.usize_opt("sliding_window")? {
        Some(w) if w < cfg.max_position_embeddings => Err(Error::config(
            "sliding_window",
            format!(
                "{w} is shorter than max_position_embeddings {}: sliding-window attention is not supported for {}",
                cfg.max_position_embeddings, cfg.model_type
            ),
        )),
        _ => Ok(()),
    }
}
