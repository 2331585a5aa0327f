//! Tensor names: checkpoints spell the text model in several ways
//! (`model.language_model.X`, `language_model.model.X`, `model.X`) and
//! carry parts moeflux does not run (vision towers, MTP heads, rotary
//! tables). Everything is normalized to the plain text-model form of
//! SPEC.md §2 before the converter looks anything up.

use crate::config::ModelConfig;

/// What to do with one source tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Name {
    /// Convert it; this is its normalized name.
    Keep(String),
    /// Leave it out; the reason, for the note printed at the end.
    Skip(&'static str),
}

/// Source prefixes of vision towers and projectors.
const VISION_PREFIXES: [&str; 9] = [
    "model.visual.",
    "visual.",
    "vision_tower.",
    "model.vision_tower.",
    "vision_model.",
    "model.vision_model.",
    "multi_modal_projector.",
    "model.multi_modal_projector.",
    "model.mm_projector.",
];

/// Prefix rewrites to the plain text-model form, first match wins.
const PREFIX_MAP: [(&str, &str); 4] = [
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("language_model.", ""),
];

pub fn normalize(raw: &str, cfg: &ModelConfig) -> Name {
    if raw.ends_with("rotary_emb.inv_freq") {
        return Name::Skip("rotary tables (recomputed at run time)");
    }
    if VISION_PREFIXES.iter().any(|p| raw.starts_with(p)) {
        return Name::Skip("vision tower");
    }
    let mut name = raw.to_string();
    for (from, to) in PREFIX_MAP {
        if let Some(rest) = raw.strip_prefix(from) {
            name = format!("{to}{rest}");
            break;
        }
    }
    if name.starts_with("mtp.") || name.starts_with("model.mtp.") {
        return Name::Skip("multi-token prediction head");
    }
    let family = cfg.arch.family();
    if let Some(why) = (family.skip)(&name, cfg) {
        return Name::Skip(why);
    }
    for (from, to) in family.renames {
        if name.contains(from) {
            name = name.replacen(from, to, 1);
        }
    }
    Name::Keep(name)
}

/// `i` of a normalized `model.layers.{i}.…` name.
pub fn layer_index(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("model.layers.")?;
    rest.split('.').next()?.parse().ok()
}

/// Whether a normalized name belongs to the routed experts.
pub fn is_expert(name: &str) -> bool {
    name.contains(".mlp.experts.") || name.contains(".mlp.switch_mlp.")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(model_type: &str) -> ModelConfig {
        let mut v = serde_json::json!({
            "model_type": model_type, "vocab_size": 16, "hidden_size": 8, "num_hidden_layers": 2,
            "num_attention_heads": 2, "moe_intermediate_size": 4, "num_experts": 4,
            "num_experts_per_tok": 2, "intermediate_size": 8,
        });
        if model_type == "deepseek_v3" {
            v["kv_lora_rank"] = 4.into();
            v["qk_nope_head_dim"] = 2.into();
            v["qk_rope_head_dim"] = 2.into();
            v["v_head_dim"] = 2.into();
        }
        ModelConfig::from_json(&v).unwrap()
    }

    #[test]
    fn prefixes_are_normalized() {
        let c = cfg("qwen3_moe");
        let keep = |s: &str| Name::Keep(s.to_string());
        assert_eq!(
            normalize("model.language_model.layers.0.mlp.gate.weight", &c),
            keep("model.layers.0.mlp.gate.weight")
        );
        assert_eq!(
            normalize("language_model.model.norm.weight", &c),
            keep("model.norm.weight")
        );
        assert_eq!(normalize("language_model.lm_head.weight", &c), keep("lm_head.weight"));
        assert_eq!(normalize("lm_head.weight", &c), keep("lm_head.weight"));
    }

    #[test]
    fn vision_mtp_and_rotary_are_skipped() {
        let c = cfg("qwen3_moe");
        for n in [
            "model.visual.blocks.0.attn.qkv.weight",
            "vision_tower.patch_embed.proj.weight",
            "mtp.fc.weight",
            "language_model.mtp.norm.weight",
            "model.layers.0.self_attn.rotary_emb.inv_freq",
        ] {
            assert!(matches!(normalize(n, &c), Name::Skip(_)), "{n}");
        }
        // Layers past num_hidden_layers are MTP only for DeepSeek.
        assert!(matches!(normalize("model.layers.2.mlp.gate.weight", &c), Name::Keep(_)));
        let d = cfg("deepseek_v3");
        assert!(matches!(normalize("model.layers.2.mlp.gate.weight", &d), Name::Skip(_)));
        assert!(matches!(normalize("model.layers.1.mlp.gate.weight", &d), Name::Keep(_)));
    }
}
