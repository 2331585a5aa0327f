//! The `Backend` trait: a small set of coarse ops on backend-owned buffers,
//! against which each architecture is written once. `cpu` implements it
//! with rayon + SIMD; `cuda` implements the same ops on device buffers.
//! The model code never touches a buffer's contents: even routing happens
//! inside the backend's `moe`, so that a GPU with every expert resident
//! never waits for the host.

pub mod cpu;
pub mod cuda;
pub mod kv;
pub mod seqs;

use crate::config::Routing;
use crate::error::{Error, Result};
use crate::experts::ExpertStore;
use crate::format::MatrixView;
pub use kv::{KvType, KvTypes};
pub use seqs::{AttnSeqs, CachePair, Rotary, Seg, StatePair};
use std::sync::Arc;

/// A strided copy of `rows` rows of `width` elements:
/// `dst[dst_off + r·dst_stride + i] = src[src_off + r·src_stride + i]`.
#[derive(Debug, Clone, Copy)]
pub struct Strided {
    pub rows: usize,
    pub width: usize,
    pub src_off: usize,
    pub src_stride: usize,
    pub dst_off: usize,
    pub dst_stride: usize,
}

impl Strided {
    /// A plain contiguous copy of `len` elements.
    pub fn contiguous(len: usize, src_off: usize, dst_off: usize) -> Strided {
        Strided {
            rows: 1,
            width: len,
            src_off,
            src_stride: len,
            dst_off,
            dst_stride: len,
        }
    }
}

/// Rotary embedding applied in place to `x` viewed as
/// `[n_tokens, n_heads, head_stride]` (token stride `token_stride`):
/// channels `[rot_off, rot_off + rot_dim)` of every head are rotated for the positions
/// `pos0 .. pos0 + n_tokens`, angle `pos·inv_freq[j]` (computed in f32),
/// and cos/sin are multiplied by `mscale`.
#[derive(Debug, Clone, Copy)]
pub struct RopeArgs {
    pub n_tokens: usize,
    pub n_heads: usize,
    pub head_stride: usize,
    pub token_stride: usize,
    pub rot_off: usize,
    pub rot_dim: usize,
    pub pos0: usize,
    /// Pairs `(2i, 2i+1)` when true, `(i, i + rot_dim/2)` otherwise.
    pub interleaved: bool,
    pub mscale: f32,
}

/// Causal GQA attention of `n` new queries at positions `pos0..pos0+n`
/// over a cache holding positions `0..pos0+n`.
/// q `[n, n_heads, head_dim]`; caches `[capacity, n_kv_heads, head_dim]`
/// (`v_dim` for V) in their own element types; out `[n, n_heads, v_dim]`.
#[derive(Debug, Clone, Copy)]
pub struct AttnArgs {
    pub n: usize,
    pub pos0: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub v_dim: usize,
    pub scale: f32,
}

/// Absorbed multi-head latent attention of `n` queries at `pos0..` over
/// `pos0 + n` cached positions.
/// q `[n, n_heads, nope + rope]` (rope part already rotated);
/// latent `[capacity, kv_lora_rank]` (normalized c_kv);
/// k_pe `[capacity, rope]` (rotated);
/// kv_b `[n_heads·(nope + v_dim), kv_lora_rank]` f32;
/// out `[n, n_heads, v_dim]`.
#[derive(Debug, Clone, Copy)]
pub struct MlaArgs {
    pub n: usize,
    pub pos0: usize,
    pub n_heads: usize,
    pub nope: usize,
    pub rope: usize,
    pub v_dim: usize,
    pub kv_lora_rank: usize,
    pub scale: f32,
}

/// One GatedDeltaNet step over `n` tokens (SPEC.md §5).
/// qkv `[n, conv_dim]` before the conv; a, b `[n, v_heads]`;
/// conv_w `[conv_dim, kernel]`; a_log, dt_bias `[v_heads]`;
/// conv_state `[kernel−1, conv_dim]` (oldest first), ssm_state
/// `[v_heads, v_dim, k_dim]`; out `[n, v_heads·v_dim]`.
#[derive(Debug, Clone, Copy)]
pub struct DeltaArgs {
    pub n: usize,
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub kernel: usize,
}

