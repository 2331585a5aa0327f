//! The device-side expert cache: slots of one expert each in GPU memory
//! under a byte budget, filled by asynchronous host→device copies on the
//! copy stream — straight from the expert files where they are registered
//! with the driver, otherwise from pinned staging buffers that a thread of
//! their own reads and copies from (`staging.rs`) — and ordered against
//! the compute stream with events (a slot is overwritten only after the
//! kernels that read it are done; kernels read a slot only after its copy
//! is: a fetch first waits until the staging thread has issued every copy
//! queued so far, then makes the compute stream wait for the copy
//! stream). Which expert keeps a slot is `SlotTable`'s choice. When the
//! budget holds every expert, all are loaded once at start and a device
//! table maps (layer, expert) to its slot, so that routing never leaves
//! the GPU.

mod ahead;
mod split;

use super::buf::DevMem;
use super::copies;
use super::driver::{Event, Gpu};
use super::host_cpu::HostCpu;
use super::hostmap::{self, HostMap};
use super::staging::StagingThread;
use super::timeline::{Mark, Timeline};
use crate::error::{Error, Result};
pub(crate) use crate::experts::budget::SlotBudget;
pub use crate::experts::budget::{CacheSize, CacheStats};
use crate::experts::tiers::LayerTiers;
use crate::experts::{ExpertStore, GuessTuner, HostShare, Place, SlotTable, SplitModel};
use cudarc::driver::sys;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Counters of the copies (the table counts lookups).
#[derive(Default)]
struct Counters {
    bytes: AtomicU64,
    stall_ns: AtomicU64,
    /// Bytes of experts computed on the CPU from host memory.
    host_bytes: AtomicU64,
    host_steps: AtomicU64,
    host_ns: AtomicU64,
    host_last: AtomicU64,
    hints: AtomicU64,
    guesses: AtomicU64,
}

struct State {
    /// Which expert is in which slot, what a miss evicts, what to prefetch.
    table: SlotTable,
    /// Sequence number of the compute-stream work that last read each slot.
    use_seq: Vec<u64>,
    seq: u64,
    /// Every sequence ≤ this is known complete.
    done_seq: u64,
    uses: VecDeque<(u64, Event)>,
    /// Reads and copies of misses where an expert file is not registered
    /// with the driver (none: resident, or every file registered).
    staging: Option<StagingThread>,
    /// Copies issued or queued on the staging thread that the compute
    /// stream has not been made to wait for.
    pending: bool,
    copied: Event,
    /// How many of a router's guesses are copied (`--hybrid auto`; none:
    /// all of them).
    guesses: Option<GuessTuner>,
    /// When this cache began, for the tuner's clock.
    epoch: Instant,
}

pub(crate) struct ExpertCache {
    gpu: Arc<Gpu>,
    store_id: usize,
    slot_bytes: usize,
    n_slots: usize,
    /// The MoE layers of each tier (`experts::tiers`).
    tiers: LayerTiers,
    pool: DevMem,
    resident: bool,
    /// `[layers, experts]` slot addresses (resident only).
    table: Option<DevMem>,
    n_experts: usize,
    moe_layers: Vec<usize>,
    prefetch: bool,
    /// The expert files registered with the driver, by layer: misses are
    /// copied from the page cache directly (no staging).
    host: Option<Vec<Option<HostMap>>>,
    st: Mutex<State>,
    c: Counters,
    /// How misses are split between copies and the CPU (none: all copied),
    /// and the CPU that computes them.
    split: Mutex<Option<SplitModel>>,
    host_cpu: OnceLock<HostCpu>,
    /// Where a streamed step's time goes (`CudaOptions::trace_layers`).
    timeline: Option<Timeline>,
}

/// Slots of the stream ring: four launches' worth, so that copies run up
/// to three launches ahead of the kernels that read them.
const STREAM_RING: usize = 4 * super::moe::STREAM_CHUNK;

fn lock_err() -> Error {
    Error::Backend {
        backend: "cuda",
        msg: "the expert cache lock was poisoned by a panic".into(),
    }
}

