//! GQA softmax attention over a KV cache: plain (qwen3_moe) or with the
//! per-head output gate and partial RoPE of Qwen3.5 / Qwen3-Next.

use super::{load_mat, load_vec, Ctx};
use crate::backend::{AttnArgs, AttnSeqs, Backend, CachePair, Rotary, Strided};
use crate::config::{ModelConfig, QkNorm};
use crate::error::Result;
use crate::format::packed::WeightsFile;

pub struct GqaWeights<B: Backend> {
    /// `[H·hd·(2 if gated), hidden]`; gated: per head `[q | gate]`.
    q_proj: B::Matrix,
    k_proj: B::Matrix, // [Hkv·hd, hidden]
    v_proj: B::Matrix, // [Hkv·hd, hidden]
    o_proj: B::Matrix, // [hidden, H·hd]
    /// q and k norms: `[hd]` each (per head) or `[H·hd]`, `[Hkv·hd]` (per layer).
    qk_norm: Option<(B::Buf, B::Buf)>,
    /// q, k, v biases `[rows]` each.
    qkv_bias: Option<[B::Buf; 3]>,
    o_bias: Option<B::Buf>, // [hidden]
    gated: bool,
}

/// y `[n, d]` += bias `[d]` on every row.
pub(super) fn add_bias<B: Backend>(b: &B, y: &mut B::Buf, bias: &B::Buf, n: usize, d: usize) -> Result<()> {
    let mut rows = b.alloc(n * d)?; // [n, d], the bias on every row
    b.copy(
        bias,
        &mut rows,
        Strided {
            rows: n,
            width: d,
            src_off: 0,
            src_stride: 0,
            dst_off: 0,
            dst_stride: d,
        },
    )?;
    b.add(y, &rows, n * d)
}

impl<B: Backend> GqaWeights<B> {
    pub fn load(b: &B, wf: &WeightsFile, p: &str, cfg: &ModelConfig) -> Result<Self> {
        let (h, kv, hd, hid) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.hidden_size,
        );
        let o = &cfg.attn;
        let gated = o.output_gate;
        let qrows = h * hd * if gated { 2 } else { 1 };
        let s = |n: &str| format!("{p}.self_attn.{n}");
        let qk_norm = match o.qk_norm {
            QkNorm::None => None,
            QkNorm::PerHead => Some((
                load_vec(b, wf, &s("q_norm.weight"), hd)?,
                load_vec(b, wf, &s("k_norm.weight"), hd)?,
            )),
            QkNorm::PerLayer => Some((
                load_vec(b, wf, &s("q_norm.weight"), h * hd)?,
                load_vec(b, wf, &s("k_norm.weight"), kv * hd)?,
            )),
        };
        let qkv_bias = match o.qkv_bias {
            true => Some([
                load_vec(b, wf, &s("q_proj.bias"), qrows)?,
                load_vec(b, wf, &s("k_proj.bias"), kv * hd)?,
                load_vec(b, wf, &s("v_proj.bias"), kv * hd)?,
            ]),
            false => None,
        };
        let o_bias = match o.o_bias {
            true => Some(load_vec(b, wf, &s("o_proj.bias"), hid)?),
            false => None,
        };
        Ok(GqaWeights {
            q_proj: load_mat(b, wf, &s("q_proj"), qrows, hid)?,
            k_proj: load_mat(b, wf, &s("k_proj"), kv * hd, hid)?,
            v_proj: load_mat(b, wf, &s("v_proj"), kv * hd, hid)?,
            o_proj: load_mat(b, wf, &s("o_proj"), hid, h * hd)?,
            qk_norm,
            qkv_bias,
            o_bias,
            gated,
        })
    }

    /// x `[n, hidden]` (normed) → out `[n, hidden]`; appends each
    /// sequence's K/V to its caches `[capacity, Hkv, hd]` at its `pos0`.
    pub fn forward(&self, c: &Ctx<B>, x: &B::Buf, caches: &mut [CachePair<'_, B>], out: &mut B::Buf) -> Result<()> {
        let (b, cfg, n) = (c.b, c.cfg, c.n);
        let (h, kv, hd) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
        // q (gated: per head `[q | gate]`), k and v in one call.
        let mut qp = b.alloc(n * h * hd * if self.gated { 2 } else { 1 })?;
        let mut k = b.alloc(n * kv * hd)?;
        let mut v = b.alloc(n * kv * hd)?;
        b.linear_many(
            &[&self.q_proj, &self.k_proj, &self.v_proj],
            x,
            n,
            &mut [&mut qp, &mut k, &mut v],
        )?;
        if let Some([bq, bk, bv]) = &self.qkv_bias {
            add_bias(b, &mut qp, bq, n, h * hd * if self.gated { 2 } else { 1 })?;
            add_bias(b, &mut k, bk, n, kv * hd)?;
            add_bias(b, &mut v, bv, n, kv * hd)?;
        }
        let (q, gate) = if self.gated {
            let mut q = b.alloc(n * h * hd)?;
            let mut g = b.alloc(n * h * hd)?;
            let split = |off| Strided {
                rows: n * h,
                width: hd,
                src_off: off,
                src_stride: 2 * hd,
                dst_off: 0,
                dst_stride: hd,
            };
            b.copy(&qp, &mut q, split(0))?;
            b.copy(&qp, &mut g, split(hd))?;
            (q, Some(g))
        } else {
            (qp, None)
        };
        let (mut qn, mut kn) = match &self.qk_norm {
            None => (q, k),
            Some((qw, kw)) => {
                let mut qn = b.alloc(n * h * hd)?;
                let mut kn = b.alloc(n * kv * hd)?;
                // Per head: rows of hd; per layer: one row of all heads a token.
                let (qr, kr, qd, kd) = if cfg.attn.qk_norm == QkNorm::PerHead {
                    (n * h, n * kv, hd, hd)
                } else {
                    (n, n, h * hd, kv * hd)
                };
                b.rms_norm(&q, qw, qr, qd, cfg.rms_norm_eps, &mut qn)?;
                b.rms_norm(&k, kw, kr, kd, cfg.rms_norm_eps, &mut kn)?;
                (qn, kn)
            }
        };
        let mut o = b.alloc(n * h * hd)?;
        let x = AttnSeqs {
            q: &mut qn,
            k: &mut kn,
            v: &v,
            inv_freq: c.inv_freq,
            rope: Rotary {
                rot_off: 0,
                rot_dim: cfg.rotary_dim(),
                interleaved: false,
                mscale: c.rope_mscale,
            },
            attn: AttnArgs {
                n,
                pos0: 0,
                n_heads: h,
                n_kv_heads: kv,
                head_dim: hd,
                v_dim: hd,
                scale: (hd as f32).powf(-0.5),
            },
        };
        b.attention_seqs(x, caches, c.segs, &mut o)?;
        if let Some(g) = &gate {
            b.sigmoid_mul(&mut o, g, n * h * hd)?;
        }
        b.linear(&self.o_proj, &o, n, out)?;
        match &self.o_bias {
            Some(bias) => add_bias(b, out, bias, n, cfg.hidden_size),
            None => Ok(()),
        }
    }
}
