//! `ModelConfig`: the model's shape, read at run time from its own
//! `config.json` (as transformers 4.x / 5.x and MLX write it), validated
//! once. Errors name the field at fault.

use crate::error::{Error, Result};
use fields::{
    at_most, hybrid_attn_kinds, qwen_moe_layers, rope_settings, text_fields, Fields, MAX_COUNT, MAX_DIM, MAX_VOCAB,
};
use serde_json::Value;
use std::path::Path;

mod fields;

/// Architecture families, by `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `qwen3_moe`: GQA + softmax-top-k MoE.
    Qwen3Moe,
    /// `qwen3_5_moe` / `qwen3_5_moe_text`: hybrid GatedDeltaNet + gated attention.
    Qwen35Moe,
    /// `qwen3_next`: same blocks as Qwen3.5, fused projections in the checkpoint.
    Qwen3Next,
    /// `deepseek_v3` / `kimi_k2`: MLA + grouped sigmoid routing.
    DeepseekV3,
}

pub const SUPPORTED_ARCHS: &str = "qwen3_moe, qwen3_5_moe (qwen3_5_moe_text), qwen3_next, deepseek_v3 (kimi_k2)";

impl Arch {
    pub fn from_model_type(t: &str) -> Result<Arch> {
        Ok(match t {
            "qwen3_moe" => Arch::Qwen3Moe,
            "qwen3_5_moe" | "qwen3_5_moe_text" => Arch::Qwen35Moe,
            "qwen3_next" => Arch::Qwen3Next,
            "deepseek_v3" | "kimi_k2" => Arch::DeepseekV3,
            other => {
                return Err(Error::UnsupportedArch {
                    model_type: other.to_string(),
                    supported: SUPPORTED_ARCHS,
                })
            }
        })
    }
    /// Qwen3.5 / Qwen3-Next: zero-centred norms, GatedDeltaNet layers.
    pub fn is_hybrid(self) -> bool {
        matches!(self, Arch::Qwen35Moe | Arch::Qwen3Next)
    }
}

/// What computes the token mixing of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKind {
    /// Softmax attention over a GQA KV cache (gated output in hybrid models).
    Full,
    /// GatedDeltaNet (linear attention with recurrent state).
    Linear,
    /// DeepSeek multi-head latent attention.
    Mla,
}

/// The feed-forward part of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnKind {
    /// Dense SwiGLU of `intermediate_size`.
    Dense,
    /// Routed experts (plus shared experts where the model has them).
    Moe,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerSpec {
    pub attn: AttnKind,
    pub ffn: FfnKind,
}

/// YaRN rope scaling (DeepSeek-V3).
#[derive(Debug, Clone, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_position_embeddings: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub mscale: Option<f64>,
    pub mscale_all_dim: Option<f64>,
    pub attention_factor: Option<f64>,
}

/// GatedDeltaNet shape.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearAttnConfig {
    pub num_key_heads: usize,
    pub num_value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
    pub conv_kernel: usize,
}

impl LinearAttnConfig {
    /// Channels that go through the causal conv: q, k and v.
    pub fn conv_dim(&self) -> usize {
        2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim
    }
}

/// Multi-head latent attention shape.
#[derive(Debug, Clone, PartialEq)]
pub struct MlaConfig {
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// Rope pairs `(2i, 2i+1)` when true, `(i, i + d/2)` otherwise.
    pub rope_interleave: bool,
}

/// How the router turns logits into K experts and weights.
#[derive(Debug, Clone, PartialEq)]
pub enum Routing {
    /// softmax over all experts → top-k → renormalize if `norm_topk_prob`.
    Softmax { norm_topk_prob: bool },
    /// DeepSeek `noaux_tc`: sigmoid, biased grouped selection, unbiased weights.
    NoauxTc {
        n_group: usize,
        topk_group: usize,
        routed_scaling_factor: f32,
        norm_topk_prob: bool,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Per-head dimension of GQA attention (unused by MLA).
    pub head_dim: usize,
    pub rope_theta: f64,
    /// Fraction of `head_dim` that RoPE rotates (1.0 = all).
    pub partial_rotary_factor: f64,
    pub yarn: Option<Yarn>,
    /// Dense MLP width (dense layers).
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    /// Width of the shared expert MLP (0 when the model has none).
    pub shared_expert_intermediate_size: usize,
    /// Qwen: shared expert output scaled by `sigmoid(shared_expert_gate·x)`.
    pub shared_expert_gated: bool,
    pub routing: Routing,
    pub linear: Option<LinearAttnConfig>,
    pub mla: Option<MlaConfig>,
    pub layers: Vec<LayerSpec>,
}

impl ModelConfig {
    /// Read `DIR/config.json`.
    pub fn from_dir(dir: &Path) -> Result<ModelConfig> {
        let path = dir.join("config.json");
        let v: Value = crate::error::read_json(&path)?;
        ModelConfig::from_json(&v)
    }