impl ExpertCache {
    /// A cache of `n_slots` slots for the experts of `moe_layers` in `store`
    /// (`probation` of them for experts not admitted: [`SlotTable`]); all
    /// of them loaded (and the device table built) when they fit.
    pub fn new(
        gpu: &Arc<Gpu>,
        store: &Arc<ExpertStore>,
        moe_layers: &[usize],
        n_slots: usize,
        probation: usize,
        prefetch: bool,
    ) -> Result<ExpertCache> {
        let mut size = 0usize;
        for &l in moe_layers {
            size = size.max(store.layer_layout(l)?.expert_size);
        }
        let slot_bytes = size.div_ceil(256) * 256;
        let n_experts = store.num_experts();
        let total = moe_layers.len() * n_experts;
        let n_slots = n_slots.min(total);
        if n_slots == 0 || slot_bytes == 0 {
            return Err(Error::Backend {
                backend: "cuda",
                msg: "the expert cache has room for no expert".into(),
            });
        }
        let pool = DevMem::new(gpu, n_slots * slot_bytes)?;
        let n_layers = moe_layers.iter().max().map_or(0, |m| m + 1);
        let resident = n_slots == total;
        let (host, tiers) = match resident {
            true => (None, Default::default()),
            false => hostmap::map_tiers(gpu, store, moe_layers, n_slots)?,
        };
        let mut table = SlotTable::new(moe_layers, n_experts, n_slots, probation);
        let held = table.hold(&tiers.held)?;
        // `free_slots` counts on this.
        debug_assert_eq!(table.free_slots(), n_slots - tiers.held.len() * n_experts);
        // A prompt's misses stream through a ring of a few launches' slots,
        // where the cache is large enough to spare them (a sixteenth).
        if !resident && table.free_slots() >= 16 * STREAM_RING {
            table.set_stream_ring(STREAM_RING);
        }
        // A resident cache stages only while it loads (`load_all`).
        let staged = !resident && !registered(&host, moe_layers);
        let staging = match staged {
            true => Some(StagingThread::spawn(gpu, store.clone(), n_slots, slot_bytes)?),
            false => None,
        };
        let st = State {
            table,
            use_seq: vec![0; n_slots],
            seq: 0,
            done_seq: 0,
            uses: VecDeque::new(),
            staging,
            pending: false,
            copied: Event::new(gpu)?,
            guesses: None,
            epoch: Instant::now(),
        };
        let mut cache = ExpertCache {
            gpu: gpu.clone(),
            store_id: store.id(),
            slot_bytes,
            n_slots,
            tiers,
            pool,
            resident,
            table: None,
            n_experts,
            moe_layers: moe_layers.to_vec(),
            prefetch,
            host,
            st: Mutex::new(st),
            c: Counters::default(),
            split: Mutex::new(None),
            host_cpu: OnceLock::new(),
            timeline: gpu.opts.trace_layers.then(|| Timeline::new(gpu)).transpose()?,
        };
        // The pool is allocated in stream order; the copy stream may use it
        // only once that allocation is done.
        gpu.sync()?;
        if cache.resident {
            cache.load_all(store, n_layers)?;
        } else if !held.is_empty() {
            cache.load_held(&held, store)?;
        }
        Ok(cache)
    }

    /// Queue the copies of the held experts (`(layer, expert, slot)`, by
    /// layer) into their slots on the staging thread; the first fetch
    /// waits for them.
    fn load_held(&mut self, held: &[(usize, u32, usize)], store: &ExpertStore) -> Result<()> {
        let (pool, slot_bytes) = (self.pool.ptr(), self.slot_bytes);
        let st = self.st.get_mut().map_err(|_| lock_err())?;
        let thread = st.staging.as_ref().ok_or_else(|| Error::Backend {
            backend: "cuda",
            msg: "held layers without a staging thread to load them".into(),
        })?;
        for layer in held.chunk_by(|a, b| a.0 == b.0) {
            let l = layer[0].0;
            let size = store.layer_layout(l)?.expert_size;
            let jobs: Vec<(u32, u64)> = layer
                .iter()
                .map(|&(_, e, s)| (e, pool + (s * slot_bytes) as u64))
                .collect();
            thread.push(l, jobs, size)?;
        }
        st.pending = true;
        Ok(())
    }

