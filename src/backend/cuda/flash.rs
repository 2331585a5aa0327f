//! Attention of prefill chunks on tensor cores (`kernels/flash.cu`): the
//! rows of a sequence in tiles of [`BQ`], the keys in tiles of 64 (16 for
//! heads of 256), the softmax online, q·k and p·v through `mma.sync` with
//! each operand split into two bf16 parts (SPEC §6's CUDA fast path). It
//! takes the sequences of a call that bring at least [`MIN_ROWS`] rows,
//! where the device has tensor cores and they are not turned off
//! (`CudaOptions::tensor_cores`), for heads of 64, 128 or 256 dimensions
//! with `v_dim == head_dim`; everything else goes to the `attention`
//! kernel (one block per head and row).

use super::driver::{Gpu, MAX_GRID_Y};
use super::seqs::Seqs;
use crate::backend::AttnArgs;
use crate::cuda_args;
use crate::error::Result;
use cudarc::driver::sys::CUfunction;

/// Query rows per block (`FA_BQ` in kernels/flash.cu).
const BQ: usize = 64;
/// Threads per block (`FA_THREADS`).
const THREADS: u32 = 128;
/// Fewest rows of one sequence that take the tiled kernel: a tile of 64
/// rows with fewer than 16 in it wastes more than the per-row kernel.
pub(crate) const MIN_ROWS: usize = 16;

/// The kernel for heads of `d` dimensions, with its key tile.
fn variant(gpu: &Gpu, d: usize) -> Option<(CUfunction, usize)> {
    let k = &gpu.k.base;
    match d {
        64 => Some((k.flash_attention64, 64)),
        128 => Some((k.flash_attention128, 64)),
        // Key tiles of 16: with tiles of 32 its scores took 16 more
        // registers a thread and pp4096 of the Qwen3.6 shape ran 5% slower.
        256 => Some((k.flash_attention256, 16)),
        _ => None,
    }
}

/// Dynamic shared memory of a block: q, and a key tile of k and v, each
/// as two bf16 parts.
fn smem(d: usize, kt: usize) -> usize {
    2 * (BQ + 2 * kt) * d * 2
}

/// Whether the tiled kernel takes these heads on this device.
pub(crate) fn takes(gpu: &Gpu, a: &AttnArgs) -> bool {
    gpu.tensor_cores
        && a.v_dim == a.head_dim
        && variant(gpu, a.head_dim).is_some_and(|(_, kt)| smem(a.head_dim, kt) <= gpu.smem_optin)
}

/// Let each variant take its shared memory, where the device allows it
/// (once, after the kernels are loaded).
pub(crate) fn allow_shared_memory(gpu: &Gpu) -> Result<()> {
    if !gpu.tensor_cores {
        return Ok(());
    }
    for d in [64, 128, 256] {
        if let Some((f, kt)) = variant(gpu, d) {
            if smem(d, kt) <= gpu.smem_optin {
                gpu.allow_shared_memory(f, smem(d, kt))?;
            }
        }
    }
    Ok(())
}

/// The attention of the rows of `t` (every sequence of it at least
/// MIN_ROWS rows, `takes` true): q at `q0`, out at `o0`, rows counted from
/// t's base; the caches of types `(ktype, vtype)` (`KV_*` of kernels/kv.cuh).
/// Returns false, launching nothing, if the grid would be too
/// tall.
pub(crate) fn attend(gpu: &Gpu, q0: u64, o0: u64, t: &Seqs, a: &AttnArgs, (ktype, vtype): (i32, i32)) -> Result<bool> {
    let Some((f, kt)) = variant(gpu, a.head_dim) else {
        return Ok(false);
    };
    let tiles = t.tiles(BQ);
    if tiles == 0 || tiles > MAX_GRID_Y {
        return Ok(tiles == 0);
    }
    let (h, hkv, sc) = (a.n_heads as i32, a.n_kv_heads as i32, a.scale);
    gpu.launch(
        f,
        (a.n_heads as u32, tiles as u32, 1),
        THREADS,
        smem(a.head_dim, kt) as u32,
        cuda_args![q0, o0, *t, h, hkv, sc, ktype, vtype],
    )?;
    Ok(true)
}
