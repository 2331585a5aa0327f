//! The one table of a model's tensors, built from its config: every dense
//! tensor of `model_weights.bin` (packed name, logical shape, role) and
//! where each layer's routed experts go, in file order. `convert` plans
//! from it, `synth` fills it, and the checks at open look every entry up.
//! The blocks' loaders in `model/` read the same names.

use crate::config::{AttnKind, FfnKind, ModelConfig, QkNorm};

/// What a matrix is, which decides how it is stored and filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mat {
    /// The token embedding.
    Embed,
    /// A projection whose output stays inside its block.
    Linear,
    /// A projection whose output is added to the residual stream
    /// (`o_proj`, `out_proj`, `down_proj`).
    Writer,
    /// A router kept at 8 bits (Qwen-style routers).
    Router,
    /// A router kept in its float dtype (sigmoid routers with a selection
    /// bias).
    RouterFloat,
    /// A scalar gate over the hidden state (`shared_expert_gate`), 8 bits.
    Gate,
}

/// What a vector (stored as F32) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vector {
    /// A norm's weight; `zero_centred` where the checkpoint stores `w` for
    /// `x̂·(1 + w)` (stored as `1 + w`).
    Norm { zero_centred: bool },
    /// A projection's bias; `writer` when added to the residual stream.
    Bias { writer: bool },
    /// A sigmoid router's selection bias (`e_score_correction_bias`).
    RouterBias,
    /// GatedDeltaNet `A_log`.
    ALog,
    /// GatedDeltaNet `dt_bias`.
    DtBias,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    /// `shape` `[rows, cols]`, stored as `name.weight` (and `name.scales`,
    /// `name.biases` when quantized).
    Matrix(Mat),
    /// `shape` `[len]`, stored under `name` as F32.
    Vector(Vector),
    /// A depthwise conv weight `[channels, kernel]`.
    Conv1d,
}

/// One dense tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub kind: TensorKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Dense(Tensor),
    /// Layer `layer`'s routed experts (its expert file).
    Experts {
        layer: usize,
    },
}

struct Table {
    out: Vec<Entry>,
}

impl Table {
    fn push(&mut self, name: String, shape: Vec<usize>, kind: TensorKind) {
        self.out.push(Entry::Dense(Tensor { name, shape, kind }));
    }
    fn mat(&mut self, name: String, rows: usize, cols: usize, m: Mat) {
        self.push(name, vec![rows, cols], TensorKind::Matrix(m));
    }
    fn vec(&mut self, name: String, len: usize, v: Vector) {
        self.push(name, vec![len], TensorKind::Vector(v));
    }
    fn norm(&mut self, name: String, len: usize, zero_centred: bool) {
        self.vec(name, len, Vector::Norm { zero_centred });
    }
    /// A projection `[rows, cols]` and, where `bias`, its bias `[rows]`.
    fn proj(&mut self, p: &str, rows: usize, cols: usize, m: Mat, bias: bool) {
        self.mat(p.to_string(), rows, cols, m);
        if bias {
            self.vec(
                format!("{p}.bias"),
                rows,
                Vector::Bias {
                    writer: m == Mat::Writer,
                },
            );
        }
    }
}

/// Every tensor of the model `cfg` describes, in file order.
pub fn table(cfg: &ModelConfig) -> Vec<Entry> {
    let mut t = Table { out: Vec::new() };
    let (h, zc) = (cfg.hidden_size, cfg.zero_centred_norms);
    t.mat("model.embed_tokens".into(), cfg.vocab_size, h, Mat::Embed);
    for (i, spec) in cfg.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        t.norm(format!("{p}.input_layernorm.weight"), h, zc);
        t.norm(format!("{p}.post_attention_layernorm.weight"), h, zc);
        match spec.attn {
            AttnKind::Full => gqa(&mut t, cfg, &p),
            AttnKind::Linear => delta_net(&mut t, cfg, &p),
            AttnKind::Mla => mla(&mut t, cfg, &p),
        }
        match spec.ffn {
            FfnKind::Dense => mlp(&mut t, &format!("{p}.mlp"), h, cfg.intermediate_size),
            FfnKind::Moe => {
                moe(&mut t, cfg, &p);
                t.out.push(Entry::Experts { layer: i });
            }
        }
    }
    t.norm("model.norm.weight".into(), h, zc);
    if !cfg.tie_word_embeddings {
        t.mat("lm_head".into(), cfg.vocab_size, h, Mat::Linear);
    }
    t.out
}

