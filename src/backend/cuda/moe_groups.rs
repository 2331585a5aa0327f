//! The grouped expert kernels of the MoE step: the (token, expert) pairs
//! of a layer, grouped by expert, through gate/up and down — on tensor
//! cores for prefill chunks (`moe_up_tc`/`moe_down_tc`, or their 16- and 32-token
//! tiles for small groups), else the f32 kernels (`moe_up`/`moe_down`).
//! `moe.rs` routes, groups and combines.

use super::buf::CudaBuf;
use super::driver::{Gpu, MAX_GRID_Y};
use super::format::{format_of, group_shift, Format, F16_SCALES};
use super::tensor::{self, expert_tile, smem_bytes, Half, TC_BM, TC_THREADS};
use crate::backend::MoeArgs;
use crate::cuda_args;
use crate::error::{Error, Result};
use crate::format::packed::LayerLayout;
use crate::format::Dtype;
use std::sync::Arc;

/// The `ELayout` kernel argument (kernels/moe.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct ELayout {
    off: [i64; 9],
    pub fmt: i32,
    pub gs_shift: i32,
    pub vec: i32,
    pad: i32,
}

/// The kernel's view of one layer's expert layout, checked against the
/// shapes: gate/up `[inter, hidden]`, down `[hidden, inter]`.
pub(crate) fn expert_layout(ll: &LayerLayout, group_size: usize, hidden: usize, inter: usize) -> Result<ELayout> {
    let bad = |msg: String| Error::Invalid(format!("expert layout: {msg}"));
    if ll.components.len() != 9 {
        return Err(bad(format!("{} components, 9 expected", ll.components.len())));
    }
    let c = &ll.components;
    let quant = c[0].dtype == "U32";
    let (fmt, gs_shift) = if quant {
        let f = Format::quant(ll.bits)?;
        let sd = Dtype::parse(&c[1].dtype, &c[1].name)?;
        let sflag = match sd {
            Dtype::Bf16 => 0,
            Dtype::F16 => F16_SCALES,
            d => return Err(bad(format!("scales of dtype {}", d.name()))),
        };
        group_shift(group_size, hidden, ll.bits)?;
        (f as i32 + sflag, group_shift(group_size, inter, ll.bits)?)
    } else {
        (Format::float(Dtype::parse(&c[0].dtype, &c[0].name)?)? as i32, 0)
    };
    let f = format_of(fmt);
    let mut vec = true;
    for (m, (rows, cols)) in [(inter, hidden), (inter, hidden), (hidden, inter)]
        .into_iter()
        .enumerate()
    {
        let (w, s, b) = (&c[3 * m], &c[3 * m + 1], &c[3 * m + 2]);
        let rb = f.row_bytes(cols);
        if w.size != rows * rb {
            return Err(bad(format!(
                "{} has {} bytes, [{rows}, {cols}] needs {}",
                w.name,
                w.size,
                rows * rb
            )));
        }
        if quant {
            let sb = rows * (cols / group_size) * 2;
            if s.size != sb || b.size != sb || s.offset % 2 != 0 || b.offset % 2 != 0 {
                return Err(bad(format!(
                    "{} / {}: {} and {} bytes, {sb} needed (2-aligned)",
                    s.name, b.name, s.size, b.size
                )));
            }
        }
        if w.offset + w.size > ll.expert_size
            || s.offset + s.size > ll.expert_size
            || b.offset + b.size > ll.expert_size
        {
            return Err(bad(format!(
                "component of matrix {m} past expert_size {}",
                ll.expert_size
            )));
        }
        vec &= w.offset % 16 == 0 && rb.is_multiple_of(16);
    }
    let mut off = [0i64; 9];
    for (o, comp) in off.iter_mut().zip(c) {
        *o = comp.offset as i64;
    }
    Ok(ELayout {
        off,
        fmt,
        gs_shift,
        vec: vec as i32,
        pad: 0,
    })
}

/// Where the expert kernels find their groups.
pub(crate) struct Groups {
    pub n: usize,
    /// Pairs in all the groups.
    pub n_pairs: usize,
    pub ptrs: u64,
    pub starts: u64,
    pub counts: u64,
    pub pairs: u64,
}

/// Tokens per tile of the grouped expert kernels (`MOE_MT` in kernels/moe.cu).
const MOE_MT: usize = 4;
/// Most dynamic shared memory a block takes without opting in.
const MAX_SMEM: usize = 48 * 1024;

/// The `stage` argument of `moe_up` / `moe_down` and its dynamic shared
/// memory: the inputs of one tile (`MOE_MT` tokens per lane set, kernels/moe.cu
/// `lane_sets`) of `cols` floats each, staged per block. x stays in global
/// memory (0, 0) for rows that are not 16-byte chunks, `cols` not a
/// multiple of 32, or a tile over 48 KiB (and, in the kernel, for a group
/// of one pair).
fn stage_smem(el: &ELayout, cols: usize) -> (i32, u32) {
    if el.vec == 0 || !cols.is_multiple_of(32) {
        return (0, 0);
    }
    // Elements in one 16-byte chunk of a row.
    let chunk = match format_of(el.fmt) {
        Format::F32 => 4,
        Format::Bf16 | Format::F16 => 8,
        Format::Q2 => 64,
        Format::Q4 => 32,
        Format::Q8 => 16,
    };
    let chunks = cols / chunk;
    let mut size = 32;
    while size > 8 && 2 * chunks <= size {
        size /= 2;
    }
    let bytes = 32 / size * MOE_MT * cols * 4;
    match bytes <= MAX_SMEM {
        true => (1, bytes as u32),
        false => (0, 0),
    }
}

