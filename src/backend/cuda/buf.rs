//! Memory the backend owns: f32 activation buffers and raw bytes on the
//! device (freed in stream order when dropped), and pinned host memory
//! for the expert copies.

use super::driver::{Check, Gpu};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Device bytes, freed when dropped (after the compute stream's uses).
pub struct DevMem {
    ptr: u64,
    bytes: usize,
    gpu: Arc<Gpu>,
}

impl DevMem {
    pub(crate) fn new(gpu: &Arc<Gpu>, bytes: usize) -> Result<DevMem> {
        gpu.bind()?;
        Ok(DevMem {
            ptr: gpu.alloc(bytes)?,
            bytes,
            gpu: gpu.clone(),
        })
    }

    /// Device memory holding `data`.
    pub(crate) fn from_host(gpu: &Arc<Gpu>, data: &[u8]) -> Result<DevMem> {
        let m = DevMem::new(gpu, data.len())?;
        gpu.htod(m.ptr, data)?;
        Ok(m)
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        self.gpu.free(self.ptr, self.bytes);
    }
}

/// An f32 buffer in device memory (the backend's `Buf`). A fresh buffer
/// reads as zeros, but is only zero-filled when something reads it before
/// it has been overwritten whole (most buffers are outputs written whole
/// first, and the fill would be a wasted launch).
pub struct CudaBuf {
    mem: DevMem,
    len: usize,
    /// The zero fill is still owed.
    zero: AtomicBool,
}

impl CudaBuf {
    /// `len` floats that read as zeros.
    pub(crate) fn zeroed(gpu: &Arc<Gpu>, len: usize) -> Result<CudaBuf> {
        Ok(CudaBuf {
            mem: DevMem::new(gpu, len * 4)?,
            len,
            zero: AtomicBool::new(true),
        })
    }

    pub(crate) fn from_host(gpu: &Arc<Gpu>, data: &[f32]) -> Result<CudaBuf> {
        Ok(CudaBuf {
            mem: DevMem::from_host(gpu, bytemuck::cast_slice(data))?,
            len: data.len(),
            zero: AtomicBool::new(false),
        })
    }

    /// The address for a kernel that reads the buffer or updates it in
    /// place (the owed zero fill is queued first).
    pub(crate) fn read(&self, gpu: &Gpu) -> Result<u64> {
        if self.zero.swap(false, Ordering::Relaxed) {
            gpu.memset_zero(self.mem.ptr, self.len * 4)?;
        }
        Ok(self.mem.ptr)
    }

    /// True (and the fill no longer owed) when the buffer still reads as
    /// zeros and a kernel is about to write all of it: the kernel can then
    /// assign where it would add.
    pub(crate) fn take_zero(&self, n: usize) -> bool {
        n >= self.len && self.zero.swap(false, Ordering::Relaxed)
    }

    /// The address for a kernel that writes elements `[0, n)` without
    /// reading them: the zero fill is still queued when `n` leaves a tail.
    pub(crate) fn write(&self, gpu: &Gpu, n: usize) -> Result<u64> {
        if n >= self.len {
            self.zero.store(false, Ordering::Relaxed);
            return Ok(self.mem.ptr);
        }
        self.read(gpu)
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// An error unless the buffer holds at least `need` elements.
    pub(crate) fn want(&self, what: &str, need: usize) -> Result<()> {
        if self.len < need {
            return Err(Error::Invalid(format!(
                "{what}: buffer of {} elements, {need} needed",
                self.len
            )));
        }
        Ok(())
    }
}

/// Page-locked host memory (the source of asynchronous expert copies).
pub(crate) struct Pinned {
    ptr: *mut u8,
    bytes: usize,
    gpu: Arc<Gpu>,
}

// SAFETY: plain memory; who writes it when is ordered by the cache's events.
unsafe impl Send for Pinned {}
// SAFETY: as above.
unsafe impl Sync for Pinned {}

impl Pinned {
    pub fn new(gpu: &Arc<Gpu>, bytes: usize) -> Result<Pinned> {
        gpu.bind()?;
        let mut p = std::ptr::null_mut();
        // SAFETY: plain allocation; freed once in `drop`.
        unsafe { sys::cuMemHostAlloc(&mut p, bytes.max(1), sys::CU_MEMHOSTALLOC_PORTABLE) }
            .check(&format!("allocating {bytes} bytes of pinned host memory"))?;
        Ok(Pinned {
            ptr: p as *mut u8,
            bytes,
            gpu: gpu.clone(),
        })
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    /// The address at which kernels read the buffer over the bus (page-
    /// locked memory is mapped into the device's address space).
    pub fn device_ptr(&self) -> Result<u64> {
        self.gpu.bind()?;
        let mut d = 0;
        // SAFETY: `ptr` is a live page-locked allocation of this context.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, self.ptr as *mut std::ffi::c_void, 0) }
            .check("mapping pinned host memory for the device")?;
        Ok(d)
    }

    /// Bytes `[off, off + len)`, for the one thread that fills them.
    ///
    /// # Safety
    /// No copy from the range may be in flight, no other reference to it
    /// may be live, and it must lie inside the buffer.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn range_mut(&self, off: usize, len: usize) -> &mut [u8] {
        debug_assert!(off + len <= self.bytes);
        std::slice::from_raw_parts_mut(self.ptr.add(off), len)
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: allocated by `new`, freed once, after the streams
            // that read it (the cache synchronizes before dropping).
            unsafe {
                let _ = sys::cuMemFreeHost(self.ptr as *mut std::ffi::c_void);
            }
        }
    }
}
