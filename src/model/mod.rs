//! The decoder, written once against the `Backend` ops. Every supported
//! architecture is the same pre-norm residual stack,
//! `h = x + Attn(norm_in(x)); y = h + FFN(norm_post(h))`, with one of three
//! token mixers per layer (`attention` GQA, `linear_attn` GatedDeltaNet,
//! `mla`) and a dense or MoE feed-forward (`ffn`).

mod attention;
mod ffn;
mod linear_attn;
mod mla;
pub mod rope;
pub mod router;
mod state;
pub mod timing;
pub mod trace;

use crate::backend::{Backend, CachePair, KvType, KvTypes, Seg, StatePair, Strided};
use crate::config::{Arch, AttnKind, FfnKind, ModelConfig};
use crate::error::{Error, Result};
use crate::experts::ExpertStore;
use crate::format::packed::WeightsFile;
use attention::GqaWeights;
use ffn::{Mlp, MoeBlock};
use linear_attn::{linear_cfg, DeltaNetWeights};
use mla::{mla_cfg, MlaWeights};
use std::sync::Arc;
use timing::{Phase, PhaseTimer};
use trace::RouteTrace;

pub(crate) fn load_mat<B: Backend>(b: &B, wf: &WeightsFile, base: &str, rows: usize, cols: usize) -> Result<B::Matrix> {
    b.matrix(&wf.matrix(base, rows, cols)?)
}

pub(crate) fn load_vec<B: Backend>(b: &B, wf: &WeightsFile, name: &str, len: usize) -> Result<B::Buf> {
    b.upload(&wf.vector(name, len)?)
}

/// What a block's forward needs besides its weights.
pub struct Ctx<'a, B: Backend> {
    pub b: &'a B,
    pub cfg: &'a ModelConfig,
    pub store: &'a Arc<ExpertStore>,
    pub inv_freq: &'a B::Buf,
    /// cos/sin factor (YaRN attention_factor; 1 otherwise).
    pub rope_mscale: f32,
    /// Softmax scale of MLA (GQA computes its own).
    pub attn_scale: f32,
    /// Tokens in this pass (all sequences'), and each sequence's part.
    pub n: usize,
    pub segs: &'a [Seg],
    pub timer: &'a PhaseTimer,
    pub trace: &'a RouteTrace,
}

/// One sequence's work in a batched forward pass.
pub struct SeqStep<'s, B: Backend> {
    pub state: &'s mut State<B>,
    pub tokens: &'s [u32],
    /// The position of the first token.
    pub pos0: usize,
    /// The logits of every token instead of the last one's.
    pub all: bool,
}

enum Mixer<B: Backend> {
    Gqa(GqaWeights<B>),
    Delta(DeltaNetWeights<B>),
    Mla(MlaWeights<B>),
}

enum Ffn<B: Backend> {
    Dense(Mlp<B>),
    Moe(MoeBlock<B>),
}

struct Layer<B: Backend> {
    input_norm: B::Buf, // [hidden]
    post_norm: B::Buf,  // [hidden]
    mixer: Mixer<B>,
    ffn: Ffn<B>,
}

/// The per-sequence state of one layer.
pub enum LayerState<B: Backend> {
    /// `[capacity, Hkv, hd]` each, in the K and V cache types.
    Kv { k: B::Cache, v: B::Cache },
    /// conv `[kernel−1, conv_dim]`, ssm `[Hv, Dv, Dk]`.
    Delta { conv: B::Buf, ssm: B::Buf },
    /// latent `[capacity, kvr]`, k_pe `[capacity, dr]`, both in the K
    /// cache type.
    Mla { latent: B::Cache, kpe: B::Cache },
}

fn wrong_state() -> Error {
    Error::Invalid("layer state does not match the layer kind".into())
}

/// Bytes of the KV caches of one position of a model of `c`, over all
/// its layers, in the types `kv` (MLA keeps both of its caches in `kv.k`).
pub fn kv_bytes_per_token(c: &ModelConfig, kv: KvTypes) -> usize {
    c.layers
        .iter()
        .map(|l| match l.attn {
            AttnKind::Full => {
                let row = c.num_key_value_heads * c.head_dim;
                kv.k.row_bytes(row) + kv.v.row_bytes(row)
            }
            AttnKind::Mla => c.mla.as_ref().map_or(0, |m| {
                kv.k.row_bytes(m.kv_lora_rank) + kv.k.row_bytes(m.qk_rope_head_dim)
            }),
            AttnKind::Linear => 0,
        })
        .sum()
}

