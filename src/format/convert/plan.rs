//! The conversion plan: every packed tensor, in file order, with the source
//! tensors it comes from (shapes checked against the config) and the form
//! it is stored in. Building the plan reads only headers, so every missing
//! tensor, wrong shape or unsupported dtype is reported before anything is
//! written.

use super::matrix::{SrcMatrix, Storage, Target};
use super::source::{Source, Tensor};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::format::gguf::GgmlType;
use crate::format::packed::LayerLayout;
use crate::format::quant::check_bits;
use crate::format::safetensors::StDtype;
use crate::format::Dtype;
use std::collections::{BTreeMap, BTreeSet};

/// What the user asked for (unquantized sources only; MLX sources are
/// repacked as they are).
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Bits of dense matrices; `None` keeps them as floats (`--bits 16`).
    pub dense_bits: Option<u32>,
    /// Bits of routed experts; `None` keeps them as floats.
    pub expert_bits: Option<u32>,
    pub group_size: usize,
    /// GGUF sources: the bits that block formats the packed format cannot
    /// hold exactly are requantized to (`--requantize`).
    pub requantize: Option<u32>,
}

/// A matrix `X`, stored as `X.weight` (+ `X.scales`, `X.biases`).
pub struct MatrixItem<'a> {
    pub name: String,
    pub src: SrcMatrix<'a>,
    pub target: Target,
}

/// A small tensor stored as F32 (norms, biases, `A_log`, conv weights).
pub struct VectorItem<'a> {
    pub name: String,
    /// Shape in the packed model (`[len]`, or `[channels, kernel]`).
    pub shape: Vec<usize>,
    pub src: Tensor<'a>,
    /// Store `1 + w` (zero-centred norms of Hugging Face hybrid models).
    pub add_one: bool,
}

/// The routed experts of one layer: `[gate, up, down]` per expert.
pub struct ExpertLayer<'a> {
    pub layer: usize,
    pub experts: Vec<[SrcMatrix<'a>; 3]>,
    pub target: Target,
    pub layout: LayerLayout,
}

pub enum Item<'a> {
    Matrix(MatrixItem<'a>),
    Vector(VectorItem<'a>),
    Experts(ExpertLayer<'a>),
}

pub struct Plan<'a> {
    pub items: Vec<Item<'a>>,
    /// Source bytes the plan reads (the progress total).
    pub source_bytes: u64,
    /// Group size of the expert files (`layout.json`).
    pub expert_group_size: usize,
    pub notes: Vec<String>,
}

/// How a dense matrix of an unquantized source is stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// At the requested bits (floats when its input size is not a
    /// multiple of the group size, or with `--bits 16`).
    Default,
    /// Qwen routers: 8 bits.
    Router,
    /// Never quantized (DeepSeek router).
    Float,
}

pub struct Planner<'a> {
    pub src: &'a Source,
    pub cfg: &'a ModelConfig,
    pub set: Settings,
    used: BTreeSet<String>,
    pub items: Vec<Item<'a>>,
    pub notes: Vec<String>,
    /// Store zero-centred norms as `1 + w`.
    pub shift_norms: bool,
    /// Qwen3-Next's fused GatedDeltaNet projections were split into the
    /// four the table names; the other three are already planned.
    pub split_fused: bool,
    pub expert_group_size: Option<usize>,
}

pub fn build<'a>(src: &'a Source, set: Settings) -> Result<Plan<'a>> {
    refuse_absorbed_mla(src)?;
    let cfg = &src.config;
    let mut p = Planner {
        src,
        cfg,
        set,
        used: BTreeSet::new(),
        items: Vec::new(),
        notes: Vec::new(),
        shift_norms: false,
        split_fused: false,
        expert_group_size: None,
    };
    p.shift_norms = cfg.zero_centred_norms && p.hf_norms();
    for entry in crate::arch::table(cfg) {
        p.entry(entry)?;
    }
    if cfg.tie_word_embeddings {
        let extra: Vec<String> = src.names().filter(|n| n.starts_with("lm_head.")).cloned().collect();
        if !extra.is_empty() {
            p.notes
                .push("lm_head is in the checkpoint, but tie_word_embeddings is true: embed_tokens is used".into());
            p.used.extend(extra);
        }
    }
    p.leftovers()?;
    let mut notes = skipped_notes(src);
    notes.append(&mut p.notes);
    let source_bytes = p.items.iter().map(item_bytes).sum();
    Ok(Plan {
        items: p.items,
        source_bytes,
        expert_group_size: p.expert_group_size.unwrap_or(set.group_size),
        notes,
    })
}

