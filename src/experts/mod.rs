//! `ExpertStore`: the routed experts of a packed model, one file per MoE
//! layer, expert `e` at `[e·expert_size, (e+1)·expert_size)`. Reads go
//! through an I/O thread pool (parallel reads, one per expert) in the
//! chosen [`IoMode`]; every read is counted.

mod ahead;
pub mod budget;
pub mod cache;
pub mod guesses;
mod io;
mod jobs;
pub mod memory;
pub mod plan;
pub mod ram;
pub mod repeats;
pub mod split;
pub mod tiers;

pub use ahead::AheadStats;
pub use budget::{CacheSize, CacheStats, GUESS_RANKS};
pub use cache::{Place, SlotTable};
pub use guesses::GuessTuner;
pub use io::{IoMode, DIRECT_ALIGN};
pub(crate) use jobs::JobQueue;
pub use memory::Memory;
pub use plan::{MemoryPlan, PlanInput};
pub use ram::RamStats;
pub use repeats::RepeatGate;
pub use split::{HostShare, Hybrid, SplitModel};

use crate::error::{Error, Result};
use crate::format::packed::{expert_file_name, LayerLayout, Layout, EXPERTS_DIR, LAYOUT_FILE};
use crate::format::Region;
use io::ExpertFile;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Reads ahead hold at most this share (1/N) of the memory the process
/// may still take at open.
const AHEAD_SHARE: u64 = 8;

/// Counters of expert traffic.
#[derive(Debug, Default)]
pub struct ExpertStats {
    pub experts_read: AtomicU64,
    pub bytes_read: AtomicU64,
    /// Nanoseconds spent in reads, summed over parallel readers.
    pub read_ns: AtomicU64,
    /// Wall-clock nanoseconds during which at least one read was in flight.
    pub busy_ns: AtomicU64,
    /// Reads in flight, and since when the count has been above zero.
    in_flight: Mutex<(usize, Option<Instant>)>,
}

/// Marks one read in flight for [`ExpertStats::busy_ns`] until dropped.
struct Reading<'a>(&'a ExpertStats);

impl ExpertStats {
    /// Run `read`, a read of `experts` experts and `bytes` bytes, counted
    /// (its time, the wall time of reads in flight, and once it succeeds
    /// the experts and bytes).
    fn counted<T>(&self, experts: u64, bytes: u64, read: impl FnOnce() -> Result<T>) -> Result<T> {
        let t0 = Instant::now();
        let reading = self.begin_read();
        let r = read();
        drop(reading);
        if r.is_ok() {
            self.experts_read.fetch_add(experts, Ordering::Relaxed);
            self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        }
        self.read_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }

    fn begin_read(&self) -> Reading<'_> {
        let mut f = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if f.0 == 0 {
            f.1 = Some(Instant::now());
        }
        f.0 += 1;
        Reading(self)
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        let mut f = self.0.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        f.0 = f.0.saturating_sub(1);
        if f.0 == 0 {
            if let Some(t0) = f.1.take() {
                self.0
                    .busy_ns
                    .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
        }
    }
}

/// A snapshot of [`ExpertStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub experts_read: u64,
    pub bytes_read: u64,
    /// Time in reads, summed over parallel readers.
    pub read_ns: u64,
    /// Wall time with at least one read in flight (at most the elapsed time).
    pub busy_ns: u64,
}

impl StatsSnapshot {
    /// The traffic between `earlier` and this snapshot.
    pub fn since(&self, earlier: &StatsSnapshot) -> StatsSnapshot {
        StatsSnapshot {
            experts_read: self.experts_read.saturating_sub(earlier.experts_read),
            bytes_read: self.bytes_read.saturating_sub(earlier.bytes_read),
            read_ns: self.read_ns.saturating_sub(earlier.read_ns),
            busy_ns: self.busy_ns.saturating_sub(earlier.busy_ns),
        }
    }
}