    /// Copy every expert into its slot (through a staging thread that
    /// lives as long as the load) and upload the table.
    fn load_all(&mut self, store: &Arc<ExpertStore>, n_layers: usize) -> Result<()> {
        let thread = StagingThread::spawn(&self.gpu, store.clone(), self.n_slots, self.slot_bytes)?;
        self.st.get_mut().map_err(|_| lock_err())?.staging = Some(thread);
        let mut table = vec![0u64; n_layers * self.n_experts];
        let all: Vec<u32> = (0..self.n_experts as u32).collect();
        for &l in &self.moe_layers.clone() {
            let addrs = self.fetch(store, l, &all)?;
            table[l * self.n_experts..(l + 1) * self.n_experts].copy_from_slice(&addrs);
        }
        // Joined (its copies complete) and its buffers freed.
        self.st.get_mut().map_err(|_| lock_err())?.staging = None;
        self.table = Some(DevMem::from_host(&self.gpu, bytemuck::cast_slice(&table))?);
        self.gpu.sync()?;
        // Loading is not traffic of the run that follows.
        for a in [&self.c.bytes, &self.c.stall_ns] {
            a.store(0, Ordering::Relaxed);
        }
        self.st.get_mut().map_err(|_| lock_err())?.table.reset_counts();
        Ok(())
    }

    pub fn store_id(&self) -> usize {
        self.store_id
    }
    pub fn resident(&self) -> bool {
        self.resident
    }
    /// Slots a call may use: all of them, less those held for good (every
    /// expert of each held layer: `SlotTable::hold`).
    pub fn free_slots(&self) -> usize {
        self.n_slots - self.tiers.held.len() * self.n_experts
    }
    /// MoE layers whose files are registered with the driver.
    pub fn pinned_layers(&self) -> usize {
        self.tiers.pinned.len()
    }
    /// MoE layers held in the cache for good.
    pub fn held_layers(&self) -> usize {
        self.tiers.held.len()
    }
    /// Device address of layer `layer`'s row of the table (resident only).
    pub fn table_row(&self, layer: usize) -> Option<u64> {
        self.table
            .as_ref()
            .map(|t| t.ptr() + (8 * layer * self.n_experts) as u64)
    }

    fn addr(&self, slot: usize) -> u64 {
        self.pool.ptr() + (slot * self.slot_bytes) as u64
    }

