//! Tiny synthetic checkpoints for the converter tests: a safetensors
//! writer (independent of the crate's reader) and builders for small
//! qwen3_moe / qwen3_next / MLX models with deterministic weights.
#![allow(dead_code)]

use half::{bf16, f16};
use serde_json::{json, Value};
use std::path::Path;

/// One tensor to write.
#[derive(Clone)]
pub struct T {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407))
    }
    pub fn u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.u32() as f32 / (1u64 << 31) as f32) - 1.0
    }
    /// `n` values, already representable in bf16.
    pub fn bf16s(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| bf16::from_f32(self.f32() * scale).to_f32()).collect()
    }
}

pub fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| bf16::from_f32(*x).to_le_bytes()).collect()
}

pub fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect()
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn bf16_t(name: &str, shape: &[usize], v: &[f32]) -> T {
    assert_eq!(shape.iter().product::<usize>(), v.len(), "{name}");
    T {
        name: name.into(),
        dtype: "BF16",
        shape: shape.to_vec(),
        data: bf16_bytes(v),
    }
}

/// Write a safetensors file (header padded to 8 bytes, as the reference
/// writer does).
pub fn write_safetensors(path: &Path, tensors: &[T]) {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut off = 0usize;
    for t in tensors {
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + t.data.len()]}),
        );
        off += t.data.len();
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    for t in tensors {
        out.extend_from_slice(&t.data);
    }
    std::fs::write(path, out).unwrap();
}

/// Write `config.json`, a stand-in tokenizer and the tensors, in one file
/// or in `shards` files with an index.
pub fn write_model(dir: &Path, config: &Value, tensors: &[T], shards: usize) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(config).unwrap()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), "{\"model\": {}}").unwrap();
    if shards <= 1 {
        write_safetensors(&dir.join("model.safetensors"), tensors);
        return;
    }
    let per = tensors.len().div_ceil(shards);
    let mut map = serde_json::Map::new();
    for (i, chunk) in tensors.chunks(per).enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, shards);
        write_safetensors(&dir.join(&file), chunk);
        for t in chunk {
            map.insert(t.name.clone(), Value::String(file.clone()));
        }
    }
    let index = json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

pub const HIDDEN: usize = 64;
pub const VOCAB: usize = 32;
pub const EXPERTS: usize = 4;
pub const MOE_INTER: usize = 64;

pub fn qwen3_moe_config() -> Value {
    json!({
        "model_type": "qwen3_moe", "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 128,
        "moe_intermediate_size": MOE_INTER, "num_experts": EXPERTS, "num_experts_per_tok": 2,
        "mlp_only_layers": [1], "tie_word_embeddings": false, "rms_norm_eps": 1e-6, "rope_theta": 10000.0
    })
}

/// Expert `e` of a layer: gate `[I, H]`, up `[I, H]`, down `[H, I]`.
pub struct Expert {
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
}

pub fn experts(rng: &mut Rng, n: usize) -> Vec<Expert> {
    (0..n)
        .map(|_| Expert {
            gate: rng.bf16s(MOE_INTER * HIDDEN, 0.1),
            up: rng.bf16s(MOE_INTER * HIDDEN, 0.1),
            down: rng.bf16s(HIDDEN * MOE_INTER, 0.1),
        })
        .collect()
}

/// Expert tensors under `prefix` (`…mlp`): one per expert, or stacked
/// `experts.gate_up_proj` `[E, 2I, H]` + `experts.down_proj` `[E, H, I]`.
pub fn expert_tensors(prefix: &str, ex: &[Expert], stacked: bool) -> Vec<T> {
    let (h, i) = (HIDDEN, MOE_INTER);
    if !stacked {
        let mut out = Vec::new();
        for (e, x) in ex.iter().enumerate() {
            out.push(bf16_t(
                &format!("{prefix}.experts.{e}.gate_proj.weight"),
                &[i, h],
                &x.gate,
            ));
            out.push(bf16_t(&format!("{prefix}.experts.{e}.up_proj.weight"), &[i, h], &x.up));
            out.push(bf16_t(
                &format!("{prefix}.experts.{e}.down_proj.weight"),
                &[h, i],
                &x.down,
            ));
        }
        return out;
    }
    let gu: Vec<f32> = ex.iter().flat_map(|x| x.gate.iter().chain(&x.up).copied()).collect();
    let dn: Vec<f32> = ex.iter().flat_map(|x| x.down.iter().copied()).collect();
    vec![
        bf16_t(&format!("{prefix}.experts.gate_up_proj"), &[ex.len(), 2 * i, h], &gu),
        bf16_t(&format!("{prefix}.experts.down_proj"), &[ex.len(), h, i], &dn),
    ]
}

/// A bf16 qwen3_moe checkpoint: layer 0 MoE, layer 1 dense. `prefix` is
/// the text model's prefix (`model.` or `model.language_model.`).
pub fn qwen3_moe_tensors(seed: u64, prefix: &str, stacked: bool) -> Vec<T> {
    let mut r = Rng::new(seed);
    let (h, v) = (HIDDEN, VOCAB);
    let mut t = vec![bf16_t(
        &format!("{prefix}embed_tokens.weight"),
        &[v, h],
        &r.bf16s(v * h, 1.0),
    )];
    for l in 0..2 {
        let p = format!("{prefix}layers.{l}");
        t.push(bf16_t(&format!("{p}.input_layernorm.weight"), &[h], &r.bf16s(h, 1.0)));
        t.push(bf16_t(
            &format!("{p}.post_attention_layernorm.weight"),
            &[h],
            &r.bf16s(h, 1.0),
        ));
        for (n, rows, cols) in [
            ("q_proj", 64, h),
            ("k_proj", 32, h),
            ("v_proj", 32, h),
            ("o_proj", h, 64),
        ] {
            t.push(bf16_t(
                &format!("{p}.self_attn.{n}.weight"),
                &[rows, cols],
                &r.bf16s(rows * cols, 0.1),
            ));
        }
        t.push(bf16_t(
            &format!("{p}.self_attn.q_norm.weight"),
            &[32],
            &r.bf16s(32, 1.0),
        ));
        t.push(bf16_t(
            &format!("{p}.self_attn.k_norm.weight"),
            &[32],
            &r.bf16s(32, 1.0),
        ));
        if l == 0 {
            t.push(bf16_t(
                &format!("{p}.mlp.gate.weight"),
                &[EXPERTS, h],
                &r.bf16s(EXPERTS * h, 0.1),
            ));
            let ex = experts(&mut r, EXPERTS);
            t.extend(expert_tensors(&format!("{p}.mlp"), &ex, stacked));
        } else {
            for (n, rows, cols) in [("gate_proj", 128, h), ("up_proj", 128, h), ("down_proj", h, 128)] {
                t.push(bf16_t(
                    &format!("{p}.mlp.{n}.weight"),
                    &[rows, cols],
                    &r.bf16s(rows * cols, 0.1),
                ));
            }
        }
    }
    t.push(bf16_t(&format!("{prefix}norm.weight"), &[h], &r.bf16s(h, 1.0)));
    t.push(bf16_t("lm_head.weight", &[v, h], &r.bf16s(v * h, 0.1)));
    t
}

pub fn find<'a>(ts: &'a [T], name: &str) -> &'a T {
    ts.iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tensor {name}"))
}
