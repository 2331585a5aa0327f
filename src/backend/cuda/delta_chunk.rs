//! The GatedDeltaNet recurrence of a long prefill chunk in the chunked
//! form of the delta rule (`kernels/delta_chunk.cu`): `delta_chunk_prep`
//! forms each 64-token chunk's products at once, `delta_chunk_scan` carries
//! the state from chunk to chunk. Heads of 128 key and value dimensions
//! (Qwen3.5, Qwen3.6, Qwen3-Next); others keep `delta_scan`.

use super::buf::CudaBuf;
use super::driver::{Gpu, MAX_GRID_Y};
use crate::backend::DeltaArgs;
use crate::cuda_args;
use crate::error::Result;
use std::sync::Arc;

/// Tokens per chunk (`DC_T`).
const T: usize = 64;
/// Key and value dimensions the kernels take (`DC_D`).
const D: usize = 128;
/// Row stride of a chunk's [T, D] tiles in shared memory (`DC_LD`).
const LD: usize = 132;
/// State rows per block of the scan (`DC_RB`).
const RB: usize = 32;
/// Row stride of the scan's tile of U0 (`DC_UL`).
const UL: usize = 36;
/// Row stride of the prep's A (`DC_AL`).
const AL: usize = 68;
/// Shared memory of `delta_chunk_prep` (`DC_PREP_SMEM`): k, q (then v),
/// A, G, β, β·γ.
const PREP_SMEM: usize = (2 * T * LD + T * AL + 3 * T) * 4;
/// Row stride of the scan's P and transposed U (`DC_PL`).
const PL: usize = 68;
/// Shared memory of `delta_chunk_scan` (`DC_SCAN_SMEM`): W, q, k, P, U0,
/// U transposed, the state rows, G and the decays.
const SCAN_SMEM: usize = (3 * T * LD + T * PL + T * UL + RB * PL + RB * LD + 2 * T) * 4;
/// Fewest tokens that take the chunked form (fewer: `delta_scan`): below
/// two chunks the token-by-token scan was as fast or faster on the H100
/// (docs/notes/2026-11-22-to-12-02-benchmark-log.md, "Chunked GatedDeltaNet for
/// CUDA prefill").
const MIN_TOKENS: usize = 2 * T;

/// Whether a prefill chunk of `n` tokens runs the chunked recurrence.
pub(crate) fn takes(gpu: &Gpu, a: &DeltaArgs, n: usize) -> bool {
    n >= MIN_TOKENS
        && n.div_ceil(T) <= MAX_GRID_Y
        && a.k_dim == D
        && a.v_dim == D
        && SCAN_SMEM.max(PREP_SMEM) <= gpu.smem_optin
}

/// Let both kernels take their shared memory (once, after loading; not
/// where the device has less to give: `takes` then refuses).
pub(crate) fn allow_shared_memory(gpu: &Gpu) -> Result<()> {
    if SCAN_SMEM.max(PREP_SMEM) > gpu.smem_optin {
        return Ok(());
    }
    gpu.allow_shared_memory(gpu.k.delta_chunk_prep, PREP_SMEM)?;
    gpu.allow_shared_memory(gpu.k.delta_chunk_scan, SCAN_SMEM)
}

/// The recurrence of `n` tokens of x `[n, C]` (after `delta_prep`: q and
/// k normalized) with `gl` `[n, 2·Hv]` (log g, β), state `ssm` `[Hv, D,
/// D]` (updated), into `out` `[n, Hv·D]` (device addresses).
pub(crate) fn run(gpu: &Arc<Gpu>, x: u64, gl: u64, ssm: u64, out: u64, n: usize, a: &DeltaArgs) -> Result<()> {
    let nc = n.div_ceil(T);
    let w = CudaBuf::zeroed(gpu, nc * T * a.v_heads * D)?; // [nc·T, Hv, D]
    let u = CudaBuf::zeroed(gpu, nc * T * a.v_heads * D)?; // [nc·T, Hv, D]
    let p = CudaBuf::zeroed(gpu, nc * a.v_heads * T * T)?; // [nc, Hv, T, T]
    let g = CudaBuf::zeroed(gpu, nc * a.v_heads * T)?; // [nc, Hv, T]
    let (wp, up, pp, gp) = (
        w.write(gpu, w.len())?,
        u.write(gpu, u.len())?,
        p.write(gpu, p.len())?,
        g.write(gpu, g.len())?,
    );
    let (ni, hk, hv) = (n as i32, a.k_heads as i32, a.v_heads as i32);
    gpu.launch(
        gpu.k.delta_chunk_prep,
        (a.v_heads as u32, nc as u32, 1),
        256,
        PREP_SMEM as u32,
        cuda_args![x, gl, wp, up, pp, gp, ni, hk, hv],
    )?;
    gpu.launch(
        gpu.k.delta_chunk_scan,
        (a.v_heads as u32, (D / RB) as u32, 1),
        256,
        SCAN_SMEM as u32,
        cuda_args![x, wp, up, pp, gp, ssm, out, ni, hk, hv],
    )
}
