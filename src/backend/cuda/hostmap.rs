//! Expert files mapped and registered with the driver as page-locked
//! memory: the copy of a missing expert then goes straight from the page
//! cache to the device by DMA, with no read into a staging buffer. Used
//! when the expert files fit in half the memory this process may still
//! use, its cgroup limit included (registering locks them there, where
//! they count against the limit and cannot be reclaimed:
//! [`pin_refusal`]); otherwise the cache reads into pinned staging
//! buffers.

use super::driver::{Check, Gpu};
use crate::error::{Error, Result};
use crate::experts::memory::pin_refusal;
use crate::experts::{ExpertStore, Memory};
use crate::format::Region;
use cudarc::driver::sys;
use memmap2::Mmap;
use std::path::Path;
use std::sync::Arc;

pub(crate) struct HostMap {
    map: Arc<Mmap>,
    gpu: Arc<Gpu>,
}

// SAFETY: a read-only mapping; the driver reads it, nothing writes it.
unsafe impl Send for HostMap {}
// SAFETY: as above.
unsafe impl Sync for HostMap {}

impl HostMap {
    fn register(gpu: &Arc<Gpu>, path: &Path) -> Result<HostMap> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the file is opened read-only; moeflux never writes a
        // packed model in place.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        gpu.bind()?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_READ_ONLY;
        // SAFETY: the mapping lives as long as `self`, which unregisters it.
        unsafe { sys::cuMemHostRegister_v2(map.as_ptr() as *mut std::ffi::c_void, map.len(), flags) }
            .check(&format!("registering {} with the driver", path.display()))?;
        Ok(HostMap {
            map: Arc::new(map),
            gpu: gpu.clone(),
        })
    }

    /// Bytes `[off, off + len)` of the file, for the CPU to read in place.
    pub fn region(&self, off: usize, len: usize) -> Option<Region> {
        (off.checked_add(len)? <= self.map.len()).then(|| Region::new(self.map.clone(), off, len))
    }

    /// The address of byte `off` of the file.
    pub fn at(&self, off: usize) -> *const u8 {
        // SAFETY: callers stay inside the file (expert offsets were checked
        // against its size when the store opened it).
        unsafe { self.map.as_ptr().add(off) }
    }
}

impl Drop for HostMap {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: registered in `register`; the cache synchronizes the
            // copy stream before its maps are dropped.
            unsafe {
                let _ = sys::cuMemHostUnregister(self.map.as_ptr() as *mut std::ffi::c_void);
            }
        }
    }
}

/// Every MoE layer's file registered, indexed by layer, when they fit in
/// half the memory this process may still use (read now, cgroup limit
/// included); `None` (with the reason said) otherwise, or when
/// `CudaOptions::staging` asks for the staging path. Nothing is mapped
/// before that check.
pub(crate) fn map_all(gpu: &Arc<Gpu>, store: &ExpertStore, moe_layers: &[usize]) -> Option<Vec<Option<HostMap>>> {
    if gpu.opts.staging {
        return None;
    }
    let mut total = 0u64;
    for &l in moe_layers {
        let size = store.layer_layout(l).ok()?.expert_size as u64;
        total = total.saturating_add(size.saturating_mul(store.num_experts() as u64));
    }
    if let Some(why) = pin_refusal(total, Memory::read().as_ref()) {
        gpu.notify
            .say(&format!("expert cache: {why}; copying through staging buffers"));
        return None;
    }
    let n = moe_layers.iter().max().map_or(0, |m| m + 1);
    let mut maps: Vec<Option<HostMap>> = (0..n).map(|_| None).collect();
    for &l in moe_layers {
        let m = store.layer_path(l).and_then(|p| HostMap::register(gpu, p));
        match m {
            Ok(m) => maps[l] = Some(m),
            Err(e) => {
                gpu.notify
                    .say(&format!("expert cache: {e}; copying through staging buffers"));
                return None;
            }
        }
    }
    Some(maps)
}
