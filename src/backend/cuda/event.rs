//! CUDA events: the order of work between the compute and copy streams
//! and the host, and (timed) the timeline of `timeline.rs`.

use super::check::Check;
use super::driver::Gpu;
use crate::error::Result;
use cudarc::driver::sys;
use std::sync::Arc;

/// A CUDA event (no timing), destroyed on drop.
pub(crate) struct Event {
    ev: sys::CUevent,
    gpu: Arc<Gpu>,
}

// SAFETY: events are driver handles, usable from any thread.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    pub fn new(gpu: &Arc<Gpu>) -> Result<Event> {
        Event::create(gpu, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
    }
    /// An event that also takes the time (`timeline.rs`).
    pub fn timed(gpu: &Arc<Gpu>) -> Result<Event> {
        Event::create(gpu, 0)
    }
    fn create(gpu: &Arc<Gpu>, flags: u32) -> Result<Event> {
        let mut ev = std::ptr::null_mut();
        // SAFETY: plain event creation in the bound context.
        unsafe { sys::cuEventCreate(&mut ev, flags) }.check("creating an event")?;
        Ok(Event { ev, gpu: gpu.clone() })
    }
    pub fn raw(&self) -> sys::CUevent {
        self.ev
    }
    pub fn record(&self, stream: sys::CUstream) -> Result<()> {
        if stream == self.gpu.stream {
            self.gpu.flush()?;
        }
        // SAFETY: both handles are valid.
        unsafe { sys::cuEventRecord(self.ev, stream) }.check("recording an event")
    }
    /// Make `stream` wait (on the GPU) for the last recording of this event.
    pub fn wait_on(&self, stream: sys::CUstream) -> Result<()> {
        if stream == self.gpu.stream {
            self.gpu.flush()?;
        }
        // SAFETY: both handles are valid.
        unsafe { sys::cuStreamWaitEvent(stream, self.ev, 0) }.check("waiting for an event")
    }
    /// Block the host until the last recording has completed.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is valid.
        unsafe { sys::cuEventSynchronize(self.ev) }.check("waiting for an event")
    }
    /// Whether the last recording has completed.
    pub fn done(&self) -> bool {
        // SAFETY: the handle is valid.
        unsafe { sys::cuEventQuery(self.ev) }.result().is_ok()
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: created by `new`, destroyed once.
            unsafe {
                let _ = sys::cuEventDestroy_v2(self.ev);
            }
        }
    }
}
