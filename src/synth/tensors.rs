//! Which tensors a synthetic model has, at which shapes, and what fills
//! them: the dense tensors of `model_weights.bin` (packed names, SPEC.md
//! §2) and the components of one routed expert.

use super::fill::{quantized_fills, Fill};
use super::random::{key, mix};
use super::skew::{self, Part, Routing, RowMask, Rows, Shared};
use crate::config::{Arch, AttnKind, FfnKind, ModelConfig};
use crate::format::packed::LayerLayout;
use crate::format::Dtype;

/// Router rows are this many times the usual `1/sqrt(cols)`, so that the
/// router logits spread (std ≈ 2) and top-k picks differ from token to token.
pub const ROUTER_GAIN: f32 = 2.0;
/// Qwen routers (`mlp.gate`, `mlp.shared_expert_gate`) are kept at 8 bits.
pub const QWEN_ROUTER_BITS: u32 = 8;

/// How matrices are quantized, and the seed of every random value.
#[derive(Debug, Clone, Copy)]
pub struct Quant {
    pub bits: u32,
    pub group_size: usize,
    pub seed: u64,
    pub routing: Routing,
    /// Skewed Qwen routing: the first dimension of the block of the
    /// hidden state that routers read and only embeddings write.
    pub block: Option<usize>,
}

impl Quant {
    /// The mask of a writer's rows (hidden dimensions) `per_row` elements
    /// wide, where the model has a block.
    fn mask(&self, per_row: usize) -> Option<RowMask> {
        self.block.map(|first| RowMask { per_row, first })
    }
}

/// One tensor of `model_weights.bin`.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: Dtype,
    pub bits: Option<u32>,
    pub group_size: Option<usize>,
    pub fill: Fill,
    pub key: u64,
    /// Rows generated as zeros.
    pub mask: Option<RowMask>,
}

impl TensorSpec {
    pub fn elems(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn nbytes(&self) -> usize {
        self.elems() * self.dtype.size()
    }
}

/// A run of `n` elements of one fill: chunk `chunk` of the tensor keyed `key`.
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    pub fill: Fill,
    pub key: u64,
    pub chunk: u64,
    pub n: usize,
    pub mask: Option<RowMask>,
}

struct Builder {
    q: Quant,
    out: Vec<TensorSpec>,
}

impl Builder {
    fn push(&mut self, name: String, shape: Vec<usize>, dtype: Dtype, fill: Fill, key: u64) {
        self.out.push(TensorSpec {
            name,
            shape,
            dtype,
            bits: None,
            group_size: None,
            fill,
            key,
            mask: None,
        });
    }

    /// Matrix `base` `[rows, cols]` with values of standard deviation
    /// `std`: quantized at `bits`, or BF16 where `cols` is not a multiple
    /// of the group size (as MLX leaves such matrices).
    fn matrix(&mut self, base: &str, rows: usize, cols: usize, std: f32, bits: u32) {
        self.masked_matrix(base, rows, cols, std, bits, false);
    }

    /// [`Builder::matrix`], with the block's rows zero when `writer` (a
    /// matrix that adds to the residual stream) and the model has a block.
    fn masked_matrix(&mut self, base: &str, rows: usize, cols: usize, std: f32, bits: u32, writer: bool) {
        let k = key(self.q.seed, base);
        let gs = self.q.group_size;
        let q = self.q;
        let mask = |per_row| if writer { q.mask(per_row) } else { None };
        if !cols.is_multiple_of(gs) {
            let bound = std * 3f32.sqrt();
            self.push(
                format!("{base}.weight"),
                vec![rows, cols],
                Dtype::Bf16,
                Fill::Bf16 { bound },
                k,
            );
            if let Some(t) = self.out.last_mut() {
                t.mask = mask(cols);
            }
            return;
        }
        let [w, s, b] = quantized_fills(std, bits);
        let parts = [
            (
                "weight",
                vec![rows, cols * bits as usize / 32],
                Dtype::U32,
                w,
                mix(k, 1),
                None,
            ),
            (
                "scales",
                vec![rows, cols / gs],
                Dtype::Bf16,
                s,
                mix(k, 2),
                mask(cols / gs),
            ),
            (
                "biases",
                vec![rows, cols / gs],
                Dtype::Bf16,
                b,
                mix(k, 2),
                mask(cols / gs),
            ),
        ];
        for (suffix, shape, dtype, fill, key, mask) in parts {
            self.out.push(TensorSpec {
                name: format!("{base}.{suffix}"),
                shape,
                dtype,
                bits: Some(bits),
                group_size: Some(gs),
                fill,
                key,
                mask,
            });
        }
    }