/// Layer `i`'s caches of each sequence (an attention layer's).
fn caches_at<'s, B: Backend>(seqs: &'s mut [SeqStep<'_, B>], i: usize) -> Result<Vec<CachePair<'s, B>>> {
    seqs.iter_mut()
        .map(|s| match &mut s.state.layers[i] {
            LayerState::Kv { k, v } => Ok((k, v)),
            LayerState::Mla { latent, kpe } => Ok((latent, kpe)),
            LayerState::Delta { .. } => Err(wrong_state()),
        })
        .collect()
}

/// Layer `i`'s recurrent states of each sequence (a GatedDeltaNet layer's).
fn states_at<'s, B: Backend>(seqs: &'s mut [SeqStep<'_, B>], i: usize) -> Result<Vec<StatePair<'s, B>>> {
    seqs.iter_mut()
        .map(|s| match &mut s.state.layers[i] {
            LayerState::Delta { conv, ssm } => Ok((conv, ssm)),
            _ => Err(wrong_state()),
        })
        .collect()
}

/// All mutable per-sequence state: one entry per layer, and the capacity
/// (positions) of the caches.
pub struct State<B: Backend> {
    pub layers: Vec<LayerState<B>>,
    pub capacity: usize,
}

/// A loaded network on backend `B`.
pub struct Net<B: Backend> {
    pub b: B,
    pub cfg: ModelConfig,
    embed: B::Matrix,           // [vocab, hidden]
    lm_head: Option<B::Matrix>, // [vocab, hidden]; None when tied
    final_norm: B::Buf,         // [hidden]
    layers: Vec<Layer<B>>,
    inv_freq: B::Buf,
    rope_mscale: f32,
    attn_scale: f32,
    pub timer: PhaseTimer,
    pub trace: RouteTrace,
    /// Check the residual stream for NaN after the embedding and each
    /// layer (`--check-nan`; a download per layer, so off by default).
    pub check_nan: std::sync::atomic::AtomicBool,
    /// The element types of the caches of states made from now on.
    kv: KvTypes,
}

impl<B: Backend> Net<B> {
    pub fn load(b: B, cfg: &ModelConfig, wf: &WeightsFile) -> Result<Net<B>> {
        let hid = cfg.hidden_size;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for (i, spec) in cfg.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let mixer = match spec.attn {
                AttnKind::Full => Mixer::Gqa(GqaWeights::load(&b, wf, &p, cfg)?),
                AttnKind::Linear => Mixer::Delta(DeltaNetWeights::load(&b, wf, &p, cfg)?),
                AttnKind::Mla => Mixer::Mla(MlaWeights::load(&b, wf, &p, cfg)?),
            };
            let ffn = match spec.ffn {
                FfnKind::Dense => Ffn::Dense(Mlp::load(&b, wf, &format!("{p}.mlp"), hid, cfg.intermediate_size)?),
                FfnKind::Moe => Ffn::Moe(MoeBlock::load(&b, wf, &p, i, cfg)?),
            };
            layers.push(Layer {
                input_norm: load_vec(&b, wf, &format!("{p}.input_layernorm.weight"), hid)?,
                post_norm: load_vec(&b, wf, &format!("{p}.post_attention_layernorm.weight"), hid)?,
                mixer,
                ffn,
            });
        }
        let (inv_freq, rope_mscale, attn_scale) = match &cfg.mla {
            Some(m) => {
                let qd = (m.qk_nope_head_dim + m.qk_rope_head_dim) as f64;
                match &cfg.yarn {
                    Some(y) => (
                        rope::yarn_inv_freq(cfg.rope_theta, m.qk_rope_head_dim, y),
                        rope::yarn_attention_factor(y) as f32,
                        (qd.powf(-0.5) * rope::yarn_softmax_factor(y)) as f32,
                    ),
                    None => (
                        rope::inv_freq(cfg.rope_theta, m.qk_rope_head_dim),
                        1.0,
                        qd.powf(-0.5) as f32,
                    ),
                }
            }
            // YaRN as transformers applies it to GQA models: its frequencies,
            // and its attention factor on cos and sin (q·k scaled by its
            // square); the softmax scale stays 1/√head_dim.
            None => {
                let scale = (cfg.head_dim as f64).powf(-0.5) as f32;
                match &cfg.yarn {
                    Some(y) => (
                        rope::yarn_inv_freq(cfg.rope_theta, cfg.rotary_dim(), y),
                        rope::yarn_attention_factor(y) as f32,
                        scale,
                    ),
                    None => (rope::inv_freq(cfg.rope_theta, cfg.rotary_dim()), 1.0, scale),
                }
            }
        };
        let embed = load_mat(&b, wf, "model.embed_tokens", cfg.vocab_size, hid)?;
        let lm_head = if cfg.tie_word_embeddings && !wf.has("lm_head.weight") {
            None
        } else {
            Some(load_mat(&b, wf, "lm_head", cfg.vocab_size, hid)?)
        };
        Ok(Net {
            final_norm: load_vec(&b, wf, "model.norm.weight", hid)?,
            inv_freq: b.upload(&inv_freq)?,
            embed,
            lm_head,
            layers,
            rope_mscale,
            attn_scale,
            timer: PhaseTimer::default(),
            trace: RouteTrace::default(),
            check_nan: std::sync::atomic::AtomicBool::new(false),
            kv: KvTypes::both(KvType::F32),
            cfg: cfg.clone(),
            b,
        })
    }

    /// True when some layer keeps a recurrent state that cannot be rewound.
    pub fn has_recurrent_layers(&self) -> bool {
        self.cfg.layers.iter().any(|l| l.attn == AttnKind::Linear)
    }

    pub fn kv_types(&self) -> KvTypes {
        self.kv
    }

    /// The element types of the caches of states made from now on (q8_0
    /// needs heads of whole blocks of 32).
    pub fn set_kv_types(&mut self, kv: KvTypes) -> Result<()> {
        let c = &self.cfg;
        let any = |k: AttnKind| c.layers.iter().any(|l| l.attn == k);
        if any(AttnKind::Full) {
            let row = c.num_key_value_heads * c.head_dim;
            kv.k.check_width(row, c.head_dim, "this model's K cache")?;
            kv.v.check_width(row, c.head_dim, "this model's V cache")?;
        }
        if let (true, Some(m)) = (any(AttnKind::Mla), &c.mla) {
            kv.k.check_width(m.kv_lora_rank, m.kv_lora_rank, "this model's latent cache")?;
            kv.k.check_width(m.qk_rope_head_dim, m.qk_rope_head_dim, "this model's rotated-key cache")?;
        }
        self.kv = kv;
        Ok(())
    }

    /// Bytes of the caches of one position, over all layers.
    pub fn kv_bytes_per_token(&self) -> usize {
        kv_bytes_per_token(&self.cfg, self.kv)
    }

    /// Empty state with room for `capacity` positions, its caches of the
    /// net's KV types.
    pub fn new_state(&self, capacity: usize) -> Result<State<B>> {
        let mut layers = Vec::with_capacity(self.layers.len());
        let kv = self.kv;
        for l in &self.layers {
            layers.push(match l.mixer {
                Mixer::Gqa(_) => {
                    let row = self.cfg.num_key_value_heads * self.cfg.head_dim;
                    LayerState::Kv {
                        k: self.b.alloc_cache(kv.k, capacity, row)?,
                        v: self.b.alloc_cache(kv.v, capacity, row)?,
                    }
                }
                Mixer::Delta(_) => {
                    let lc = linear_cfg(&self.cfg)?;
                    LayerState::Delta {
                        conv: self.b.alloc((lc.conv_kernel - 1) * lc.conv_dim())?,
                        ssm: self.b.alloc(lc.num_value_heads * lc.value_head_dim * lc.key_head_dim)?,
                    }
                }
                Mixer::Mla(_) => {
                    let m = mla_cfg(&self.cfg)?;
                    LayerState::Mla {
                        latent: self.b.alloc_cache(kv.k, capacity, m.kv_lora_rank)?,
                        kpe: self.b.alloc_cache(kv.k, capacity, m.qk_rope_head_dim)?,
                    }
                }
            });
        }
        Ok(State { layers, capacity })
    }

    /// `st` back to empty without allocating its caches again: a cache's
    /// positions past the sequence's are never read, so only the recurrent
    /// layers' states are made zero (new zeroed buffers, small).
    pub fn reset_state(&self, st: &mut State<B>) -> Result<()> {
        for l in &mut st.layers {
            if let LayerState::Delta { conv, ssm } = l {
                let lc = linear_cfg(&self.cfg)?;
                *conv = self.b.alloc((lc.conv_kernel - 1) * lc.conv_dim())?;
                *ssm = self.b.alloc(lc.num_value_heads * lc.value_head_dim * lc.key_head_dim)?;
            }
        }
        Ok(())
    }

    /// Elements per position of each cache buffer of a layer state.
    fn row_sizes(&self, s: &LayerState<B>) -> Option<(usize, usize)> {
        match s {
            LayerState::Kv { .. } => {
                let row = self.cfg.num_key_value_heads * self.cfg.head_dim;
                Some((row, row))
            }
            LayerState::Mla { .. } => self.cfg.mla.as_ref().map(|m| (m.kv_lora_rank, m.qk_rope_head_dim)),
            LayerState::Delta { .. } => None,
        }
    }

    /// Evaluate `tokens` at positions `pos0..` and return the logits of the
    /// last token `[vocab]`, or of every token `[n, vocab]` when `all`.
    pub fn forward(
        &self,
        st: &mut State<B>,
        store: &Arc<ExpertStore>,
        tokens: &[u32],
        pos0: usize,
        all: bool,
    ) -> Result<Vec<f32>> {
        let mut seqs = [SeqStep {
            state: st,
            tokens,
            pos0,
            all,
        }];
        Ok(self.forward_batch(&mut seqs, store)?.pop().unwrap_or_default())
    }

    /// One forward pass over several sequences, each with its own state,
    /// positions and tokens: the dense products and the MoE layers run once
    /// over all the tokens (each expert is read once for every token routed
    /// to it), the token mixers per sequence. Returns each sequence's
    /// logits as [`Net::forward`] does.
    pub fn forward_batch(&self, seqs: &mut [SeqStep<'_, B>], store: &Arc<ExpertStore>) -> Result<Vec<Vec<f32>>> {
        let (b, cfg) = (&self.b, &self.cfg);
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let mut segs = Vec::with_capacity(seqs.len());
        let mut tokens = Vec::new();
        for s in seqs.iter() {
            if s.tokens.is_empty() {
                return Err(Error::Invalid("no tokens to evaluate".into()));
            }
            if let Some(&t) = s.tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
                return Err(Error::TokenOutOfRange {
                    token: t,
                    vocab: cfg.vocab_size,
                });
            }
            segs.push(Seg {
                off: tokens.len(),
                n: s.tokens.len(),
                pos0: s.pos0,
            });
            tokens.extend_from_slice(s.tokens);
        }
        for s in seqs.iter() {
            let end = s.pos0 + s.tokens.len();
            if end > s.state.capacity {
                return Err(Error::ContextFull {
                    pos: end,
                    limit: s.state.capacity,
                });
            }
        }
        let n = tokens.len();
        b.begin_pass(n);
        let hid = cfg.hidden_size;
        let ctx = Ctx {
            b,
            cfg,
            store,
            inv_freq: &self.inv_freq,
            rope_mscale: self.rope_mscale,
            attn_scale: self.attn_scale,
            n,
            segs: &segs,
            timer: &self.timer,
            trace: &self.trace,
        };
        let mut x = b.alloc(n * hid)?; // [n, hidden], the residual stream
        b.embed(&self.embed, &tokens, &mut x)?;
        let check_nan = self.check_nan.load(std::sync::atomic::Ordering::Relaxed);
        if check_nan {
            self.nan_check(&x, n, "the embedding (embed_tokens)")?;
        }
        let eps = cfg.rms_norm_eps;
        let mut xn = b.alloc(n * hid)?; // [n, hidden], the normed input of the next mixer or FFN
        let mut y = b.alloc(n * hid)?;
        if let Some(first) = self.layers.first() {
            self.timer.measure(b, Phase::Attention, || {
                b.rms_norm(&x, &first.input_norm, n, hid, eps, &mut xn)
            })?;
        }
        for (i, layer) in self.layers.iter().enumerate() {
            self.timer.measure(b, Phase::Attention, || match &layer.mixer {
                Mixer::Gqa(w) => w.forward(&ctx, &xn, &mut caches_at(seqs, i)?, &mut y),
                Mixer::Delta(w) => w.forward(&ctx, &xn, &mut states_at(seqs, i)?, &mut y),
                Mixer::Mla(w) => w.forward(&ctx, &xn, &mut caches_at(seqs, i)?, &mut y),
            })?;
            b.add_rms_norm(&mut x, &y, &layer.post_norm, n, hid, eps, &mut xn)?;
            match &layer.ffn {
                Ffn::Dense(m) => self
                    .timer
                    .measure(b, Phase::DenseFfn, || m.forward(b, &xn, n, &mut y))?,
                Ffn::Moe(m) => {
                    // The next MoE layer, whose experts a streaming backend
                    // can start copying early (one-token steps).
                    let next = self.layers[i + 1..].iter().find_map(|l| match &l.ffn {
                        Ffn::Moe(nm) => Some(nm),
                        Ffn::Dense(_) => None,
                    });
                    m.forward(&ctx, &xn, next, &mut y)?
                }
            }
            // The FFN's residual add, and the next layer's input norm (a
            // token-mixing cost, as the first layer's is).
            match self.layers.get(i + 1) {
                Some(next) => self.timer.measure(b, Phase::Attention, || {
                    b.add_rms_norm(&mut x, &y, &next.input_norm, n, hid, eps, &mut xn)
                })?,
                None => b.add(&mut x, &y, n * hid)?,
            }
            if check_nan {
                self.nan_check(&x, n, &format!("the output of layer {i}"))?;
            }
        }
        self.timer.measure(b, Phase::LmHead, || self.lm_head(&x, &segs, seqs))
    }

    /// An error naming `what` when the `[n, hidden]` buffer `x` holds a NaN.
    fn nan_check(&self, x: &B::Buf, n: usize, what: &str) -> Result<()> {
        let hid = self.cfg.hidden_size;
        let mut host = vec![0f32; n * hid];
        self.b.download(x, 0, &mut host)?;
        match host.iter().position(|v| v.is_nan()) {
            None => Ok(()),
            Some(at) => Err(Error::Numeric(format!(
                "NaN in {what} (token {} of the step, element {}): the model's weights or its computation are broken; `moeflux inspect --verify` checks the files",
                at / hid,
                at % hid
            ))),
        }
    }

    /// The final norm and the LM head over the rows whose logits are
    /// wanted (each sequence's last, or all of them), in one product.
    fn lm_head(&self, x: &B::Buf, segs: &[Seg], seqs: &[SeqStep<'_, B>]) -> Result<Vec<Vec<f32>>> {
        let (b, cfg) = (&self.b, &self.cfg);
        let (hid, vocab) = (cfg.hidden_size, cfg.vocab_size);
        // (first row, rows) of each sequence's wanted logits.
        let want: Vec<(usize, usize)> = segs
            .iter()
            .zip(seqs)
            .map(|(g, s)| if s.all { (g.off, g.n) } else { (g.off + g.n - 1, 1) })
            .collect();
        let rows: usize = want.iter().map(|w| w.1).sum();
        let mut last = b.alloc(rows * hid)?; // [rows, hidden]
        let mut at = 0;
        for &(first, r) in &want {
            b.copy(x, &mut last, Strided::contiguous(r * hid, first * hid, at * hid))?;
            at += r;
        }
        let mut normed = b.alloc(rows * hid)?;
        b.rms_norm(&last, &self.final_norm, rows, hid, cfg.rms_norm_eps, &mut normed)?;
        let mut logits = b.alloc(rows * vocab)?; // [rows, vocab]
        b.linear(self.lm_head.as_ref().unwrap_or(&self.embed), &normed, rows, &mut logits)?;
        // Each sequence's rows into its own vector.
        let parts: Vec<(usize, usize)> = want
            .iter()
            .scan(0, |at, &(_, r)| {
                let part = (*at * vocab, r * vocab);
                *at += r;
                Some(part)
            })
            .collect();
        b.download_parts(&logits, &parts)
    }

    pub fn arch(&self) -> Arch {
        self.cfg.arch
    }
}
