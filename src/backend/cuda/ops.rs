//! Launchers of the non-matrix ops: norms, element-wise ops, copies,
//! RoPE, attention, MLA and the GatedDeltaNet step. Each checks the
//! buffer sizes and the limits its kernel has, then launches.

use super::buf::CudaBuf;
use super::driver::Gpu;
use super::driver::{MAX_GRID_Y, PDL_MAX_TOKENS};
use crate::backend::{AttnArgs, DeltaArgs, MlaArgs, RopeArgs, Strided};
use crate::cuda_args;
use crate::error::{Error, Result};
use std::sync::Arc;

/// Tokens per staged chunk of `delta_scan` (`DS_T` in kernels/delta.cu).
const DS_T: usize = 16;
/// The most dynamic shared memory `delta_scan` is given: key heads of up
/// to 256 dimensions (the kernel's limit).
const DELTA_SCAN_MAX_SMEM: usize = 2 * (2 * DS_T * 256 + DS_T * 16 + 2 * DS_T) * 4;

/// Let `delta_scan` take up to DELTA_SCAN_MAX_SMEM of shared memory
/// (compute capability 7.0 and later; below, it takes 48 KiB at most).
pub(crate) fn allow_shared_memory(gpu: &Gpu) -> Result<()> {
    match gpu.cc.0 >= 7 {
        true => gpu.allow_shared_memory(gpu.k.delta_scan, DELTA_SCAN_MAX_SMEM),
        false => Ok(()),
    }
}

/// Blocks of 256 threads for a grid-stride loop over `len` elements.
fn grid_for(len: usize) -> (u32, u32, u32) {
    (len.div_ceil(256).clamp(1, 8192) as u32, 1, 1)
}