struct LayerFile {
    file: ExpertFile,
    layout: LayerLayout,
    /// Mapped files: the experts whose pages the kernel was already asked
    /// to read ahead. The hint is a system call that walks the range's
    /// pages (about 60 µs per MoE layer of 8 experts on the 16-core device
    /// host, page cache warm); it is given once per expert — mapping is
    /// chosen when the experts fit in memory, so they stay cached.
    advised: Box<[AtomicBool]>,
}

pub struct ExpertStore {
    /// `layout.json` as read.
    layout: Layout,
    /// Shared with the reads ahead, which run on the I/O pool.
    layers: Vec<Option<Arc<LayerFile>>>,
    num_experts: usize,
    group_size: usize,
    mode: IoMode,
    /// The bytes of all expert files, and the memory `Auto` was resolved
    /// against.
    expert_bytes: u64,
    memory: Option<Memory>,
    pool: rayon::ThreadPool,
    stats: Arc<ExpertStats>,
    /// Experts kept in this process's memory (`set_ram_tier`).
    ram: Option<ram::RamTier>,
    /// Experts read ahead of need (`set_read_ahead`).
    ahead: Option<ahead::ReadAhead>,
}

/// The size of the expert file at `path`, checked to hold `num_experts`
/// experts of `layout` (a truncated or empty file is an error that says so).
pub fn check_layer_file(path: &Path, num_experts: usize, layout: &LayerLayout) -> Result<u64> {
    let len = std::fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
    let want = num_experts.checked_mul(layout.expert_size).map(|n| n as u64);
    if want != Some(len) {
        let want = want.map_or_else(|| "more than 2^64".to_string(), |n| n.to_string());
        return Err(Error::format(
            path,
            format!(
                "{len} bytes, expected {want} ({LAYOUT_FILE}: num_experts {num_experts} × expert_size {}): the file is truncated or from another model",
                layout.expert_size
            ),
        ));
    }
    Ok(len)
}

