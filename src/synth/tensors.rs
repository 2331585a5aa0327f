//! Which tensors a synthetic model has, at which shapes, and what fills
//! them: the dense tensors of `model_weights.bin` (packed names, SPEC.md
//! §2) and the components of one routed expert.

use super::fill::{quantized_fills, Fill};
use super::random::{key, mix};
use super::skew::{self, Part, Routing, RowMask, Rows, Shared};
use crate::arch::{self, Entry, Mat, Tensor, TensorKind, Vector};
use crate::config::ModelConfig;
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

/// Every dense tensor of the model's table (`arch::table`), in file order.
pub fn dense_tensors(cfg: &ModelConfig, q: Quant) -> Vec<TensorSpec> {
    let mut b = Builder { q, out: Vec::new() };
    for entry in arch::table(cfg) {
        if let Entry::Dense(t) = entry {
            b.tensor(cfg, &t);
        }
    }
    b.out
}

impl Builder {
    /// One tensor of the table, filled by its role.
    fn tensor(&mut self, cfg: &ModelConfig, t: &Tensor) {
        let (name, len) = (t.name.as_str(), t.shape[0]);
        let cols = t.shape.get(1).copied().unwrap_or(1);
        let h = cfg.hidden_size;
        let router_std = ROUTER_GAIN / (h as f32).sqrt();
        match t.kind {
            TensorKind::Matrix(Mat::Embed) => match self.q.block {
                None => self.matrix(name, len, cols, 1.0, self.q.bits),
                Some(block) => {
                    let shared = Shared::Embedding { block };
                    self.rows_matrix(name, len, cols, self.q.bits, shared);
                }
            },
            TensorKind::Matrix(Mat::Linear) => self.linear(name, len, cols),
            TensorKind::Matrix(Mat::Writer) => self.writer(name, len, cols),
            TensorKind::Matrix(Mat::Router) => match self.q.block {
                None => self.matrix(name, len, cols, router_std, QWEN_ROUTER_BITS),
                Some(block) => {
                    let shared = Shared::Router {
                        block,
                        pop: skew::qwen_preference(cfg.num_experts_per_tok, len),
                        pref: key(self.q.seed, &format!("{name}.preference")),
                        noise: ROUTER_GAIN / (skew::BLOCK as f32 / 2.0).sqrt(),
                        experts: len,
                    };
                    self.rows_matrix(name, len, cols, QWEN_ROUTER_BITS, shared);
                }
            },
            TensorKind::Matrix(Mat::RouterFloat) => {
                // Unquantized router [E, hidden].
                let w = format!("{name}.weight");
                let k = key(self.q.seed, &w);
                let bound = router_std * 3f32.sqrt();
                self.push(w, vec![len, cols], Dtype::Bf16, Fill::Bf16 { bound }, k);
            }
            TensorKind::Matrix(Mat::Gate) => self.matrix(name, len, cols, 1.0 / (cols as f32).sqrt(), QWEN_ROUTER_BITS),
            TensorKind::Vector(Vector::Norm { .. }) => self.norm(name, len),
            TensorKind::Vector(Vector::Bias { writer }) => {
                self.f32_vector(name, len, Fill::F32 { lo: -0.02, hi: 0.02 });
                if writer {
                    if let Some(t) = self.out.last_mut() {
                        t.mask = self.q.mask(1);
                    }
                }
            }
            TensorKind::Vector(Vector::RouterBias) => {
                let fill = match self.q.routing {
                    Routing::Uniform => Fill::F32 { lo: -0.02, hi: 0.02 },
                    Routing::Skewed => Fill::Preference {
                        pop: skew::DEEPSEEK_PREFERENCE,
                    },
                };
                self.f32_vector(name, len, fill);
            }
            // exp(A_log) in [1, 16), as Qwen3-Next initialises it.
            TensorKind::Vector(Vector::ALog) => self.f32_vector(name, len, Fill::LnF32 { lo: 1.0, hi: 16.0 }),
            TensorKind::Vector(Vector::DtBias) => self.f32_vector(name, len, Fill::F32 { lo: -4.0, hi: -1.0 }),
            TensorKind::Conv1d => {
                // [conv_dim, kernel], uniform in ±1/sqrt(kernel) like PyTorch's init.
                let bound = 1.0 / (cols as f32).sqrt();
                let k = key(self.q.seed, name);
                self.push(name.to_string(), vec![len, cols], Dtype::Bf16, Fill::Bf16 { bound }, k);
            }
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
