//! Copies of device buffers back to the host. Large ones (the logits) go
//! through a page-locked stage: from pageable memory a copy to the host
//! ran at about 2 GB/s on the lent H100 VM, which cost a decode step ~0.4
//! ms for one sequence's logits.

use super::buf::{CudaBuf, Pinned};
use super::driver::Gpu;
use crate::error::{Error, Result};
use rayon::prelude::*;
use std::sync::{Arc, Mutex};

/// Downloads of at least this many bytes go through the pinned stage.
const STAGE_MIN_BYTES: usize = 64 << 10;

/// The page-locked stage, grown to the largest download so far.
#[derive(Default)]
pub(crate) struct Stage(Mutex<Option<Pinned>>);

impl Stage {
    /// `bytes` from device address `p` through the stage, handed to `f`.
    fn fetch<R>(&self, gpu: &Arc<Gpu>, p: u64, bytes: usize, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let mut stage = self.0.lock().map_err(|_| Error::Backend {
            backend: "cuda",
            msg: "the download stage's lock was poisoned".into(),
        })?;
        let s = match stage.take() {
            Some(s) if s.len() >= bytes => stage.insert(s),
            _ => stage.insert(Pinned::new(gpu, bytes.next_power_of_two())?),
        };
        // SAFETY: the stage is ours while the lock is held, no copy into
        // it is in flight (dtoh waits for its copy), and it holds `bytes`.
        let host = unsafe { s.range_mut(0, bytes) };
        gpu.dtoh(host, p)?;
        Ok(f(host))
    }
}

/// `out.len()` elements of `buf` from `off`.
pub(crate) fn download(gpu: &Arc<Gpu>, stage: &Stage, buf: &CudaBuf, off: usize, out: &mut [f32]) -> Result<()> {
    gpu.bind()?;
    buf.want("download", off + out.len())?;
    let p = buf.read(gpu)? + 4 * off as u64;
    let bytes = 4 * out.len();
    if bytes < STAGE_MIN_BYTES {
        return gpu.dtoh(bytemuck::cast_slice_mut(out), p);
    }
    stage.fetch(gpu, p, bytes, |host| {
        bytemuck::cast_slice_mut::<f32, u8>(out).copy_from_slice(host)
    })
}

/// Each `(off, len)` part of `buf` in a vector of its own: one transfer
/// of the range that covers them through the stage, then each part
/// copied into its vector on the threads of the pool. Fresh vectors of a
/// megabyte fault their pages in as they are written, and eight of them a
/// step (the logits of 8 sequences) took 3.6 ms of host time on one
/// thread on the lent H100 VM.
pub(crate) fn download_parts(
    gpu: &Arc<Gpu>,
    stage: &Stage,
    buf: &CudaBuf,
    parts: &[(usize, usize)],
) -> Result<Vec<Vec<f32>>> {
    let lo = parts.iter().map(|p| p.0).min().unwrap_or(0);
    let hi = parts.iter().map(|p| p.0 + p.1).max().unwrap_or(0);
    if parts.len() < 2 || 4 * (hi - lo) < STAGE_MIN_BYTES {
        return crate::backend::download_each(parts, |off, out| download(gpu, stage, buf, off, out));
    }
    gpu.bind()?;
    buf.want("download", hi)?;
    let p = buf.read(gpu)? + 4 * lo as u64;
    stage.fetch(gpu, p, 4 * (hi - lo), |host| {
        let all: &[f32] = bytemuck::try_cast_slice(host).map_err(|e| Error::Backend {
            backend: "cuda",
            msg: format!("the download stage is not a run of f32s: {e}"),
        })?;
        Ok(parts
            .par_iter()
            .map(|&(off, len)| all[off - lo..off - lo + len].to_vec())
            .collect())
    })?
}
