//! Launchers of the token mixers, for one sequence or the rows of several
//! (a batched step): RoPE, GQA attention with the KV-cache append, and
//! the GatedDeltaNet step. Several sequences go to each kernel as one
//! [`Seqs`] table (at most [`MAX_SEQS`] per launch), so that a step of
//! eight decoding sequences costs a handful of launches per layer rather
//! than a handful per sequence.

use super::buf::CudaBuf;
use super::delta_chunk;
use super::driver::{Gpu, MAX_GRID_Y, PDL_MAX_TOKENS};
use super::flash;
use super::kv_cache::CudaCache;
use super::ops::{grid_for, limit, ATT_MAX_DIM, ATT_THREADS};
use super::seqs::{Seqs, MAX_SEQS};
use crate::backend::seqs::check_segs;
use crate::backend::{AttnArgs, DeltaArgs, KvType, RopeArgs, Rotary, Seg};
use crate::cuda_args;
use crate::error::{Error, Result};
use std::sync::Arc;

pub(crate) fn rope(gpu: &Gpu, x: &mut CudaBuf, inv_freq: &CudaBuf, a: RopeArgs) -> Result<()> {
    if a.n_tokens == 0 || a.n_heads == 0 || a.rot_dim < 2 {
        return Ok(());
    }
    x.want(
        "rope input",
        (a.n_tokens - 1) * a.token_stride + (a.n_heads - 1) * a.head_stride + a.rot_off + a.rot_dim,
    )?;
    inv_freq.want("rope frequencies", a.rot_dim / 2)?;
    let (xp, fp) = (x.read(gpu)?, inv_freq.read(gpu)?);
    let (nt, nh, hs, ts) = (
        a.n_tokens as i32,
        a.n_heads as i32,
        a.head_stride as i32,
        a.token_stride as i32,
    );
    let (ro, rd, p0, il, ms) = (
        a.rot_off as i32,
        a.rot_dim as i32,
        a.pos0 as i32,
        a.interleaved as i32,
        a.mscale,
    );
    let len = a.n_tokens * a.n_heads * a.rot_dim / 2;
    gpu.launch(
        gpu.k.rope,
        grid_for(len),
        256,
        0,
        cuda_args![xp, fp, nt, nh, hs, ts, ro, rd, p0, il, ms],
    )
}

fn check_heads(a: &AttnArgs) -> Result<()> {
    limit("head_dim", a.head_dim, ATT_MAX_DIM)?;
    limit("v_dim", a.v_dim, ATT_MAX_DIM)?;
    if a.n_kv_heads == 0 || !a.n_heads.is_multiple_of(a.n_kv_heads) {
        return Err(Error::Invalid(format!(
            "{} query heads over {} KV heads",
            a.n_heads, a.n_kv_heads
        )));
    }
    Ok(())
}

/// Keys a row must attend to before its keys are split over blocks
/// (`attention_decode`, `attention_split`).
const SPLIT_MIN_KEYS: usize = 1024;
/// The fewest keys one split takes, and the most splits of a row
/// (`attention_merge` takes 256).
const SPLIT_KEYS: usize = 128;
const MAX_SPLITS: usize = 256;
/// Rows of a call that may split (decode steps; longer calls have blocks
/// enough).
const SPLIT_MAX_ROWS: usize = 256;
/// Keys of a tile of `attention_decode` (`AD_T`), and the most query heads
/// of a group it takes (a warp each).
const DECODE_TILE: usize = 32;
const MAX_GROUP: usize = 16;

/// The heads of `a` as the attention kernels take them: query heads, KV
/// heads, head and value dimensions, scale.
fn head_args(a: &AttnArgs) -> (i32, i32, i32, i32, f32) {
    (
        a.n_heads as i32,
        a.n_kv_heads as i32,
        a.head_dim as i32,
        a.v_dim as i32,
        a.scale,
    )
}

/// How `attention_decode` holds a tile of keys and values in shared
/// memory: decoded to f32, or copied as they are from f16 or q8_0 caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tile {
    F32,
    F16,
    Q8,
}

