//! `ModelConfig`: the model's shape, read at run time from its own
//! `config.json` (as transformers 4.x / 5.x and MLX write it), validated
//! once. Errors name the field at fault.

use crate::error::{Error, Result};
use fields::{at_most, rope_settings, text_fields, Fields, MAX_COUNT, MAX_DIM, MAX_VOCAB};
use serde_json::Value;
use std::path::Path;

pub(crate) mod fields;

/// Architecture families, by `model_type` (each has its file in `arch/`).
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
    /// `deepseek_v2`: MLA + softmax routing over groups.
    DeepseekV2,
    /// `glm4_moe`: GQA with biases and partial RoPE + sigmoid routing.
    Glm4Moe,
    /// `minimax_m2`: GQA with per-layer q/k norms + sigmoid routing.
    MinimaxM2,
    /// `mixtral`: GQA + softmax top-k MoE.
    Mixtral,
    /// `qwen2_moe`: GQA with q/k/v biases + gated shared expert.
    Qwen2Moe,
}

impl Arch {
    /// The architecture of a `model_type`, or an error listing the supported ones.
    pub fn from_model_type(t: &str) -> Result<Arch> {
        Ok(crate::arch::family(t)?.arch)
    }

    /// The family file that describes it.
    pub fn family(self) -> &'static crate::arch::Family {
        crate::arch::FAMILIES
            .iter()
            .copied()
            .find(|f| f.arch == self)
            .unwrap_or(crate::arch::FAMILIES[0])
    }
}

/// How a GQA layer's q and k are normalized before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// One RMSNorm `[head_dim]` applied to each head.
    PerHead,
    /// One RMSNorm over all heads of the layer (`[H·head_dim]`).
    PerLayer,
}

/// The options of the GQA block that families differ in.
#[derive(Debug, Clone, PartialEq)]
pub struct AttnOptions {
    /// `q_proj` also yields a per-head output gate, `[q | gate]`, applied
    /// as `o ⊙ sigmoid(gate)` (Qwen3.5, Qwen3-Next).
    pub output_gate: bool,
    pub qk_norm: QkNorm,
    /// q, k and v projections have biases.
    pub qkv_bias: bool,
    /// `o_proj` has a bias.
    pub o_bias: bool,
}

/// The options of the MoE block that families differ in.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeOptions {
    /// The shared expert's module under `mlp.` (`shared_expert`, or
    /// DeepSeek's `shared_experts`).
    pub shared_name: &'static str,
    /// The shared expert is scaled by `sigmoid(shared_expert_gate·x)`.
    pub shared_gated: bool,
    /// The router has a selection bias (`e_score_correction_bias`) and is
    /// kept in its float dtype.
    pub router_bias: bool,
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

/// YaRN rope scaling: DeepSeek-V2/V3 (MLA), and GQA models whose config
/// asks for it (Qwen3 for long contexts).
#[derive(Debug, Clone, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_position_embeddings: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub mscale: Option<f64>,
    pub mscale_all_dim: Option<f64>,
    pub attention_factor: Option<f64>,
    /// Round the correction range's ends to whole dimensions
    /// (transformers' default; gpt-oss turns it off).
    pub truncate: bool,
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
    /// DeepSeek-V2 `greedy` / `group_limited_greedy`: softmax over all
    /// experts; groups scored by their largest probability, the best
    /// `topk_group` kept (the others' experts count as 0); top-k; weights
    /// the probabilities times `routed_scaling_factor`, not renormalized.
    SoftmaxGroups {
        n_group: usize,
        topk_group: usize,
        routed_scaling_factor: f32,
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
    pub routing: Routing,
    pub attn: AttnOptions,
    pub moe: MoeOptions,
    /// The checkpoint stores the block norms as `w` of `x̂·(1 + w)`
    /// (Qwen3.5, Qwen3-Next): converted to the applied `1 + w`.
    pub zero_centred_norms: bool,
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
        let family = crate::arch::family(&model_type)?;
        let merged = text_fields(root);
        let f = Fields(&merged);

        let hidden_size = f.usize("hidden_size")?;
        let num_hidden_layers = f.usize("num_hidden_layers")?;
        // Checked before the per-layer tables are built from it.
        at_most("num_hidden_layers", num_hidden_layers, MAX_COUNT)?;
        let num_attention_heads = f.usize("num_attention_heads")?;
        let num_key_value_heads = f.usize_or("num_key_value_heads", num_attention_heads)?;
        let rope = rope_settings(&f)?;
        let num_experts = match f.usize_opt("num_experts")? {
            Some(n) => n,
            None => match f.usize_opt("num_local_experts")? {
                Some(n) => n,
                None => f.usize("n_routed_experts")?,
            },
        };

        // The common fields, with the defaults most families share; the
        // family's `configure` reads the rest and may change any of them.
        let mut cfg = ModelConfig {
            arch: family.arch,
            model_type,
            vocab_size: f.usize("vocab_size")?,
            hidden_size,
            num_hidden_layers,
            rms_norm_eps: f.f64_opt("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            max_position_embeddings: f.usize_or("max_position_embeddings", 4096)?,
            tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
            num_attention_heads,
            num_key_value_heads,
            head_dim: f.usize_or("head_dim", hidden_size / num_attention_heads.max(1))?,
            rope_theta: rope.theta,
            partial_rotary_factor: rope.partial_rotary_factor.unwrap_or(1.0),
            yarn: rope.yarn,
            intermediate_size: f.usize_or("intermediate_size", 0)?,
            moe_intermediate_size: f.usize_or("moe_intermediate_size", 0)?,
            num_experts,
            num_experts_per_tok: f.usize("num_experts_per_tok")?,
            shared_expert_intermediate_size: 0,
            routing: Routing::Softmax { norm_topk_prob: false },
            attn: AttnOptions {
                output_gate: false,
                qk_norm: QkNorm::None,
                qkv_bias: false,
                o_bias: false,
            },
            moe: MoeOptions {
                shared_name: "shared_expert",
                shared_gated: false,
                router_bias: false,
            },
            zero_centred_norms: false,
            linear: None,
            mla: None,
            layers: vec![],
        };
        (family.configure)(&f, &mut cfg)?;
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
        if self.mla.is_none() {
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
        }
        | Routing::SoftmaxGroups {
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
            if matches!(self.routing, Routing::NoauxTc { .. }) && self.num_experts / n_group < 2 {
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
        }
        | Routing::SoftmaxGroups {
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
