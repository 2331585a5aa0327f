//! The GatedDeltaNet block of Qwen3.5 / Qwen3-Next (SPEC.md §5).

use super::{load_mat, load_vec, Ctx};
use crate::backend::{Backend, DeltaArgs, DeltaWeights, StatePair};
use crate::config::{LinearAttnConfig, ModelConfig};
use crate::error::{Error, Result};
use crate::format::packed::WeightsFile;

pub struct DeltaNetWeights<B: Backend> {
    in_proj_qkv: B::Matrix, // [conv_dim, hidden]
    in_proj_z: B::Matrix,   // [Hv·Dv, hidden]
    in_proj_b: B::Matrix,   // [Hv, hidden]
    in_proj_a: B::Matrix,   // [Hv, hidden]
    out_proj: B::Matrix,    // [hidden, Hv·Dv]
    conv_w: B::Buf,         // [conv_dim, kernel]
    a_log: B::Buf,          // [Hv]
    dt_bias: B::Buf,        // [Hv]
    norm: B::Buf,           // [Dv]
}

pub fn linear_cfg(cfg: &ModelConfig) -> Result<&LinearAttnConfig> {
    cfg.linear
        .as_ref()
        .ok_or_else(|| Error::config("linear_num_key_heads", "missing for a linear-attention layer"))
}

impl<B: Backend> DeltaNetWeights<B> {
    pub fn load(b: &B, wf: &WeightsFile, p: &str, cfg: &ModelConfig) -> Result<Self> {
        let l = linear_cfg(cfg)?;
        let (hid, hv, dv) = (cfg.hidden_size, l.num_value_heads, l.value_head_dim);
        let a = |s: &str| format!("{p}.linear_attn.{s}");
        Ok(DeltaNetWeights {
            in_proj_qkv: load_mat(b, wf, &a("in_proj_qkv"), l.conv_dim(), hid)?,
            in_proj_z: load_mat(b, wf, &a("in_proj_z"), hv * dv, hid)?,
            in_proj_b: load_mat(b, wf, &a("in_proj_b"), hv, hid)?,
            in_proj_a: load_mat(b, wf, &a("in_proj_a"), hv, hid)?,
            out_proj: load_mat(b, wf, &a("out_proj"), hid, hv * dv)?,
            conv_w: load_vec(b, wf, &a("conv1d.weight"), l.conv_dim() * l.conv_kernel)?,
            a_log: load_vec(b, wf, &a("A_log"), hv)?,
            dt_bias: load_vec(b, wf, &a("dt_bias"), hv)?,
            norm: load_vec(b, wf, &a("norm.weight"), dv)?,
        })
    }

    /// x `[n, hidden]` (normed) → out `[n, hidden]`, advancing the state.
    pub fn forward(&self, c: &Ctx<B>, x: &B::Buf, states: &mut [StatePair<'_, B>], out: &mut B::Buf) -> Result<()> {
        let (b, n) = (c.b, c.n);
        let l = linear_cfg(c.cfg)?;
        let (hv, dv) = (l.num_value_heads, l.value_head_dim);
        let mut qkv = b.alloc(n * l.conv_dim())?;
        let mut z = b.alloc(n * hv * dv)?;
        let mut beta = b.alloc(n * hv)?;
        let mut alpha = b.alloc(n * hv)?;
        b.linear_many(
            &[&self.in_proj_qkv, &self.in_proj_z, &self.in_proj_b, &self.in_proj_a],
            x,
            n,
            &mut [&mut qkv, &mut z, &mut beta, &mut alpha],
        )?;
        let mut o = b.alloc(n * hv * dv)?;
        let args = DeltaArgs {
            n,
            k_heads: l.num_key_heads,
            v_heads: hv,
            k_dim: l.key_head_dim,
            v_dim: dv,
            kernel: l.conv_kernel,
        };
        let w = DeltaWeights {
            conv_w: &self.conv_w,
            a_log: &self.a_log,
            dt_bias: &self.dt_bias,
        };
        b.gated_delta_seqs(&mut qkv, &mut alpha, &mut beta, w, states, c.segs, args, &mut o)?;
        let mut y = b.alloc(n * hv * dv)?;
        b.gated_rms_norm(&o, &z, &self.norm, n * hv, dv, c.cfg.rms_norm_eps, &mut y)?;
        b.linear(&self.out_proj, &y, n, out)
    }
}