    pub fn from_json(v: &Value) -> Result<ModelConfig> {
        let root = v
            .as_object()
            .ok_or_else(|| Error::config("(root)", "config.json is not a JSON object"))?;
        let model_type = root
            .get("model_type")
            .and_then(|t| t.as_str())
            .ok_or_else(|| Error::config("model_type", "missing"))?
            .to_string();
        let arch = Arch::from_model_type(&model_type)?;
        let merged = text_fields(root);
        let f = Fields(&merged);

        let hidden_size = f.usize("hidden_size")?;
        let num_hidden_layers = f.usize("num_hidden_layers")?;
        // Checked before the per-layer tables are built from it.
        at_most("num_hidden_layers", num_hidden_layers, MAX_COUNT)?;
        let num_attention_heads = f.usize("num_attention_heads")?;
        let num_key_value_heads = f.usize_or("num_key_value_heads", num_attention_heads)?;
        let rope = rope_settings(&f)?;

        if f.bool_or("attention_bias", false)? {
            return Err(Error::config("attention_bias", "attention biases are not supported"));
        }
        if arch == Arch::Qwen3Moe && f.bool_or("use_sliding_window", false)? {
            return Err(Error::config(
                "use_sliding_window",
                "sliding-window attention is not supported",
            ));
        }

        let num_experts = match f.usize_opt("num_experts")? {
            Some(n) => n,
            None => match f.usize_opt("num_local_experts")? {
                Some(n) => n,
                None => f.usize("n_routed_experts")?,
            },
        };

        let mut cfg = ModelConfig {
            arch,
            model_type,
            vocab_size: f.usize("vocab_size")?,
            hidden_size,
            num_hidden_layers,
            rms_norm_eps: f.f64_opt("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            max_position_embeddings: f.usize_or("max_position_embeddings", 4096)?,
            tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
            num_attention_heads,
            num_key_value_heads,
            // transformers' Qwen3.5 / Qwen3-Next configs default head_dim to 256
            // and partial_rotary_factor to 0.25; the others derive / rotate all.
            head_dim: f.usize_or(
                "head_dim",
                if arch.is_hybrid() {
                    256
                } else {
                    hidden_size / num_attention_heads.max(1)
                },
            )?,
            rope_theta: rope.theta,
            partial_rotary_factor: rope
                .partial_rotary_factor
                .unwrap_or(if arch.is_hybrid() { 0.25 } else { 1.0 }),
            yarn: rope.yarn,
            intermediate_size: f.usize_or("intermediate_size", 0)?,
            moe_intermediate_size: f.usize("moe_intermediate_size")?,
            num_experts,
            num_experts_per_tok: f.usize("num_experts_per_tok")?,
            shared_expert_intermediate_size: 0,
            shared_expert_gated: false,
            routing: Routing::Softmax { norm_topk_prob: false },
            linear: None,
            mla: None,
            layers: vec![],
        };

        match arch {
            Arch::Qwen3Moe => {
                cfg.routing = Routing::Softmax {
                    norm_topk_prob: f.bool_or("norm_topk_prob", false)?,
                };
                let moe = qwen_moe_layers(&f, num_hidden_layers)?;
                cfg.layers = moe
                    .into_iter()
                    .map(|m| LayerSpec {
                        attn: AttnKind::Full,
                        ffn: m,
                    })
                    .collect();
            }
            Arch::Qwen35Moe | Arch::Qwen3Next => {
                cfg.routing = Routing::Softmax {
                    norm_topk_prob: arch == Arch::Qwen35Moe || f.bool_or("norm_topk_prob", true)?,
                };
                cfg.shared_expert_intermediate_size = f.usize_or("shared_expert_intermediate_size", 0)?;
                cfg.shared_expert_gated = true;
                cfg.linear = Some(LinearAttnConfig {
                    num_key_heads: f.usize("linear_num_key_heads")?,
                    num_value_heads: f.usize("linear_num_value_heads")?,
                    key_head_dim: f.usize("linear_key_head_dim")?,
                    value_head_dim: f.usize("linear_value_head_dim")?,
                    conv_kernel: f.usize_or("linear_conv_kernel_dim", 4)?,
                });
                let attn = hybrid_attn_kinds(&f, num_hidden_layers)?;
                let moe = qwen_moe_layers(&f, num_hidden_layers)?;
                cfg.layers = attn
                    .into_iter()
                    .zip(moe)
                    .map(|(a, m)| LayerSpec { attn: a, ffn: m })
                    .collect();
            }
            Arch::DeepseekV3 => {
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
                let n_shared = f.usize_or("n_shared_experts", 0)?;
                cfg.shared_expert_intermediate_size = n_shared
                    .checked_mul(cfg.moe_intermediate_size)
                    .filter(|&n| n <= MAX_DIM)
                    .ok_or_else(|| Error::config("n_shared_experts", format!("{n_shared} is too large")))?;
                cfg.mla = Some(MlaConfig {
                    q_lora_rank: f.usize_opt("q_lora_rank")?,
                    kv_lora_rank: f.usize("kv_lora_rank")?,
                    qk_nope_head_dim: f.usize("qk_nope_head_dim")?,
                    qk_rope_head_dim: f.usize("qk_rope_head_dim")?,
                    v_head_dim: f.usize("v_head_dim")?,
                    rope_interleave: f.bool_or("rope_interleave", true)?,
                });
                // As transformers: MoE iff i >= first_k_dense_replace
                // (`moe_layer_freq` is 1 in every released checkpoint).
                let first_dense = f.usize_or("first_k_dense_replace", 0)?;
                cfg.layers = (0..num_hidden_layers)
                    .map(|i| LayerSpec {
                        attn: AttnKind::Mla,
                        ffn: if i >= first_dense { FfnKind::Moe } else { FfnKind::Dense },
                    })
                    .collect();
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        let pos = |field: &str, v: usize| -> Result<()> {
            if v == 0 {
                Err(Error::config(field, "must be greater than 0"))
            } else {
                Ok(())
            }
        };
        self.validate_ranges()?;
        pos("vocab_size", self.vocab_size)?;
        pos("hidden_size", self.hidden_size)?;
        pos("num_hidden_layers", self.num_hidden_layers)?;
        pos("num_attention_heads", self.num_attention_heads)?;
        pos("num_key_value_heads", self.num_key_value_heads)?;
        pos("num_experts", self.num_experts)?;
        pos("num_experts_per_tok", self.num_experts_per_tok)?;
        pos("moe_intermediate_size", self.moe_intermediate_size)?;
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return Err(Error::config(
                "num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads {}",
                    self.num_key_value_heads, self.num_attention_heads
                ),
            ));
        }
        if self.num_experts_per_tok > self.num_experts {
            return Err(Error::config(
                "num_experts_per_tok",
                format!(
                    "{} exceeds the number of experts {}",
                    self.num_experts_per_tok, self.num_experts
                ),
            ));
        }
        if self.layers.iter().any(|l| l.ffn == FfnKind::Dense) && self.intermediate_size == 0 {
            return Err(Error::config(
                "intermediate_size",
                "missing, but the model has dense MLP layers",
            ));
        }
        if self.rope_theta.is_nan() || self.rope_theta <= 0.0 {
            return Err(Error::config("rope_theta", "must be positive"));
        }
        if self.arch != Arch::DeepseekV3 {
            let rd = self.rotary_dim();
            if rd == 0 || !rd.is_multiple_of(2) || rd > self.head_dim {
                return Err(Error::config(
                    "partial_rotary_factor",
                    format!(
                        "gives rotary dim {rd} for head_dim {}; it must be even and in (0, head_dim]",
                        self.head_dim
                    ),
                ));
            }
        }
        if let Some(l) = &self.linear {
            pos("linear_num_key_heads", l.num_key_heads)?;
            pos("linear_conv_kernel_dim", l.conv_kernel)?;
            if l.num_value_heads % l.num_key_heads != 0 {
                return Err(Error::config(
                    "linear_num_value_heads",
                    format!(
                        "{} is not a multiple of linear_num_key_heads {}",
                        l.num_value_heads, l.num_key_heads
                    ),
                ));
            }
        }
        if let Some(m) = &self.mla {
            if m.qk_rope_head_dim % 2 != 0 {
                return Err(Error::config("qk_rope_head_dim", "must be even"));
            }
        }
        if let Routing::NoauxTc {
            n_group, topk_group, ..
        } = self.routing
        {
            if n_group == 0 || !self.num_experts.is_multiple_of(n_group) {
                return Err(Error::config(
                    "n_group",
                    format!("{n_group} does not divide the number of experts {}", self.num_experts),
                ));
            }
            if topk_group == 0 || topk_group > n_group {
                return Err(Error::config(
                    "topk_group",
                    format!("{topk_group} must be in 1..={n_group}"),
                ));
            }
            if self.num_experts / n_group < 2 {
                return Err(Error::config("n_group", "each group needs at least 2 experts"));
            }
        }
        Ok(())
    }

    /// Bounds on every count, size and number, so that nothing derived
    /// from them overflows and nothing is allocated from an absurd value
    /// before the weights are checked against it.
    fn validate_ranges(&self) -> Result<()> {
        for (field, v) in [
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("num_experts", self.num_experts),
            ("num_experts_per_tok", self.num_experts_per_tok),
        ] {
            at_most(field, v, MAX_COUNT)?;
        }
        for (field, v) in [
            ("hidden_size", self.hidden_size),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.intermediate_size),
            ("moe_intermediate_size", self.moe_intermediate_size),
            ("shared_expert_intermediate_size", self.shared_expert_intermediate_size),
        ] {
            at_most(field, v, MAX_DIM)?;
        }
        at_most("vocab_size", self.vocab_size, MAX_VOCAB)?;
        // MFLX snapshots store lengths as i32.
        at_most(
            "max_position_embeddings",
            self.max_position_embeddings,
            i32::MAX as usize,
        )?;
        if self.max_position_embeddings == 0 {
            return Err(Error::config("max_position_embeddings", "must be greater than 0"));
        }
        let eps = self.rms_norm_eps;
        if !(eps.is_finite() && eps > 0.0) {
            return Err(Error::config(
                "rms_norm_eps",
                format!("{eps} is not a small positive number"),
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(Error::config("rope_theta", "must be positive"));
        }
        let prf = self.partial_rotary_factor;
        if !(prf > 0.0 && prf <= 1.0) {
            return Err(Error::config(
                "partial_rotary_factor",
                format!("{prf} is not in (0, 1]"),
            ));
        }
        if let Some(y) = &self.yarn {
            for (field, v) in [
                ("rope_scaling.factor", y.factor),
                (
                    "rope_scaling.original_max_position_embeddings",
                    y.original_max_position_embeddings,
                ),
            ] {
                if !(v.is_finite() && v > 0.0) {
                    return Err(Error::config(field, format!("{v} must be positive")));
                }
            }
            let optional = [
                ("rope_scaling.mscale", y.mscale),
                ("rope_scaling.mscale_all_dim", y.mscale_all_dim),
                ("rope_scaling.attention_factor", y.attention_factor),
            ];
            for (field, v) in [
                ("rope_scaling.beta_fast", Some(y.beta_fast)),
                ("rope_scaling.beta_slow", Some(y.beta_slow)),
            ]
            .into_iter()
            .chain(optional)
            {
                if v.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
                    return Err(Error::config(field, format!("{v:?} must be positive")));
                }
            }
        }
        if let Routing::NoauxTc {
            routed_scaling_factor, ..
        } = self.routing
        {
            if !routed_scaling_factor.is_finite() {
                return Err(Error::config("routed_scaling_factor", "must be a finite number"));
            }
        }
        if let Some(l) = &self.linear {
            for (field, v) in [
                ("linear_num_key_heads", l.num_key_heads),
                ("linear_num_value_heads", l.num_value_heads),
            ] {
                at_most(field, v, MAX_COUNT)?;
            }
            for (field, v) in [
                ("linear_key_head_dim", l.key_head_dim),
                ("linear_value_head_dim", l.value_head_dim),
            ] {
                at_most(field, v, MAX_DIM)?;
            }
            at_most("linear_conv_kernel_dim", l.conv_kernel, 1 << 10)?;
            // The snapshot header holds both state sizes as u32 bytes.
            let conv = (2 * l.num_key_heads * l.key_head_dim + l.num_value_heads * l.value_head_dim)
                .checked_mul(l.conv_kernel.saturating_sub(1) * 4);
            let ssm = (l.num_value_heads * l.value_head_dim)
                .checked_mul(l.key_head_dim)
                .and_then(|n| n.checked_mul(4));
            for (field, v) in [("linear_conv_kernel_dim", conv), ("linear_key_head_dim", ssm)] {
                if v.is_none_or(|v| v > u32::MAX as usize) {
                    return Err(Error::config(
                        field,
                        "the linear-attention state would exceed 4 GiB per layer",
                    ));
                }
            }
        }
        if let Some(m) = &self.mla {
            for (field, v) in [
                ("q_lora_rank", m.q_lora_rank.unwrap_or(0)),
                ("kv_lora_rank", m.kv_lora_rank),
                ("qk_nope_head_dim", m.qk_nope_head_dim),
                ("qk_rope_head_dim", m.qk_rope_head_dim),
                ("v_head_dim", m.v_head_dim),
            ] {
                at_most(field, v, MAX_DIM)?;
            }
        }
        Ok(())
    }

    /// Channels of a GQA head that RoPE rotates.
    pub fn rotary_dim(&self) -> usize {
        ((self.head_dim as f64) * self.partial_rotary_factor) as usize
    }

    pub fn num_moe_layers(&self) -> usize {
        self.layers.iter().filter(|l| l.ffn == FfnKind::Moe).count()
    }
}