/// Weights of one GatedDeltaNet layer as the op needs them.
pub struct DeltaWeights<'a, B: Backend> {
    pub conv_w: &'a B::Buf,
    pub a_log: &'a B::Buf,
    pub dt_bias: &'a B::Buf,
}

// Three shared references: copied freely (a derive would ask `B: Copy`).
impl<B: Backend> Clone for DeltaWeights<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: Backend> Copy for DeltaWeights<'_, B> {}

/// The recurrent state of one GatedDeltaNet layer.
pub struct DeltaState<'a, B: Backend> {
    pub conv: &'a mut B::Buf,
    pub ssm: &'a mut B::Buf,
}

/// The routed experts of `n` tokens for one MoE layer: token `t` uses
/// experts `ids[t·k .. (t+1)·k]` with weights `weights[t·k ..]`.
#[derive(Debug, Clone)]
pub struct Routes {
    pub k: usize,
    pub ids: Vec<u32>,
    pub weights: Vec<f32>,
}

/// One MoE step over `n` tokens: route each token from its router logits
/// `[n, n_experts]` (`routing`, `k` experts per token, plus DeepSeek's
/// correction bias where given), then `out[t] += Σ_j w[t,j] ·
/// expert_j(x[t])` with x `[n, hidden]` and experts of width `inter` read
/// from the store for `layer`.
#[derive(Debug, Clone, Copy)]
pub struct MoeArgs<'a> {
    pub layer: usize,
    pub n: usize,
    pub hidden: usize,
    pub inter: usize,
    pub n_experts: usize,
    pub k: usize,
    pub routing: &'a Routing,
    /// Every sequence of the pass gives it one token (a decode step of
    /// `n` sequences), so each expert serves few tokens: a backend that
    /// streams experts may compute some misses where they lie (CUDA's
    /// `--hybrid`) instead of copying them; prefill chunks never do.
    pub decode: bool,
}

/// A guess at a later MoE layer's experts: that layer's router logits
/// `[n, n_experts]`, computed early on this layer's input (the pass's `n`
/// tokens), so that a backend which streams experts can start copying or
/// reading them while this layer computes.
pub struct MoeHint<'a, Buf> {
    pub layer: usize,
    pub logits: &'a Buf,
}

/// The tensors of one MoE layer's call: its input x `[n, hidden]`, its
/// router logits `[n, n_experts]` and selection bias `[n_experts]`, the
/// experts, and optionally a guess at a later layer's experts (the result
/// is the same with or without: a hint only moves copies earlier).
pub struct MoeInputs<'a, Buf> {
    pub x: &'a Buf,
    pub logits: &'a Buf,
    pub bias: Option<&'a Buf>,
    /// Shared: a backend may read experts on a thread of its own (CUDA's
    /// staging thread).
    pub store: &'a Arc<ExpertStore>,
    pub hint: Option<MoeHint<'a, Buf>>,
}

/// Each `(off, len)` of `parts` in a vector of its own, filled by
/// `download(off, out)`: [`Backend::download_parts`] one part at a time.
pub fn download_each(
    parts: &[(usize, usize)],
    mut download: impl FnMut(usize, &mut [f32]) -> Result<()>,
) -> Result<Vec<Vec<f32>>> {
    parts
        .iter()
        .map(|&(off, len)| {
            let mut v = vec![0.0f32; len];
            download(off, &mut v)?;
            Ok(v)
        })
        .collect()
}