    pub fn stats(&self) -> CacheStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let t = self.st.lock().map(|s| s.table.counts()).unwrap_or_default();
        let tl = self.timeline.as_ref().map(|t| t.totals()).unwrap_or_default();
        CacheStats {
            hits: t.hits,
            misses: t.misses,
            bypassed: t.bypassed,
            prefetched: t.prefetched,
            prefetch_hits: t.prefetch_hits,
            rank_copied: t.rank_copied,
            rank_used: t.rank_used,
            repeat_seen: t.repeat_seen,
            repeat_again: t.repeat_again,
            bytes_copied: l(&self.c.bytes),
            on_host: t.on_host,
            bytes_on_host: l(&self.c.host_bytes),
            host_steps: l(&self.c.host_steps),
            host_ns: l(&self.c.host_ns),
            host_last: l(&self.c.host_last),
            layer_parts_ns: tl.0,
            layer_steps: tl.1,
            layer_host_ns: tl.2,
            hints: l(&self.c.hints),
            guesses: l(&self.c.guesses),
            stall_ns: l(&self.c.stall_ns),
            slots: self.n_slots as u64,
            resident: self.resident,
        }
    }

    /// The device addresses of `experts` (distinct) of `layer`, copying the
    /// missing ones; the compute stream is made to wait for the copies.
    /// At most [`ExpertCache::free_slots`] experts per call.
    pub fn fetch(&self, store: &ExpertStore, layer: usize, experts: &[u32]) -> Result<Vec<u64>> {
        let addrs = self.fetch_planned(store, layer, experts, |_| HostShare::Nothing)?;
        addrs
            .into_iter()
            .map(|a| a.ok_or_else(|| Error::Invalid("an expert was left on the host unasked".into())))
            .collect()
    }

    /// [`ExpertCache::fetch`], leaving misses where they are as the split
    /// model plans (`None`: the caller computes them on the CPU; `tokens`:
    /// the step's tokens per expert on average).
    pub fn fetch_split(
        &self,
        store: &ExpertStore,
        layer: usize,
        experts: &[u32],
        tokens: usize,
    ) -> Result<Vec<Option<u64>>> {
        let bytes = store.layer_layout(layer)?.expert_size as u64;
        self.fetch_planned(store, layer, experts, |m| self.plan(m, bytes, tokens))
    }

    fn fetch_planned(
        &self,
        store: &ExpertStore,
        layer: usize,
        experts: &[u32],
        host: impl FnOnce(usize) -> HostShare,
    ) -> Result<Vec<Option<u64>>> {
        let mut st = self.st.lock().map_err(|_| lock_err())?;
        let addrs = self.lookup(&mut st, store, layer, experts, false, host)?;
        self.wait_copies(&mut st)?;
        Ok(addrs)
    }

    /// [`ExpertCache::fetch`] for a prompt's chunk: hits where they are,
    /// misses into room that evicts nothing resident
    /// ([`SlotTable::place_stream`]).
    pub fn fetch_stream(&self, store: &ExpertStore, layer: usize, experts: &[u32]) -> Result<Vec<u64>> {
        let mut st = self.st.lock().map_err(|_| lock_err())?;
        let places = st.table.place_stream(layer, experts)?;
        let addrs = self.copy_in(&mut st, store, layer, experts, &places)?;
        self.wait_copies(&mut st)?;
        addrs
            .into_iter()
            .map(|a| a.ok_or_else(|| Error::Invalid("a prompt's expert was given no slot".into())))
            .collect()
    }

    /// Whether `expert` of `layer` is in a slot now.
    pub fn holds(&self, layer: usize, expert: u32) -> Result<bool> {
        Ok(self.st.lock().map_err(|_| lock_err())?.table.holds(layer, expert))
    }

    /// Misses of one [`ExpertCache::fetch_stream`] call that evict nothing.
    pub fn stream_room(&self) -> Result<usize> {
        Ok(self.st.lock().map_err(|_| lock_err())?.table.stream_room())
    }

    /// Issue the queued copies and make the compute stream wait for them.
    fn wait_copies(&self, st: &mut State) -> Result<()> {
        self.flush(st)?;
        self.mark(Mark::Wait)?;
        if st.pending {
            st.copied.record(self.gpu.copy)?;
            st.copied.wait_on(self.gpu.stream)?;
            st.pending = false;
        }
        self.mark(Mark::Copied)
    }

    /// Mark the slots of `experts` of `layer` as read by the work queued on
    /// the compute stream so far.
    pub fn release(&self, layer: usize, experts: &[u32]) -> Result<()> {
        let mut st = self.st.lock().map_err(|_| lock_err())?;
        // Reuse the oldest event once its work is done.
        let mut ev = None;
        if st.uses.front().is_some_and(|(_, e)| e.done()) {
            if let Some((s, e)) = st.uses.pop_front() {
                st.done_seq = s;
                ev = Some(e);
            }
        }
        let ev = match ev {
            Some(e) => e,
            None => Event::new(&self.gpu)?,
        };
        ev.record(self.gpu.stream)?;
        st.seq += 1;
        let seq = st.seq;
        st.uses.push_back((seq, ev));
        for &e in experts {
            if let Some(s) = st.table.slot(layer, e) {
                st.use_seq[s] = seq;
            }
        }
        Ok(())
    }

    /// Whether a copy is only queued on the copy stream (every expert file
    /// registered with the driver), with no read of the file first.
    pub fn copies_queue_only(&self) -> bool {
        registered(&self.host, &self.moe_layers)
    }

    /// Reach `m` in the step's timeline, where one is kept.
    pub fn mark(&self, m: Mark) -> Result<()> {
        self.timeline.as_ref().map_or(Ok(()), |t| t.mark(m))
    }

    /// The step's ids are back on the host (its timeline, where one is kept).
    pub fn ids_back(&self) {
        if let Some(t) = &self.timeline {
            t.ids_back();
        }
    }

    /// Slots for `experts`: hits touched, misses given victims and copied.
    fn lookup(
        &self,
        st: &mut State,
        store: &ExpertStore,
        layer: usize,
        experts: &[u32],
        prefetch: bool,
        host: impl FnOnce(usize) -> HostShare,
    ) -> Result<Vec<Option<u64>>> {
        let places = st.table.place_split(layer, experts, prefetch, host)?;
        self.copy_in(st, store, layer, experts, &places)
    }

    /// The addresses of `places` (of `experts` of `layer`), the fills'
    /// copies issued.
    fn copy_in(
        &self,
        st: &mut State,
        store: &ExpertStore,
        layer: usize,
        experts: &[u32],
        places: &[Place],
    ) -> Result<Vec<Option<u64>>> {
        let addrs = places.iter().map(|p| p.slot().map(|s| self.addr(s))).collect();
        let jobs: Vec<(u32, usize)> = experts
            .iter()
            .zip(places)
            .filter_map(|(&e, p)| match p {
                Place::Fill(s) => Some((e, *s)),
                Place::Hit(_) | Place::Host => None,
            })
            .collect();
        if jobs.is_empty() {
            return Ok(addrs);
        }
        let t0 = Instant::now();
        let latest_use = jobs.iter().map(|&(_, s)| st.use_seq[s]).max().unwrap_or(0);
        // The copy stream must not overwrite a slot before the kernels that
        // read it are done.
        self.wait_uses(st, latest_use)?;
        let size = store.layer_layout(layer)?.expert_size;
        if let Some(m) = self.host.as_ref().and_then(|h| h.get(layer)).and_then(|m| m.as_ref()) {
            // Copies queued on the staging thread go first (a slot may be
            // refilled before they are issued). With layers pinned and
            // layers staged (`experts::tiers`) the queue is mostly empty
            // here: a staged layer's fetch flushed it, and guesses for a
            // staged layer are queued after this layer's lookups.
            self.flush(st)?;
            let pieces: Vec<(u64, *const u8)> = jobs
                .iter()
                .map(|&(e, s)| (self.addr(s), m.at(e as usize * size)))
                .collect();
            // SAFETY: each slot holds `slot_bytes` ≥ `size` bytes and is
            // not read until the copy stream's event; the registered file
            // holds expert `e` at `e·size` and stays registered until the
            // copy stream is synchronized (drop).
            unsafe { copies::host_to_device(&pieces, size, self.gpu.copy) }?;
            self.account(st, &jobs, size, t0);
            return Ok(addrs);
        }
        // Read and copied by the staging thread, after the waits above.
        // (Copies of earlier jobs it has not issued yet land behind those
        // waits too: a delay, never a cycle, since the compute stream
        // waits only for copies issued before a flush.)
        let thread = st.staging.as_ref().ok_or_else(|| Error::Backend {
            backend: "cuda",
            msg: format!("layer {layer}'s expert file is neither registered with the driver nor staged"),
        })?;
        thread.push(layer, jobs.iter().map(|&(e, s)| (e, self.addr(s))).collect(), size)?;
        self.account(st, &jobs, size, t0);
        Ok(addrs)
    }

    /// Count the copies just issued (or queued on the staging thread).
    fn account(&self, st: &mut State, jobs: &[(u32, usize)], size: usize, t0: Instant) {
        st.pending = true;
        let n = jobs.len() as u64;
        self.c.bytes.fetch_add(n * size as u64, Ordering::Relaxed);
        self.c
            .stall_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Wait until the staging thread has issued the copies of every job
    /// queued so far (the time counts as stall), so that an event recorded
    /// on the copy stream next follows them; a job's error, if one failed.
    fn flush(&self, st: &State) -> Result<()> {
        let Some(thread) = &st.staging else {
            return Ok(());
        };
        let t0 = Instant::now();
        let res = thread.flush();
        self.c
            .stall_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        res
    }

    /// Make the copy stream wait for the compute work of sequence `seq`.
    fn wait_uses(&self, st: &mut State, seq: u64) -> Result<()> {
        while let Some((s, e)) = st.uses.front() {
            if !e.done() {
                break;
            }
            st.done_seq = *s;
            st.uses.pop_front();
        }
        if seq <= st.done_seq {
            return Ok(());
        }
        match st.uses.iter().find(|(s, _)| *s >= seq) {
            Some((_, e)) => e.wait_on(self.gpu.copy),
            None => Ok(()),
        }
    }
}

/// Whether the files of every layer of `moe_layers` are registered with
/// the driver (`host`).
fn registered(host: &Option<Vec<Option<HostMap>>>, moe_layers: &[usize]) -> bool {
    host.as_ref()
        .is_some_and(|h| moe_layers.iter().all(|&l| h.get(l).is_some_and(|m| m.is_some())))
}

impl Drop for ExpertCache {
    fn drop(&mut self) {
        // The staging thread ends first (the job running finishes, the
        // rest are dropped; its buffers outlive their copies); the slots
        // must outlive every copy.
        match self.st.get_mut() {
            Ok(st) => st.staging = None,
            Err(p) => p.into_inner().staging = None,
        }
        if self.gpu.bind().is_ok() {
            // SAFETY: the stream is valid while `gpu` lives.
            unsafe {
                let _ = sys::cuStreamSynchronize(self.gpu.copy);
            }
            let _ = self.gpu.sync();
        }
    }
}
