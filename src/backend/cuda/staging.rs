//! Pinned staging buffers for expert copies where the expert files are not
//! registered with the driver, and the thread that fills them.
//!
//! A wave of experts is read (in pieces, by as many threads as there are
//! pieces) into one set of buffers while the other set's copies run; the
//! copies are issued from one thread once the wave is read (driver calls
//! on one stream from many threads contend). That thread is
//! [`StagingThread`]'s own: the expert cache queues a job per lookup and
//! goes on launching work, and before the compute stream is made to wait
//! for the copies it flushes the queue (every job's copies issued on the
//! copy stream), so that the wait covers them.

use super::buf::Pinned;
use super::check::Check;
use super::driver::{Event, Gpu};
use crate::error::Result;
use crate::experts::{ExpertStore, JobQueue};
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

/// Two waves of pinned buffers and the reads and copies through them.
struct Stager {
    gpu: Arc<Gpu>,
    waves: Vec<Wave>,
    next: usize,
}

impl Stager {
    /// Two waves of buffers of `slot_bytes` for a cache of `n_slots`.
    fn new(gpu: &Arc<Gpu>, n_slots: usize, slot_bytes: usize) -> Result<Stager> {
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
        Ok(Stager {
            gpu: gpu.clone(),
            waves,
            next: 0,
        })
    }

    /// Read each expert of `jobs` (expert, device address of its slot) of
    /// `layer` and queue its copy on the copy stream.
    fn copy(&mut self, store: &ExpertStore, layer: usize, jobs: &[(u32, u64)], size: usize) -> Result<()> {
        let gpu = &*self.gpu;
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

impl Drop for Stager {
    fn drop(&mut self) {
        // The buffers must outlive their copies (also those of a wave
        // whose event a failed job did not record).
        if self.gpu.bind().is_ok() {
            // SAFETY: the stream is valid while `gpu` lives.
            unsafe {
                let _ = sys::cuStreamSynchronize(self.gpu.copy);
            }
        }
    }
}

/// One job of the staging thread: experts of `layer`, `size` bytes each,
/// to copy into their slots (expert, device address of its slot).
struct StageJob {
    layer: usize,
    dst: Vec<(u32, u64)>,
    size: usize,
}

/// Reads of experts into the staging buffers and their copies to the
/// device, on a thread of their own ("moeflux-staging"), job by job in
/// the order they were queued: the copy stream receives the copies in
/// that order. What the copy stream must wait for before a job's copies
/// (the kernels still reading a victim slot) is queued on it by the
/// caller before [`StagingThread::push`]. Errors of a job (a failed read
/// or driver call) come back from the next [`StagingThread::flush`].
/// Dropping it waits for the job running, then for the copy stream, and
/// frees the buffers.
pub(crate) struct StagingThread {
    queue: JobQueue<StageJob>,
}

impl StagingThread {
    /// Staging buffers for a cache of `n_slots` slots of `slot_bytes`,
    /// and the thread that reads `store` into them.
    pub fn spawn(gpu: &Arc<Gpu>, store: Arc<ExpertStore>, n_slots: usize, slot_bytes: usize) -> Result<StagingThread> {
        let mut stager = Stager::new(gpu, n_slots, slot_bytes)?;
        let mut bound = false;
        let queue = JobQueue::spawn("moeflux-staging", move |j: StageJob| {
            if !bound {
                stager.gpu.bind()?;
                bound = true;
            }
            stager.copy(&store, j.layer, &j.dst, j.size)
        })?;
        Ok(StagingThread { queue })
    }

    /// Queue reading `dst`'s experts (expert, device address of its slot)
    /// of `layer`, `size` bytes each, and copying them to their slots.
    pub fn push(&self, layer: usize, dst: Vec<(u32, u64)>, size: usize) -> Result<()> {
        self.queue.push(StageJob { layer, dst, size })
    }

    /// Wait until the copies of every job queued so far are issued on the
    /// copy stream (an event recorded there next follows them); the first
    /// error of a job since the last flush.
    pub fn flush(&self) -> Result<()> {
        self.queue.flush()
    }
}
