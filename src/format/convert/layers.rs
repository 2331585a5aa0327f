//! Planning the entries of the model's table (`arch::table`): dense
//! tensors by their role, Qwen3-Next's fused projections, and the routed
//! experts from whichever layout the checkpoint uses.

use super::matrix::{SrcMatrix, Storage, Target};
use super::plan::{shape_err, ExpertLayer, Item, Planner, Rule, VectorItem};
use crate::arch::{Entry, Mat, TensorKind, Vector};
use crate::error::{Error, Result};
use crate::format::packed::LayerLayout;

impl<'a> Planner<'a> {
    /// Plan one entry of the model's table (`arch::table`).
    pub fn entry(&mut self, e: Entry) -> Result<()> {
        let t = match e {
            Entry::Experts { layer } => {
                let l = self.experts(layer)?;
                self.items.push(Item::Experts(l));
                return Ok(());
            }
            Entry::Dense(t) => t,
        };
        let (name, shape) = (t.name.as_str(), t.shape.as_slice());
        match (t.kind, shape) {
            (TensorKind::Matrix(m), &[rows, cols]) => {
                if name.ends_with(".linear_attn.in_proj_qkv") && self.fused_delta_net(name)? {
                    return Ok(());
                }
                if self.split_fused
                    && [".in_proj_z", ".in_proj_b", ".in_proj_a"]
                        .iter()
                        .any(|s| name.ends_with(s))
                {
                    return Ok(());
                }
                let rule = match m {
                    Mat::Router | Mat::Gate => Rule::Router,
                    Mat::RouterFloat => Rule::Float,
                    Mat::Embed | Mat::Linear | Mat::Writer => Rule::Default,
                };
                self.matrix(name, rows, cols, rule)
            }
            (TensorKind::Vector(Vector::Norm { zero_centred }), &[len]) => self.norm(name, len, zero_centred),
            (TensorKind::Vector(_), &[len]) => self.vector(name, len, false),
            (TensorKind::Conv1d, &[c, k]) => self.conv1d(name, c, k),
            _ => Err(Error::Convert(format!("table entry `{name}` has shape {shape:?}"))),
        }
    }

    /// Qwen3-Next's fused projections, split into the four that Qwen3.5
    /// names (SPEC.md §5), where the checkpoint has them; `qkv` is the
    /// packed name of `in_proj_qkv`.
    fn fused_delta_net(&mut self, qkv: &str) -> Result<bool> {
        let a = qkv.trim_end_matches(".in_proj_qkv").to_string();
        if !self.src.has(&format!("{a}.in_proj_qkvz.weight")) {
            return Ok(false);
        }
        let Some(l) = self.cfg.linear.clone() else {
            return Err(Error::config(
                "linear_num_key_heads",
                "missing for a linear-attention layer",
            ));
        };
        let h = self.cfg.hidden_size;
        let (hk, dk, hv, dv) = (l.num_key_heads, l.key_head_dim, l.num_value_heads, l.value_head_dim);
        let r = hv / hk;
        let g_rows = 2 * dk + 2 * r * dv;
        let qkvz = self.load(&format!("{a}.in_proj_qkvz.weight"), 0, hk * g_rows, h)?;
        let ba = self.load(&format!("{a}.in_proj_ba.weight"), 0, hk * 2 * r, h)?;
        let group = |g: usize, off: usize, n: usize| (g * g_rows + off)..(g * g_rows + off + n);
        let (mut qkv, mut z, mut b, mut av) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (off, n) in [(0, dk), (dk, dk), (2 * dk, r * dv)] {
            (0..hk).for_each(|g| qkv.extend(group(g, off, n)));
        }
        (0..hk).for_each(|g| z.extend(group(g, 2 * dk + r * dv, r * dv)));
        (0..hk).for_each(|g| b.extend(g * 2 * r..g * 2 * r + r));
        (0..hk).for_each(|g| av.extend(g * 2 * r + r..(g + 1) * 2 * r));
        self.push_matrix(&format!("{a}.in_proj_qkv"), qkvz.select(&qkv), Rule::Default);
        self.push_matrix(&format!("{a}.in_proj_z"), qkvz.select(&z), Rule::Default);
        self.push_matrix(&format!("{a}.in_proj_b"), ba.select(&b), Rule::Default);
        self.push_matrix(&format!("{a}.in_proj_a"), ba.select(&av), Rule::Default);
        self.split_fused = true;
        Ok(true)
    }

    /// The depthwise conv weight, stored `[channels, kernel]` (from HF's
    /// `[C, 1, K]` or MLX's `[C, K, 1]`: the same bytes either way).
    fn conv1d(&mut self, name: &str, c: usize, k: usize) -> Result<()> {
        let t = self.require(name)?;
        super::plan::float_dtype(&t)?;
        if t.shape != [c, 1, k] && t.shape != [c, k, 1] {
            return Err(shape_err(&t, vec![c, 1, k]));
        }
        self.items.push(Item::Vector(VectorItem {
            name: name.to_string(),
            shape: vec![c, k],
            src: t,
            add_one: false,
        }));
        Ok(())
    }