/// GQA attention (`model/attention.rs`).
fn gqa(t: &mut Table, cfg: &ModelConfig, p: &str) {
    let (h, hd, a) = (cfg.hidden_size, cfg.head_dim, &cfg.attn);
    let (nq, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    // Gated: per head [q | gate].
    let q_rows = nq * hd * if a.output_gate { 2 } else { 1 };
    let s = format!("{p}.self_attn");
    t.proj(&format!("{s}.q_proj"), q_rows, h, Mat::Linear, a.qkv_bias);
    t.proj(&format!("{s}.k_proj"), nkv * hd, h, Mat::Linear, a.qkv_bias);
    t.proj(&format!("{s}.v_proj"), nkv * hd, h, Mat::Linear, a.qkv_bias);
    t.proj(&format!("{s}.o_proj"), h, nq * hd, Mat::Writer, a.o_bias);
    let zc = cfg.zero_centred_norms;
    match a.qk_norm {
        QkNorm::None => {}
        QkNorm::PerHead => {
            t.norm(format!("{s}.q_norm.weight"), hd, zc);
            t.norm(format!("{s}.k_norm.weight"), hd, zc);
        }
        QkNorm::PerLayer => {
            t.norm(format!("{s}.q_norm.weight"), nq * hd, zc);
            t.norm(format!("{s}.k_norm.weight"), nkv * hd, zc);
        }
    }
}

/// GatedDeltaNet (`model/linear_attn.rs`).
fn delta_net(t: &mut Table, cfg: &ModelConfig, p: &str) {
    let Some(l) = &cfg.linear else { return };
    let h = cfg.hidden_size;
    let (hv, v_dim) = (l.num_value_heads, l.num_value_heads * l.value_head_dim);
    let a = format!("{p}.linear_attn");
    t.mat(format!("{a}.in_proj_qkv"), l.conv_dim(), h, Mat::Linear);
    t.mat(format!("{a}.in_proj_z"), v_dim, h, Mat::Linear);
    t.mat(format!("{a}.in_proj_b"), hv, h, Mat::Linear);
    t.mat(format!("{a}.in_proj_a"), hv, h, Mat::Linear);
    t.mat(format!("{a}.out_proj"), h, v_dim, Mat::Writer);
    t.push(
        format!("{a}.conv1d.weight"),
        vec![l.conv_dim(), l.conv_kernel],
        TensorKind::Conv1d,
    );
    t.vec(format!("{a}.A_log"), hv, Vector::ALog);
    t.vec(format!("{a}.dt_bias"), hv, Vector::DtBias);
    // The gated norm is plain in every checkpoint.
    t.norm(format!("{a}.norm.weight"), l.value_head_dim, false);
}

/// Multi-head latent attention (`model/mla.rs`).
fn mla(t: &mut Table, cfg: &ModelConfig, p: &str) {
    let Some(m) = &cfg.mla else { return };
    let (h, nh) = (cfg.hidden_size, cfg.num_attention_heads);
    let s = format!("{p}.self_attn");
    let q_head = m.qk_nope_head_dim + m.qk_rope_head_dim;
    match m.q_lora_rank {
        Some(r) => {
            t.mat(format!("{s}.q_a_proj"), r, h, Mat::Linear);
            t.norm(format!("{s}.q_a_layernorm.weight"), r, false);
            t.mat(format!("{s}.q_b_proj"), nh * q_head, r, Mat::Linear);
        }
        None => t.mat(format!("{s}.q_proj"), nh * q_head, h, Mat::Linear),
    }
    t.mat(
        format!("{s}.kv_a_proj_with_mqa"),
        m.kv_lora_rank + m.qk_rope_head_dim,
        h,
        Mat::Linear,
    );
    t.norm(format!("{s}.kv_a_layernorm.weight"), m.kv_lora_rank, false);
    t.mat(
        format!("{s}.kv_b_proj"),
        nh * (m.qk_nope_head_dim + m.v_head_dim),
        m.kv_lora_rank,
        Mat::Linear,
    );
    t.mat(format!("{s}.o_proj"), h, nh * m.v_head_dim, Mat::Writer);
}

/// A SwiGLU MLP `p.{gate,up,down}_proj` of width `inter` (`model/ffn.rs`).
fn mlp(t: &mut Table, p: &str, h: usize, inter: usize) {
    t.mat(format!("{p}.gate_proj"), inter, h, Mat::Linear);
    t.mat(format!("{p}.up_proj"), inter, h, Mat::Linear);
    t.mat(format!("{p}.down_proj"), h, inter, Mat::Writer);
}

/// The router and shared experts of an MoE layer (`model/ffn.rs`); the
/// routed experts are in the layer's expert file.
fn moe(t: &mut Table, cfg: &ModelConfig, p: &str) {
    let (h, e, m) = (cfg.hidden_size, cfg.num_experts, &cfg.moe);
    let g = format!("{p}.mlp.gate");
    if m.router_bias {
        t.mat(g.clone(), e, h, Mat::RouterFloat);
        t.vec(format!("{g}.e_score_correction_bias"), e, Vector::RouterBias);
    } else {
        t.mat(g, e, h, Mat::Router);
    }
    let s = cfg.shared_expert_intermediate_size;
    if s > 0 {
        mlp(t, &format!("{p}.mlp.{}", m.shared_name), h, s);
        if m.shared_gated {
            t.mat(format!("{p}.mlp.shared_expert_gate"), 1, h, Mat::Gate);
        }
    }
}
