//! One file per architecture family. Each family file holds what is its
//! own: the `model_type`s it answers to, its config fields and their
//! checks (which fill the family-neutral [`ModelConfig`]: the routing, the
//! layer recipe and the block options), and how its checkpoints name
//! tensors where they differ from the packed names. The blocks it uses
//! live in `model/`; the one table of a model's dense tensors
//! ([`table`]) is built from the config by the blocks' declarations in
//! `arch/table.rs`, and `convert`, `synth` and the checks at open all read
//! it. DESIGN.md, "Adding an architecture", says what a new family writes.

mod deepseek_v2;
mod deepseek_v3;
mod glm4_moe;
mod minimax_m2;
mod mixtral;
mod qwen2_moe;
mod qwen3_5_moe;
mod qwen3_moe;
mod table;

pub use table::{table, Entry, Mat, Tensor, TensorKind, Vector};

use crate::config::fields::Fields;
use crate::config::{Arch, AttnKind, FfnKind, LayerSpec, ModelConfig};
use crate::error::{Error, Result};

/// An architecture family: what `config.json`'s `model_type` selects.
pub struct Family {
    pub arch: Arch,
    /// The `model_type`s it answers to; the first is its name.
    pub model_types: &'static [&'static str],
    /// The weight formats its official checkpoints ship, for the docs and
    /// `inspect`.
    pub formats: &'static str,
    /// Reads the family's own config fields into `cfg`, whose common
    /// fields are already read: routing, the layer recipe, block options.
    /// A field the family does not implement is an error naming it.
    pub(crate) configure: fn(&Fields, &mut ModelConfig) -> Result<()>,
    /// Checkpoint name rewrites (after the text-model prefix is
    /// normalized): each `(from, to)` replaces the first occurrence.
    pub renames: &'static [(&'static str, &'static str)],
    /// Why a normalized checkpoint tensor is left out (an MTP layer), if
    /// it is.
    pub skip: fn(&str, &ModelConfig) -> Option<&'static str>,
}

impl Family {
    pub fn name(&self) -> &'static str {
        self.model_types[0]
    }
}

/// Leaves nothing out.
pub(crate) fn skip_nothing(_: &str, _: &ModelConfig) -> Option<&'static str> {
    None
}

/// Families whose checkpoints never have attention biases refuse a config
/// that asks for them.
pub(crate) fn refuse_attention_bias(f: &Fields) -> Result<()> {
    if f.bool_or("attention_bias", false)? {
        return Err(Error::config(
            "attention_bias",
            "attention biases are not supported for this model_type",
        ));
    }
    Ok(())
}

/// Qwen-style configs refuse `use_sliding_window`: moeflux attends to the
/// whole context.
pub(crate) fn refuse_use_sliding_window(f: &Fields, model_type: &str) -> Result<()> {
    if f.bool_or("use_sliding_window", false)? {
        return Err(Error::config(
            "use_sliding_window",
            format!("sliding-window attention is not supported for {model_type}"),
        ));
    }
    Ok(())
}

/// Every layer GQA attention, its FFN as `ffn` gives.
pub(crate) fn gqa_layers(ffn: Vec<FfnKind>) -> Vec<LayerSpec> {
    ffn.into_iter()
        .map(|ffn| LayerSpec {
            attn: AttnKind::Full,
            ffn,
        })
        .collect()
}

/// Every family, in the order the docs list them.
pub const FAMILIES: &[&Family] = &[
    &qwen3_moe::FAMILY,
    &qwen3_5_moe::FAMILY,
    &qwen3_5_moe::NEXT,
    &deepseek_v3::FAMILY,
    &deepseek_v2::FAMILY,
    &glm4_moe::FAMILY,
    &minimax_m2::FAMILY,
    &mixtral::FAMILY,
    &qwen2_moe::FAMILY,
];

/// The family of a `model_type`, or an error that lists the supported ones.
pub fn family(model_type: &str) -> Result<&'static Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.model_types.contains(&model_type))
        .ok_or_else(|| Error::UnsupportedArch {
            model_type: model_type.to_string(),
            supported: supported(),
        })
}

/// The supported `model_type`s, aliases in parentheses.
pub fn supported() -> String {
    FAMILIES
        .iter()
        .map(|f| match f.model_types {
            [one] => one.to_string(),
            [first, rest @ ..] => format!("{first} ({})", rest.join(", ")),
            [] => String::new(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_types_are_unique() {
        let mut all: Vec<&str> = FAMILIES.iter().flat_map(|f| f.model_types.iter().copied()).collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "a model_type belongs to two families");
    }

    #[test]
    fn unknown_model_type_lists_the_supported_ones() {
        let Err(Error::UnsupportedArch { model_type, supported }) = family("llama") else {
            panic!("llama is not a MoE family moeflux runs");
        };
        assert_eq!(model_type, "llama");
        for f in FAMILIES {
            assert!(supported.contains(f.name()), "{supported}");
        }
    }
}
