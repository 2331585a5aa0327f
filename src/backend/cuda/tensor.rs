//! Tensor-core products for prefill (`kernels/tensor.cu`): which products
//! take them, the f16 copy of their input rows (`to_half`), and the
//! launches of `gemm_tc`, `moe_up_tc` and `moe_down_tc`.
//!
//! They are the fast path of SPEC §6 on CUDA: weights and activations
//! rounded to f16, products accumulated in f32. They run where the device
//! has compute capability 8.0 or later and the model was not opened
//! `exact` (`CudaOptions::tensor_cores`), for products of more than
//! `PDL_MAX_TOKENS` tokens (prefill chunks) and of 9 to 16 (batched decode
//! steps) through matrices the kernels take ([`takes`]); 2 to 8 tokens
//! through quantized matrices take `matvec_tc` (`matvec_tc.rs`), one token
//! the f32 kernels.

use super::buf::DevMem;
use super::driver::Gpu;
use super::format::{format_of, Format, MatArg, MatSet};
use crate::cuda_args;
use crate::error::{Error, Result};
use std::sync::Arc;

/// A block's tile: weight rows, tokens, columns per step (`TC_BM`,
/// `TC_BN`, `TC_BK` in kernels/tensor.cu), and its threads.
pub(crate) const TC_BM: usize = 64;
pub(crate) const TC_BN: usize = 64;
pub(crate) const TC_BK: usize = 64;
pub(crate) const TC_THREADS: u32 = 128;

/// The smallest product (tokens) that takes the tensor cores: above a
/// batched decode step.
pub(crate) const MIN_TOKENS: usize = super::driver::PDL_MAX_TOKENS + 1;

/// A batched decode step (5 to 16 tokens; quantized matrices, 9 to 16:
/// up to 8 take `matvec_tc` or `matvec_qt`, see matrix.rs) takes the tensor cores, in one
/// 16-token tile (`gemm_tc16`) with the columns split so that the tiles
/// fill the GPU, for matrices of at least this many rows: `matvec_tok4/8`
/// re-read every token's x for each 4 rows of a warp and were bound by
/// L1 (52 µs for [8192, 2048] at 4 bits and 8 tokens on the H100, ncu).
pub(crate) const STEP_MIN_ROWS: usize = 512;

/// ... and of at least this many tokens: with fewer, most of the 16-token
/// tile idles, and 2 and 4 streams of a resident decode were slower with it on
/// the H100 (docs/notes/2026-11-22-to-12-02-benchmark-log.md, "Batched token
/// mixers and the logits stage").
pub(crate) const STEP_MIN_TOKENS: usize = 5;

/// Whether the tensor-core kernels take a matrix of weight format code
/// `fmt` (log2 group size `gs_shift` for quantized formats) over `cols`
/// columns: f16, bf16 or 2/4/8-bit weights in 16-byte aligned rows
/// (`vec`), whole steps of columns, and quantization groups no shorter
/// than a 16-byte chunk of packed weights.
pub(crate) fn takes(gpu: &Gpu, fmt: i32, gs_shift: i32, cols: usize, vec: bool) -> bool {
    if !gpu.tensor_cores || !vec || cols == 0 || !cols.is_multiple_of(TC_BK) {
        return false;
    }
    // Elements in one 16-byte chunk of a packed row.
    let chunk = match format_of(fmt) {
        Format::F32 => return false,
        Format::Bf16 | Format::F16 => return true,
        Format::Q2 => 64,
        Format::Q4 => 32,
        Format::Q8 => 16,
    };
    (1usize << gs_shift) >= chunk
}

/// Bytes of dynamic shared memory a tensor-core block of `bn`-token tiles
/// takes (`sizeof(TcSmem<BN>)` in kernels/tensor.cu: two buffers of 64 ×
/// 64 halves of weights and of bn × 64 of each activation part, 2 × 2 ×
/// 64 × 4 floats of scales and biases, 2 × bn × 4 of group sums).
pub(crate) const fn smem_bytes(bn: usize) -> u32 {
    (2 * 64 * 64 * 2 + 2 * 2 * bn * 64 * 2 + 2 * 2 * 64 * 4 * 4 + 2 * bn * 4 * 4) as u32
}

