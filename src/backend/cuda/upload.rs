//! Small host→device copies through page-locked memory. From pageable
//! memory the driver stages a copy itself and may first wait for the
//! stream (CUDA's "API synchronization behavior"): a streamed MoE step's
//! group table, uploaded after the step's wait for its expert copies was
//! queued, then held the host until the GPU had finished waiting, and the
//! GPU idled while the host went on to issue the experts' launches.
//! Through pinned memory the copy is only queued.

use super::check::Check;
use crate::error::Result;
use cudarc::driver::sys;
use std::ffi::c_void;

/// Slots of a ring of pinned buffers; a copy of at most `SLOT_BYTES`
/// takes the next slot, whose last copy must be complete first (an event
/// per slot).
const SLOTS: usize = 32;
pub(crate) const SLOT_BYTES: usize = 32 << 10;

/// The ring, allocated on first use and freed by the owning `Gpu`
/// (`free`), in whose context it was allocated.
#[derive(Default)]
pub(crate) struct Upload {
    ptr: usize,
    events: Vec<sys::CUevent>,
    next: usize,
}

// SAFETY: plain memory and event handles, used under the Gpu's mutex.
unsafe impl Send for Upload {}

impl Upload {
    /// Queue the copy of `src` (at most `SLOT_BYTES`) to `dst` on `stream`
    /// (the context bound; what was captured launched first).
    pub fn copy(&mut self, stream: sys::CUstream, dst: u64, src: &[u8]) -> Result<()> {
        if self.ptr == 0 {
            let mut p = std::ptr::null_mut();
            // SAFETY: plain allocation; freed once in `free`.
            unsafe { sys::cuMemHostAlloc(&mut p, SLOTS * SLOT_BYTES, 0) }
                .check("allocating pinned host memory for uploads")?;
            self.ptr = p as usize;
            for _ in 0..SLOTS {
                let mut ev = std::ptr::null_mut();
                // SAFETY: plain event creation in the bound context.
                unsafe { sys::cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) }
                    .check("creating an upload event")?;
                self.events.push(ev);
            }
        }
        let s = self.next;
        self.next = (s + 1) % SLOTS;
        let ev = self.events[s];
        // SAFETY: the event is valid; an event never recorded is complete.
        unsafe { sys::cuEventSynchronize(ev) }.check("waiting for an upload slot")?;
        let buf = (self.ptr + s * SLOT_BYTES) as *mut u8;
        // SAFETY: the slot holds SLOT_BYTES ≥ src.len() bytes (the caller's
        // bound), and its last copy is complete.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), buf, src.len()) };
        // SAFETY: the caller owns `src.len()` bytes at `dst`; the slot is
        // not written again before the event recorded after the copy.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, buf as *const c_void, src.len(), stream) }
            .check("copy to the device")?;
        // SAFETY: both handles are valid.
        unsafe { sys::cuEventRecord(ev, stream) }.check("recording an upload event")
    }

    /// Free the ring (its context bound, its copies complete).
    pub fn free(&mut self) {
        // SAFETY: created by `copy`, destroyed and freed once.
        unsafe {
            for ev in self.events.drain(..) {
                let _ = sys::cuEventDestroy_v2(ev);
            }
            if self.ptr != 0 {
                let _ = sys::cuMemFreeHost(self.ptr as *mut c_void);
            }
        }
        self.ptr = 0;
    }
}