impl Tile {
    /// The tile for heads `a` over caches of `types`: copied where the
    /// group has 8 to 16 heads (a warp copies at most four rows) and the
    /// rows are whole 16-byte pieces (q8_0: rows of 256 values and more,
    /// so that every row of codes and scales starts on 16 bytes).
    fn of(a: &AttnArgs, types: (i32, i32)) -> Tile {
        let group = a.n_heads / a.n_kv_heads;
        let (f16, q8) = (KvType::F16.code() as i32, KvType::Q8_0.code() as i32);
        let (kw, vw) = (a.n_kv_heads * a.head_dim, a.n_kv_heads * a.v_dim);
        if !(8..=MAX_GROUP).contains(&group) {
            Tile::F32
        } else if types == (f16, f16) && a.head_dim.is_multiple_of(8) && a.v_dim.is_multiple_of(8) {
            Tile::F16
        } else if types == (q8, q8) && kw.is_multiple_of(256) && vw.is_multiple_of(256) {
            Tile::Q8
        } else {
            Tile::F32
        }
    }

    /// Dynamic shared memory of the kernel: the tile (rows of keys padded
    /// by 4 bytes, or by one f32), and the group's queries in f32.
    fn smem(self, group: usize, hd: usize, vd: usize) -> usize {
        let tile = match self {
            Tile::F32 => 4 * DECODE_TILE * (hd + 1 + vd),
            Tile::F16 => 2 * DECODE_TILE * (hd + 2 + vd),
            Tile::Q8 => DECODE_TILE * (hd + 4 + vd) + 4 * DECODE_TILE * (hd + vd) / 32,
        };
        tile + 4 * group * hd
    }
}

/// How many ranges each row's keys are cut into, for `blocks_per_split`
/// blocks a split: enough for two blocks per multiprocessor, once the
/// rows attend to SPLIT_MIN_KEYS or more.
fn splits(gpu: &Gpu, t: &Seqs, rows: usize, blocks_per_split: usize) -> usize {
    let longest = t.longest();
    if longest < SPLIT_MIN_KEYS || rows > SPLIT_MAX_ROWS {
        return 1;
    }
    (2 * gpu.sms)
        .div_ceil(blocks_per_split * rows)
        .min(MAX_SPLITS)
        .min(longest / SPLIT_KEYS)
        .max(1)
}

/// Deep decode rows with their keys split over blocks, the splits merged
/// into o0: `attention_decode` (a KV head's group of query heads a block,
/// each tile of keys read once for them) where the group fits, else
/// `attention_split` (a query head a block). False when the rows are
/// not deep enough to split.
fn attend_split(
    gpu: &Arc<Gpu>,
    q0: u64,
    o0: u64,
    t: &Seqs,
    rows: usize,
    a: &AttnArgs,
    types: (i32, i32),
) -> Result<bool> {
    let group = a.n_heads / a.n_kv_heads;
    let tile = Tile::of(a, types);
    let smem = tile.smem(group, a.head_dim, a.v_dim);
    let grouped = group <= MAX_GROUP && gpu.cc.0 >= 7 && smem <= gpu.smem_optin;
    let sp = splits(gpu, t, rows, if grouped { a.n_kv_heads } else { a.n_heads });
    if sp < 2 {
        return Ok(false);
    }
    let (h, hkv, hd, vd, sc) = head_args(a);
    // [rows, H, splits, vd + 2]: each split's max, sum and weighted values.
    let part = CudaBuf::zeroed(gpu, rows * a.n_heads * sp * (a.v_dim + 2))?;
    let pp = part.write(gpu, part.len())?;
    let (y0, sp32) = (0i32, sp as i32);
    let args = cuda_args![q0, pp, *t, y0, h, hkv, hd, vd, sc, types.0, types.1, sp32];
    if grouped {
        let grid = (a.n_kv_heads as u32, rows as u32, sp as u32);
        let f = match tile {
            Tile::F32 => gpu.k.attention_decode,
            Tile::F16 => gpu.k.attention_decode16,
            Tile::Q8 => gpu.k.attention_decode8,
        };
        gpu.launch(f, grid, 32 * group as u32, smem as u32, args)?;
    } else {
        let grid = (a.n_heads as u32, rows as u32, sp as u32);
        gpu.launch(gpu.k.attention_split, grid, ATT_THREADS, 0, args)?;
    }
    gpu.launch(
        gpu.k.attention_merge,
        (a.n_heads as u32, rows as u32, 1),
        128,
        0,
        cuda_args![pp, o0, *t, y0, h, vd, sp32],
    )?;
    Ok(true)
}