pub trait Backend: Send + Sync + Sized + 'static {
    /// An f32 buffer in the backend's memory.
    type Buf: Send + Sync;
    /// A KV cache: rows of `width` values in a [`KvType`] (the row
    /// encoding of `kv.rs`, or the backend's own).
    type Cache: Send + Sync;
    /// A resident weight matrix.
    type Matrix: Send + Sync;

    fn name(&self) -> &'static str;

    /// Wait until all queued work is done (a no-op on synchronous backends).
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// A forward pass over `tokens` tokens begins: a backend may tune its
    /// launches to the size of the pass (CUDA launches with programmatic
    /// dependent launch in decode only). No effect on the results.
    fn begin_pass(&self, _tokens: usize) {}

    /// A zeroed buffer of `len` f32.
    fn alloc(&self, len: usize) -> Result<Self::Buf>;
    fn upload(&self, data: &[f32]) -> Result<Self::Buf>;
    /// Copy `out.len()` elements starting at `off` back to the host.
    fn download(&self, buf: &Self::Buf, off: usize, out: &mut [f32]) -> Result<()>;
    /// The elements `[off, off + len)` of `buf` for each `(off, len)` of
    /// `parts`, each in a vector of its own (the logits of each sequence
    /// of a pass). A backend may fetch them in one transfer.
    fn download_parts(&self, buf: &Self::Buf, parts: &[(usize, usize)]) -> Result<Vec<Vec<f32>>> {
        download_each(parts, |off, out| self.download(buf, off, out))
    }
    /// A cache of `rows` rows of `width` values of type `t` (contents
    /// undefined until stored).
    fn alloc_cache(&self, t: KvType, rows: usize, width: usize) -> Result<Self::Cache>;
    /// Rows `[row0, row0 + n)` of `cache` = rows `[src_row, src_row + n)`
    /// of `src` `[*, width]`, rounded to the cache's type.
    fn cache_store(
        &self,
        src: &Self::Buf,
        src_row: usize,
        n: usize,
        cache: &mut Self::Cache,
        row0: usize,
    ) -> Result<()>;
    /// The values of rows `[row0, row0 + out.len() / width)`, decoded.
    fn cache_download(&self, cache: &Self::Cache, row0: usize, out: &mut [f32]) -> Result<()>;
    /// Rows from `row0` on = `data` (whole rows), rounded to the type.
    fn cache_upload(&self, cache: &mut Self::Cache, row0: usize, width: usize, data: &[f32]) -> Result<()> {
        let src = self.upload(data)?;
        self.cache_store(&src, 0, data.len() / width.max(1), cache, row0)
    }
    /// Make a weight matrix resident.
    fn matrix(&self, m: &MatrixView) -> Result<Self::Matrix>;

    /// `y[n, rows] = x[n, cols] · Wᵀ`.
    fn linear(&self, w: &Self::Matrix, x: &Self::Buf, n: usize, y: &mut Self::Buf) -> Result<()>;
    /// `ys[i][n, rows_i] = x[n, cols] · W_iᵀ` for matrices that share their
    /// input (the same `cols`); a backend may run them in one launch.
    fn linear_many(&self, ws: &[&Self::Matrix], x: &Self::Buf, n: usize, ys: &mut [&mut Self::Buf]) -> Result<()> {
        if ws.len() != ys.len() {
            return Err(Error::Invalid(format!(
                "linear_many: {} matrices and {} outputs",
                ws.len(),
                ys.len()
            )));
        }
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            self.linear(w, x, n, y)?;
        }
        Ok(())
    }
    /// `y[n, rows] = (silu(gate) ⊙ up) · Wᵀ` with gate, up `[n, inter]` and
    /// W `[rows, inter]`: `swiglu` then `linear`, fused where a backend can.
    fn swiglu_linear(
        &self,
        w: &Self::Matrix,
        gate: &Self::Buf,
        up: &Self::Buf,
        n: usize,
        inter: usize,
        y: &mut Self::Buf,
    ) -> Result<()> {
        let mut h = self.alloc(n * inter)?; // [n, inter]
        self.swiglu(gate, up, n * inter, &mut h)?;
        self.linear(w, &h, n, y)
    }
    /// `y[t] = row tokens[t] of table`.
    fn embed(&self, table: &Self::Matrix, tokens: &[u32], y: &mut Self::Buf) -> Result<()>;

    /// `y[r] = x[r] / sqrt(mean(x[r]²) + eps) · w` for `rows` rows of `dim`.
    fn rms_norm(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        rows: usize,
        dim: usize,
        eps: f32,
        y: &mut Self::Buf,
    ) -> Result<()>;
    /// Gated norm: `y[r] = rms_norm(x[r])·w · silu(z[r])`.
    #[allow(clippy::too_many_arguments)]
    fn gated_rms_norm(
        &self,
        x: &Self::Buf,
        z: &Self::Buf,
        w: &Self::Buf,
        rows: usize,
        dim: usize,
        eps: f32,
        y: &mut Self::Buf,
    ) -> Result<()>;
    /// The residual step of a pre-norm block: `x[..rows·dim] += y`, then
    /// `out = rms_norm(x)·w` — exactly `add` then `rms_norm`.
    #[allow(clippy::too_many_arguments)]
    fn add_rms_norm(
        &self,
        x: &mut Self::Buf,
        y: &Self::Buf,
        w: &Self::Buf,
        rows: usize,
        dim: usize,
        eps: f32,
        out: &mut Self::Buf,
    ) -> Result<()> {
        self.add(x, y, rows * dim)?;
        self.rms_norm(x, w, rows, dim, eps, out)
    }
    /// `y[..len] += x[..len]`.
    fn add(&self, y: &mut Self::Buf, x: &Self::Buf, len: usize) -> Result<()>;
    /// `y[..len] += scale[r] · x` row-wise: rows of `dim`, `scale` on the host
    /// side already applied as sigmoid when `sigmoid` is set.
    fn add_scaled_rows(
        &self,
        y: &mut Self::Buf,
        x: &Self::Buf,
        scale: &Self::Buf,
        rows: usize,
        dim: usize,
        sigmoid: bool,
    ) -> Result<()>;
    /// `y[..len] = silu(gate) ⊙ up`.
    fn swiglu(&self, gate: &Self::Buf, up: &Self::Buf, len: usize, y: &mut Self::Buf) -> Result<()>;
    /// `x[..len] ⊙= sigmoid(gate)`.
    fn sigmoid_mul(&self, x: &mut Self::Buf, gate: &Self::Buf, len: usize) -> Result<()>;
    fn copy(&self, src: &Self::Buf, dst: &mut Self::Buf, s: Strided) -> Result<()>;

    fn rope(&self, x: &mut Self::Buf, inv_freq: &Self::Buf, a: RopeArgs) -> Result<()>;
    fn attention(
        &self,
        q: &Self::Buf,
        k: &Self::Cache,
        v: &Self::Cache,
        a: AttnArgs,
        out: &mut Self::Buf,
    ) -> Result<()>;
    fn mla_attention(
        &self,
        q: &Self::Buf,
        latent: &Self::Cache,
        k_pe: &Self::Cache,
        kv_b: &Self::Buf,
        a: MlaArgs,
        out: &mut Self::Buf,
    ) -> Result<()>;
    #[allow(clippy::too_many_arguments)]
    fn gated_delta(
        &self,
        qkv: &Self::Buf,
        a: &Self::Buf,
        b: &Self::Buf,
        w: DeltaWeights<'_, Self>,
        state: DeltaState<'_, Self>,
        args: DeltaArgs,
        out: &mut Self::Buf,
    ) -> Result<()>;

    /// GQA attention for the rows of several sequences (`segs`, rows in
    /// order): each sequence's q and k rotated for its positions, its k
    /// and v appended to its caches `(k, v)` at its `pos0`, and its
    /// queries attending over its cache; out `[n, n_heads, v_dim]`.
    /// The default runs the one-sequence ops per sequence.
    fn attention_seqs(
        &self,
        x: AttnSeqs<'_, Self>,
        caches: &mut [CachePair<'_, Self>],
        segs: &[Seg],
        out: &mut Self::Buf,
    ) -> Result<()> {
        seqs::attention_each(self, x, caches, segs, out)
    }

    /// `gated_delta` for the rows of several sequences (`segs`, rows in
    /// order of `qkv`, `a`, `b` and `out`), each with its state
    /// `(conv, ssm)`; `args.n` is the rows of all. The default runs
    /// `gated_delta` per sequence.
    #[allow(clippy::too_many_arguments)]
    fn gated_delta_seqs(
        &self,
        qkv: &mut Self::Buf,
        a: &mut Self::Buf,
        b: &mut Self::Buf,
        w: DeltaWeights<'_, Self>,
        states: &mut [StatePair<'_, Self>],
        segs: &[Seg],
        args: DeltaArgs,
        out: &mut Self::Buf,
    ) -> Result<()> {
        seqs::gated_delta_each(self, [qkv, a, b], w, states, segs, args, out)
    }

    /// Route the tokens of one layer, run their experts and add the
    /// weighted sum into `out` `[n, hidden]`.
    fn moe(&self, m: MoeInputs<'_, Self::Buf>, a: MoeArgs<'_>, out: &mut Self::Buf) -> Result<()>;

    /// Whether `moe` would use a [`MoeHint`] for the experts of `store` in
    /// a pass of `n` tokens (they stream, and prefetch is on); the model
    /// computes none otherwise.
    fn wants_moe_hint(&self, _store: &ExpertStore, _n: usize) -> bool {
        false
    }
}
