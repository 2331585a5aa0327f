//! Quantized dense products of 2 to 8 tokens (batched decode steps) on
//! tensor cores: the launch of `matvec_tc` (`kernels/matvec_tc.cu`), the
//! fast path of SPEC §6 for them (`--exact` keeps `matvec_qt`, whose
//! sums are bit for bit a token's alone).

use super::driver::Gpu;
use super::format::{format_of, Format, MatArg, MatSet};
use crate::cuda_args;
use crate::error::{Error, Result};

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

/// Bytes of the kernel's static shared memory: the warps' sums, `MtRed`
/// in kernels/matvec_tc.cu (MT_SLOTS × 9 floats).
const RED_BYTES: usize = 512 * 9 * 4;

/// Bits of a level of `arg`'s format, where `matvec_tc` takes it.
fn bits(arg: &MatArg) -> Option<usize> {
    match format_of(arg.fmt) {
        Format::Q2 => Some(2),
        Format::Q4 => Some(4),
        Format::Q8 => Some(8),
        _ => None,
    }
}

/// Dynamic shared memory of a block of `rt` 16-row tiles of `arg` (a
/// quantized format of `bits`): each row's levels at a stride of their
/// bytes rounded up to 128 plus 16 per word of a quarter group
/// (`mt_stride` in kernels/matvec_tc.cu: the 8 rows of a fragment on
/// distinct banks), then the rows' scales and biases, 2 bytes a group.
fn smem(arg: &MatArg, bits: usize, rt: usize) -> usize {
    let cols = arg.cols as usize;
    let words = (1usize << arg.gs_shift) * bits / 128;
    let stride = (cols * bits / 8).div_ceil(128) * 128 + 16 * words;
    let groups = cols >> arg.gs_shift;
    16 * rt * (stride + 4 * groups)
}

/// Most dynamic shared memory a block may take and still share its
/// multiprocessor with another.
fn two_a_sm(gpu: &Gpu) -> usize {
    (gpu.smem_sm / 2).saturating_sub(gpu.smem_reserved + RED_BYTES)
}

/// Most dynamic shared memory a block may take.
fn smem_max(gpu: &Gpu) -> usize {
    gpu.smem_optin.saturating_sub(RED_BYTES)
}

/// Whether `matvec_tc` takes matrices of `arg`'s format: tensor cores on,
/// quantized, rows 16-byte aligned, a quarter of a quantization group
/// 1, 2 or 4 packed words (`gs·bits/128`: 4-bit groups of 32 to 128, 8-bit
/// of 16 to 64, 2-bit of 64 or 128), the arrays 16-byte aligned, and a
/// tile of 16 rows within the shared memory a block may have.
pub(crate) fn takes(gpu: &Gpu, arg: &MatArg) -> bool {
    let Some(bits) = bits(arg) else {
        return false;
    };
    let words = (1usize << arg.gs_shift) * bits / 128;
    let aligned = [arg.w, arg.s, arg.b].iter().all(|a| a % 16 == 0);
    gpu.tensor_cores && arg.vec == 1 && matches!(words, 1 | 2 | 4) && aligned && smem(arg, bits, 1) <= smem_max(gpu)
}

/// Let every format's `matvec_tc` take the shared memory of its largest
/// tile (once, after the kernels are loaded).
pub(crate) fn allow_shared_memory(gpu: &Gpu) -> Result<()> {
    for (_, k) in &gpu.k.formats {
        gpu.allow_shared_memory(k.matvec_tc, smem_max(gpu))?;
    }
    Ok(())
}

/// 16-row tiles per warp: 4 where blocks of 64 rows still give every SM
/// one, else 2, else 1 (a block's warps share its rows and split their
/// groups, so fewer rows a block spread a small matrix over more SMs),
/// and no more than leave room for two blocks an SM. A row's sums depend
/// on the warps of its block (the order in which its groups are added),
/// which follow from the launch's matrices alone, never from the tokens.
fn tiles_per_warp(gpu: &Gpu, set: &[(MatArg, u64)], bits: usize) -> usize {
    for rt in [4, 2] {
        let blocks: usize = set.iter().map(|(m, _)| (m.rows as usize).div_ceil(16 * rt)).sum();
        if blocks >= gpu.sms && smem(&set[0].0, bits, rt) <= two_a_sm(gpu) {
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
    let Some(bits) = bits(first) else {
        return Err(Error::Invalid(format!(
            "matvec_tc: format code {} is not quantized",
            first.fmt
        )));
    };
    let rt = tiles_per_warp(gpu, set, bits);
    let parts: Vec<(MatArg, u64, usize)> = set
        .iter()
        .map(|&(m, y)| (m, y, (m.rows as usize).div_ceil(16 * rt)))
        .collect();
    let (arg, blocks) = MatSet::new("matvec_tc", &parts)?;
    let f = gpu.k.fmt(first.fmt)?.matvec_tc;
    let threads = 32 * warps(rt);
    let bytes = smem(first, bits, rt) as u32;
    let (n, rt) = (n as i32, rt as i32);
    gpu.launch(f, (blocks as u32, 1, 1), threads, bytes, cuda_args![arg, x, u, n, rt])
}