impl ExpertStore {
    /// Open `DIR/packed_experts/`, checking each layer file's size against
    /// its layout. `IoMode::Auto` is resolved against the total size of
    /// the expert files and the memory this process may use, its cgroup
    /// limit included ([`IoMode::resolve`], [`Memory::read`]).
    /// `IoMode::Direct` on a filesystem that refuses `O_DIRECT` falls back
    /// to `Pread` with a warning; [`ExpertStore::mode`] says which mode is
    /// in use.
    pub fn open(dir: &Path, num_layers: usize, mode: IoMode, io_threads: usize) -> Result<ExpertStore> {
        let layout = Layout::read(dir)?;
        if layout.num_layers != num_layers {
            return Err(Error::format(
                dir.join(EXPERTS_DIR).join(LAYOUT_FILE),
                format!(
                    "`num_layers` is {}, the model has {num_layers} layers",
                    layout.num_layers
                ),
            ));
        }
        let expert_bytes: u64 = (0..num_layers)
            .filter_map(|i| layout.layer(i))
            .map(|ll| (ll.expert_size as u64).saturating_mul(layout.num_experts as u64))
            .fold(0, u64::saturating_add);
        let memory = Memory::read();
        let mut mode = mode.resolve(expert_bytes, memory);
        let mut layers = Vec::with_capacity(num_layers);
        for i in 0..num_layers {
            let Some(ll) = layout.layer(i) else {
                layers.push(None);
                continue;
            };
            let path = dir.join(EXPERTS_DIR).join(expert_file_name(i));
            let len = check_layer_file(&path, layout.num_experts, ll)?;
            let file = match ExpertFile::open(&path, len, mode)? {
                Some(f) => f,
                None => {
                    // Said by the caller, which sees the mode change.
                    mode = IoMode::Pread;
                    // Layers opened before this one keep O_DIRECT, which works for them.
                    ExpertFile::open_pread(&path)?
                }
            };
            layers.push(Some(Arc::new(LayerFile {
                file,
                layout: ll.clone(),
                advised: (0..layout.num_experts).map(|_| AtomicBool::new(false)).collect(),
            })));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(io_threads.max(1))
            .thread_name(|i| format!("moeflux-io-{i}"))
            .build()
            .map_err(|e| Error::Invalid(format!("I/O thread pool: {e}")))?;
        Ok(ExpertStore {
            layers,
            num_experts: layout.num_experts,
            group_size: layout.group_size,
            mode,
            expert_bytes,
            memory,
            pool,
            stats: Arc::new(ExpertStats::default()),
            layout,
            ram: None,
            ahead: None,
        })
    }

    /// Keep up to `size` of experts read from disk in this process's memory
    /// (`--ram-cache`; `Percent` of the experts' bytes). `Auto`: where reads
    /// go around the page cache (`O_DIRECT`), half of the memory the
    /// process may still take; otherwise none (the page cache holds them).
    /// Returns the tier's bytes (0: off); a size above the memory left is
    /// an error that says so.
    pub fn set_ram_tier(&mut self, size: CacheSize) -> Result<u64> {
        let moe: Vec<usize> = (0..self.layers.len()).filter(|&l| self.layers[l].is_some()).collect();
        let slot = self.largest_expert();
        let room = self.memory.map(|m| m.available);
        let bytes = match size {
            CacheSize::Auto if self.mode == IoMode::Direct => room.unwrap_or(0) / 2,
            CacheSize::Auto => 0,
            CacheSize::Bytes(n) => n,
            CacheSize::Percent(p) => (self.expert_bytes as f64 * p / 100.0) as u64,
        }
        .min(self.expert_bytes);
        if let Some(room) = room.filter(|&r| bytes > r) {
            return Err(Error::Invalid(format!(
                "a RAM tier of {:.2} GB does not fit: {:.2} GB of memory is left to this process",
                bytes as f64 / 1e9,
                room as f64 / 1e9
            )));
        }
        let slots = (bytes / slot.max(1)) as usize;
        self.ram = (slots > 0).then(|| ram::RamTier::new(&moe, self.num_experts, slots, slot));
        Ok(slots as u64 * slot)
    }

    /// Bytes of the largest expert of any MoE layer (0 without one).
    fn largest_expert(&self) -> u64 {
        (0..self.layers.len())
            .filter_map(|l| self.layer_layout(l).ok())
            .map(|l| l.expert_size as u64)
            .max()
            .unwrap_or(0)
    }

    /// Read experts ahead of need ([`ExpertStore::read_ahead`]) or not.
    /// It pays where reads go to disk (`O_DIRECT`: the files exceed the
    /// memory); elsewhere the page cache keeps the files, and a read ahead
    /// would only copy what is there.
    ///
    /// At most an eighth of the memory the process may still take
    /// (`Memory::available` at open) is held in reads ahead, so that a
    /// batch's or a prompt's guesses of large experts stay well inside a
    /// container's limit.
    pub fn set_read_ahead(&mut self, on: bool) {
        let second = self.layers.iter().enumerate().filter(|(_, l)| l.is_some()).nth(1);
        let size = self.largest_expert().max(1);
        let most = self
            .memory
            .map_or(usize::MAX, |m| ((m.available / AHEAD_SHARE / size) as usize).max(1));
        self.ahead = on.then(|| {
            let mut ra = ahead::ReadAhead::default();
            ra.token_layer = second.map(|(i, _)| i);
            ra.most = most;
            ra
        });
    }

    /// Whether [`ExpertStore::read_ahead`] reads (`set_read_ahead`).
    pub fn reads_ahead(&self) -> bool {
        self.ahead.is_some()
    }

    /// Start reading the best of `guesses` of `layer` (`[n, k]`: each of
    /// n tokens' `k` router guesses, best first) on the I/O pool, a guess
    /// at what that layer's next [`ExpertStore::read`] asks for: it takes
    /// them from here, waiting for a read still running. How many of each
    /// token's guesses is tuned on step times (a step begins with the
    /// guesses for the second MoE layer); the tokens' guesses are read
    /// rank by rank (every token's best, then every token's second, ...),
    /// each expert once, as many as an eighth of the memory holds
    /// ([`ExpertStore::set_read_ahead`]). Experts the RAM tier holds are
    /// skipped; the guesses of another layer not asked for are dropped.
    /// Does nothing unless reads ahead are on. Reads ahead are counted as
    /// reads.
    pub fn read_ahead(&self, layer: usize, guesses: &[u32], k: usize) -> Result<()> {
        let Some(ra) = &self.ahead else {
            return Ok(());
        };
        if k == 0 || !guesses.len().is_multiple_of(k) {
            return Err(Error::Invalid(format!(
                "read ahead: {} guesses are not whole rows of {k}",
                guesses.len()
            )));
        }
        let lf = self.layer_file(layer)?.clone();
        let take = ra.count(k, ra.token_layer == Some(layer))?.min(k);
        let held = |e: u32| self.ram.as_ref().is_some_and(|r| r.holds(layer, e));
        let want = ahead::pick(guesses, k, take, self.num_experts, ra.most, held);
        let size = lf.layout.expert_size;
        for (e, pending) in ra.start(layer, &want)? {
            let (lf, stats) = (lf.clone(), self.stats.clone());
            self.pool.spawn(move || {
                pending.finish(stats.counted(1, size as u64, || lf.file.read(e as u64 * size as u64, size, false)));
            });
        }
        Ok(())
    }

    /// The reads ahead's counters, when they are on.
    pub fn ahead_stats(&self) -> Option<AheadStats> {
        self.ahead.as_ref().map(|a| a.stats())
    }

    /// The RAM tier's counters, when there is one.
    pub fn ram_stats(&self) -> Option<RamStats> {
        self.ram.as_ref().map(|r| r.stats())
    }

    /// A number that identifies this store for as long as it lives (moves
    /// included): device caches use it to tell whose experts they hold.
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.stats) as usize
    }

    pub fn num_experts(&self) -> usize {
        self.num_experts
    }
    /// `packed_experts/layout.json`.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    pub fn group_size(&self) -> usize {
        self.group_size
    }
    /// The mode reads use (never `Auto`; `Pread` after an `O_DIRECT` fallback).
    pub fn mode(&self) -> IoMode {
        self.mode
    }
    /// The bytes of all expert files.
    pub fn expert_bytes(&self) -> u64 {
        self.expert_bytes
    }
    /// The memory the process could use when the store opened (`None`
    /// where it could not be read): what `IoMode::Auto` was resolved against.
    pub fn memory(&self) -> Option<Memory> {
        self.memory
    }

    /// The expert file of `layer` (device caches map it to copy from the
    /// page cache directly).
    pub fn layer_path(&self, layer: usize) -> Result<&Path> {
        self.layer_file(layer).map(|l| l.file.path())
    }

    pub fn layer_layout(&self, layer: usize) -> Result<&LayerLayout> {
        self.layer_file(layer).map(|l| &l.layout)
    }

    fn layer_file(&self, layer: usize) -> Result<&Arc<LayerFile>> {
        self.layers
            .get(layer)
            .and_then(|l| l.as_ref())
            .ok_or_else(|| Error::Invalid(format!("layer {layer} has no expert file")))
    }

    /// The experts `ids` (distinct) of `layer`: from the RAM tier where it
    /// holds them, read (in parallel) otherwise; one blob per id.
    pub fn read(&self, layer: usize, ids: &[u32]) -> Result<Vec<Region>> {
        self.layer_file(layer)?;
        for &e in ids {
            if e as usize >= self.num_experts {
                return Err(Error::Invalid(format!(
                    "expert {e} of layer {layer} out of range (the model has {} experts)",
                    self.num_experts
                )));
            }
        }
        match &self.ram {
            Some(r) => r.get(layer, ids, |m| self.read_missing(layer, m)),
            None => self.read_missing(layer, ids),
        }
    }

    /// `ids` of `layer` from the reads ahead where they hold them, read
    /// from the files (in parallel) otherwise.
    fn read_missing(&self, layer: usize, ids: &[u32]) -> Result<Vec<Region>> {
        let Some(ra) = &self.ahead else {
            return self.read_files(layer, ids);
        };
        let mut ahead = Vec::with_capacity(ids.len());
        for &e in ids {
            ahead.push(ra.take(layer, e)?);
        }
        let rest: Vec<u32> = ids
            .iter()
            .zip(&ahead)
            .filter(|(_, a)| a.is_none())
            .map(|(&e, _)| e)
            .collect();
        let mut read = match rest.is_empty() {
            true => Vec::new(),
            false => self.read_files(layer, &rest)?,
        }
        .into_iter();
        ids.iter()
            .zip(ahead)
            .map(|(&e, a)| match a {
                // A read ahead that failed is read again (its error, if
                // it fails again, is this read's).
                Some(p) => p
                    .wait()
                    .or_else(|_| self.read_files(layer, &[e]).map(|mut v| v.remove(0))),
                None => read
                    .next()
                    .ok_or_else(|| Error::Invalid("an expert read came back short".into())),
            })
            .collect()
    }

    /// Whether a RAM tier holds experts read from disk (`read` serves them).
    pub fn has_ram_tier(&self) -> bool {
        self.ram.is_some()
    }

    /// The bytes the RAM tier may hold once full (0 without one): memory
    /// the process will take as it reads, not taken yet.
    pub fn ram_tier_bytes(&self) -> u64 {
        self.ram.as_ref().map_or(0, |r| {
            let s = r.stats();
            s.slots * s.slot_bytes
        })
    }

    /// Read the experts `ids` of `layer` from their file, in parallel.
    fn read_files(&self, layer: usize, ids: &[u32]) -> Result<Vec<Region>> {
        let lf = self.layer_file(layer)?;
        let size = lf.layout.expert_size;
        let read = |&e: &u32| {
            let advise = !lf.advised[e as usize].swap(true, Ordering::Relaxed);
            lf.file.read(e as u64 * size as u64, size, advise)
        };
        let n = ids.len() as u64;
        self.stats.counted(n, n * size as u64, || match self.mode {
            // A mapped read is a view (no copy): no need to hand it to the pool.
            IoMode::Mmap => ids.iter().map(read).collect(),
            _ => self.pool.install(|| {
                use rayon::prelude::*;
                ids.par_iter().map(read).collect()
            }),
        })
    }

    /// Read bytes `[off, off + dst.len())` of expert `e` of `layer` into
    /// `dst` (callers that own the destination, such as pinned staging
    /// memory for device copies, save a copy; several callers may read
    /// pieces of one expert in parallel). Counted like
    /// [`ExpertStore::read`], an expert for the piece that starts at 0;
    /// `read_ns` adds up the time of each call.
    pub fn read_into(&self, layer: usize, e: u32, off: usize, dst: &mut [u8]) -> Result<()> {
        let lf = self.layer_file(layer)?;
        let size = lf.layout.expert_size;
        if e as usize >= self.num_experts || off + dst.len() > size {
            return Err(Error::Invalid(format!(
                "bytes {off}..{} of expert {e} of layer {layer} (the model has {} experts of {size} bytes)",
                off + dst.len(),
                self.num_experts
            )));
        }
        let len = dst.len() as u64;
        self.stats.counted((off == 0) as u64, len, || {
            lf.file.read_into(e as u64 * size as u64 + off as u64, dst)
        })
    }

    pub fn stats(&self) -> StatsSnapshot {
        StatsSnapshot {
            experts_read: self.stats.experts_read.load(Ordering::Relaxed),
            bytes_read: self.stats.bytes_read.load(Ordering::Relaxed),
            read_ns: self.stats.read_ns.load(Ordering::Relaxed),
            busy_ns: self.stats.busy_ns.load(Ordering::Relaxed),
        }
    }

    /// Set every counter back to zero.
    pub fn reset_stats(&self) {
        if let Some(r) = &self.ram {
            r.reset_stats();
        }
        if let Some(a) = &self.ahead {
            a.reset_stats();
        }
        self.stats.experts_read.store(0, Ordering::Relaxed);
        self.stats.bytes_read.store(0, Ordering::Relaxed);
        self.stats.read_ns.store(0, Ordering::Relaxed);
        self.stats.busy_ns.store(0, Ordering::Relaxed);
    }
}