/// The attention of `rows` rows from q `q0` and out `o0` (the rows of the
/// sequences of `t`): the sequences of a prefill chunk on tensor cores
/// (`flash.rs`) where it takes them, the others through the `attention`
/// kernel in grids of at most MAX_GRID_Y rows, their keys split over
/// blocks when they are deep (`attend_split`).
fn attend(gpu: &Arc<Gpu>, q0: u64, o0: u64, t: &Seqs, rows: usize, a: &AttnArgs, types: (i32, i32)) -> Result<()> {
    let mut t = *t;
    if flash::takes(gpu, a) {
        let (big, small) = t.split(flash::MIN_ROWS);
        if !big.is_empty() && flash::attend(gpu, q0, o0, &big, a, types)? {
            if small.is_empty() {
                return Ok(());
            }
            t = small;
        }
    }
    let (h, hkv, hd, vd, sc) = head_args(a);
    if attend_split(gpu, q0, o0, &t, rows, a, types)? {
        return Ok(());
    }
    for r0 in (0..rows).step_by(MAX_GRID_Y) {
        let nr = (rows - r0).min(MAX_GRID_Y);
        let y0 = r0 as i32;
        gpu.launch(
            gpu.k.attention,
            (a.n_heads as u32, nr as u32, 1),
            ATT_THREADS,
            0,
            cuda_args![q0, o0, t, y0, h, hkv, hd, vd, sc, types.0, types.1],
        )?;
    }
    Ok(())
}

/// One sequence's attention over caches that already hold its new keys.
pub(crate) fn attention(
    gpu: &Arc<Gpu>,
    q: &CudaBuf,
    k: &CudaCache,
    v: &CudaCache,
    a: AttnArgs,
    out: &mut CudaBuf,
) -> Result<()> {
    check_heads(&a)?;
    let len = a.pos0 + a.n;
    q.want("attention q", a.n * a.n_heads * a.head_dim)?;
    check_cache(k, "attention K cache", len, a.n_kv_heads * a.head_dim)?;
    check_cache(v, "attention V cache", len, a.n_kv_heads * a.v_dim)?;
    out.want("attention output", a.n * a.n_heads * a.v_dim)?;
    if a.n == 0 {
        return Ok(());
    }
    let seg = Seg {
        off: 0,
        n: a.n,
        pos0: a.pos0,
    };
    let t = Seqs::new(&[((k.ptr(), v.ptr()), seg)], 0);
    let (q0, o0) = (q.read(gpu)?, out.write(gpu, a.n * a.n_heads * a.v_dim)?);
    attend(gpu, q0, o0, &t, a.n, &a, (k.code(), v.code()))
}

/// An error unless `c` holds `len` positions of rows of `width`.
fn check_cache(c: &CudaCache, what: &str, len: usize, width: usize) -> Result<()> {
    if c.width() != width {
        return Err(Error::Invalid(format!(
            "{what}: rows of {} values, the heads need {width}",
            c.width()
        )));
    }
    c.want(what, len)
}

/// The rows of a batched attention call: q and k (normalized, rotated
/// here in place), v, and the RoPE frequencies.
pub(crate) struct AttnBufs<'a> {
    pub q: &'a CudaBuf,
    pub k: &'a CudaBuf,
    pub v: &'a CudaBuf,
    pub inv_freq: &'a CudaBuf,
}