/// Tokens per tile of the expert kernels for `pairs` (token, expert)
/// pairs in `groups` expert groups: 16 (`moe_up_tc16`, `moe_down_tc16`)
/// while the mean group fits in one such tile with room to spare, 32 for
/// means up to 24, else 64. A group longer than its tile takes a second
/// pass over its weights for the tokens left: with tiles of 16, a mean of
/// 16 (Qwen3.6 shape, pp512: 256 experts) unpacks the weights of about 4
/// groups in 10 twice (Poisson counts). Tiles of 32 made the Qwen3.6 shape's
/// pp512 faster on the H100 (docs/notes/2026-11-22-to-12-02-benchmark-log.md,
/// "Product steps without rematerialized addresses; tiles of 32 tokens").
pub(crate) fn expert_tile(pairs: usize, groups: usize) -> usize {
    match pairs {
        p if p <= 8 * groups => 16,
        p if p <= 24 * groups => 32,
        _ => TC_BN,
    }
}

/// Let the tensor-core kernels take their shared memory (once, after the
/// kernels are loaded; nothing when they are not used).
pub(crate) fn allow_shared_memory(gpu: &Gpu) -> Result<()> {
    if !gpu.tensor_cores {
        return Ok(());
    }
    for (_, f) in &gpu.k.formats {
        for (func, bn) in [
            (f.gemm_tc, TC_BN),
            (f.gemm_tc16, 16),
            (f.moe_up_tc, TC_BN),
            (f.moe_down_tc, TC_BN),
            (f.moe_up_tc16, 16),
            (f.moe_down_tc16, 16),
            (f.moe_up_tc32, 32),
            (f.moe_down_tc32, 32),
        ] {
            gpu.allow_shared_memory(func, smem_bytes(bn) as usize)?;
        }
    }
    Ok(())
}

/// The `HalfRows` kernel argument: a product's input rows split in two
/// f16 parts, the factor that undoes each row's scale, and (for quantized
/// weights) each row's sums per group.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct HalfRows {
    pub hi: u64,
    pub lo: u64,
    pub inv: u64,
    pub sum: u64,
}

/// Rows of activations split in f16 parts (`to_half`), with their memory.
pub(crate) struct Half {
    _mem: DevMem,
    pub arg: HalfRows,
}

/// `n` rows of `cols` f32 at `x` split into f16 parts for products with
/// weights of format code `fmt` (kernels/tensor.cu `to_half`): each row
/// scaled by a power of two, its columns in the order in which the
/// kernels unpack a packed word of that format, and for quantized
/// weights each row's sums per group of `1 << gs_shift` columns; with
/// `rows` (a device list of `n` row indices), only those rows are
/// converted, each to its own place in a copy of `total` rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn to_half(
    gpu: &Arc<Gpu>,
    x: u64,
    rows: Option<u64>,
    n: usize,
    total: usize,
    cols: usize,
    fmt: i32,
    gs_shift: i32,
) -> Result<Half> {
    let (half, pb, gs) = half_rows(gpu, total, cols, fmt, gs_shift)?;
    let arg = half.arg;
    let (rp, nn, cc) = (rows.unwrap_or(0), n as i32, cols as i32);
    // One warp per row, 4 to a block.
    let grid = (n.div_ceil(4) as u32, 1, 1);
    gpu.launch(
        gpu.k.to_half,
        grid,
        128,
        0,
        cuda_args![x, rp, arg.hi, arg.lo, arg.inv, arg.sum, nn, cc, gs, pb],
    )?;
    Ok(half)
}

