//! Quantized dense products of 2 to 8 tokens (batched decode steps) on
//! tensor cores: the launch of `matvec_tc` (`kernels/matvec_tc.cu`), the
//! fast path of SPEC §6 for them (`--exact` keeps `matvec_qt`, whose
//! sums are bit for bit a token's alone).

use super::driver::Gpu;
use super::format::{format_of, Format, MatArg, MatSet};
use crate::cuda_args;
use crate::error::Result;

/// Most tokens of one launch: the 8 columns of an mma m16n8k16.
pub(crate) const MAX_TOKENS: usize = 8;

/// Warps of a block of `rt` tiles a warp: 8 of 4 tiles (two blocks an
/// SM at 128 registers a thread), else 16, so that a small matrix's
/// groups are split 16 ways and each warp's chain of groups is short
/// (`nw·rt·16` is at most `MT_SLOTS` in kernels/matvec_tc.cu).
fn warps(rt: usize) -> u32 {
    if rt == 4 {
        8
    } else {
        16
    }
}

/// Whether `matvec_tc` takes matrices of `arg`'s format: tensor cores on,
/// quantized, rows 16-byte aligned, and a quarter of a quantization group
/// 1, 2 or 4 packed words (`gs·bits/128`: 4-bit groups of 32 to 128, 8-bit
/// of 16 to 64, 2-bit of 64 or 128).
pub(crate) fn takes(gpu: &Gpu, arg: &MatArg) -> bool {
    let bits = match format_of(arg.fmt) {
        Format::Q2 => 2,
        Format::Q4 => 4,
        Format::Q8 => 8,
        _ => return false,
    };
    let words = (1usize << arg.gs_shift) * bits / 128;
    gpu.tensor_cores && arg.vec == 1 && matches!(words, 1 | 2 | 4)
}

/// 16-row tiles per warp: 4 where blocks of 64 rows still give every SM
/// one, else 2, else 1 (a block's warps share its rows and split their
/// groups, so fewer rows a block spread a small matrix over more SMs). A
/// row's sums depend on the warps of its block (the order in which its
/// groups are added), which follow from the launch's matrices alone,
/// never from the tokens.
fn tiles_per_warp(gpu: &Gpu, set: &[(MatArg, u64)]) -> usize {
    for rt in [4, 2] {
        let blocks: usize = set.iter().map(|(m, _)| (m.rows as usize).div_ceil(16 * rt)).sum();
        if blocks >= gpu.sms {
            return rt;
        }
    }
    1
}

/// One `matvec_tc` launch: `y_i[n, rows_i] = v[n, cols]·W_iᵀ` for each
/// (matrix, output address) of `set` (1 to MQ_SET matrices of one format
/// code and group size that [`takes`] takes, all of the same cols), v = x
/// or silu(x) ⊙ u when `u` is not 0, 2 ≤ n ≤ MAX_TOKENS.
pub(crate) fn launch(gpu: &Gpu, set: &[(MatArg, u64)], x: u64, u: u64, n: usize) -> Result<()> {
    let Some((first, _)) = set.first() else {
        return Ok(());
    };
    let rt = tiles_per_warp(gpu, set);
    let parts: Vec<(MatArg, u64, usize)> = set
        .iter()
        .map(|&(m, y)| (m, y, (m.rows as usize).div_ceil(16 * rt)))
        .collect();
    let (arg, blocks) = MatSet::new("matvec_tc", &parts)?;
    let f = gpu.k.fmt(first.fmt)?.matvec_tc;
    let threads = 32 * warps(rt);
    let (n, rt) = (n as i32, rt as i32);
    gpu.launch(f, (blocks as u32, 1, 1), threads, 0, cuda_args![arg, x, u, n, rt])
}
