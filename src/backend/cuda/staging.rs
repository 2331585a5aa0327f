//! Pinned staging buffers for expert copies where the expert files are not
//! registered with the driver: a wave of experts is read (in pieces, by
//! as many threads as there are pieces) into one set of buffers while the
//! other set's copies run; the copies are issued from one thread once the
//! wave is read (driver calls on one stream from many threads contend).

use super::buf::Pinned;
use super::check::Check;
use super::driver::{Event, Gpu};
use crate::error::Result;
use crate::experts::ExpertStore;
use cudarc::driver::sys;
use rayon::prelude::*;
use std::sync::Arc;

/// Experts per wave of copies; two waves of staging buffers alternate, so
/// that reading one overlaps the DMA of the other. Experts are read in
/// pieces of `CudaOptions::copy_piece_bytes`.
const WAVE: usize = 16;

/// One wave's staging buffers.
struct Wave {
    bufs: Vec<Pinned>,
    /// Recorded on the copy stream after the wave's copies.
    done: Event,
    used: bool,
}

pub(crate) struct Stager {
    waves: Vec<Wave>,
    next: usize,
}

impl Stager {
    /// Two waves of buffers of `slot_bytes` for a cache of `n_slots`.
    pub fn new(gpu: &Arc<Gpu>, n_slots: usize, slot_bytes: usize) -> Result<Stager> {
        let waves = (0..2)
            .map(|_| {
                Ok(Wave {
                    bufs: (0..WAVE.min(n_slots))
                        .map(|_| Pinned::new(gpu, slot_bytes))
                        .collect::<Result<_>>()?,
                    done: Event::new(gpu)?,
                    used: false,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Stager { waves, next: 0 })
    }

    /// Read each expert of `jobs` (expert, device address of its slot) of
    /// `layer` and queue its copy on the copy stream.
    pub fn copy(
        &mut self,
        gpu: &Gpu,
        store: &ExpertStore,
        layer: usize,
        jobs: &[(u32, u64)],
        size: usize,
    ) -> Result<()> {
        let wave = self.waves[0].bufs.len();
        for chunk in jobs.chunks(wave) {
            let w = self.next;
            self.next = (w + 1) % 2;
            let stg = &self.waves[w];
            if stg.used {
                stg.done.synchronize()?;
            }
            // (job, offset, length) for every piece of the wave.
            let piece = gpu.opts.copy_piece_bytes.max(4096);
            let pieces: Vec<(usize, usize, usize)> = (0..chunk.len())
                .flat_map(|j| (0..size).step_by(piece).map(move |o| (j, o, piece.min(size - o))))
                .collect();
            // With a RAM tier, whole experts from it (or read into it) first.
            let ids: Vec<u32> = chunk.iter().map(|j| j.0).collect();
            let held = store.has_ram_tier().then(|| store.read(layer, &ids)).transpose()?;
            pieces
                .par_iter()
                .map(|&(j, off, len)| {
                    // SAFETY: the wave's last copies are complete (synchronized
                    // above) and each piece is filled by one task.
                    let dst = unsafe { stg.bufs[j].range_mut(off, len) };
                    match &held {
                        Some(h) => dst.copy_from_slice(&h[j].bytes()[off..off + len]),
                        None => return store.read_into(layer, ids[j], off, dst),
                    }
                    Ok(())
                })
                .collect::<Result<Vec<()>>>()?;
            for (&(_, dst), buf) in chunk.iter().zip(&stg.bufs) {
                // SAFETY: the slot holds ≥ `size` bytes; the pinned source
                // stays untouched until `done` completes.
                unsafe { sys::cuMemcpyHtoDAsync_v2(dst, buf.as_ptr() as *const std::ffi::c_void, size, gpu.copy) }
                    .check("copying an expert to the device")?;
            }
            self.waves[w].done.record(gpu.copy)?;
            self.waves[w].used = true;
        }
        Ok(())
    }
}
