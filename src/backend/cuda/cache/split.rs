//! The expert cache's side of hybrid misses (`experts::split`): the
//! split model and the CPU that computes its share, and the host bytes of
//! the experts it computes.

use super::super::host_cpu::HostCpu;
use super::{lock_err, ExpertCache};
use crate::error::{Error, Result};
use crate::experts::{ExpertStore, GuessTuner, HostShare, Hybrid, SplitModel};
use crate::format::Region;
use std::sync::atomic::Ordering;

impl ExpertCache {
    /// Let `cpu` compute misses, split by `m` (not when resident).
    pub fn set_split(&self, m: SplitModel, cpu: HostCpu) -> Result<()> {
        if self.resident {
            return Ok(());
        }
        self.host_cpu
            .set(cpu)
            .map_err(|_| Error::Invalid("the expert cache already has a CPU for its misses".into()))?;
        *self.split.lock().map_err(|_| lock_err())? = Some(m);
        if m.mode == Hybrid::Auto {
            self.st.lock().map_err(|_| lock_err())?.guesses = Some(GuessTuner::new());
        }
        Ok(())
    }

    /// The CPU that computes misses, once `set_split` gave one.
    pub fn host_cpu(&self) -> Option<&HostCpu> {
        self.host_cpu.get()
    }

    /// The split model, when the CPU may compute misses.
    pub fn split(&self) -> Option<SplitModel> {
        self.split.lock().ok().and_then(|m| *m)
    }

    /// How many of a step's `misses` experts (of `bytes`, `tokens` tokens
    /// each on average) the CPU should compute.
    pub(super) fn plan(&self, misses: usize, bytes: u64, tokens: usize) -> HostShare {
        match self.split.lock() {
            Ok(mut m) => {
                let warm = self.host_cpu.get().is_some_and(|c| c.warm());
                m.as_mut()
                    .map_or(HostShare::Nothing, |m| m.plan(misses, bytes, tokens, warm))
            }
            Err(_) => HostShare::Nothing,
        }
    }

    /// A CPU step computed `c` experts of `bytes` for `tokens` tokens each
    /// in `secs`; `last`: the GPU's share had finished before it; `cold`:
    /// the CPU's workers were asleep when it began (its time tells the
    /// model the cost of waking them, not the warm costs).
    pub fn observe_host(&self, c: usize, bytes: u64, tokens: usize, secs: f64, last: bool, cold: bool) -> Result<()> {
        self.c.host_bytes.fetch_add(c as u64 * bytes, Ordering::Relaxed);
        self.c.host_steps.fetch_add(1, Ordering::Relaxed);
        self.c.host_ns.fetch_add((secs * 1e9) as u64, Ordering::Relaxed);
        self.c.host_last.fetch_add(last as u64, Ordering::Relaxed);
        if let Some(m) = self.split.lock().map_err(|_| lock_err())?.as_mut() {
            m.observe(c, bytes, tokens, secs, last, cold);
        }
        Ok(())
    }

    /// The bytes of `experts` of `layer` for the CPU: in place where the
    /// file is mapped for the driver, read from the store otherwise.
    pub fn host_regions(&self, store: &ExpertStore, layer: usize, experts: &[u32]) -> Result<Vec<Region>> {
        let size = store.layer_layout(layer)?.expert_size;
        if let Some(m) = self.host.as_ref().and_then(|h| h.get(layer)).and_then(|m| m.as_ref()) {
            return experts
                .iter()
                .map(|&e| {
                    m.region(e as usize * size, size)
                        .ok_or_else(|| Error::Invalid(format!("expert {e} of layer {layer} lies past its mapped file")))
                })
                .collect();
        }
        store.read(layer, experts)
    }
}
