//! Several sequences in one call of a token mixer. A batched forward pass
//! runs the products over the rows of every sequence at once; the mixers
//! (attention over each sequence's KV cache, the GatedDeltaNet
//! recurrence over each one's state) take the sequences' parts of the
//! rows ([`Seg`]) and their states. A backend may run all of them in one
//! launch ([`Backend::attention_seqs`], [`Backend::gated_delta_seqs`]);
//! the defaults here run the one-sequence ops once per sequence, on copies
//! of its rows.

use super::{AttnArgs, Backend, DeltaArgs, DeltaState, DeltaWeights, RopeArgs, Strided};
use crate::error::{Error, Result};

/// One sequence's part of a forward pass: rows `[off, off + n)` of the
/// pass's activations, at positions `pos0 .. pos0 + n` of its own state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seg {
    pub off: usize,
    pub n: usize,
    pub pos0: usize,
}

/// A recurrent layer's two state buffers: GatedDeltaNet's conv and
/// recurrent states.
pub type StatePair<'s, B> = (&'s mut <B as Backend>::Buf, &'s mut <B as Backend>::Buf);

/// An attention layer's two caches: K and V, or MLA's latent and rotated
/// key.
pub type CachePair<'s, B> = (&'s mut <B as Backend>::Cache, &'s mut <B as Backend>::Cache);

/// The rotation [`Backend::attention_seqs`] gives q and k: channels
/// `[rot_off, rot_off + rot_dim)` of every head, as [`RopeArgs`] says.
#[derive(Debug, Clone, Copy)]
pub struct Rotary {
    pub rot_off: usize,
    pub rot_dim: usize,
    pub interleaved: bool,
    pub mscale: f32,
}

impl Rotary {
    /// The RoPE of `n_tokens` rows of `n_heads` heads of `head_dim`, from
    /// position `pos0`.
    pub fn args(&self, n_tokens: usize, n_heads: usize, head_dim: usize, pos0: usize) -> RopeArgs {
        RopeArgs {
            n_tokens,
            n_heads,
            head_stride: head_dim,
            token_stride: n_heads * head_dim,
            rot_off: self.rot_off,
            rot_dim: self.rot_dim,
            pos0,
            interleaved: self.interleaved,
            mscale: self.mscale,
        }
    }
}

/// The inputs of [`Backend::attention_seqs`] for the rows of every
/// sequence: q `[n, n_heads, head_dim]` and k `[n, n_kv_heads, head_dim]`
/// (normalized, not yet rotated; both may be overwritten), v
/// `[n, n_kv_heads, v_dim]`. `attn.n` is the rows of all the sequences;
/// each one's position is its [`Seg`]'s (`attn.pos0` is not read).
pub struct AttnSeqs<'a, B: Backend> {
    pub q: &'a mut B::Buf,
    pub k: &'a mut B::Buf,
    pub v: &'a B::Buf,
    pub inv_freq: &'a B::Buf,
    pub rope: Rotary,
    pub attn: AttnArgs,
}

/// The segments cover rows `0..n` in order, one state each.
pub fn check_segs(segs: &[Seg], states: usize, n: usize) -> Result<()> {
    if segs.len() != states {
        return Err(Error::Invalid(format!("{} sequences with {states} states", segs.len())));
    }
    let mut next = 0;
    for s in segs {
        if s.off != next {
            return Err(Error::Invalid(format!(
                "sequence rows start at {} where {next} was expected",
                s.off
            )));
        }
        next += s.n;
    }
    if next != n {
        return Err(Error::Invalid(format!("sequences cover {next} of {n} rows")));
    }
    Ok(())
}

/// Run `core` once per sequence, on that sequence's rows of `ins`
/// (`ins[i]` is `[n, widths[i]]`), with its state, writing its rows of
/// `out` `[n, out_w]`. With one sequence `core` gets the buffers
/// themselves; with several, copies of the rows (and its output is copied
/// into place).
pub fn per_seq<B: Backend, S, const N: usize>(
    b: &B,
    segs: &[Seg],
    mut ins: [&mut B::Buf; N],
    widths: [usize; N],
    (out, out_w): (&mut B::Buf, usize),
    states: &mut [S],
    mut core: impl FnMut(Seg, [&mut B::Buf; N], &mut S, &mut B::Buf) -> Result<()>,
) -> Result<()> {
    if segs.len() != states.len() {
        return Err(Error::Invalid(format!(
            "{} sequences with {} states",
            segs.len(),
            states.len()
        )));
    }
    if let ([seg], [st]) = (segs, &mut *states) {
        return core(*seg, ins, st, out);
    }
    for (seg, st) in segs.iter().zip(states.iter_mut()) {
        let mut own = Vec::with_capacity(N);
        for (buf, &w) in ins.iter_mut().zip(&widths) {
            let mut t = b.alloc(seg.n * w)?; // [seg.n, w]
            b.copy(buf, &mut t, Strided::contiguous(seg.n * w, seg.off * w, 0))?;
            own.push(t);
        }
        let mut own: [B::Buf; N] = own
            .try_into()
            .map_err(|_| Error::Invalid("per_seq: one copy per input".into()))?;
        let mut o = b.alloc(seg.n * out_w)?; // [seg.n, out_w]
        core(*seg, own.each_mut(), st, &mut o)?;
        b.copy(&o, out, Strided::contiguous(seg.n * out_w, 0, seg.off * out_w))?;
    }
    Ok(())
}

/// [`Backend::attention_seqs`] one sequence at a time: rotate its q and
/// k, append its k and v to its caches, attend.
pub fn attention_each<B: Backend>(
    b: &B,
    x: AttnSeqs<'_, B>,
    caches: &mut [CachePair<'_, B>],
    segs: &[Seg],
    out: &mut B::Buf,
) -> Result<()> {
    let a = x.attn;
    let (qw, kw) = (a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim);
    // v is only read: each sequence's rows go straight to its cache.
    per_seq(
        b,
        segs,
        [x.q, x.k],
        [qw, kw],
        (out, a.n_heads * a.v_dim),
        caches,
        |s, [q, k], (kc, vc), o| {
            b.rope(q, x.inv_freq, x.rope.args(s.n, a.n_heads, a.head_dim, s.pos0))?;
            b.rope(k, x.inv_freq, x.rope.args(s.n, a.n_kv_heads, a.head_dim, s.pos0))?;
            b.cache_store(k, 0, s.n, kc, s.pos0)?;
            b.cache_store(x.v, s.off, s.n, vc, s.pos0)?;
            let args = AttnArgs {
                n: s.n,
                pos0: s.pos0,
                ..a
            };
            b.attention(q, kc, vc, args, o)
        },
    )
}

/// [`Backend::gated_delta_seqs`] one sequence at a time.
pub fn gated_delta_each<B: Backend>(
    b: &B,
    [qkv, alpha, beta]: [&mut B::Buf; 3],
    w: DeltaWeights<'_, B>,
    states: &mut [StatePair<'_, B>],
    segs: &[Seg],
    args: DeltaArgs,
    out: &mut B::Buf,
) -> Result<()> {
    let hv = args.v_heads;
    let conv_dim = 2 * args.k_heads * args.k_dim + hv * args.v_dim;
    per_seq(
        b,
        segs,
        [qkv, alpha, beta],
        [conv_dim, hv, hv],
        (out, hv * args.v_dim),
        states,
        |s, [qkv, alpha, beta], (conv, ssm), o| {
            let args = DeltaArgs { n: s.n, ..args };
            b.gated_delta(qkv, alpha, beta, w, DeltaState { conv, ssm }, args, o)
        },
    )
}
