//! Synthetic qwen3_next (fused or split projections) and MLX-quantized
//! qwen3_moe checkpoints.
#![allow(dead_code)]

use super::synthetic::*;
use serde_json::{json, Value};

pub const HK: usize = 2;
pub const DK: usize = 16;
pub const HV: usize = 4;
pub const DV: usize = 16;
pub const CONV: usize = 2 * HK * DK + HV * DV;

pub fn qwen3_next_config() -> Value {
    json!({
        "model_type": "qwen3_next", "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "partial_rotary_factor": 0.25,
        "layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": HK,
        "linear_num_value_heads": HV, "linear_key_head_dim": DK, "linear_value_head_dim": DV,
        "linear_conv_kernel_dim": 4, "moe_intermediate_size": MOE_INTER, "num_experts": EXPERTS,
        "num_experts_per_tok": 2, "shared_expert_intermediate_size": 64, "intermediate_size": 128,
        "tie_word_embeddings": false, "rope_theta": 10000.0
    })
}

/// Rows `[start, start + n)` of a row-major `[_, cols]` matrix.
fn rows(m: &[f32], cols: usize, start: usize, n: usize) -> &[f32] {
    &m[start * cols..(start + n) * cols]
}

/// A bf16 qwen3_next checkpoint. With `fused`, the GatedDeltaNet
/// projections are `in_proj_qkvz` / `in_proj_ba` built from the split ones
/// by the grouping of SPEC.md §5; otherwise they are stored split.
pub fn qwen3_next_tensors(seed: u64, fused: bool) -> Vec<T> {
    let mut r = Rng::new(seed);
    let (h, v, s) = (HIDDEN, VOCAB, 64);
    let mut t = vec![bf16_t("model.embed_tokens.weight", &[v, h], &r.bf16s(v * h, 1.0))];
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        t.push(bf16_t(&format!("{p}.input_layernorm.weight"), &[h], &r.bf16s(h, 0.5)));
        t.push(bf16_t(
            &format!("{p}.post_attention_layernorm.weight"),
            &[h],
            &r.bf16s(h, 0.5),
        ));
        if l == 0 {
            let a = format!("{p}.linear_attn");
            let q = r.bf16s(HK * DK * h, 0.1);
            let k = r.bf16s(HK * DK * h, 0.1);
            let vv = r.bf16s(HV * DV * h, 0.1);
            let z = r.bf16s(HV * DV * h, 0.1);
            let b = r.bf16s(HV * h, 0.1);
            let al = r.bf16s(HV * h, 0.1);
            if fused {
                let g = HV / HK;
                let (mut qkvz, mut ba) = (Vec::new(), Vec::new());
                for grp in 0..HK {
                    qkvz.extend_from_slice(rows(&q, h, grp * DK, DK));
                    qkvz.extend_from_slice(rows(&k, h, grp * DK, DK));
                    qkvz.extend_from_slice(rows(&vv, h, grp * g * DV, g * DV));
                    qkvz.extend_from_slice(rows(&z, h, grp * g * DV, g * DV));
                    ba.extend_from_slice(rows(&b, h, grp * g, g));
                    ba.extend_from_slice(rows(&al, h, grp * g, g));
                }
                t.push(bf16_t(&format!("{a}.in_proj_qkvz.weight"), &[qkvz.len() / h, h], &qkvz));
                t.push(bf16_t(&format!("{a}.in_proj_ba.weight"), &[ba.len() / h, h], &ba));
            } else {
                let qkv: Vec<f32> = q.iter().chain(&k).chain(&vv).copied().collect();
                t.push(bf16_t(&format!("{a}.in_proj_qkv.weight"), &[CONV, h], &qkv));
                t.push(bf16_t(&format!("{a}.in_proj_z.weight"), &[HV * DV, h], &z));
                t.push(bf16_t(&format!("{a}.in_proj_b.weight"), &[HV, h], &b));
                t.push(bf16_t(&format!("{a}.in_proj_a.weight"), &[HV, h], &al));
            }
            t.push(bf16_t(
                &format!("{a}.conv1d.weight"),
                &[CONV, 1, 4],
                &r.bf16s(CONV * 4, 0.5),
            ));
            t.push(T {
                name: format!("{a}.A_log"),
                dtype: "F32",
                shape: vec![HV],
                data: f32_bytes(&[0.1, -0.2, 0.3, 0.7]),
            });
            t.push(bf16_t(&format!("{a}.dt_bias"), &[HV], &r.bf16s(HV, 1.0)));
            t.push(bf16_t(&format!("{a}.norm.weight"), &[DV], &r.bf16s(DV, 1.0)));
            t.push(bf16_t(
                &format!("{a}.out_proj.weight"),
                &[h, HV * DV],
                &r.bf16s(h * HV * DV, 0.1),
            ));
        } else {
            let sa = format!("{p}.self_attn");
            for (n, rr, cc) in [
                ("q_proj", 128, h),
                ("k_proj", 32, h),
                ("v_proj", 32, h),
                ("o_proj", h, 64),
            ] {
                t.push(bf16_t(&format!("{sa}.{n}.weight"), &[rr, cc], &r.bf16s(rr * cc, 0.1)));
            }
            t.push(bf16_t(&format!("{sa}.q_norm.weight"), &[32], &r.bf16s(32, 0.5)));
            t.push(bf16_t(&format!("{sa}.k_norm.weight"), &[32], &r.bf16s(32, 0.5)));
        }
        let m = format!("{p}.mlp");
        t.push(bf16_t(
            &format!("{m}.gate.weight"),
            &[EXPERTS, h],
            &r.bf16s(EXPERTS * h, 0.1),
        ));
        for (n, rr, cc) in [("gate_proj", s, h), ("up_proj", s, h), ("down_proj", h, s)] {
            t.push(bf16_t(
                &format!("{m}.shared_expert.{n}.weight"),
                &[rr, cc],
                &r.bf16s(rr * cc, 0.1),
            ));
        }
        t.push(bf16_t(
            &format!("{m}.shared_expert_gate.weight"),
            &[1, h],
            &r.bf16s(h, 0.1),
        ));
        let ex = experts(&mut r, EXPERTS);
        t.extend(expert_tensors(&m, &ex, false));
    }
    t.push(bf16_t("model.norm.weight", &[h], &r.bf16s(h, 0.5)));
    t.push(bf16_t("lm_head.weight", &[v, h], &r.bf16s(v * h, 0.1)));
    t
}