/// `Backend::attention_seqs`: for each run of at most MAX_SEQS sequences,
/// q and k rotated at each row's position, k and v appended to each
/// sequence's caches, then the attention of all their rows: four launches.
pub(crate) fn attention_seqs(
    gpu: &Arc<Gpu>,
    x: AttnBufs,
    (rope, a): (Rotary, AttnArgs),
    caches: &[(&CudaCache, &CudaCache)],
    segs: &[Seg],
    out: &mut CudaBuf,
) -> Result<()> {
    check_heads(&a)?;
    check_segs(segs, caches.len(), a.n)?;
    // One launch reads every sequence's caches: they have one pair of types.
    let types = match caches.first() {
        Some((k, v)) => (k.code(), v.code()),
        None => return Ok(()),
    };
    if caches.iter().any(|(k, v)| (k.code(), v.code()) != types) {
        return Err(Error::Invalid(
            "the sequences of one attention call hold caches of different types".into(),
        ));
    }
    let (qw, kw, vw, ow) = (
        a.n_heads * a.head_dim,
        a.n_kv_heads * a.head_dim,
        a.n_kv_heads * a.v_dim,
        a.n_heads * a.v_dim,
    );
    x.q.want("attention q", a.n * qw)?;
    x.k.want("attention k", a.n * kw)?;
    x.v.want("attention v", a.n * vw)?;
    out.want("attention output", a.n * ow)?;
    let rotates = rope.rot_dim >= 2;
    if rotates {
        x.inv_freq.want("rope frequencies", rope.rot_dim / 2)?;
        if rope.rot_off + rope.rot_dim > a.head_dim {
            return Err(Error::Invalid(format!(
                "rope channels {}..{} of heads of {}",
                rope.rot_off,
                rope.rot_off + rope.rot_dim,
                a.head_dim
            )));
        }
    }
    let mut parts = Vec::with_capacity(segs.len());
    for (s, (kc, vc)) in segs.iter().zip(caches) {
        check_cache(kc, "attention K cache", s.pos0 + s.n, kw)?;
        check_cache(vc, "attention V cache", s.pos0 + s.n, vw)?;
        parts.push(((kc.ptr(), vc.ptr()), *s));
    }
    if a.n == 0 {
        return Ok(());
    }
    let (qp, kp, vp, fp) = (x.q.read(gpu)?, x.k.read(gpu)?, x.v.read(gpu)?, x.inv_freq.read(gpu)?);
    let op = out.write(gpu, a.n * ow)?;
    let at = |p: u64, row: usize, w: usize| p + 4 * (row * w) as u64;
    let (hs, ro, rd, il, ms) = (
        a.head_dim as i32,
        rope.rot_off as i32,
        rope.rot_dim as i32,
        rope.interleaved as i32,
        rope.mscale,
    );
    for chunk in parts.chunks(MAX_SEQS) {
        let first = chunk[0].1.off;
        let rows = chunk.iter().map(|(_, s)| s.n).sum::<usize>();
        let t = Seqs::new(chunk, first);
        let nr = rows as i32;
        if rotates {
            for (p, heads) in [(qp, a.n_heads), (kp, a.n_kv_heads)] {
                let w = heads * a.head_dim;
                let (xp, nh, ts) = (at(p, first, w), heads as i32, w as i32);
                gpu.launch(
                    gpu.k.rope_seqs,
                    grid_for(rows * heads * rope.rot_dim / 2),
                    256,
                    0,
                    cuda_args![xp, fp, nr, nh, hs, ts, ro, rd, il, ms, t],
                )?;
            }
        }
        let (k0, v0, kw32, vw32) = (at(kp, first, kw), at(vp, first, vw), kw as i32, vw as i32);
        gpu.launch(
            gpu.k.kv_append,
            grid_for(rows * (kw + vw)),
            256,
            0,
            cuda_args![k0, v0, t, nr, kw32, vw32, types.0, types.1],
        )?;
        attend(gpu, at(qp, first, qw), at(op, first, ow), &t, rows, &a, types)?;
    }
    Ok(())
}

/// Tokens per staged chunk of `delta_scan` (`DS_T` in kernels/delta.cu).
const DS_T: usize = 16;
/// The most dynamic shared memory `delta_scan` is given: key heads of up
/// to 256 dimensions (the kernel's limit).
const DELTA_SCAN_MAX_SMEM: usize = 2 * (2 * DS_T * 256 + DS_T * 16 + 2 * DS_T) * 4;
const DELTA_MAX_KERNEL: usize = 8;
const DELTA_MAX_KEY: usize = 256;

