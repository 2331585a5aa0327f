//! Launchers of the non-matrix ops: norms, element-wise ops, copies and
//! MLA (the other token mixers are in `mixers.rs`). Each checks the
//! buffer sizes and the limits its kernel has, then launches.

use super::buf::CudaBuf;
use super::driver::{Gpu, MAX_GRID_Y};
use super::kv_cache::CudaCache;
use crate::backend::{MlaArgs, Strided};
use crate::cuda_args;
use crate::error::{Error, Result};

/// Blocks of 256 threads for a grid-stride loop over `len` elements.
pub(crate) fn grid_for(len: usize) -> (u32, u32, u32) {
    (len.div_ceil(256).clamp(1, 8192) as u32, 1, 1)
}

pub(crate) fn limit(what: &str, value: usize, max: usize) -> Result<()> {
    if value > max {
        return Err(Error::Backend {
            backend: "cuda",
            msg: format!("{what} = {value} is above the kernel's limit of {max}"),
        });
    }
    Ok(())
}

/// Values a thread of the norm kernels keeps in registers (`NORM_PER` in
/// kernels/elementwise.cu).
const NORM_PER: usize = 16;
/// Rows per block of `rms_norm_rows` (`NORM_ROWS`).
const NORM_ROWS: usize = 8;
/// The longest row `rms_norm_rows` takes (`NORM_ROW_MAX`: a warp's 32
/// lanes × NORM_PER values); longer rows take `rms_norm`, a block of 256
/// threads per row.
const NORM_ROW_MAX: usize = 32 * NORM_PER;

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
    let [xp, rp, zp] = xrz;
    let (wp, yp, d) = (w.read(gpu)?, y.write(gpu, rows * dim)?, dim as i32);
    // The kernel and block size set the reduction order: one rule for
    // every number of rows.
    if dim <= NORM_ROW_MAX {
        let r = rows as i32;
        return gpu.launch(
            gpu.k.rms_norm_rows,
            (rows.div_ceil(NORM_ROWS) as u32, 1, 1),
            32 * NORM_ROWS as u32,
            0,
            cuda_args![xp, rp, wp, zp, yp, r, d, eps],
        );
    }
    gpu.launch(
        gpu.k.rms_norm,
        (rows as u32, 1, 1),
        256,
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

/// Heads dims per lane × 32 (kernels/attention.cu).
pub(crate) const ATT_MAX_DIM: usize = 256;
const MLA_MAX_RANK: usize = 512;
const MLA_MAX_ROPE: usize = 128;
pub(crate) const ATT_THREADS: u32 = 256;

pub(crate) fn mla_attention(
    gpu: &Gpu,
    q: &CudaBuf,
    latent: &CudaCache,
    k_pe: &CudaCache,
    kv_b: &CudaBuf,
    a: MlaArgs,
    out: &mut CudaBuf,
) -> Result<()> {
    limit("kv_lora_rank", a.kv_lora_rank, MLA_MAX_RANK)?;
    limit("qk_rope_head_dim", a.rope, MLA_MAX_ROPE)?;
    let (dn, dr, dv, r) = (a.nope, a.rope, a.v_dim, a.kv_lora_rank);
    let len = a.pos0 + a.n;
    q.want("mla q", a.n * a.n_heads * (dn + dr))?;
    latent.want("mla latent cache", len)?;
    k_pe.want("mla rope-key cache", len)?;
    if latent.width() != r || k_pe.width() != dr || latent.kind() != k_pe.kind() {
        return Err(Error::Invalid(format!(
            "mla caches of rows of {} and {} values ({} and {}), the layer needs {r} and {dr} of one type",
            latent.width(),
            k_pe.width(),
            latent.kind(),
            k_pe.kind()
        )));
    }
    kv_b.want("mla kv_b", a.n_heads * (dn + dv) * r)?;
    out.want("mla output", a.n * a.n_heads * dv)?;
    let smem = ((ATT_THREADS as usize / 32 + 1) * r * 4) as u32;
    let (q0, o0) = (q.read(gpu)?, out.write(gpu, a.n * a.n_heads * dv)?);
    let (lp, kp, bp, kt) = (latent.ptr(), k_pe.ptr(), kv_b.read(gpu)?, latent.code());
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
            cuda_args![qp, lp, kp, bp, op, p0, h, dn, dr, dv, r, sc, kt],
        )?;
    }
    Ok(())
}