/// An MLX-quantized qwen3_moe checkpoint (4-bit, group 64, F16 scales;
/// router at 8 bits by a per-tensor override; o_proj left unquantized;
/// experts stacked as `switch_mlp`). Weights are random words: the
/// converter must copy them, not interpret them.
pub fn mlx_qwen3_moe(seed: u64) -> (Value, Vec<T>) {
    let mut r = Rng::new(seed);
    let mut cfg = qwen3_moe_config();
    let q = json!({"group_size": 64, "bits": 4, "mode": "affine",
                   "model.layers.0.mlp.gate": {"group_size": 64, "bits": 8}});
    cfg["quantization"] = q.clone();
    cfg["quantization_config"] = q;
    let (h, v, e, i) = (HIDDEN, VOCAB, EXPERTS, MOE_INTER);
    let mut t = Vec::new();
    quant(&mut r, &mut t, "model.embed_tokens", &[], v, h, 4);
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        for n in ["input_layernorm", "post_attention_layernorm"] {
            let vals = r.bf16s(h, 1.0);
            t.push(bf16_t(&format!("{p}.{n}.weight"), &[h], &vals));
        }
        for (n, rows) in [("q_proj", 64), ("k_proj", 32), ("v_proj", 32)] {
            quant(&mut r, &mut t, &format!("{p}.self_attn.{n}"), &[], rows, h, 4);
        }
        let o = r.bf16s(h * 64, 0.1);
        t.push(bf16_t(&format!("{p}.self_attn.o_proj.weight"), &[h, 64], &o));
        for n in ["q_norm", "k_norm"] {
            let vals = r.bf16s(32, 1.0);
            t.push(bf16_t(&format!("{p}.self_attn.{n}.weight"), &[32], &vals));
        }
        if l == 0 {
            quant(&mut r, &mut t, &format!("{p}.mlp.gate"), &[], e, h, 8);
            let sw = format!("{p}.mlp.switch_mlp");
            quant(&mut r, &mut t, &format!("{sw}.gate_proj"), &[e], i, h, 4);
            quant(&mut r, &mut t, &format!("{sw}.up_proj"), &[e], i, h, 4);
            quant(&mut r, &mut t, &format!("{sw}.down_proj"), &[e], h, i, 4);
        } else {
            quant(&mut r, &mut t, &format!("{p}.mlp.gate_proj"), &[], 128, h, 4);
            quant(&mut r, &mut t, &format!("{p}.mlp.up_proj"), &[], 128, h, 4);
            quant(&mut r, &mut t, &format!("{p}.mlp.down_proj"), &[], h, 128, 4);
        }
    }
    let vals = r.bf16s(h, 1.0);
    t.push(bf16_t("model.norm.weight", &[h], &vals));
    quant(&mut r, &mut t, "lm_head", &[], v, h, 4);
    (cfg, t)
}

/// Append a random MLX-quantized matrix `base` (`[lead.., rows, cols]`).
fn quant(r: &mut Rng, t: &mut Vec<T>, base: &str, lead: &[usize], rows: usize, cols: usize, bits: usize) {
    let n: usize = lead.iter().product::<usize>() * rows;
    let words: Vec<u8> = (0..n * cols * bits / 32).flat_map(|_| r.u32().to_le_bytes()).collect();
    let shape = |last: usize| lead.iter().copied().chain([rows, last]).collect::<Vec<_>>();
    t.push(T {
        name: format!("{base}.weight"),
        dtype: "U32",
        shape: shape(cols * bits / 32),
        data: words,
    });
    for part in ["scales", "biases"] {
        let vals: Vec<f32> = (0..n * cols / 64).map(|_| r.f32() * 0.01).collect();
        t.push(T {
            name: format!("{base}.{part}"),
            dtype: "F16",
            shape: shape(cols / 64),
            data: f16_bytes(&vals),
        });
    }
}