/// Let `delta_scan` take up to DELTA_SCAN_MAX_SMEM of shared memory
/// (compute capability 7.0 and later; below, it takes 48 KiB at most).
pub(crate) fn allow_shared_memory(gpu: &Gpu) -> Result<()> {
    match gpu.cc.0 >= 7 {
        true => {
            gpu.allow_shared_memory(gpu.k.delta_scan, DELTA_SCAN_MAX_SMEM)?;
            gpu.allow_shared_memory(gpu.k.delta_scan128, DELTA_SCAN_MAX_SMEM)?;
            for (f, tile) in [
                (gpu.k.attention_decode, Tile::F32),
                (gpu.k.attention_decode16, Tile::F16),
                (gpu.k.attention_decode8, Tile::Q8),
            ] {
                gpu.allow_shared_memory(f, tile.smem(MAX_GROUP, ATT_MAX_DIM, ATT_MAX_DIM))?;
            }
            delta_chunk::allow_shared_memory(gpu)
        }
        false => Ok(()),
    }
}

/// Inputs of one GatedDeltaNet step.
pub(crate) struct DeltaBufs<'a> {
    pub qkv: &'a CudaBuf,
    pub a: &'a CudaBuf,
    pub b: &'a CudaBuf,
    pub conv_w: &'a CudaBuf,
    pub a_log: &'a CudaBuf,
    pub dt_bias: &'a CudaBuf,
}

/// One sequence's GatedDeltaNet step.
pub(crate) fn gated_delta(
    gpu: &Arc<Gpu>,
    i: DeltaBufs,
    conv: &mut CudaBuf,
    ssm: &mut CudaBuf,
    a: DeltaArgs,
    out: &mut CudaBuf,
) -> Result<()> {
    let seg = Seg {
        off: 0,
        n: a.n,
        pos0: 0,
    };
    gated_delta_seqs(gpu, i, &[(conv, ssm)], &[seg], a, out)
}