fn limit(what: &str, value: usize, max: usize) -> Result<()> {
    if value > max {
        return Err(Error::Backend {
            backend: "cuda",
            msg: format!("{what} = {value} is above the kernel's limit of {max}"),
        });
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn rms_norm(
    gpu: &Gpu,
    x: &CudaBuf,
    z: Option<&CudaBuf>,
    w: &CudaBuf,
    rows: usize,
    dim: usize,
    eps: f32,
    y: &mut CudaBuf,
) -> Result<()> {
    let len = rows * dim;
    x.want("rms_norm input", len)?;
    y.want("rms_norm output", len)?;
    w.want("rms_norm weight", dim)?;
    if let Some(z) = z {
        z.want("gated_rms_norm gate", len)?;
    }
    if len == 0 {
        return Ok(());
    }
    let zp = match z {
        Some(z) => z.read(gpu)?,
        None => 0,
    };
    launch_norm(gpu, [x.read(gpu)?, 0, zp], w, rows, dim, eps, y)
}

/// `x += res`, then `y = rms_norm(x)·w`: the `add` and `rms_norm` kernels'
/// arithmetic in one launch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn add_rms_norm(
    gpu: &Gpu,
    x: &mut CudaBuf,
    res: &CudaBuf,
    w: &CudaBuf,
    rows: usize,
    dim: usize,
    eps: f32,
    y: &mut CudaBuf,
) -> Result<()> {
    let len = rows * dim;
    x.want("add_rms_norm residual", len)?;
    res.want("add_rms_norm input", len)?;
    y.want("add_rms_norm output", len)?;
    w.want("add_rms_norm weight", dim)?;
    if len == 0 {
        return Ok(());
    }
    launch_norm(gpu, [x.read(gpu)?, res.read(gpu)?, 0], w, rows, dim, eps, y)
}

/// The `rms_norm` kernel on checked buffers; `xrz` holds the addresses of
/// x, the residual input and the gate (0: absent).
fn launch_norm(
    gpu: &Gpu,
    xrz: [u64; 3],
    w: &CudaBuf,
    rows: usize,
    dim: usize,
    eps: f32,
    y: &mut CudaBuf,
) -> Result<()> {
    // The block size sets the reduction order: one rule for every variant.
    let block = (dim.div_ceil(32) * 32).clamp(32, 256) as u32;
    let [xp, rp, zp] = xrz;
    let (wp, yp, d) = (w.read(gpu)?, y.write(gpu, rows * dim)?, dim as i32);
    gpu.launch(
        gpu.k.rms_norm,
        (rows as u32, 1, 1),
        block,
        0,
        cuda_args![xp, rp, wp, zp, yp, d, eps],
    )
}

pub(crate) fn add(gpu: &Gpu, y: &mut CudaBuf, x: &CudaBuf, len: usize) -> Result<()> {
    y.want("add output", len)?;
    x.want("add input", len)?;
    if y.take_zero(len) {
        let (yp, xp) = (y.write(gpu, len)?, x.read(gpu)?);
        return copy_words(gpu, yp, xp, len);
    }
    let (yp, xp, l) = (y.read(gpu)?, x.read(gpu)?, len as i64);
    gpu.launch(gpu.k.add, grid_for(len), 256, 0, cuda_args![yp, xp, l])
}

pub(crate) fn add_scaled_rows(
    gpu: &Gpu,
    y: &mut CudaBuf,
    x: &CudaBuf,
    scale: &CudaBuf,
    rows: usize,
    dim: usize,
    sigmoid: bool,
) -> Result<()> {
    let len = rows * dim;
    y.want("add_scaled_rows output", len)?;
    x.want("add_scaled_rows input", len)?;
    scale.want("add_scaled_rows scale", rows)?;
    if len == 0 {
        return Ok(());
    }
    let assign = y.take_zero(len) as i32;
    let (yp, xp, sp) = (y.read(gpu)?, x.read(gpu)?, scale.read(gpu)?);
    let (l, d, sig) = (len as i64, dim as i32, sigmoid as i32);
    gpu.launch(
        gpu.k.add_scaled_rows,
        grid_for(len),
        256,
        0,
        cuda_args![yp, xp, sp, l, d, sig, assign],
    )
}

pub(crate) fn swiglu(gpu: &Gpu, gate: &CudaBuf, up: &CudaBuf, len: usize, y: &mut CudaBuf) -> Result<()> {
    gate.want("swiglu gate", len)?;
    up.want("swiglu up", len)?;
    y.want("swiglu output", len)?;
    let (gp, upp, yp, l) = (gate.read(gpu)?, up.read(gpu)?, y.write(gpu, len)?, len as i64);
    gpu.launch(gpu.k.swiglu, grid_for(len), 256, 0, cuda_args![gp, upp, yp, l])
}

pub(crate) fn sigmoid_mul(gpu: &Gpu, x: &mut CudaBuf, gate: &CudaBuf, len: usize) -> Result<()> {
    x.want("sigmoid_mul input", len)?;
    gate.want("sigmoid_mul gate", len)?;
    let (xp, gp, l) = (x.read(gpu)?, gate.read(gpu)?, len as i64);
    gpu.launch(gpu.k.sigmoid_mul, grid_for(len), 256, 0, cuda_args![xp, gp, l])
}

/// Floats from which a contiguous copy goes to the copy engine
/// (`cuMemcpyDtoDAsync`); smaller ones run as a kernel, which a CUDA graph
/// segment can hold (a driver copy ends the segment: two KV-cache appends
/// per attention layer would cut each decode token's graph apart).
const DTOD_MIN: usize = 1 << 20;

/// `len` floats from `src` to `dst` (device addresses, no overlap).
fn copy_words(gpu: &Gpu, dst: u64, src: u64, len: usize) -> Result<()> {
    if len >= DTOD_MIN {
        return gpu.dtod(dst, src, 4 * len);
    }
    let (rows, width, zero) = (1i32, len as i32, 0i64);
    gpu.launch(
        gpu.k.copy_strided,
        grid_for(len),
        256,
        0,
        cuda_args![src, dst, rows, width, zero, zero, zero, zero],
    )
}

pub(crate) fn copy(gpu: &Gpu, src: &CudaBuf, dst: &mut CudaBuf, s: Strided) -> Result<()> {
    if s.rows == 0 || s.width == 0 {
        return Ok(());
    }
    src.want("copy source", s.src_off + (s.rows - 1) * s.src_stride + s.width)?;
    dst.want("copy destination", s.dst_off + (s.rows - 1) * s.dst_stride + s.width)?;
    let contiguous = s.rows == 1 || (s.src_stride == s.width && s.dst_stride == s.width);
    let sp = src.read(gpu)?;
    // The whole destination is written only by a contiguous copy from 0.
    let dp = if contiguous && s.dst_off == 0 {
        dst.write(gpu, s.rows * s.width)?
    } else {
        dst.read(gpu)?
    };
    if contiguous {
        return copy_words(
            gpu,
            dp + 4 * s.dst_off as u64,
            sp + 4 * s.src_off as u64,
            s.rows * s.width,
        );
    }
    let (rows, width) = (s.rows as i32, s.width as i32);
    let (so, ss, dof, ds) = (
        s.src_off as i64,
        s.src_stride as i64,
        s.dst_off as i64,
        s.dst_stride as i64,
    );
    gpu.launch(
        gpu.k.copy_strided,
        grid_for(s.rows * s.width),
        256,
        0,
        cuda_args![sp, dp, rows, width, so, ss, dof, ds],
    )
}

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

/// Heads dims per lane × 32 (kernels/attention.cu).
const ATT_MAX_DIM: usize = 256;
const MLA_MAX_RANK: usize = 512;
const MLA_MAX_ROPE: usize = 128;
const ATT_THREADS: u32 = 256;

pub(crate) fn attention(
    gpu: &Gpu,
    q: &CudaBuf,
    k: &CudaBuf,
    v: &CudaBuf,
    a: AttnArgs,
    out: &mut CudaBuf,
) -> Result<()> {
    limit("head_dim", a.head_dim, ATT_MAX_DIM)?;
    limit("v_dim", a.v_dim, ATT_MAX_DIM)?;
    if a.n_kv_heads == 0 || !a.n_heads.is_multiple_of(a.n_kv_heads) {
        return Err(Error::Invalid(format!(
            "{} query heads over {} KV heads",
            a.n_heads, a.n_kv_heads
        )));
    }
    let len = a.pos0 + a.n;
    q.want("attention q", a.n * a.n_heads * a.head_dim)?;
    k.want("attention K cache", len * a.n_kv_heads * a.head_dim)?;
    v.want("attention V cache", len * a.n_kv_heads * a.v_dim)?;
    out.want("attention output", a.n * a.n_heads * a.v_dim)?;
    let (q0, o0, kp, vp) = (
        q.read(gpu)?,
        out.write(gpu, a.n * a.n_heads * a.v_dim)?,
        k.read(gpu)?,
        v.read(gpu)?,
    );
    for t0 in (0..a.n).step_by(MAX_GRID_Y) {
        let nt = (a.n - t0).min(MAX_GRID_Y);
        let qp = q0 + 4 * (t0 * a.n_heads * a.head_dim) as u64;
        let op = o0 + 4 * (t0 * a.n_heads * a.v_dim) as u64;
        let p0 = (a.pos0 + t0) as i32;
        let (h, hkv, hd, vd, sc) = (
            a.n_heads as i32,
            a.n_kv_heads as i32,
            a.head_dim as i32,
            a.v_dim as i32,
            a.scale,
        );
        let grid = (a.n_heads as u32, nt as u32, 1);
        gpu.launch(
            gpu.k.attention,
            grid,
            ATT_THREADS,
            0,
            cuda_args![qp, kp, vp, op, p0, h, hkv, hd, vd, sc],
        )?;
    }
    Ok(())
}

pub(crate) fn mla_attention(
    gpu: &Gpu,
    q: &CudaBuf,
    latent: &CudaBuf,
    k_pe: &CudaBuf,
    kv_b: &CudaBuf,
    a: MlaArgs,
    out: &mut CudaBuf,
) -> Result<()> {
    limit("kv_lora_rank", a.kv_lora_rank, MLA_MAX_RANK)?;
    limit("qk_rope_head_dim", a.rope, MLA_MAX_ROPE)?;
    let (dn, dr, dv, r) = (a.nope, a.rope, a.v_dim, a.kv_lora_rank);
    let len = a.pos0 + a.n;
    q.want("mla q", a.n * a.n_heads * (dn + dr))?;
    latent.want("mla latent cache", len * r)?;
    k_pe.want("mla rope-key cache", len * dr)?;
    kv_b.want("mla kv_b", a.n_heads * (dn + dv) * r)?;
    out.want("mla output", a.n * a.n_heads * dv)?;
    let smem = ((ATT_THREADS as usize / 32 + 1) * r * 4) as u32;
    let (q0, o0) = (q.read(gpu)?, out.write(gpu, a.n * a.n_heads * dv)?);
    let (lp, kp, bp) = (latent.read(gpu)?, k_pe.read(gpu)?, kv_b.read(gpu)?);
    for t0 in (0..a.n).step_by(MAX_GRID_Y) {
        let nt = (a.n - t0).min(MAX_GRID_Y);
        let qp = q0 + 4 * (t0 * a.n_heads * (dn + dr)) as u64;
        let op = o0 + 4 * (t0 * a.n_heads * dv) as u64;
        let p0 = (a.pos0 + t0) as i32;
        let (h, dn, dr, dv, r, sc) = (a.n_heads as i32, dn as i32, dr as i32, dv as i32, r as i32, a.scale);
        let grid = (a.n_heads as u32, nt as u32, 1);
        gpu.launch(
            gpu.k.mla_attention,
            grid,
            ATT_THREADS,
            smem,
            cuda_args![qp, lp, kp, bp, op, p0, h, dn, dr, dv, r, sc],
        )?;
    }
    Ok(())
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

const DELTA_MAX_KERNEL: usize = 8;
const DELTA_MAX_KEY: usize = 256;

pub(crate) fn gated_delta(
    gpu: &Arc<Gpu>,
    i: DeltaBufs,
    conv: &mut CudaBuf,
    ssm: &mut CudaBuf,
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
    let c = 2 * a.k_heads * a.k_dim + a.v_heads * a.v_dim;
    i.qkv.want("gated_delta qkv", a.n * c)?;
    i.a.want("gated_delta a", a.n * a.v_heads)?;
    i.b.want("gated_delta b", a.n * a.v_heads)?;
    i.conv_w.want("gated_delta conv weight", c * a.kernel)?;
    i.a_log.want("gated_delta A_log", a.v_heads)?;
    i.dt_bias.want("gated_delta dt_bias", a.v_heads)?;
    conv.want("gated_delta conv state", (a.kernel - 1) * c)?;
    ssm.want("gated_delta recurrent state", a.v_heads * a.v_dim * a.k_dim)?;
    out.want("gated_delta output", a.n * a.v_heads * a.v_dim)?;
    if a.n == 0 {
        return Ok(());
    }
    let x = CudaBuf::zeroed(gpu, a.n * c)?; // [n, C] after the conv
    let (qp, wp, sp, xp) = (
        i.qkv.read(gpu)?,
        i.conv_w.read(gpu)?,
        conv.read(gpu)?,
        x.write(gpu, a.n * c)?,
    );
    let (n, cc, kk) = (a.n as i32, c as i32, a.kernel as i32);
    // 128 channels per block, DELTA_CONV_T (kernels/delta.cu) tokens per thread.
    let grid = (c.div_ceil(128) as u32, a.n.div_ceil(16) as u32, 1);
    gpu.launch(gpu.k.delta_conv, grid, 128, 0, cuda_args![qp, wp, sp, xp, n, cc, kk])?;
    let (ap, bp, lp, dp) = (i.a.read(gpu)?, i.b.read(gpu)?, i.a_log.read(gpu)?, i.dt_bias.read(gpu)?);
    let (hp, op) = (ssm.read(gpu)?, out.write(gpu, a.n * a.v_heads * a.v_dim)?);
    let (hk, hv, dk, dv) = (a.k_heads as i32, a.v_heads as i32, a.k_dim as i32, a.v_dim as i32);
    let grid = (a.v_heads as u32, a.v_dim.div_ceil(16) as u32, 1);
    // A prefill chunk whose inputs can be staged 16 bytes at a time: the
    // norms of q and k and the gates of every token first, all at once
    // (delta_prep), then the recurrence from shared memory (delta_scan),
    // whose chain per token holds only the state update. The same
    // arithmetic as delta_step.
    let smem = 2 * (2 * DS_T * a.k_dim + DS_T * 16 + 2 * DS_T) * 4;
    let fits = smem <= 48 * 1024 || (gpu.cc.0 >= 7 && smem <= DELTA_SCAN_MAX_SMEM);
    let aligned = a.k_dim.is_multiple_of(4) && a.v_dim.is_multiple_of(4) && c.is_multiple_of(4);
    if a.n > PDL_MAX_TOKENS && aligned && fits {
        let gb = CudaBuf::zeroed(gpu, a.n * 2 * a.v_heads)?; // [n, 2·Hv]: g, β
        let gp = gb.write(gpu, gb.len())?;
        let prep = ((a.n * a.k_heads).div_ceil(4) as u32, 1, 1);
        gpu.launch(
            gpu.k.delta_prep,
            prep,
            128,
            0,
            cuda_args![xp, ap, bp, lp, dp, gp, n, hk, hv, dk, dv],
        )?;
        return gpu.launch(
            gpu.k.delta_scan,
            grid,
            128,
            smem as u32,
            cuda_args![xp, gp, hp, op, n, hk, hv, dk, dv],
        );
    }
    gpu.launch(
        gpu.k.delta_step,
        grid,
        128,
        0,
        cuda_args![xp, ap, bp, lp, dp, hp, op, n, hk, hv, dk, dv],
    )
}
