//! GQA softmax attention over a KV cache: plain (qwen3_moe) or with the
//! per-head output gate and partial RoPE of Qwen3.5 / Qwen3-Next.

use super::{load_mat, load_vec, Ctx};
use crate::backend::{AttnArgs, AttnSeqs, Backend, Rotary, StatePair, Strided};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::format::packed::WeightsFile;

pub struct GqaWeights<B: Backend> {
    /// `[H·hd·(2 if gated), hidden]`; gated: per head `[q | gate]`.
    q_proj: B::Matrix,
    k_proj: B::Matrix, // [Hkv·hd, hidden]
    v_proj: B::Matrix, // [Hkv·hd, hidden]
    o_proj: B::Matrix, // [hidden, H·hd]
    q_norm: B::Buf,    // [hd]
    k_norm: B::Buf,    // [hd]
    gated: bool,
}

impl<B: Backend> GqaWeights<B> {
    pub fn load(b: &B, wf: &WeightsFile, p: &str, cfg: &ModelConfig) -> Result<Self> {
        let (h, kv, hd, hid) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.hidden_size,
        );
        let gated = cfg.arch.is_hybrid();
        let qrows = h * hd * if gated { 2 } else { 1 };
        Ok(GqaWeights {
            q_proj: load_mat(b, wf, &format!("{p}.self_attn.q_proj"), qrows, hid)?,
            k_proj: load_mat(b, wf, &format!("{p}.self_attn.k_proj"), kv * hd, hid)?,
            v_proj: load_mat(b, wf, &format!("{p}.self_attn.v_proj"), kv * hd, hid)?,
            o_proj: load_mat(b, wf, &format!("{p}.self_attn.o_proj"), hid, h * hd)?,
            q_norm: load_vec(b, wf, &format!("{p}.self_attn.q_norm.weight"), hd)?,
            k_norm: load_vec(b, wf, &format!("{p}.self_attn.k_norm.weight"), hd)?,
            gated,
        })
    }

    /// x `[n, hidden]` (normed) → out `[n, hidden]`; appends each
    /// sequence's K/V to its caches `[capacity, Hkv, hd]` at its `pos0`.
    pub fn forward(&self, c: &Ctx<B>, x: &B::Buf, caches: &mut [StatePair<'_, B>], out: &mut B::Buf) -> Result<()> {
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
        let mut qn = b.alloc(n * h * hd)?;
        let mut kn = b.alloc(n * kv * hd)?;
        b.rms_norm(&q, &self.q_norm, n * h, hd, cfg.rms_norm_eps, &mut qn)?;
        b.rms_norm(&k, &self.k_norm, n * kv, hd, cfg.rms_norm_eps, &mut kn)?;
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
                mscale: 1.0,
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
        b.linear(&self.o_proj, &o, n, out)
    }
}
