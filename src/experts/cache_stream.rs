//! A prompt's chunks through the expert cache (`SlotTable::place_stream`).
//!
//! A prefill chunk asks for nearly every expert of every layer, layer
//! after layer. Placed as a decode step's misses are (admitted to main,
//! evicting CLOCK's victim), a cache smaller than the model thrashes: each
//! layer's experts push out those of a layer the next chunk needs first,
//! and nearly every expert is copied for every chunk whatever the cache
//! holds. A chunk's lookups therefore leave main as it is: hits are used
//! where they are; a miss takes an empty main slot while there is one
//! (a cold cache fills up), else the oldest slot of the *stream ring*, a
//! few launches' worth of slots set aside for this at start
//! ([`SlotTable::set_stream_ring`]) — nothing resident is evicted, and
//! the frequency counts that decode's admission compares are not touched.
//! The ring is its own (not probation, whose size decode's hill climbing
//! moves), so that copies into it can always run a launch ahead.

use super::{Place, SlotTable};
use crate::error::{Error, Result};

impl SlotTable {
    /// Whether `(layer, expert)` is in a slot now.
    pub fn holds(&self, layer: usize, expert: u32) -> bool {
        self.slot(layer, expert).is_some()
    }

    /// Set up to `n` empty main slots aside as the stream ring (called
    /// after [`SlotTable::hold`], before lookups; at least a quarter of
    /// the free slots stay in the policy). Returns the ring's size.
    pub fn set_stream_ring(&mut self, n: usize) -> usize {
        let n = n.min(self.free_slots() / 4);
        let takeable: Vec<usize> = (0..self.n_slots)
            .rev()
            .filter(|&s| self.main[s] && !self.held[s] && !self.in_ring[s] && self.owner[s].is_none())
            .take(n)
            .collect();
        for &s in &takeable {
            self.main[s] = false;
            self.in_ring[s] = true;
            self.ring.push_back(s);
        }
        self.ring.len()
    }

    /// Slots of the stream ring: the misses of one stream call that evict
    /// nothing resident.
    pub fn stream_room(&self) -> usize {
        self.ring.len()
    }

    /// Where each of `experts` (distinct) of `layer` is or goes, for a
    /// prompt's chunk (see the module doc). At most
    /// [`SlotTable::stream_room`] misses per call keep main untouched;
    /// more take main's victims.
    pub fn place_stream(&mut self, layer: usize, experts: &[u32]) -> Result<Vec<Place>> {
        if let Some(&e) = experts.iter().find(|&&e| e as usize >= self.n_experts) {
            return Err(Error::Invalid(format!(
                "expert {e} asked of a layer of {} experts",
                self.n_experts
            )));
        }
        if experts.len() > self.n_slots {
            return Err(Error::Invalid(format!(
                "{} experts asked of a cache of {} slots",
                experts.len(),
                self.n_slots
            )));
        }
        let mut out = vec![Place::Hit(0); experts.len()];
        let mut protect = vec![false; self.n_slots];
        let mut misses = Vec::new();
        for (i, &e) in experts.iter().enumerate() {
            match self.slot(layer, e) {
                Some(s) => {
                    out[i] = Place::Hit(s);
                    protect[s] = true;
                    self.counts.hits += 1;
                    if self.guessed[s].take().is_some() {
                        self.counts.prefetch_hits += 1;
                    }
                }
                None => misses.push(i),
            }
        }
        for i in misses {
            let s = match self.empty_main(&protect) {
                Some(s) => s,
                None => match self.ring.iter().position(|&s| !protect[s]) {
                    Some(at) => {
                        let s = self.ring.remove(at).unwrap_or(at);
                        self.ring.push_back(s);
                        self.counts.bypassed += 1;
                        s
                    }
                    None => self
                        .main_victim(&protect)
                        .ok_or_else(|| Error::Invalid("the expert cache has no slot left for this call".into()))?,
                },
            };
            let key = (layer, experts[i]);
            self.evict(s);
            self.owner[s] = Some(key);
            self.slot_of.insert(key, s);
            self.referenced[s] = false;
            self.guessed[s] = None;
            protect[s] = true;
            self.counts.misses += 1;
            out[i] = Place::Fill(s);
        }
        Ok(out)
    }

    /// The next empty main slot, if any is left.
    fn empty_main(&mut self, protect: &[bool]) -> Option<usize> {
        while self.empty_from < self.n_slots {
            let s = self.empty_from;
            self.empty_from += 1;
            if self.main[s] && !self.held[s] && self.owner[s].is_none() && !protect[s] {
                return Some(s);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two layers of 8 experts, 10 slots (2 probation, 2 in the stream
    /// ring): chunks that use every expert of both layers, over and over,
    /// hit what main filled with first and copy only the rest; decode
    /// placement of the same chunks would miss all but a few.
    #[test]
    fn prompts_keep_what_main_holds() {
        let all: Vec<u32> = (0..8).collect();
        let mut t = SlotTable::new(&[0, 1], 8, 10, 2);
        assert_eq!(t.set_stream_ring(2), 2);
        assert_eq!(t.stream_room(), 2);
        for round in 0..4 {
            let before = t.counts();
            for layer in [0, 1] {
                for chunk in all.chunks(2) {
                    let places = t.place_stream(layer, chunk).unwrap();
                    assert_eq!(places.len(), chunk.len());
                }
            }
            let c = t.counts();
            let (hits, misses) = (c.hits - before.hits, c.misses - before.misses);
            assert_eq!(hits + misses, 16);
            if round > 0 {
                // Main's 6 slots keep the first 6 experts the cold cache
                // met; the other 10 stream through the ring.
                assert_eq!((hits, misses), (6, 10), "round {round}");
            }
        }
        // Decode steps afterwards still find them.
        let hits: usize = (0..8).filter(|&e| t.holds(0, e)).count() + (0..8).filter(|&e| t.holds(1, e)).count();
        assert!(hits >= 6, "{hits}");
    }

    /// A chunk's misses never take a slot another expert of the same call
    /// was given, and every place is a distinct slot.
    #[test]
    fn a_call_gets_distinct_slots() {
        let mut t = SlotTable::new(&[0, 1, 2], 16, 16, 4);
        t.set_stream_ring(4);
        for layer in [0, 1, 2, 0, 1, 2] {
            let chunk: Vec<u32> = (0..4).map(|i| (i * 3 + layer as u32) % 16).collect();
            let places = t.place_stream(layer, &chunk).unwrap();
            let mut slots: Vec<usize> = places.iter().filter_map(|p| p.slot()).collect();
            slots.sort();
            slots.dedup();
            assert_eq!(slots.len(), chunk.len(), "{places:?}");
        }
    }
}
