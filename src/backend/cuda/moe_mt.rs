//! The routed experts of a batched decode step (5 to 16 tokens) on tensor
//! cores: the launches of `moe_up_mt` and `moe_down_mt`
//! (`kernels/moe_mt.cu`), the fast path of SPEC §6 for them (`--exact`
//! keeps the f32 kernels). The same two kernels serve the resident
//! experts (each pair found through the device's table) and the host's
//! groups (streamed experts), so that a pair's sums are the same bits on
//! both paths; `moe_combine` adds the pairs of each token.

use super::buf::CudaBuf;
use super::driver::{Gpu, MAX_GRID_Y};
use super::format::{format_of, Format};
use super::moe_groups::{ELayout, Groups};
use super::tensor::{self, Half};
use crate::backend::MoeArgs;
use crate::cuda_args;
use crate::error::{Error, Result};
use std::sync::Arc;

/// Tokens a step must have for these kernels. Fewer keep the f32 kernels
/// (`moe_up_routed` and `moe_down_combine` when resident): with their two
/// splits and the combine as three more launches a layer, these lost at 2
/// tokens (docs/notes/2026-11-22-to-12-02-benchmark-log.md, "Routed experts of
/// batched decode steps on tensor cores"). Above 16 the prefill kernels
/// (`moe_up_tc`,
/// `moe_down_tc`) take the step.
const TOKENS: std::ops::RangeInclusive<usize> = 5..=super::driver::PDL_MAX_TOKENS;
/// 16-row tiles of gate and of up a block of `moe_up_mt` takes
/// (`MM_UP_RT` in kernels/moe_mt.cu).
const UP_TILES: usize = 1;
/// Warps of a `moe_up_mt` block, which share its rows' quantization
/// groups (`MM_UP_KS`): fixed, as a sum's order follows from it.
const UP_WARPS: u32 = 4;
/// 16-row tiles of down a block of `moe_down_mt` takes (`MM_DOWN_RT`).
const DOWN_TILES: usize = 2;
/// Warps of a `moe_down_mt` block (`MM_DOWN_KS`).
const DOWN_WARPS: u32 = 2;

/// The `MtGroups` kernel argument (kernels/moe_mt.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct MtGroups {
    ptr: u64,
    start: u64,
    count: u64,
    pairs: u64,
    table: u64,
    ids: u64,
}

/// Where the pairs' experts are.
pub(crate) enum Experts<'a> {
    /// Every expert resident: the layer's row of expert addresses and the
    /// routed ids `[n, k]` (u32) on the device; each pair its own group.
    Table { table: u64, ids: u64 },
    /// The host's groups of pairs that share an expert.
    Groups(&'a Groups),
}

/// Whether a step of `n` tokens through experts of layout `el` runs on
/// these kernels: tensor cores on, 5 to 16 tokens, quantized experts in
/// 16-byte aligned rows whose quarter of a quantization group is 1, 2 or
/// 4 packed words (4-bit groups of 32 to 128, 8-bit of 16 to 64, 2-bit of
/// 64 or 128). Rows of 16 bytes make `hidden` and `inter` whole 16-row
/// tiles (multiples of 128/bits).
pub(crate) fn takes(gpu: &Gpu, el: &ELayout, n: usize) -> bool {
    let bits = match format_of(el.fmt) {
        Format::Q2 => 2,
        Format::Q4 => 4,
        Format::Q8 => 8,
        _ => return false,
    };
    let words = (1usize << el.gs_shift) * bits / 128;
    gpu.tensor_cores && TOKENS.contains(&n) && el.vec == 1 && matches!(words, 1 | 2 | 4)
}

/// Blocks of a launch over `rows` rows, `tiles` 16-row tiles a block.
fn blocks(rows: usize, tiles: usize) -> u32 {
    rows.div_ceil(16 * tiles) as u32
}

/// The step's `n` tokens `x` split for these kernels (`to_half`).
pub(crate) fn split_x(gpu: &Arc<Gpu>, el: &ELayout, x: &CudaBuf, a: &MoeArgs) -> Result<Half> {
    tensor::to_half(gpu, x.read(gpu)?, None, a.n, a.n, a.hidden, el.fmt, el.gs_shift)
}

/// gate/up into `h` `[pairs, inter]` from `xh` (`split_x`), then down
/// into `d` `[pairs, hidden]`, for every pair of `experts` (all `n·k`
/// pairs with a table; a group's pairs with groups). Layouts that
/// [`takes`] takes.
pub(crate) fn run(
    gpu: &Arc<Gpu>,
    el: ELayout,
    xh: &Half,
    h: &CudaBuf,
    d: &CudaBuf,
    experts: Experts,
    a: &MoeArgs,
) -> Result<()> {
    let np = a.n * a.k;
    let (groups, g, rows) = match experts {
        Experts::Table { table, ids } => (
            a.n * a.k,
            MtGroups {
                ptr: 0,
                start: 0,
                count: 0,
                pairs: 0,
                table,
                ids,
            },
            None,
        ),
        Experts::Groups(gr) => (
            gr.n,
            MtGroups {
                ptr: gr.ptrs,
                start: gr.starts,
                count: gr.counts,
                pairs: gr.pairs,
                table: 0,
                ids: 0,
            },
            Some((gr.pairs, gr.n_pairs)),
        ),
    };
    if groups > MAX_GRID_Y {
        return Err(Error::Invalid(format!(
            "{groups} expert groups in one launch (at most {MAX_GRID_Y})"
        )));
    }
    if groups == 0 {
        return Ok(());
    }
    let f = gpu.k.fmt(el.fmt)?;
    let (k, hid, inter) = (a.k as i32, a.hidden as i32, a.inter as i32);
    let (xa, hw) = (xh.arg, h.write(gpu, h.len())?);
    let grid = (blocks(a.inter, UP_TILES), groups as u32, 1);
    gpu.launch(
        f.moe_up_mt,
        grid,
        32 * UP_WARPS,
        0,
        cuda_args![el, xa, hw, g, k, hid, inter],
    )?;
    // The pairs' rows of h split in their places (all of them with a table).
    let (list, n) = match rows {
        Some((p, n)) => (Some(p), n),
        None => (None, np),
    };
    let hh = tensor::to_half(gpu, h.read(gpu)?, list, n, np, a.inter, el.fmt, el.gs_shift)?;
    let (hp, dw) = (hh.arg, d.write(gpu, d.len())?);
    let grid = (blocks(a.hidden, DOWN_TILES), groups as u32, 1);
    gpu.launch(
        f.moe_down_mt,
        grid,
        32 * DOWN_WARPS,
        0,
        cuda_args![el, hp, dw, g, hid, inter],
    )
}

#[cfg(test)]
mod tests {
    use super::super::compile::define;
    use super::*;

    #[test]
    fn sizes_match_the_kernels() {
        let src = include_str!("kernels/moe_mt.cu");
        assert_eq!(define(src, "MM_UP_RT"), Some(UP_TILES));
        assert_eq!(define(src, "MM_UP_KS"), Some(UP_WARPS as usize));
        assert_eq!(define(src, "MM_DOWN_RT"), Some(DOWN_TILES));
        assert_eq!(define(src, "MM_DOWN_KS"), Some(DOWN_WARPS as usize));
        let most = define(src, "MM_KS").unwrap();
        assert!(UP_WARPS as usize <= most && DOWN_WARPS as usize <= most);
        assert_eq!(blocks(512, UP_TILES), 32);
        assert_eq!(blocks(2048, DOWN_TILES), 64);
        assert_eq!(blocks(520, UP_TILES), 33);
    }
}
