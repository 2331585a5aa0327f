//! DeepSeek-V3 multi-head latent attention, computed in absorbed form
//! over a cache of the normalized latent and the rotated rope key.

use super::{load_mat, load_vec, Ctx};
use crate::backend::seqs::per_seq;
use crate::backend::{Backend, CachePair, MlaArgs, RopeArgs, Strided};
use crate::config::{MlaConfig, ModelConfig};
use crate::error::{Error, Result};
use crate::format::packed::WeightsFile;

/// `q_a_layernorm` and `kv_a_layernorm` use this eps whatever the config says.
const LORA_NORM_EPS: f32 = 1e-6;

enum QProj<B: Backend> {
    Lora {
        q_a: B::Matrix, // [q_lora, hidden]
        norm: B::Buf,   // [q_lora]
        q_b: B::Matrix, // [H·(dn+dr), q_lora]
        rank: usize,
    },
    Direct(B::Matrix), // [H·(dn+dr), hidden]
}

pub struct MlaWeights<B: Backend> {
    q: QProj<B>,
    kv_a: B::Matrix, // [kvr + dr, hidden]
    kv_norm: B::Buf, // [kvr]
    /// `[H·(dn + dv), kvr]` in f32: the absorbed attention reads it per head.
    kv_b: B::Buf,
    o_proj: B::Matrix, // [hidden, H·dv]
}

pub fn mla_cfg(cfg: &ModelConfig) -> Result<&MlaConfig> {
    cfg.mla
        .as_ref()
        .ok_or_else(|| Error::config("kv_lora_rank", "missing for an MLA layer"))
}

impl<B: Backend> MlaWeights<B> {
    pub fn load(b: &B, wf: &WeightsFile, p: &str, cfg: &ModelConfig) -> Result<Self> {
        let m = mla_cfg(cfg)?;
        let (h, hid) = (cfg.num_attention_heads, cfg.hidden_size);
        let qd = m.qk_nope_head_dim + m.qk_rope_head_dim;
        let a = |s: &str| format!("{p}.self_attn.{s}");
        let q = match m.q_lora_rank {
            Some(r) => QProj::Lora {
                q_a: load_mat(b, wf, &a("q_a_proj"), r, hid)?,
                norm: load_vec(b, wf, &a("q_a_layernorm.weight"), r)?,
                q_b: load_mat(b, wf, &a("q_b_proj"), h * qd, r)?,
                rank: r,
            },
            None => QProj::Direct(load_mat(b, wf, &a("q_proj"), h * qd, hid)?),
        };
        let kv_b = wf.matrix(&a("kv_b_proj"), h * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)?;
        Ok(MlaWeights {
            q,
            kv_a: load_mat(
                b,
                wf,
                &a("kv_a_proj_with_mqa"),
                m.kv_lora_rank + m.qk_rope_head_dim,
                hid,
            )?,
            kv_norm: load_vec(b, wf, &a("kv_a_layernorm.weight"), m.kv_lora_rank)?,
            kv_b: b.upload(&kv_b.to_f32())?,
            o_proj: load_mat(b, wf, &a("o_proj"), hid, h * m.v_head_dim)?,
        })
    }

    /// x `[n, hidden]` (normed) → out `[n, hidden]`; appends each
    /// sequence's latent and rope key to its caches at its `pos0`.
    pub fn forward(&self, c: &Ctx<B>, x: &B::Buf, caches: &mut [CachePair<'_, B>], out: &mut B::Buf) -> Result<()> {
        let (b, cfg, n) = (c.b, c.cfg, c.n);
        let m = mla_cfg(cfg)?;
        let h = cfg.num_attention_heads;
        let (dn, dr, dv, r) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank);
        let qd = dn + dr;
        let mut q = b.alloc(n * h * qd)?;
        let mut ckv = b.alloc(n * (r + dr))?;
        match &self.q {
            QProj::Lora { q_a, norm, q_b, rank } => {
                let mut t = b.alloc(n * rank)?;
                b.linear_many(&[q_a, &self.kv_a], x, n, &mut [&mut t, &mut ckv])?;
                let mut tn = b.alloc(n * rank)?;
                b.rms_norm(&t, norm, n, *rank, LORA_NORM_EPS, &mut tn)?;
                b.linear(q_b, &tn, n, &mut q)?;
            }
            QProj::Direct(w) => b.linear_many(&[w, &self.kv_a], x, n, &mut [&mut q, &mut ckv])?,
        }
        // ckv `[n, r + dr]` → the latent `[n, r]` (normed) and k_pe `[n, dr]`.
        let part = |width, src_off| Strided {
            rows: n,
            width,
            src_off,
            src_stride: r + dr,
            dst_off: 0,
            dst_stride: width,
        };
        let mut c_kv = b.alloc(n * r)?;
        b.copy(&ckv, &mut c_kv, part(r, 0))?;
        let mut c_norm = b.alloc(n * r)?;
        b.rms_norm(&c_kv, &self.kv_norm, n, r, LORA_NORM_EPS, &mut c_norm)?;
        let mut k_rot = b.alloc(n * dr)?;
        b.copy(&ckv, &mut k_rot, part(dr, r))?;

        let mut o = b.alloc(n * h * dv)?;
        let widths = [h * qd, r, dr];
        per_seq(
            c.b,
            c.segs,
            [&mut q, &mut c_norm, &mut k_rot],
            widths,
            (&mut o, h * dv),
            caches,
            |s, [q, c_norm, k_rot], (latent, kpe), o| {
                let rope = |heads, stride| RopeArgs {
                    n_tokens: s.n,
                    n_heads: heads,
                    head_stride: stride,
                    token_stride: heads * stride,
                    rot_off: stride - dr,
                    rot_dim: dr,
                    pos0: s.pos0,
                    interleaved: m.rope_interleave,
                    mscale: c.rope_mscale,
                };
                b.rope(q, c.inv_freq, rope(h, qd))?;
                b.cache_store(c_norm, 0, s.n, latent, s.pos0)?;
                b.rope(k_rot, c.inv_freq, rope(1, dr))?;
                b.cache_store(k_rot, 0, s.n, kpe, s.pos0)?;
                let args = MlaArgs {
                    n: s.n,
                    pos0: s.pos0,
                    n_heads: h,
                    nope: dn,
                    rope: dr,
                    v_dim: dv,
                    kv_lora_rank: r,
                    scale: c.attn_scale,
                };
                b.mla_attention(q, latent, kpe, &self.kv_b, args, o)
            },
        )?;
        b.linear(&self.o_proj, &o, n, out)
    }
}