/// gate/up of every pair of the groups into h.
fn launch_up(gpu: &Gpu, el: ELayout, x: &CudaBuf, h: &CudaBuf, g: &Groups, a: &MoeArgs) -> Result<()> {
    if g.n > MAX_GRID_Y {
        return Err(Error::Invalid(format!(
            "{} expert groups in one launch (at most {MAX_GRID_Y})",
            g.n
        )));
    }
    let (hid, inter) = (a.hidden as i32, a.inter as i32);
    let (xp, hp) = (x.read(gpu)?, h.write(gpu, h.len())?);
    let (gp, gs, gc, pp, k) = (g.ptrs, g.starts, g.counts, g.pairs, a.k as i32);
    let (stage, smem) = stage_smem(&el, a.hidden);
    // 8 warps × 2 rows of gate and of up per block.
    let grid = (a.inter.div_ceil(16) as u32, g.n as u32, 1);
    gpu.launch(
        gpu.k.fmt(el.fmt)?.moe_up,
        grid,
        256,
        smem,
        cuda_args![el, xp, hp, gp, gs, gc, pp, k, hid, inter, stage],
    )
}

/// gate/up, then down into d, for every pair of the (host-made) groups:
/// on tensor cores from `xh` (x in f16) when given (a prefill chunk;
/// batched decode steps take `moe_mt::run` instead).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_experts(
    gpu: &Arc<Gpu>,
    el: ELayout,
    x: &CudaBuf,
    xh: Option<&Half>,
    h: &CudaBuf,
    d: &CudaBuf,
    g: &Groups,
    a: &MoeArgs,
) -> Result<()> {
    if let Some(xh) = xh {
        return run_experts_tc(gpu, el, xh, h, d, g, a);
    }
    launch_up(gpu, el, x, h, g, a)?;
    let (hid, inter) = (a.hidden as i32, a.inter as i32);
    let (hp, dp) = (h.read(gpu)?, d.write(gpu, d.len())?);
    let (gp, gs, gc, pp) = (g.ptrs, g.starts, g.counts, g.pairs);
    let (stage, smem) = stage_smem(&el, a.inter);
    // 8 warps × 4 rows of down per block.
    let grid = (a.hidden.div_ceil(32) as u32, g.n as u32, 1);
    gpu.launch(
        gpu.k.fmt(el.fmt)?.moe_down,
        grid,
        256,
        smem,
        cuda_args![el, hp, dp, gp, gs, gc, pp, hid, inter, stage],
    )
}

/// run_experts on tensor cores (kernels/tensor.cu): gate/up from x in
/// f16, h's rows of these pairs in f16, then down.
pub(crate) fn run_experts_tc(
    gpu: &Arc<Gpu>,
    el: ELayout,
    xh: &Half,
    h: &CudaBuf,
    d: &CudaBuf,
    g: &Groups,
    a: &MoeArgs,
) -> Result<()> {
    if g.n > MAX_GRID_Y {
        return Err(Error::Invalid(format!(
            "{} expert groups in one launch (at most {MAX_GRID_Y})",
            g.n
        )));
    }
    let (hid, inter, k) = (a.hidden as i32, a.inter as i32, a.k as i32);
    let (gp, gs, gc, pp) = (g.ptrs, g.starts, g.counts, g.pairs);
    let (xa, hp) = (xh.arg, h.write(gpu, h.len())?);
    // Tiles of TC_BM/2 rows of gate and of up, and of 16, 32 or 64 tokens.
    let grid = (a.inter.div_ceil(TC_BM / 2) as u32, g.n as u32, 1);
    let f = gpu.k.fmt(el.fmt)?;
    let bn = expert_tile(g.n_pairs, g.n);
    let (up, down) = match bn {
        16 => (f.moe_up_tc16, f.moe_down_tc16),
        32 => (f.moe_up_tc32, f.moe_down_tc32),
        _ => (f.moe_up_tc, f.moe_down_tc),
    };
    gpu.launch(
        up,
        grid,
        TC_THREADS,
        smem_bytes(bn),
        cuda_args![el, xa, hp, gp, gs, gc, pp, k, hid, inter],
    )?;
    let hh = tensor::to_half(gpu, hp, Some(pp), g.n_pairs, a.n * a.k, a.inter, el.fmt, el.gs_shift)?;
    let (ha, dp) = (hh.arg, d.write(gpu, d.len())?);
    let grid = (a.hidden.div_ceil(TC_BM) as u32, g.n as u32, 1);
    gpu.launch(
        down,
        grid,
        TC_THREADS,
        smem_bytes(bn),
        cuda_args![el, ha, dp, gp, gs, gc, pp, hid, inter],
    )
}

/// Whether a step of `n` tokens through experts of layout `el` runs on
/// tensor cores.
pub(crate) fn experts_tc(gpu: &Gpu, el: &ELayout, n: usize, a: &MoeArgs) -> bool {
    n >= tensor::MIN_TOKENS
        && tensor::takes(gpu, el.fmt, el.gs_shift, a.hidden, el.vec == 1)
        && tensor::takes(gpu, el.fmt, el.gs_shift, a.inter, el.vec == 1)
}
