//! The expert cache's copies ahead of need: the experts the next MoE layer
//! used at the last token (`predict`), its router's guesses
//! (`prefetch_hint`, tuned by `GuessTuner` when misses are split), and a
//! whole next layer for a long prefill chunk.

use super::{lock_err, ExpertCache};
use crate::error::Result;
use crate::experts::{ExpertStore, HostShare};
use std::sync::atomic::Ordering;

impl ExpertCache {
    /// After a single-token step of `layer` used `experts`: start copying
    /// the experts the next MoE layer used at the previous token (those
    /// already in a slot are left alone; [`crate::experts::SlotTable::predict`]).
    pub fn predict(&self, store: &ExpertStore, layer: usize, experts: &[u32]) -> Result<()> {
        if !self.prefetch || self.resident {
            return Ok(());
        }
        let mut st = self.st.lock().map_err(|_| lock_err())?;
        if let Some((next, want)) = st.table.predict(layer, experts) {
            self.lookup(&mut st, store, next, &want, true, |_| HostShare::Nothing)?;
        }
        Ok(())
    }

    /// Start copying `experts` of `layer`, a guess at what its next step
    /// will route to (the top-k of that layer's router run early on the
    /// current layer's input): those already in a slot are left alone, and
    /// a guess never takes more than a third of the slots.
    ///
    /// `experts` come best first; with misses split between copies and
    /// the CPU, only as many of the first as [`crate::experts::GuessTuner`] finds fastest
    /// are copied (the call for the first MoE layer's guess marks a token).
    pub fn prefetch_hint(&self, store: &ExpertStore, layer: usize, experts: &[u32]) -> Result<()> {
        let mut st = self.st.lock().map_err(|_| lock_err())?;
        let k = experts.len();
        let now = st.epoch.elapsed().as_secs_f64();
        let first = self.moe_layers.get(1) == Some(&layer);
        let take = match st.guesses.as_mut() {
            Some(t) => {
                if first {
                    t.token(now, k);
                }
                t.count(k)
            }
            None => k,
        };
        // The guesses in expert order, each with its rank (the best of a
        // repeated one).
        let mut ranked: Vec<(u32, u8)> = experts[..take]
            .iter()
            .enumerate()
            .map(|(r, &e)| (e, r.min(u8::MAX as usize) as u8))
            .collect();
        ranked.sort_unstable();
        ranked.dedup_by_key(|g| g.0);
        if !self.prefetch || self.resident || !st.table.guess_fits(ranked.len()) {
            return Ok(());
        }
        self.c.hints.fetch_add(1, Ordering::Relaxed);
        self.c.guesses.fetch_add(take as u64, Ordering::Relaxed);
        let (want, ranks): (Vec<u32>, Vec<u8>) = ranked.into_iter().unzip();
        let places = st.table.place_guesses(layer, &want, &ranks)?;
        self.copy_in(&mut st, store, layer, &want, &places)?;
        Ok(())
    }

    /// Whether copies ahead of need are allowed (and useful: not resident).
    pub fn prefetching(&self) -> bool {
        self.prefetch && !self.resident
    }

    /// After a step of `n` tokens of `layer` (each routed to `k` of the
    /// layer's experts): when so many tokens almost surely need every
    /// expert of the next MoE layer (expected coverage 1 − (1 − k/E)^n ≥
    /// 95%), start copying all of that layer's experts now, so that the
    /// copies run while this layer's experts and the next layer's attention
    /// compute. Only when the cache holds three layers' worth (this layer,
    /// the next, and room to spare), and never past the last layer.
    pub fn prefetch_next_layer(&self, store: &ExpertStore, layer: usize, n: usize, k: usize) -> Result<()> {
        if !self.prefetch || self.resident {
            return Ok(());
        }
        let mut st = self.st.lock().map_err(|_| lock_err())?;
        if let Some(next) = st.table.next_layer_for_all(layer, n, k) {
            let all: Vec<u32> = (0..self.n_experts as u32).collect();
            self.lookup(&mut st, store, next, &all, true, |_| HostShare::Nothing)?;
        }
        Ok(())
    }
}