/// The memory of `total` rows of `cols` split for weights of format code
/// `fmt` (see [`to_half`]), not yet written, with the kernel's `pb` (the
/// columns of a packed word) and group shift.
pub(crate) fn half_rows(
    gpu: &Arc<Gpu>,
    total: usize,
    cols: usize,
    fmt: i32,
    gs_shift: i32,
) -> Result<(Half, i32, i32)> {
    let (gs_shift, pb) = match format_of(fmt) {
        Format::Q2 => (Some(gs_shift), 16),
        Format::Q4 => (Some(gs_shift), 8),
        Format::Q8 => (Some(gs_shift), 4),
        _ => (None, 1i32),
    };
    // The kernels address a row's columns by 32-bit element offsets.
    if total.checked_mul(cols).is_none_or(|e| e > u32::MAX as usize) {
        return Err(Error::Invalid(format!(
            "to_half: {total} rows of {cols} columns exceed the tensor-core kernels' 32-bit offsets; \
             use a shorter prefill chunk"
        )));
    }
    let part = total * cols * 2;
    let groups = gs_shift.map_or(0, |g| cols >> g);
    let mem = DevMem::new(gpu, 2 * part + total * 4 + total * groups * 4)?;
    let base = mem.ptr();
    let arg = HalfRows {
        hi: base,
        lo: base + part as u64,
        inv: base + 2 * part as u64,
        sum: match gs_shift {
            Some(_) => base + (2 * part + total * 4) as u64,
            None => 0,
        },
    };
    Ok((Half { _mem: mem, arg }, pb, gs_shift.unwrap_or(0)))
}

/// `y_i[n, rows_i] = x[n, cols] · W_iᵀ` on tensor cores for each (`Mat`
/// argument, output address) of `set`: 1 to `MQ_SET` matrices of one
/// format code and group size over the same cols, each one [`takes`];
/// x is split once, one launch.
pub(crate) fn gemm(gpu: &Arc<Gpu>, set: &[(MatArg, u64)], x: u64, n: usize) -> Result<()> {
    let Some(&(m0, _)) = set.first() else {
        return Ok(());
    };
    if set
        .iter()
        .any(|(m, _)| (m.fmt, m.gs_shift, m.cols) != (m0.fmt, m0.gs_shift, m0.cols))
    {
        return Err(Error::Invalid(
            "gemm_tc: matrices of different formats, groups or widths in one launch".into(),
        ));
    }
    let parts: Vec<(MatArg, u64, usize)> = set
        .iter()
        .map(|&(m, y)| (m, y, (m.rows as usize).div_ceil(TC_BM)))
        .collect();
    let (arg, blocks) = MatSet::new("gemm_tc", &parts)?;
    let hx = to_half(gpu, x, None, n, n, m0.cols as usize, m0.fmt, m0.gs_shift)?;
    let (ha, nn) = (hx.arg, n as i32);
    let f = gpu.k.fmt(m0.fmt)?;
    if n >= MIN_TOKENS {
        let grid = (blocks as u32, n.div_ceil(TC_BN) as u32, 1);
        return gpu.launch(f.gemm_tc, grid, TC_THREADS, smem_bytes(TC_BN), cuda_args![arg, ha, nn]);
    }
    // A decode step: one 16-token tile per 64 rows, the columns split into
    // parts until there are two blocks per SM, the parts added in order.
    let steps = m0.cols as usize / TC_BK;
    // Each part `per` steps (the kernel takes it as given): at least one,
    // and whole quantization groups, which a part scales at their ends.
    let group_steps = match format_of(m0.fmt) {
        Format::Q2 | Format::Q4 | Format::Q8 => ((1usize << m0.gs_shift) / TC_BK).max(1),
        _ => 1,
    };
    let per = steps
        .div_ceil((2 * gpu.sms / blocks.max(1)).clamp(1, steps.max(1)))
        .next_multiple_of(group_steps);
    let parts = steps.div_ceil(per.max(1)).max(1);
    let rall: usize = set.iter().map(|(m, _)| m.rows as usize).sum();
    let ws = match parts > 1 {
        true => Some(DevMem::new(gpu, parts * n * rall * 4)?),
        false => None,
    };
    let (wp, pp) = (ws.as_ref().map_or(0, |w| w.ptr()), per as i32);
    let grid = (blocks as u32, 1, parts as u32);
    gpu.launch(
        f.gemm_tc16,
        grid,
        TC_THREADS,
        smem_bytes(16),
        cuda_args![arg, ha, nn, wp, pp],
    )?;
    if parts > 1 {
        let np = parts as i32;
        let sum_grid = ((n * rall).div_ceil(256).clamp(1, 8192) as u32, 1, 1);
        gpu.launch(f.tc_parts_sum, sum_grid, 256, 0, cuda_args![arg, wp, nn, np])?;
    }
    Ok(())
}
