//! GGUF tensor names (llama.cpp's `blk.N.*`) → the names of moeflux's
//! packed model (the Hugging Face module paths, SPEC §2).

/// A routed-expert projection, stacked over the experts in GGUF
/// (`[E, rows, cols]`, ggml dims `[cols, rows, E]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertProj {
    Gate,
    Up,
    Down,
    /// Gate and up fused (`ffn_gate_up_exps`): gate rows first.
    GateUp,
}

/// Where a GGUF tensor goes in the packed model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapped {
    /// One packed tensor, by full name (`model.layers.0.self_attn.q_proj.weight`).
    Tensor(String),
    /// A layer's routed experts: one projection of all of them (`bias`:
    /// the `.bias` tensor, which gpt-oss has).
    Experts { layer: usize, proj: ExpertProj, bias: bool },
    /// Part of a packed tensor that GGUF stores split, e.g. DeepSeek's
    /// `kv_b_proj` as `attn_k_b` (`part` "k_b") and `attn_v_b` ("v_b").
    Part { name: String, part: &'static str },
}

/// Families whose shared expert is `mlp.shared_experts` (DeepSeek, GLM)
/// rather than Qwen's `mlp.shared_expert`.
fn shared_experts_plural(arch: &str) -> bool {
    matches!(arch, "deepseek2" | "glm4moe")
}

