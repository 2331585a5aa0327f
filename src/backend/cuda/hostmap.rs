//! Expert files mapped and registered with the driver as page-locked
//! memory: the copy of a missing expert then goes straight from the page
//! cache to the device by DMA, with no read into a staging buffer. As many
//! layers' files as the pin budget allows ([`pin_budget`]: registering
//! locks them in memory, where they count against a cgroup limit and
//! cannot be reclaimed); the other layers are held in the device cache or
//! read into pinned staging buffers (`experts::tiers`).

use super::driver::{Check, Gpu};
use crate::error::{Error, Result};
use crate::experts::memory::{human_size, pin_budget};
use crate::experts::tiers::{self, LayerTiers};
use crate::experts::{CacheSize, ExpertStore, Memory};
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

/// The MoE layers' tiers (`experts::tiers`) for a device cache of
/// `n_slots` slots, and the files of the pinned ones registered, indexed
/// by layer (`None` where nothing is pinned). The pin budget is
/// `CudaOptions::pin` (`Auto`: [`pin_budget`] of the memory read now);
/// `CudaOptions::staging` pins nothing.
/// Nothing is mapped before the plan; a layer the driver refuses ends the
/// pinning there (said), the rest planned again.
pub(crate) fn map_tiers(
    gpu: &Arc<Gpu>,
    store: &ExpertStore,
    moe_layers: &[usize],
    n_slots: usize,
) -> Result<(Option<Vec<Option<HostMap>>>, LayerTiers)> {
    let mut layers = Vec::with_capacity(moe_layers.len());
    for &l in moe_layers {
        let size = store.layer_layout(l)?.expert_size as u64;
        layers.push((l, size.saturating_mul(store.num_experts() as u64)));
    }
    let total: u64 = layers.iter().map(|l| l.1).sum();
    let mem = Memory::read();
    let (budget, why) = match gpu.opts.pin {
        _ if gpu.opts.staging => (0, "staging asked for".to_string()),
        // Less the RAM tier, which fills as it reads (not counted yet).
        CacheSize::Auto => match (pin_budget(mem.as_ref()), store.ram_tier_bytes()) {
            (b, 0) => b,
            ((b, why), ram) => (
                b.saturating_sub(ram),
                format!("{why}, less the {} RAM tier", human_size(ram)),
            ),
        },
        CacheSize::Bytes(b) => (b, format!("--pin-experts {}", human_size(b))),
        CacheSize::Percent(p) => (
            (total as f64 * p / 100.0) as u64,
            format!("--pin-experts {p}% of {}", human_size(total)),
        ),
    };
    let e = store.num_experts();
    let mut tiers = tiers::plan(&layers, budget, n_slots, e);
    let paths: Vec<&Path> = tiers.pinned.iter().filter_map(|&l| store.layer_path(l).ok()).collect();
    warm(&paths);
    let n = moe_layers.iter().max().map_or(0, |m| m + 1);
    let mut maps: Vec<Option<HostMap>> = (0..n).map(|_| None).collect();
    let bytes_of = |l: usize| layers.iter().find(|x| x.0 == l).map_or(0, |x| x.1);
    for (i, &l) in tiers.pinned.clone().iter().enumerate() {
        match store.layer_path(l).and_then(|p| HostMap::register(gpu, p)) {
            Ok(m) => maps[l] = Some(m),
            Err(err) => {
                gpu.notify
                    .say(&format!("expert cache: {err}; the layers from {l} on are not pinned"));
                // Planned again with what was pinned: the same layers.
                let done: u64 = tiers.pinned[..i].iter().map(|&p| bytes_of(p)).sum();
                tiers = tiers::plan(&layers, done, n_slots, e);
                break;
            }
        }
    }
    let pinned = tiers.pinned_bytes(bytes_of);
    if tiers.pinned.len() < layers.len() {
        gpu.notify.say(&format!(
            "expert cache: {} of {} MoE layers' files locked in host memory ({}; {why}); {} held on the device for good, {} read through staging buffers",
            tiers.pinned.len(),
            layers.len(),
            human_size(pinned),
            tiers.held.len(),
            tiers.staged.len()
        ));
    }
    let maps = (!tiers.pinned.is_empty()).then_some(maps);
    Ok((maps, tiers))
}

/// Ask the kernel to read `paths` into the page cache now, all of them at
/// once (`POSIX_FADV_WILLNEED`: reads queued, no copy, nearly free for
/// pages already cached), so that registering them next finds their pages
/// there: the driver faults a file's pages in one after the other, about
/// one disk stream. A file that cannot be opened is left to the
/// registration to report.
fn warm(paths: &[&Path]) {
    use std::os::fd::AsRawFd;
    std::thread::scope(|s| {
        for p in paths {
            s.spawn(move || {
                if let Ok(f) = std::fs::File::open(p) {
                    // SAFETY: a valid descriptor; advice only.
                    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_WILLNEED) };
                }
            });
        }
    });
}