fn item_bytes(it: &Item) -> u64 {
    match it {
        Item::Matrix(m) => (m.src.rows * m.src.src_row_bytes()) as u64,
        Item::Vector(v) => v.src.data.len() as u64,
        Item::Experts(l) => l
            .experts
            .iter()
            .flatten()
            .map(|m| (m.rows * m.src_row_bytes()) as u64)
            .sum(),
    }
}

/// MLX DeepSeek repositories may hold the absorbed MLA matrices instead of
/// `kv_b_proj`; they are refused by name rather than misread.
fn refuse_absorbed_mla(src: &Source) -> Result<()> {
    let first = |part: &str| src.names().find(|n| n.contains(part)).cloned();
    let found: Vec<String> = [first(".embed_q."), first(".unembed_out.")]
        .into_iter()
        .flatten()
        .collect();
    if found.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = found.iter().map(|n| format!("`{n}`")).collect();
    Err(Error::Convert(format!(
        "{} are MLX's absorbed-MLA matrices (embed_q / unembed_out, made by mlx-lm in place of kv_b_proj); \
         moeflux does not read them: convert the original Hugging Face checkpoint instead",
        list.join(" and ")
    )))
}

fn skipped_notes(src: &Source) -> Vec<String> {
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, why) in &src.skipped {
        *by.entry(why).or_default() += 1;
    }
    by.into_iter()
        .map(|(why, n)| format!("skipped {n} tensors: {why}"))
        .collect()
}