    /// Matrix `base` `[rows, cols]` quantized at `bits` from float rows
    /// (skewed routing: embeddings and Qwen routers).
    fn rows_matrix(&mut self, base: &str, rows: usize, cols: usize, bits: u32, shared: Shared) {
        let gs = self.q.group_size;
        let spec = Rows {
            cols,
            bits,
            group_size: gs,
            shared,
            key: key(self.q.seed, base),
            dir: key(self.q.seed, "synth.routing.direction"),
        };
        let parts = [
            ("weight", vec![rows, cols * bits as usize / 32], Dtype::U32, Part::Words),
            ("scales", vec![rows, cols / gs], Dtype::Bf16, Part::Scales),
            ("biases", vec![rows, cols / gs], Dtype::Bf16, Part::Biases),
        ];
        for (suffix, shape, dtype, part) in parts {
            self.out.push(TensorSpec {
                name: format!("{base}.{suffix}"),
                shape,
                dtype,
                bits: Some(bits),
                group_size: Some(gs),
                fill: Fill::Rows { part, rows: spec },
                key: spec.key,
                mask: None,
            });
        }
    }

    /// A linear layer with the usual `1/sqrt(cols)` scale at the model's bits.
    fn linear(&mut self, base: &str, rows: usize, cols: usize) {
        self.matrix(base, rows, cols, 1.0 / (cols as f32).sqrt(), self.q.bits);
    }

    /// A linear layer whose output is added to the residual stream
    /// (`rows` = hidden): the block's rows are zero where there is a block.
    fn writer(&mut self, base: &str, rows: usize, cols: usize) {
        self.masked_matrix(base, rows, cols, 1.0 / (cols as f32).sqrt(), self.q.bits, true);
    }

    /// A norm weight: the applied multiplier, near 1.
    fn norm(&mut self, name: &str, len: usize) {
        let k = key(self.q.seed, name);
        self.push(
            name.to_string(),
            vec![len],
            Dtype::F32,
            Fill::F32 { lo: 0.9, hi: 1.1 },
            k,
        );
    }

    fn f32_vector(&mut self, name: &str, len: usize, fill: Fill) {
        let k = key(self.q.seed, name);
        self.push(name.to_string(), vec![len], Dtype::F32, fill, k);
    }
}

/// Every dense tensor the model code reads, in file order.
pub fn dense_tensors(cfg: &ModelConfig, q: Quant) -> Vec<TensorSpec> {
    let mut b = Builder { q, out: Vec::new() };
    let h = cfg.hidden_size;
    match q.block {
        None => b.matrix("model.embed_tokens", cfg.vocab_size, h, 1.0, q.bits),
        Some(block) => {
            let shared = Shared::Embedding { block };
            b.rows_matrix("model.embed_tokens", cfg.vocab_size, h, q.bits, shared);
        }
    }
    for (i, spec) in cfg.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        b.norm(&format!("{p}.input_layernorm.weight"), h);
        b.norm(&format!("{p}.post_attention_layernorm.weight"), h);
        match spec.attn {
            AttnKind::Full => full_attention(&mut b, cfg, &p),
            AttnKind::Linear => linear_attention(&mut b, cfg, &p),
            AttnKind::Mla => mla(&mut b, cfg, &p),
        }
        match spec.ffn {
            FfnKind::Dense => {
                let inter = cfg.intermediate_size;
                b.linear(&format!("{p}.mlp.gate_proj"), inter, h);
                b.linear(&format!("{p}.mlp.up_proj"), inter, h);
                b.writer(&format!("{p}.mlp.down_proj"), h, inter);
            }
            FfnKind::Moe => moe_dense_parts(&mut b, cfg, &p),
        }
    }
    b.norm("model.norm.weight", h);
    if !cfg.tie_word_embeddings {
        b.linear("lm_head", cfg.vocab_size, h);
    }
    b.out
}