    /// The routed experts of layer `i`, from whichever of the three
    /// layouts the checkpoint uses.
    fn experts(&mut self, i: usize) -> Result<ExpertLayer<'a>> {
        let c = self.cfg;
        let (h, inter, n) = (c.hidden_size, c.moe_intermediate_size, c.num_experts);
        let p = format!("model.layers.{i}.mlp");
        let mut experts: Vec<[SrcMatrix<'a>; 3]> = Vec::with_capacity(n);
        if self.src.has(&format!("{p}.experts.0.gate_proj.weight")) {
            for e in 0..n {
                let x = format!("{p}.experts.{e}");
                experts.push([
                    self.load(&format!("{x}.gate_proj.weight"), 0, inter, h)?,
                    self.load(&format!("{x}.up_proj.weight"), 0, inter, h)?,
                    self.load(&format!("{x}.down_proj.weight"), 0, h, inter)?,
                ]);
            }
        } else if self.src.has(&format!("{p}.experts.gate_up_proj")) {
            let gu = self.load(&format!("{p}.experts.gate_up_proj"), n, 2 * inter, h)?;
            let dn = self.load(&format!("{p}.experts.down_proj"), n, h, inter)?;
            for e in 0..n {
                let at = e * 2 * inter;
                experts.push([gu.slice(at, inter), gu.slice(at + inter, inter), dn.slice(e * h, h)]);
            }
        } else if self.src.has(&format!("{p}.switch_mlp.gate_proj.weight")) {
            let x = format!("{p}.switch_mlp");
            let g = self.load(&format!("{x}.gate_proj.weight"), n, inter, h)?;
            let u = self.load(&format!("{x}.up_proj.weight"), n, inter, h)?;
            let d = self.load(&format!("{x}.down_proj.weight"), n, h, inter)?;
            for e in 0..n {
                experts.push([g.slice(e * inter, inter), u.slice(e * inter, inter), d.slice(e * h, h)]);
            }
        } else {
            return Err(Error::MissingTensor {
                name: format!("{p}.experts.0.gate_proj.weight"),
                where_: Some(format!(
                    "{} (nor the stacked `experts.gate_up_proj` or MLX `switch_mlp` layouts)",
                    self.src.dir.display()
                )),
            });
        }
        let (target, layout) = self.expert_form(i, &experts)?;
        Ok(ExpertLayer {
            layer: i,
            experts,
            target,
            layout,
        })
    }

    /// How layer `i`'s experts are stored: repacked when the source is
    /// quantized (one width per layer), else quantized at the expert bits
    /// or kept as floats.
    fn expert_form(&mut self, i: usize, experts: &[[SrcMatrix<'a>; 3]]) -> Result<(Target, LayerLayout)> {
        let (h, inter) = (self.cfg.hidden_size, self.cfg.moe_intermediate_size);
        let first = &experts[0][0];
        let q = first.quant_params();
        let gs = self.set.group_size;
        // GGUF: experts that are not all in one exactly held form are
        // requantized as a whole, when the user asked for it.
        let blocks = experts
            .iter()
            .flatten()
            .any(|m| matches!(m.storage, Storage::Gguf { .. }));
        let one_form = experts.iter().flatten().all(|m| m.quant_params() == q);
        if let (true, false, Some(bits)) = (blocks, one_form && q.is_some(), self.set.requantize) {
            if h % gs == 0 && inter % gs == 0 {
                self.expert_group(i, gs)?;
                let target = Target::Quantize { bits, group_size: gs };
                return Ok((target, LayerLayout::quantized(h, inter, bits, gs)));
            }
        }
        for m in experts.iter().flatten() {
            if m.quant_params() != q {
                return Err(Error::Convert(format!(
                    "layer {i}: experts `{}` and `{}` are stored differently (quantized at different widths, \
                     or quantized and not); moeflux needs one form per layer",
                    first.name, m.name
                )));
            }
        }
        if let Some((bits, gs, sd)) = q {
            self.expert_group(i, gs)?;
            return Ok((Target::Repack, LayerLayout::quantized_scales(h, inter, bits, gs, sd)));
        }
        let float = Target::Float(first.float_dtype());
        let target = match self.set.expert_bits {
            _ if self.src.mlx.is_some() || self.src.gguf.is_some() => float,
            None => float,
            Some(_) if h % gs != 0 || inter % gs != 0 => {
                self.notes.push(format!(
                    "layer {i}: experts kept unquantized: hidden {h} or moe_intermediate_size {inter} is not a multiple of group size {gs}"
                ));
                float
            }
            Some(bits) => {
                self.expert_group(i, gs)?;
                Target::Quantize { bits, group_size: gs }
            }
        };
        let layout = match target {
            Target::Quantize { bits, group_size } => LayerLayout::quantized(h, inter, bits, group_size),
            _ => LayerLayout::float(h, inter, first.float_dtype()),
        };
        Ok((target, layout))
    }

    /// `layout.json` has one group size for all expert files.
    fn expert_group(&mut self, i: usize, gs: usize) -> Result<()> {
        match self.expert_group_size {
            Some(g) if g != gs => Err(Error::Convert(format!(
                "layer {i}: experts use group size {gs}, earlier layers {g}; one group size for all experts is supported"
            ))),
            _ => {
                self.expert_group_size = Some(gs);
                Ok(())
            }
        }
    }
}
