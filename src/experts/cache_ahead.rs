//! The slot table's plans of copies ahead of need (`cache.rs`): the last
//! token's experts of the next layer, whether a guess fits, and the whole
//! next layer for a long prefill chunk.

use super::SlotTable;

impl SlotTable {
    /// After a one-token step of `layer` used `experts`: count how many of
    /// its last token's experts it used again, remember them, and return
    /// the next MoE layer with the experts it used at the previous token,
    /// to be copied early — only while layers reuse enough of them
    /// ([`crate::experts::RepeatGate`]) and they take at most a third of
    /// the slots.
    pub fn predict(&mut self, layer: usize, experts: &[u32]) -> Option<(usize, Vec<u32>)> {
        let i = self.moe_layers.iter().position(|&l| l == layer)?;
        let next = self.moe_layers[(i + 1) % self.moe_layers.len()];
        if let Some(p) = self.prev.get_mut(layer) {
            if !p.is_empty() {
                let again = experts.iter().filter(|e| p.contains(e)).count();
                self.repeats.step(p.len(), again);
                self.counts.repeat_seen += p.len() as u64;
                self.counts.repeat_again += again.min(p.len()) as u64;
            }
            p.clear();
            p.extend_from_slice(experts);
        }
        if !self.repeats.open() {
            return None;
        }
        let want = self.prev.get(next).cloned().unwrap_or_default();
        (!want.is_empty() && want.len() * 3 <= self.free_slots()).then_some((next, want))
    }

    /// Whether a guess of `n` experts is small enough to copy (at most
    /// half the slots: the layer that computes keeps the other half).
    pub fn guess_fits(&self, n: usize) -> bool {
        n > 0 && n * 2 <= self.free_slots()
    }

    /// After a step of `n` tokens of `layer`, each routed to `k` experts:
    /// the next MoE layer, when so many tokens almost surely need all of
    /// its experts (expected coverage 1 − (1 − k/E)^n ≥ 95%) and the cache
    /// holds three layers' worth (this one, the next and room to spare).
    pub fn next_layer_for_all(&self, layer: usize, n: usize, k: usize) -> Option<usize> {
        if n < 2 {
            return None;
        }
        let e = self.n_experts;
        let miss_all = (1.0 - k as f64 / e as f64).powi(n.min(i32::MAX as usize) as i32);
        if 1.0 - miss_all < 0.95 || 3 * e > self.free_slots() {
            return None;
        }
        let i = self.moe_layers.iter().position(|&l| l == layer)?;
        self.moe_layers.get(i + 1).copied()
    }
}