fn full_attention(b: &mut Builder, cfg: &ModelConfig, p: &str) {
    let (h, hd) = (cfg.hidden_size, cfg.head_dim);
    let (nq, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    // Hybrid models: per head [q | gate].
    let q_rows = if cfg.arch.is_hybrid() { 2 * nq * hd } else { nq * hd };
    b.linear(&format!("{p}.self_attn.q_proj"), q_rows, h);
    b.linear(&format!("{p}.self_attn.k_proj"), nkv * hd, h);
    b.linear(&format!("{p}.self_attn.v_proj"), nkv * hd, h);
    b.writer(&format!("{p}.self_attn.o_proj"), h, nq * hd);
    b.norm(&format!("{p}.self_attn.q_norm.weight"), hd);
    b.norm(&format!("{p}.self_attn.k_norm.weight"), hd);
}

fn linear_attention(b: &mut Builder, cfg: &ModelConfig, p: &str) {
    let Some(l) = &cfg.linear else { return };
    let h = cfg.hidden_size;
    let v_dim = l.num_value_heads * l.value_head_dim;
    let conv_dim = l.conv_dim();
    let a = format!("{p}.linear_attn");
    b.linear(&format!("{a}.in_proj_qkv"), conv_dim, h);
    b.linear(&format!("{a}.in_proj_z"), v_dim, h);
    b.linear(&format!("{a}.in_proj_b"), l.num_value_heads, h);
    b.linear(&format!("{a}.in_proj_a"), l.num_value_heads, h);
    b.writer(&format!("{a}.out_proj"), h, v_dim);
    // [conv_dim, kernel], uniform in ±1/sqrt(kernel) like PyTorch's init.
    let conv = format!("{a}.conv1d.weight");
    let bound = 1.0 / (l.conv_kernel as f32).sqrt();
    let k = key(b.q.seed, &conv);
    b.push(
        conv,
        vec![conv_dim, l.conv_kernel],
        Dtype::Bf16,
        Fill::Bf16 { bound },
        k,
    );
    // exp(A_log) in [1, 16), as Qwen3-Next initialises it.
    b.f32_vector(
        &format!("{a}.A_log"),
        l.num_value_heads,
        Fill::LnF32 { lo: 1.0, hi: 16.0 },
    );
    b.f32_vector(
        &format!("{a}.dt_bias"),
        l.num_value_heads,
        Fill::F32 { lo: -4.0, hi: -1.0 },
    );
    b.norm(&format!("{a}.norm.weight"), l.value_head_dim);
}

fn mla(b: &mut Builder, cfg: &ModelConfig, p: &str) {
    let Some(m) = &cfg.mla else { return };
    let (h, nh) = (cfg.hidden_size, cfg.num_attention_heads);
    let a = format!("{p}.self_attn");
    let q_head = m.qk_nope_head_dim + m.qk_rope_head_dim;
    match m.q_lora_rank {
        Some(r) => {
            b.linear(&format!("{a}.q_a_proj"), r, h);
            b.norm(&format!("{a}.q_a_layernorm.weight"), r);
            b.linear(&format!("{a}.q_b_proj"), nh * q_head, r);
        }
        None => b.linear(&format!("{a}.q_proj"), nh * q_head, h),
    }
    b.linear(
        &format!("{a}.kv_a_proj_with_mqa"),
        m.kv_lora_rank + m.qk_rope_head_dim,
        h,
    );
    b.norm(&format!("{a}.kv_a_layernorm.weight"), m.kv_lora_rank);
    b.linear(
        &format!("{a}.kv_b_proj"),
        nh * (m.qk_nope_head_dim + m.v_head_dim),
        m.kv_lora_rank,
    );
    b.writer(&format!("{a}.o_proj"), h, nh * m.v_head_dim);
}

/// The router and shared experts of an MoE layer (the routed experts live
/// in the layer's expert file).
fn moe_dense_parts(b: &mut Builder, cfg: &ModelConfig, p: &str) {
    let (h, e) = (cfg.hidden_size, cfg.num_experts);
    let router_std = ROUTER_GAIN / (h as f32).sqrt();
    let s = cfg.shared_expert_intermediate_size;
    if cfg.arch == Arch::DeepseekV3 {
        // Unquantized router [E, hidden] and its selection bias [E].
        let gate = format!("{p}.mlp.gate.weight");
        let k = key(b.q.seed, &gate);
        b.push(
            gate,
            vec![e, h],
            Dtype::Bf16,
            Fill::Bf16 {
                bound: router_std * 3f32.sqrt(),
            },
            k,
        );
        let fill = match b.q.routing {
            Routing::Uniform => Fill::F32 { lo: -0.02, hi: 0.02 },
            Routing::Skewed => Fill::Preference {
                pop: skew::DEEPSEEK_PREFERENCE,
            },
        };
        b.f32_vector(&format!("{p}.mlp.gate.e_score_correction_bias"), e, fill);
        if s > 0 {
            b.linear(&format!("{p}.mlp.shared_experts.gate_proj"), s, h);
            b.linear(&format!("{p}.mlp.shared_experts.up_proj"), s, h);
            b.writer(&format!("{p}.mlp.shared_experts.down_proj"), h, s);
        }
        return;
    }
    let gate = format!("{p}.mlp.gate");
    match b.q.block {
        None => b.matrix(&gate, e, h, router_std, QWEN_ROUTER_BITS),
        Some(block) => {
            let shared = Shared::Router {
                block,
                pop: skew::qwen_preference(cfg.num_experts_per_tok, e),
                pref: key(b.q.seed, &format!("{gate}.preference")),
                noise: ROUTER_GAIN / (skew::BLOCK as f32 / 2.0).sqrt(),
                experts: e,
            };
            b.rows_matrix(&gate, e, h, QWEN_ROUTER_BITS, shared);
        }
    }
    if s > 0 {
        b.linear(&format!("{p}.mlp.shared_expert.gate_proj"), s, h);
        b.linear(&format!("{p}.mlp.shared_expert.up_proj"), s, h);
        b.writer(&format!("{p}.mlp.shared_expert.down_proj"), h, s);
        if cfg.shared_expert_gated {
            b.matrix(
                &format!("{p}.mlp.shared_expert_gate"),
                1,
                h,
                1.0 / (h as f32).sqrt(),
                QWEN_ROUTER_BITS,
            );
        }
    }
}

/// The nine components of expert `e` of `layer`, in file order.
/// `q.block`: the down projection's block rows are zero.
pub fn expert_segments(layout: &LayerLayout, layer: usize, e: usize, q: &Quant) -> Vec<Segment> {
    let mut out = Vec::with_capacity(9);
    for (m, comps) in layout.components.chunks_exact(3).enumerate() {
        let cols = comps[0].shape[1] * 32 / layout.bits as usize;
        let k = mix(
            key(q.seed, &format!("model.layers.{layer}.experts")),
            (e * 3 + m) as u64,
        );
        let fills = quantized_fills(1.0 / (cols as f32).sqrt(), layout.bits);
        let down = m == 2;
        for (i, (c, fill)) in comps.iter().zip(fills).enumerate() {
            out.push(Segment {
                fill,
                key: mix(k, [1u64, 2, 2][i]),
                chunk: 0,
                n: c.size / fill.elem_size(),
                mask: if down && i > 0 { q.mask(c.shape[1]) } else { None },
            });
        }
    }
    out
}
