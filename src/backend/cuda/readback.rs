//! Small device→host reads through page-locked memory. `Readback`: a copy
//! into pageable memory goes through the driver's own staging with a wait
//! of its own per part; into pinned memory the parts are queued together
//! and the stream is waited for once. `Published`: the routing of a
//! streamed MoE step (expert ids, and for a split step the weights and
//! the activations), once per layer, written by a kernel into mapped
//! pinned memory with a flag that the host spins on.

use super::check::Check;
use crate::error::Result;
use cudarc::driver::sys;
use std::ffi::c_void;

/// Pinned bytes kept for reads (enough for four tokens' activations of a
/// hidden size of 8,192 with their routing).
pub(crate) const READBACK_BYTES: usize = 256 << 10;

/// Where each part starts: 16-byte aligned.
const ALIGN: usize = 16;

/// A page-locked buffer, allocated on first use and freed by the owning
/// `Gpu` (`free`), whose context it was allocated in.
#[derive(Default)]
pub(crate) struct Readback {
    ptr: usize,
}

impl Readback {
    /// Whether `parts` fit together.
    pub fn fits(parts: &[(&mut [u8], u64)]) -> bool {
        parts
            .iter()
            .map(|(d, _)| d.len().next_multiple_of(ALIGN))
            .sum::<usize>()
            <= READBACK_BYTES
    }

    /// Queue the copies of `parts` into the buffer on `stream` (the
    /// context bound, `fits(parts)`), call `wait` (the stream's sync),
    /// then move them to their destinations.
    pub fn read(
        &mut self,
        stream: sys::CUstream,
        parts: &mut [(&mut [u8], u64)],
        wait: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        if self.ptr == 0 {
            let mut p = std::ptr::null_mut();
            // SAFETY: plain allocation; freed once in `free`.
            unsafe { sys::cuMemHostAlloc(&mut p, READBACK_BYTES, 0) }
                .check("allocating pinned host memory for reads")?;
            self.ptr = p as usize;
        }
        let mut off = 0;
        for (dst, src) in parts.iter() {
            if !dst.is_empty() {
                // SAFETY: `fits` keeps every part inside the buffer, which
                // nothing else uses while this holds it.
                unsafe { sys::cuMemcpyDtoHAsync_v2((self.ptr + off) as *mut c_void, *src, dst.len(), stream) }
                    .check("copy to the host")?;
            }
            off += dst.len().next_multiple_of(ALIGN);
        }
        wait()?;
        let mut off = 0;
        for (dst, _) in parts.iter_mut() {
            // SAFETY: the copies into `[off, off + len)` are complete.
            dst.copy_from_slice(unsafe { std::slice::from_raw_parts((self.ptr + off) as *const u8, dst.len()) });
            off += dst.len().next_multiple_of(ALIGN);
        }
        Ok(())
    }

    /// Free the buffer (its context bound, its copies complete).
    pub fn free(&mut self) {
        free_host(&mut self.ptr);
    }
}

/// Free page-locked memory at `*ptr` (if any) allocated by a `read`, once.
fn free_host(ptr: &mut usize) {
    if *ptr != 0 {
        // SAFETY: allocated by cuMemHostAlloc in `read`; zeroed below, so
        // freed once.
        unsafe {
            let _ = sys::cuMemFreeHost(*ptr as *mut c_void);
        }
        *ptr = 0;
    }
}

/// Words before the parts in a [`Published`] buffer: the flag.
const FLAG_WORDS: usize = 64;

/// Device→host reads written by a kernel (`publish`) into mapped
/// page-locked memory, followed by a flag that the host spins on: no
/// copy to set up and no stream sync to wake from (a streamed MoE step's
/// routing, once a layer).
#[derive(Default)]
pub(crate) struct Published {
    ptr: usize,
    /// `ptr` as the device addresses it.
    dev: u64,
    seq: u32,
}

impl Published {
    /// Whether `parts` (at most three) fit.
    pub fn fits(parts: &[(&mut [u8], u64)]) -> bool {
        parts.len() <= 3 && parts.iter().all(|(d, _)| d.len() % 4 == 0) && Readback::fits(parts)
    }

    /// Launch `publish` for `parts` with `launch` (function, args), flush
    /// the stream with `flush`, spin until the flag says the parts are
    /// written (`query`: the stream's state, looked at now and then, so
    /// that a failed stream ends the wait), then move them to their
    /// destinations.
    pub fn read(
        &mut self,
        parts: &mut [(&mut [u8], u64)],
        launch: impl FnOnce(u64, &[(u64, i32, i32); 3], u32) -> Result<()>,
        flush: impl FnOnce() -> Result<()>,
        query: impl Fn() -> sys::CUresult,
    ) -> Result<()> {
        if self.ptr == 0 {
            let mut p = std::ptr::null_mut();
            // SAFETY: plain allocation; freed once in `free`.
            unsafe { sys::cuMemHostAlloc(&mut p, 4 * FLAG_WORDS + READBACK_BYTES, sys::CU_MEMHOSTALLOC_DEVICEMAP) }
                .check("allocating mapped pinned host memory for reads")?;
            // SAFETY: fresh allocation of at least 4 bytes.
            unsafe { *(p as *mut u32) = 0 };
            let mut dev = 0;
            // SAFETY: `p` is a live page-locked allocation of this context.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, p, 0) }
                .check("mapping pinned host memory for the device")?;
            (self.ptr, self.dev) = (p as usize, dev);
        }
        let dev = self.dev;
        // (source, word offset, words) of each part.
        let mut spec = [(0u64, 0i32, 0i32); 3];
        let mut off = FLAG_WORDS;
        for ((dst, src), s) in parts.iter().zip(spec.iter_mut()) {
            *s = (*src, off as i32, (dst.len() / 4) as i32);
            off += dst.len().next_multiple_of(ALIGN) / 4;
        }
        self.seq = self.seq.wrapping_add(1).max(1);
        launch(dev, &spec, self.seq)?;
        flush()?;
        // SAFETY: the buffer's first word, aligned, written by the kernel.
        let flag = unsafe { std::sync::atomic::AtomicU32::from_ptr(self.ptr as *mut u32) };
        let mut spins = 0u32;
        while flag.load(std::sync::atomic::Ordering::Acquire) != self.seq {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(4096) {
                let r = query();
                if r != sys::CUresult::CUDA_ERROR_NOT_READY {
                    if flag.load(std::sync::atomic::Ordering::Acquire) == self.seq {
                        break;
                    }
                    r.check("waiting for the routing")?;
                    return Err(crate::error::Error::Backend {
                        backend: "cuda",
                        msg: "the stream finished without publishing the routing".into(),
                    });
                }
            }
            std::hint::spin_loop();
        }
        for ((dst, _), s) in parts.iter_mut().zip(&spec) {
            // SAFETY: the kernel wrote `[s.1, s.1 + s.2)` words before the flag.
            dst.copy_from_slice(unsafe {
                std::slice::from_raw_parts((self.ptr + 4 * s.1 as usize) as *const u8, dst.len())
            });
        }
        Ok(())
    }

    /// Free the buffer (its context bound, its kernel complete).
    pub fn free(&mut self) {
        free_host(&mut self.ptr);
    }
}