impl<'a> Planner<'a> {
    /// A source tensor by normalized name, marked as used.
    pub fn take(&mut self, name: &str) -> Option<Tensor<'a>> {
        let t = self.src.get(name)?;
        self.used.insert(name.to_string());
        Some(t)
    }

    pub fn require(&mut self, name: &str) -> Result<Tensor<'a>> {
        self.take(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
            where_: Some(self.src.dir.display().to_string()),
        })
    }

    /// Whether norms are in Hugging Face zero-centred form: told apart by
    /// the conv1d weight, `[C, 1, K]` (HF) vs `[C, K, 1]` (MLX, shifted).
    fn hf_norms(&mut self) -> bool {
        let first_linear = self
            .cfg
            .layers
            .iter()
            .position(|l| l.attn == crate::config::AttnKind::Linear);
        let shape = first_linear
            .and_then(|i| self.src.get(&format!("model.layers.{i}.linear_attn.conv1d.weight")))
            .map(|t| t.shape.to_vec());
        match shape.as_deref() {
            Some([_, 1, k]) if *k > 1 => true,
            Some([_, k, 1]) if *k > 1 => false,
            _ => {
                let hf = self.src.mlx.is_none();
                self.notes.push(format!(
                    "could not tell Hugging Face from MLX norms by the conv1d weight; assuming {}",
                    if hf {
                        "Hugging Face (zero-centred)"
                    } else {
                        "MLX (already shifted)"
                    }
                ));
                hf
            }
        }
    }

    /// The matrix whose weight tensor is `weight_name`, logical
    /// `[rows, cols]` per slice; `lead > 0` for stacked `[lead, rows, …]`
    /// tensors, which come back as `[lead·rows, cols]`.
    pub fn load(&mut self, weight_name: &str, lead: usize, rows: usize, cols: usize) -> Result<SrcMatrix<'a>> {
        let t = self.require(weight_name)?;
        let base = weight_name.strip_suffix(".weight").unwrap_or(weight_name);
        let mut lead_dims = if lead > 0 { vec![lead] } else { vec![] };
        lead_dims.push(rows);
        let n = rows * lead.max(1);
        let with_last = |last: usize| -> Vec<usize> { lead_dims.iter().copied().chain([last]).collect() };
        if let Some(sc) = self.take(&format!("{base}.scales")) {
            let bi = self.require(&format!("{base}.biases"))?;
            let (bits, gs) = self.quant_shape(&t, &sc, &bi, &lead_dims, cols)?;
            let scale_dtype = float_dtype(&sc)?;
            let storage = Storage::Quant {
                bits,
                group_size: gs,
                weight: t.data,
                scales: sc.data,
                biases: bi.data,
                scale_dtype,
            };
            return Ok(SrcMatrix::new(t.name.to_string(), n, cols, storage));
        }
        if *t.dtype == StDtype::F8E4M3 {
            return self.load_fp8(weight_name, t, lead, rows, cols);
        }
        if let Some(ty) = t.ggml {
            if t.shape != with_last(cols).as_slice() {
                return Err(shape_err(&t, with_last(cols)));
            }
            self.gguf_form(&t, ty)?;
            return Ok(SrcMatrix::new(
                t.name.to_string(),
                n,
                cols,
                Storage::Gguf { ty, data: t.data },
            ));
        }
        let dtype = float_dtype(&t)?;
        if t.shape != with_last(cols).as_slice() {
            return Err(shape_err(&t, with_last(cols)));
        }
        Ok(SrcMatrix::new(
            t.name.to_string(),
            n,
            cols,
            Storage::Float { dtype, data: t.data },
        ))
    }

    fn load_fp8(
        &mut self,
        weight_name: &str,
        t: Tensor<'a>,
        lead: usize,
        rows: usize,
        cols: usize,
    ) -> Result<SrcMatrix<'a>> {
        if lead > 0 {
            return Err(Error::Dtype {
                name: t.name.to_string(),
                dtype: "F8_E4M3 in a stacked expert tensor (only 2-D fp8 weights are supported)".into(),
            });
        }
        if t.shape != [rows, cols] {
            return Err(shape_err(&t, vec![rows, cols]));
        }
        let s = self
            .take(&format!("{weight_name}_scale_inv"))
            .ok_or_else(|| Error::MissingTensor {
                name: format!("{}_scale_inv", t.name),
                where_: Some(format!(
                    "{} (every fp8 weight needs its block scales)",
                    self.src.dir.display()
                )),
            })?;
        let block = self.src.fp8_block;
        let grid = vec![rows.div_ceil(block[0]), cols.div_ceil(block[1])];
        if s.shape != grid.as_slice() {
            return Err(shape_err(&s, grid));
        }
        let sd = float_dtype(&s)?;
        let mut scale = vec![0f32; s.shape.iter().product()];
        sd.decode_into(s.data, &mut scale);
        let storage = Storage::Fp8 {
            data: t.data,
            scale_inv: scale.into(),
            block,
        };
        Ok(SrcMatrix::new(t.name.to_string(), rows, cols, storage))
    }

    /// Bits and group size of an MLX-quantized tensor, from its shapes,
    /// checked against the config's `quantization` block.
    fn quant_shape(&self, w: &Tensor, s: &Tensor, b: &Tensor, lead: &[usize], cols: usize) -> Result<(u32, usize)> {
        if *w.dtype != StDtype::U32 {
            return Err(Error::Dtype {
                name: w.name.to_string(),
                dtype: format!("{} (quantized weights with scales must be U32)", w.dtype.name()),
            });
        }
        if b.shape != s.shape || b.dtype != s.dtype {
            return Err(shape_err(b, s.shape.to_vec()));
        }
        let k = lead.len();
        let lead_ok = |t: &Tensor| t.shape.len() == k + 1 && t.shape[..k] == *lead;
        let (wl, sl) = (
            w.shape.last().copied().unwrap_or(0),
            s.shape.last().copied().unwrap_or(0),
        );
        let bits = if cols > 0 && (wl * 32) % cols == 0 {
            (wl * 32 / cols) as u32
        } else {
            0
        };
        if !lead_ok(w) || !lead_ok(s) || sl == 0 || !cols.is_multiple_of(sl) || bits == 0 {
            return Err(Error::Convert(format!(
                "tensor `{}`: shape {:?} with scales {:?} is not a quantized {:?} matrix",
                w.name,
                w.shape,
                s.shape,
                lead.iter().chain([&cols]).collect::<Vec<_>>()
            )));
        }
        let gs = cols / sl;
        if !check_bits(bits) {
            return Err(Error::Convert(format!(
                "tensor `{}` is {bits}-bit quantized; moeflux reads 2, 4 or 8-bit affine MLX weights",
                w.name
            )));
        }
        if let Some(q) = &self.src.mlx {
            let module = w.name.strip_suffix(".weight").unwrap_or(w.name);
            let says = match q.for_module(module) {
                Some((cb, cg)) if (cb, cg) == (bits, gs) => None,
                Some((cb, cg)) => Some(format!("{cb}-bit, group {cg}")),
                None => Some("unquantized".to_string()),
            };
            if let Some(says) = says {
                return Err(Error::Convert(format!(
                    "tensor `{}`: config.json `quantization` says {says}, but its shapes mean {bits}-bit, group {gs}",
                    w.name
                )));
            }
        }
        Ok((bits, gs))
    }

    /// A GGUF tensor of block format `ty` is kept exactly where the affine
    /// form holds it; any other one needs `--requantize`, and the
    /// converter must read it.
    fn gguf_form(&mut self, t: &Tensor, ty: GgmlType) -> Result<()> {
        let path = self.src.dir.clone();
        if crate::format::gguf::BlockFormat::new(ty).is_none() {
            return Err(Error::GgufType {
                path,
                tensor: t.name.to_string(),
                ty: ty.name(),
                supported: GgmlType::SUPPORTED_NAMES,
            });
        }
        if super::gguf::affine(ty).is_some() {
            return Ok(());
        }
        match self.set.requantize {
            Some(bits) => {
                let note = format!("GGUF {ty} tensors requantized to {bits}-bit affine (--requantize {bits})");
                if !self.notes.contains(&note) {
                    self.notes.push(note);
                }
                Ok(())
            }
            None => Err(Error::Convert(format!(
                "{}: tensor `{}` is {ty}, which moeflux's packed format cannot hold exactly (it keeps F32, F16, \
                 BF16, Q8_0, Q4_0 and Q4_1 bit for bit); pass --requantize 4 or 8 to requantize such tensors \
                 into its affine format",
                path.display(),
                t.name
            ))),
        }
    }

    /// The packed form of a dense matrix under `rule`.
    pub fn target(&self, m: &SrcMatrix, rule: Rule) -> Target {
        if m.quant_params().is_some() {
            return Target::Repack;
        }
        let float = Target::Float(m.float_dtype());
        if let (Storage::Gguf { .. }, Some(bits)) = (&m.storage, self.set.requantize) {
            return match m.cols.is_multiple_of(self.set.group_size) {
                true => Target::Quantize {
                    bits,
                    group_size: self.set.group_size,
                },
                false => float,
            };
        }
        if self.src.mlx.is_some() || self.src.gguf.is_some() {
            return float;
        }
        let bits = match (rule, self.set.dense_bits) {
            (Rule::Float, _) | (_, None) => return float,
            (Rule::Router, Some(_)) => 8,
            (Rule::Default, Some(b)) => b,
        };
        if !m.cols.is_multiple_of(self.set.group_size) {
            return float;
        }
        Target::Quantize {
            bits,
            group_size: self.set.group_size,
        }
    }

    /// Plan the matrix `base` (`base.weight`, …) of shape `[rows, cols]`.
    pub fn matrix(&mut self, base: &str, rows: usize, cols: usize, rule: Rule) -> Result<()> {
        let mut src = self.load(&format!("{base}.weight"), 0, rows, cols)?;
        if self.src.permuted_qk() {
            let hd = self.cfg.head_dim;
            if base.ends_with(".self_attn.q_proj") || base.ends_with(".self_attn.k_proj") {
                src = src.select(&super::gguf_source::unpermute_rows(rows / hd, hd));
            }
        }
        self.push_matrix(base, src, rule);
        Ok(())
    }

    pub fn push_matrix(&mut self, base: &str, src: SrcMatrix<'a>, rule: Rule) {
        let target = self.target(&src, rule);
        self.items.push(Item::Matrix(MatrixItem {
            name: base.to_string(),
            src,
            target,
        }));
    }

    /// Plan a vector `name` of `len` elements.
    pub fn vector(&mut self, name: &str, len: usize, add_one: bool) -> Result<()> {
        let t = self.require(name)?;
        float_dtype(&t)?;
        if t.shape != [len] {
            return Err(shape_err(&t, vec![len]));
        }
        self.items.push(Item::Vector(VectorItem {
            name: name.to_string(),
            shape: vec![len],
            src: t,
            add_one,
        }));
        Ok(())
    }

    /// A norm weight; `zero_centred` for the five norms SPEC.md §2 lists.
    pub fn norm(&mut self, name: &str, len: usize, zero_centred: bool) -> Result<()> {
        let shift = zero_centred && self.shift_norms;
        self.vector(name, len, shift)
    }

    fn leftovers(&self) -> Result<()> {
        let left: Vec<String> = self
            .src
            .names()
            .filter(|n| !self.used.contains(*n))
            .map(|n| format!("`{}`", self.src.get(n).map_or(n.as_str(), |t| t.name)))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        let shown: Vec<&str> = left.iter().take(4).map(|s| s.as_str()).collect();
        Err(Error::Convert(format!(
            "{} tensor(s) in {} are not part of a {} model as moeflux reads it: {}{}; \
             refusing to drop weights silently",
            left.len(),
            self.src.dir.display(),
            self.cfg.model_type,
            shown.join(", "),
            if left.len() > shown.len() { ", …" } else { "" }
        )))
    }
}

/// The float dtype of a tensor, or an error naming it.
pub fn float_dtype(t: &Tensor) -> Result<Dtype> {
    match t.dtype {
        StDtype::Bf16 => Ok(Dtype::Bf16),
        StDtype::F16 => Ok(Dtype::F16),
        StDtype::F32 => Ok(Dtype::F32),
        other => Err(Error::Dtype {
            name: t.name.to_string(),
            dtype: other.name().to_string(),
        }),
    }
}

pub fn shape_err(t: &Tensor, expected: Vec<usize>) -> Error {
    Error::Shape {
        name: t.name.to_string(),
        expected,
        found: t.shape.to_vec(),
    }
}