/// The GatedDeltaNet step of several sequences, each with its state
/// `(conv, ssm)`: one conv launch and one recurrence launch per
/// MAX_SEQS sequences, except that a prefill chunk of more than
/// PDL_MAX_TOKENS tokens runs its recurrence on its own through
/// delta_prep and delta_scan.
pub(crate) fn gated_delta_seqs(
    gpu: &Arc<Gpu>,
    i: DeltaBufs,
    states: &[(&CudaBuf, &CudaBuf)],
    segs: &[Seg],
    a: DeltaArgs,
    out: &mut CudaBuf,
) -> Result<()> {
    limit("linear_conv_kernel_dim", a.kernel, DELTA_MAX_KERNEL)?;
    limit("linear_key_head_dim", a.k_dim, DELTA_MAX_KEY)?;
    if a.kernel == 0 || a.k_heads == 0 || !a.v_heads.is_multiple_of(a.k_heads) {
        return Err(Error::Invalid(format!(
            "GatedDeltaNet: kernel {}, {} value heads over {} key heads",
            a.kernel, a.v_heads, a.k_heads
        )));
    }
    check_segs(segs, states.len(), a.n)?;
    let c = 2 * a.k_heads * a.k_dim + a.v_heads * a.v_dim;
    let ow = a.v_heads * a.v_dim;
    i.qkv.want("gated_delta qkv", a.n * c)?;
    i.a.want("gated_delta a", a.n * a.v_heads)?;
    i.b.want("gated_delta b", a.n * a.v_heads)?;
    i.conv_w.want("gated_delta conv weight", c * a.kernel)?;
    i.a_log.want("gated_delta A_log", a.v_heads)?;
    i.dt_bias.want("gated_delta dt_bias", a.v_heads)?;
    out.want("gated_delta output", a.n * ow)?;
    let mut parts = Vec::with_capacity(segs.len());
    for (s, (conv, ssm)) in segs.iter().zip(states) {
        conv.want("gated_delta conv state", (a.kernel - 1) * c)?;
        ssm.want("gated_delta recurrent state", a.v_heads * a.v_dim * a.k_dim)?;
        parts.push(((conv.read(gpu)?, ssm.read(gpu)?), *s));
    }
    if a.n == 0 {
        return Ok(());
    }
    let x = CudaBuf::zeroed(gpu, a.n * c)?; // [n, C] after the conv
    let (qp, wp, xp) = (i.qkv.read(gpu)?, i.conv_w.read(gpu)?, x.write(gpu, a.n * c)?);
    let (cc, kk) = (c as i32, a.kernel as i32);
    for chunk in parts.chunks(MAX_SEQS) {
        let t = Seqs::new(chunk, 0);
        // 128 channels per block, DELTA_CONV_T (kernels/delta.cu) tokens
        // per thread, a sequence per z.
        let grid = (
            c.div_ceil(128) as u32,
            t.most_rows().div_ceil(16).max(1) as u32,
            chunk.len() as u32,
        );
        gpu.launch(gpu.k.delta_conv, grid, 128, 0, cuda_args![qp, wp, xp, t, cc, kk])?;
    }
    let (ap, bp, lp, dp) = (i.a.read(gpu)?, i.b.read(gpu)?, i.a_log.read(gpu)?, i.dt_bias.read(gpu)?);
    let op = out.write(gpu, a.n * ow)?;
    let (hk, hv, dk, dv) = (a.k_heads as i32, a.v_heads as i32, a.k_dim as i32, a.v_dim as i32);
    // A prefill chunk whose inputs can be staged 16 bytes at a time: the
    // norms of q and k and the gates of every token first, all at once
    // (delta_prep), then the recurrence from shared memory (delta_scan),
    // whose chain per token holds only the state update. The same
    // arithmetic as delta_step.
    let smem = 2 * (2 * DS_T * a.k_dim + DS_T * 16 + 2 * DS_T) * 4;
    let fits = smem <= 48 * 1024 || (gpu.cc.0 >= 7 && smem <= DELTA_SCAN_MAX_SMEM);
    let aligned = a.k_dim.is_multiple_of(4) && a.v_dim.is_multiple_of(4) && c.is_multiple_of(4);
    let scans = |s: &Seg| s.n > PDL_MAX_TOKENS && aligned && fits;
    let heads = (a.v_heads as u32, a.v_dim.div_ceil(16) as u32);
    let at = |p: u64, row: usize, w: usize| p + 4 * (row * w) as u64;
    for &((_, hp), s) in parts.iter().filter(|(_, s)| scans(s)) {
        let gb = CudaBuf::zeroed(gpu, s.n * 2 * a.v_heads)?; // [n, 2·Hv]: log g, β
        let gp = gb.write(gpu, gb.len())?;
        let (xs, as_, bs, os, n) = (
            at(xp, s.off, c),
            at(ap, s.off, a.v_heads),
            at(bp, s.off, a.v_heads),
            at(op, s.off, ow),
            s.n as i32,
        );
        let prep = ((s.n * a.k_heads).div_ceil(4) as u32, 1, 1);
        gpu.launch(
            gpu.k.delta_prep,
            prep,
            128,
            0,
            cuda_args![xs, as_, bs, lp, dp, gp, n, hk, hv, dk, dv],
        )?;
        // Two chunks of 64 tokens or more, heads of 128: the chunked form.
        if delta_chunk::takes(gpu, &a, s.n) {
            delta_chunk::run(gpu, xs, gp, hp, os, s.n, &a)?;
            continue;
        }
        // Key heads of up to 128 dimensions: 4 a lane, not 8.
        let scan = match a.k_dim <= 128 {
            true => gpu.k.delta_scan128,
            false => gpu.k.delta_scan,
        };
        gpu.launch(
            scan,
            (heads.0, heads.1, 1),
            128,
            smem as u32,
            cuda_args![xs, gp, hp, os, n, hk, hv, dk, dv],
        )?;
    }
    let steps: Vec<_> = parts.iter().filter(|(_, s)| !scans(s)).copied().collect();
    for chunk in steps.chunks(MAX_SEQS) {
        let t = Seqs::new(chunk, 0);
        gpu.launch(
            gpu.k.delta_step,
            (heads.0, heads.1, chunk.len() as u32),
            128,
            0,
            cuda_args![xp, ap, bp, lp, dp, op, t, hk, hv, dk, dv],
        )?;
    }
    Ok(())
}
