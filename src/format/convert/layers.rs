//! The tensors of one decoder layer, per architecture (SPEC.md §2 names,
//! shapes from the config).

use super::matrix::{SrcMatrix, Target};
use super::plan::{shape_err, ExpertLayer, Item, Planner, Rule, VectorItem};
use crate::config::{Arch, AttnKind, FfnKind};
use crate::error::{Error, Result};
use crate::format::packed::LayerLayout;

impl<'a> Planner<'a> {
    pub fn layer(&mut self, i: usize) -> Result<()> {
        let spec = self.cfg.layers[i];
        let (p, h) = (format!("model.layers.{i}"), self.cfg.hidden_size);
        self.norm(&format!("{p}.input_layernorm.weight"), h, true)?;
        match spec.attn {
            AttnKind::Full => self.gqa(&p)?,
            AttnKind::Linear => self.linear_attn(&p)?,
            AttnKind::Mla => self.mla(&p)?,
        }
        self.norm(&format!("{p}.post_attention_layernorm.weight"), h, true)?;
        match spec.ffn {
            FfnKind::Dense => self.mlp(&format!("{p}.mlp"), self.cfg.intermediate_size),
            FfnKind::Moe => self.moe(i),
        }
    }

    /// GQA attention; in hybrid models q_proj also yields the output gate.
    fn gqa(&mut self, p: &str) -> Result<()> {
        let c = self.cfg;
        let (h, hd) = (c.hidden_size, c.head_dim);
        let q_rows = c.num_attention_heads * hd * if c.arch.is_hybrid() { 2 } else { 1 };
        self.matrix(&format!("{p}.self_attn.q_proj"), q_rows, h, Rule::Default)?;
        self.matrix(
            &format!("{p}.self_attn.k_proj"),
            c.num_key_value_heads * hd,
            h,
            Rule::Default,
        )?;
        self.matrix(
            &format!("{p}.self_attn.v_proj"),
            c.num_key_value_heads * hd,
            h,
            Rule::Default,
        )?;
        self.matrix(
            &format!("{p}.self_attn.o_proj"),
            h,
            c.num_attention_heads * hd,
            Rule::Default,
        )?;
        self.norm(&format!("{p}.self_attn.q_norm.weight"), hd, true)?;
        self.norm(&format!("{p}.self_attn.k_norm.weight"), hd, true)
    }

    /// GatedDeltaNet; Qwen3-Next's fused projections are split (SPEC.md §5).
    fn linear_attn(&mut self, p: &str) -> Result<()> {
        let Some(l) = self.cfg.linear.clone() else {
            return Err(Error::config(
                "linear_num_key_heads",
                "missing for a linear-attention layer",
            ));
        };
        let h = self.cfg.hidden_size;
        let (hk, dk, hv, dv) = (l.num_key_heads, l.key_head_dim, l.num_value_heads, l.value_head_dim);
        let a = format!("{p}.linear_attn");
        if self.src.has(&format!("{a}.in_proj_qkvz.weight")) {
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
        } else {
            self.matrix(&format!("{a}.in_proj_qkv"), l.conv_dim(), h, Rule::Default)?;
            self.matrix(&format!("{a}.in_proj_z"), hv * dv, h, Rule::Default)?;
            self.matrix(&format!("{a}.in_proj_b"), hv, h, Rule::Default)?;
            self.matrix(&format!("{a}.in_proj_a"), hv, h, Rule::Default)?;
        }
        self.conv1d(&format!("{a}.conv1d.weight"), l.conv_dim(), l.conv_kernel)?;
        self.vector(&format!("{a}.A_log"), hv, false)?;
        self.vector(&format!("{a}.dt_bias"), hv, false)?;
        self.norm(&format!("{a}.norm.weight"), dv, false)?;
        self.matrix(&format!("{a}.out_proj"), h, hv * dv, Rule::Default)
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

    /// DeepSeek multi-head latent attention.
    fn mla(&mut self, p: &str) -> Result<()> {
        let c = self.cfg;
        let Some(m) = c.mla.clone() else {
            return Err(Error::config("kv_lora_rank", "missing for an MLA layer"));
        };
        let (h, nh) = (c.hidden_size, c.num_attention_heads);
        let qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
        let s = format!("{p}.self_attn");
        match m.q_lora_rank {
            Some(r) => {
                self.matrix(&format!("{s}.q_a_proj"), r, h, Rule::Default)?;
                self.norm(&format!("{s}.q_a_layernorm.weight"), r, false)?;
                self.matrix(&format!("{s}.q_b_proj"), nh * qk, r, Rule::Default)?;
            }
            None => self.matrix(&format!("{s}.q_proj"), nh * qk, h, Rule::Default)?,
        }
        let kv_a = m.kv_lora_rank + m.qk_rope_head_dim;
        self.matrix(&format!("{s}.kv_a_proj_with_mqa"), kv_a, h, Rule::Default)?;
        self.norm(&format!("{s}.kv_a_layernorm.weight"), m.kv_lora_rank, false)?;
        let kv_b = nh * (m.qk_nope_head_dim + m.v_head_dim);
        self.matrix(&format!("{s}.kv_b_proj"), kv_b, m.kv_lora_rank, Rule::Default)?;
        self.matrix(&format!("{s}.o_proj"), h, nh * m.v_head_dim, Rule::Default)
    }

    /// A SwiGLU MLP `prefix.{gate,up,down}_proj` of width `inter`.
    fn mlp(&mut self, prefix: &str, inter: usize) -> Result<()> {
        let h = self.cfg.hidden_size;
        self.matrix(&format!("{prefix}.gate_proj"), inter, h, Rule::Default)?;
        self.matrix(&format!("{prefix}.up_proj"), inter, h, Rule::Default)?;
        self.matrix(&format!("{prefix}.down_proj"), h, inter, Rule::Default)
    }

    /// Router, shared experts and routed experts of MoE layer `i`.
    fn moe(&mut self, i: usize) -> Result<()> {
        let c = self.cfg;
        let (h, e, s) = (c.hidden_size, c.num_experts, c.shared_expert_intermediate_size);
        let p = format!("model.layers.{i}.mlp");
        if c.arch == Arch::DeepseekV3 {
            self.matrix(&format!("{p}.gate"), e, h, Rule::Float)?;
            self.vector(&format!("{p}.gate.e_score_correction_bias"), e, false)?;
            if s > 0 {
                self.mlp(&format!("{p}.shared_experts"), s)?;
            }
        } else {
            self.matrix(&format!("{p}.gate"), e, h, Rule::Router)?;
            if s > 0 {
                self.mlp(&format!("{p}.shared_expert"), s)?;
                self.matrix(&format!("{p}.shared_expert_gate"), 1, h, Rule::Router)?;
            }
        }
        let layer = self.experts(i)?;
        self.items.push(Item::Experts(layer));
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
        let gs = self.set.group_size;
        let target = match self.set.expert_bits {
            _ if self.src.mlx.is_some() => float,
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