/// The packed name of a GGUF tensor of a model of `arch`
/// (`general.architecture`); `None` for names it has no place for (MTP
/// layers beyond `num_hidden_layers` are the caller's to skip).
///
/// Values that GGUF stores transformed keep their packed name here; the
/// converter undoes the transform: Qwen3-Next / Qwen3.5 `ssm_a` holds
/// `−exp(A_log)`, their norms (not `ssm_norm`) hold `1 + w` already (as
/// moeflux stores them), `ssm_conv1d` is `[channels, kernel]`, and V heads
/// of the linear attention are reordered when key and value head counts
/// differ.
pub fn packed_name(arch: &str, gguf: &str) -> Option<Mapped> {
    let t = |s: String| Some(Mapped::Tensor(s));
    match gguf {
        "token_embd.weight" => return t("model.embed_tokens.weight".into()),
        "output_norm.weight" => return t("model.norm.weight".into()),
        "output.weight" => return t("lm_head.weight".into()),
        _ => {}
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    if rest == "ssm_a" {
        // No `.weight`, as llama.cpp names it.
        return t(format!("model.layers.{layer}.linear_attn.A_log"));
    }
    let (base, suffix) = rest.rsplit_once('.')?;
    if !matches!(suffix, "weight" | "bias") {
        return None;
    }
    let bias = suffix == "bias";
    let experts = |proj| Some(Mapped::Experts { layer, proj, bias });
    match base {
        "ffn_gate_exps" => return experts(ExpertProj::Gate),
        "ffn_up_exps" => return experts(ExpertProj::Up),
        "ffn_down_exps" => return experts(ExpertProj::Down),
        "ffn_gate_up_exps" => return experts(ExpertProj::GateUp),
        "attn_k_b" | "attn_v_b" => {
            return Some(Mapped::Part {
                name: format!("model.layers.{layer}.self_attn.kv_b_proj.weight"),
                part: if base == "attn_k_b" { "k_b" } else { "v_b" },
            })
        }
        _ => {}
    }
    let shexp = if shared_experts_plural(arch) {
        "shared_experts"
    } else {
        "shared_expert"
    };
    let module: String = match base {
        "attn_norm" => "input_layernorm".into(),
        "ffn_norm" | "post_attention_norm" => "post_attention_layernorm".into(),
        "attn_q" => "self_attn.q_proj".into(),
        "attn_k" => "self_attn.k_proj".into(),
        "attn_v" => "self_attn.v_proj".into(),
        "attn_output" => "self_attn.o_proj".into(),
        "attn_q_norm" => "self_attn.q_norm".into(),
        "attn_k_norm" => "self_attn.k_norm".into(),
        "attn_sinks" => "self_attn.sinks".into(),
        // DeepSeek MLA.
        "attn_q_a" => "self_attn.q_a_proj".into(),
        "attn_q_a_norm" => "self_attn.q_a_layernorm".into(),
        "attn_q_b" => "self_attn.q_b_proj".into(),
        "attn_kv_a_mqa" => "self_attn.kv_a_proj_with_mqa".into(),
        "attn_kv_a_norm" => "self_attn.kv_a_layernorm".into(),
        "attn_kv_b" => "self_attn.kv_b_proj".into(),
        // Qwen3-Next / Qwen3.5 GatedDeltaNet.
        "attn_qkv" => "linear_attn.in_proj_qkv".into(),
        "attn_gate" => "linear_attn.in_proj_z".into(),
        "ssm_ba" => "linear_attn.in_proj_ba".into(),
        "ssm_beta" => "linear_attn.in_proj_b".into(),
        "ssm_alpha" => "linear_attn.in_proj_a".into(),
        "ssm_conv1d" => "linear_attn.conv1d".into(),
        "ssm_dt" if bias => return t(format!("model.layers.{layer}.linear_attn.dt_bias")),
        "ssm_norm" => "linear_attn.norm".into(),
        "ssm_out" => "linear_attn.out_proj".into(),
        // Routers and the MoE block.
        "ffn_gate_inp" if arch == "gpt-oss" => "mlp.router".into(),
        "ffn_gate_inp" => "mlp.gate".into(),
        "exp_probs_b" => return t(format!("model.layers.{layer}.mlp.gate.e_score_correction_bias")),
        "ffn_gate_inp_shexp" => "mlp.shared_expert_gate".into(),
        "ffn_gate_shexp" => format!("mlp.{shexp}.gate_proj"),
        "ffn_up_shexp" => format!("mlp.{shexp}.up_proj"),
        "ffn_down_shexp" => format!("mlp.{shexp}.down_proj"),
        // Dense MLP layers.
        "ffn_gate" => "mlp.gate_proj".into(),
        "ffn_up" => "mlp.up_proj".into(),
        "ffn_down" => "mlp.down_proj".into(),
        _ => return None,
    };
    t(format!("model.layers.{layer}.{module}.{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(arch: &str, g: &str) -> String {
        match packed_name(arch, g) {
            Some(Mapped::Tensor(s)) => s,
            other => panic!("{g}: {other:?}"),
        }
    }

    #[test]
    fn dense_and_attention_tensors() {
        let q = "qwen3moe";
        assert_eq!(name(q, "token_embd.weight"), "model.embed_tokens.weight");
        assert_eq!(name(q, "output.weight"), "lm_head.weight");
        assert_eq!(name(q, "output_norm.weight"), "model.norm.weight");
        assert_eq!(name(q, "blk.3.attn_q.weight"), "model.layers.3.self_attn.q_proj.weight");
        assert_eq!(
            name(q, "blk.3.attn_output.weight"),
            "model.layers.3.self_attn.o_proj.weight"
        );
        assert_eq!(
            name(q, "blk.3.attn_k_norm.weight"),
            "model.layers.3.self_attn.k_norm.weight"
        );
        assert_eq!(
            name(q, "blk.0.attn_norm.weight"),
            "model.layers.0.input_layernorm.weight"
        );
        assert_eq!(
            name(q, "blk.0.ffn_norm.weight"),
            "model.layers.0.post_attention_layernorm.weight"
        );
        assert_eq!(name(q, "blk.12.ffn_gate_inp.weight"), "model.layers.12.mlp.gate.weight");
        assert_eq!(name(q, "blk.1.ffn_down.weight"), "model.layers.1.mlp.down_proj.weight");
        assert_eq!(
            name("qwen2moe", "blk.1.attn_q.bias"),
            "model.layers.1.self_attn.q_proj.bias"
        );
        assert_eq!(packed_name(q, "blk.x.attn_q.weight"), None);
        assert_eq!(packed_name(q, "blk.0.attn_q.scale"), None);
        assert_eq!(packed_name(q, "rope_freqs.weight"), None);
    }

    #[test]
    fn experts_and_shared_experts() {
        assert_eq!(
            packed_name("qwen3moe", "blk.7.ffn_gate_exps.weight"),
            Some(Mapped::Experts {
                layer: 7,
                proj: ExpertProj::Gate,
                bias: false
            })
        );
        assert_eq!(
            packed_name("gpt-oss", "blk.0.ffn_gate_up_exps.bias"),
            Some(Mapped::Experts {
                layer: 0,
                proj: ExpertProj::GateUp,
                bias: true
            })
        );
        assert_eq!(
            name("gpt-oss", "blk.0.ffn_gate_inp.weight"),
            "model.layers.0.mlp.router.weight"
        );
        assert_eq!(
            name("qwen3next", "blk.2.ffn_up_shexp.weight"),
            "model.layers.2.mlp.shared_expert.up_proj.weight"
        );
        assert_eq!(
            name("qwen3next", "blk.2.ffn_gate_inp_shexp.weight"),
            "model.layers.2.mlp.shared_expert_gate.weight"
        );
        assert_eq!(
            name("deepseek2", "blk.5.ffn_down_shexp.weight"),
            "model.layers.5.mlp.shared_experts.down_proj.weight"
        );
        assert_eq!(
            name("deepseek2", "blk.5.exp_probs_b.bias"),
            "model.layers.5.mlp.gate.e_score_correction_bias"
        );
    }

    #[test]
    fn mla_and_linear_attention() {
        let d = "deepseek2";
        assert_eq!(
            name(d, "blk.0.attn_q_a.weight"),
            "model.layers.0.self_attn.q_a_proj.weight"
        );
        assert_eq!(
            name(d, "blk.0.attn_kv_a_mqa.weight"),
            "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
        );
        assert_eq!(
            name(d, "blk.0.attn_kv_a_norm.weight"),
            "model.layers.0.self_attn.kv_a_layernorm.weight"
        );
        assert_eq!(
            packed_name(d, "blk.0.attn_v_b.weight"),
            Some(Mapped::Part {
                name: "model.layers.0.self_attn.kv_b_proj.weight".into(),
                part: "v_b"
            })
        );
        let q = "qwen35moe";
        assert_eq!(
            name(q, "blk.0.attn_qkv.weight"),
            "model.layers.0.linear_attn.in_proj_qkv.weight"
        );
        assert_eq!(
            name(q, "blk.0.attn_gate.weight"),
            "model.layers.0.linear_attn.in_proj_z.weight"
        );
        assert_eq!(
            name(q, "blk.0.ssm_beta.weight"),
            "model.layers.0.linear_attn.in_proj_b.weight"
        );
        assert_eq!(name(q, "blk.0.ssm_dt.bias"), "model.layers.0.linear_attn.dt_bias");
        assert_eq!(name(q, "blk.0.ssm_a"), "model.layers.0.linear_attn.A_log");
        assert_eq!(
            name(q, "blk.0.ssm_conv1d.weight"),
            "model.layers.0.linear_attn.conv1d.weight"
        );
        assert_eq!(
            name(q, "blk.3.post_attention_norm.weight"),
            "model.layers.3.post_attention_layernorm.weight"
        );
    }
}
