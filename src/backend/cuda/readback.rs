//! Small device→host reads through page-locked memory: the routing of a
//! streamed MoE step (expert ids, and for a split step the weights and
//! the activations) comes back once per layer, and a copy into pageable
//! memory goes through the driver's own staging with a wait of its own
//! per part; into pinned memory the parts are queued together and the
//! stream is waited for once.

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
        if self.ptr != 0 {
            // SAFETY: allocated by `read`, freed once.
            unsafe {
                let _ = sys::cuMemFreeHost(self.ptr as *mut c_void);
            }
            self.ptr = 0;
        }
    }
}
