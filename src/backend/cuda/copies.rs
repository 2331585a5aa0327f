//! Host→device copies of expert-sized pieces from memory registered with
//! the driver, queued as one batch where the driver has
//! `cuMemcpyBatchAsync` (CUDA 13 drivers): on the lent H200, batches of
//! expert-sized pieces reach the rate of one large copy, and one call a piece
//! does not (docs/notes/2026-11-22-to-12-02-benchmark-log.md, "Expert copies in
//! batches"; `tools/device/copy_rate.cu`). Older drivers, and a
//! driver that refuses a batch, get one `cuMemcpyHtoDAsync` a piece.

use super::driver::Check;
use crate::error::Result;
use cudarc::driver::sys;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The first driver version (13.0) whose library has
/// `cuMemcpyBatchAsync_v2`.
const BATCH_DRIVER: i32 = 13000;

/// Whether this process's driver takes batches of copies: asked once,
/// and off for good once a batch is refused (its copies are then issued
/// one by one: the same bytes to the same places).
fn batches() -> bool {
    static ASKED: OnceLock<bool> = OnceLock::new();
    let driver = *ASKED.get_or_init(|| {
        let mut v = 0;
        // SAFETY: writes one integer.
        let ok = unsafe { sys::cuDriverGetVersion(&mut v) } == sys::CUresult::CUDA_SUCCESS;
        ok && v >= BATCH_DRIVER
    });
    driver && !REFUSED.load(Ordering::Relaxed)
}

/// A batch was refused by the driver.
static REFUSED: AtomicBool = AtomicBool::new(false);

/// Queue on `stream` the copies of `size` bytes each from host address
/// `src` (registered with the driver) to device address `dst`, for every
/// `(dst, src)` of `pieces`. The copies of a batch may run in any order
/// among themselves (none overlaps another's destination), all after the
/// work queued on `stream` before and before the work queued after.
///
/// # Safety
/// Each `src .. src + size` lies in memory registered with the driver
/// that outlives the copies; each `dst .. dst + size` is device memory
/// that nothing else writes until they are done.
pub(crate) unsafe fn host_to_device(pieces: &[(u64, *const u8)], size: usize, stream: sys::CUstream) -> Result<()> {
    if pieces.len() > 1 && batches() {
        let mut dsts: Vec<sys::CUdeviceptr> = pieces.iter().map(|p| p.0).collect();
        let mut srcs: Vec<sys::CUdeviceptr> = pieces.iter().map(|p| p.1 as sys::CUdeviceptr).collect();
        let mut sizes = vec![size; pieces.len()];
        // One set of attributes for every copy of the batch: the source
        // read in stream order (the pages stay registered until the copy
        // stream is synchronized).
        // SAFETY: a plain C struct whose zero value is valid (invalid
        // location hints, which the driver ignores for registered memory).
        let mut attr: sys::CUmemcpyAttributes = unsafe { std::mem::zeroed() };
        attr.srcAccessOrder = sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
        let mut first = 0usize;
        // SAFETY: the arrays hold `pieces.len()` entries and outlive the
        // call (the driver copies them); the caller vouches for the ranges.
        let r = unsafe {
            sys::cuMemcpyBatchAsync_v2(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                pieces.len(),
                &mut attr,
                &mut first,
                1,
                stream,
            )
        };
        if r == sys::CUresult::CUDA_SUCCESS {
            return Ok(());
        }
        // Refused (a platform without batches): every piece one by one
        // below, whatever of the batch was queued (a piece copied twice
        // lands the same bytes).
        REFUSED.store(true, Ordering::Relaxed);
    }
    for &(dst, src) in pieces {
        // SAFETY: as the caller vouches.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src as *const std::ffi::c_void, size, stream) }
            .check("copying an expert to the device")?;
    }
    Ok(())
}
