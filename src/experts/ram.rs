//! The RAM tier: experts read from disk kept in this process's memory, up
//! to a budget of its own (`--ram-cache`), between the device cache (or
//! the CPU's products) and the files. Where the expert files fit in
//! memory the page cache does this job and the tier is off; where they do
//! not (reads with `O_DIRECT`, or a container's memory limit below the
//! files), the kernel's page cache either is bypassed or keeps whatever it
//! read last, and this tier keeps the experts asked for most instead.
//!
//! Which expert holds a slot is [`SlotTable`]'s decision (frequency-based
//! admission, CLOCK, a probation ring), as for the device cache. A held
//! expert is a [`Region`] (reference-counted), handed out without a copy;
//! one evicted while a caller still uses it lives until that caller drops
//! it.

use super::cache::{Place, SlotTable};
use crate::error::{Error, Result};
use crate::format::Region;
use std::sync::Mutex;

/// Counters of the tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RamStats {
    /// Experts served from the tier, and read from disk.
    pub hits: u64,
    pub misses: u64,
    /// Its slots, and the bytes of each.
    pub slots: u64,
    pub slot_bytes: u64,
}

impl RamStats {
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / (self.hits + self.misses).max(1) as f64
    }
}

struct Tier {
    table: SlotTable,
    /// What each slot holds (none while its read is in flight).
    held: Vec<Option<Region>>,
    stats: RamStats,
}

pub(crate) struct RamTier {
    st: Mutex<Tier>,
    n_slots: usize,
}

fn poisoned() -> Error {
    Error::Invalid("the RAM tier's lock was poisoned by a panic".into())
}

impl RamTier {
    /// `slots` slots of `slot_bytes` for the experts of `moe_layers`
    /// (`n_experts` each).
    pub fn new(moe_layers: &[usize], n_experts: usize, slots: usize, slot_bytes: u64) -> RamTier {
        let slots = slots.max(1);
        // Probation: an eighth, as the device cache.
        let table = SlotTable::new(moe_layers, n_experts, slots, slots / 8);
        RamTier {
            st: Mutex::new(Tier {
                table,
                held: vec![None; slots],
                stats: RamStats {
                    slots: slots as u64,
                    slot_bytes,
                    ..RamStats::default()
                },
            }),
            n_slots: slots,
        }
    }

    /// The experts `ids` (distinct) of `layer`: those held, and `read` for
    /// the rest, which are then held where the table placed them. The
    /// lock is not held while `read` runs.
    pub fn get(&self, layer: usize, ids: &[u32], read: impl Fn(&[u32]) -> Result<Vec<Region>>) -> Result<Vec<Region>> {
        let mut out: Vec<Option<Region>> = vec![None; ids.len()];
        for (i0, chunk) in ids
            .chunks(self.n_slots)
            .enumerate()
            .map(|(c, ch)| (c * self.n_slots, ch))
        {
            // (index in ids, slot to fill or none)
            let mut want: Vec<(usize, Option<usize>)> = Vec::new();
            {
                let mut st = self.st.lock().map_err(|_| poisoned())?;
                let places = st.table.place(layer, chunk, false)?;
                for (j, p) in places.into_iter().enumerate() {
                    let i = i0 + j;
                    match p {
                        Place::Hit(s) => match st.held[s].clone() {
                            Some(r) => {
                                out[i] = Some(r);
                                st.stats.hits += 1;
                            }
                            // Its read is in flight in another call, or
                            // failed: read it here too.
                            None => want.push((i, Some(s))),
                        },
                        Place::Fill(s) => {
                            st.held[s] = None;
                            want.push((i, Some(s)));
                        }
                        Place::Host => want.push((i, None)),
                    }
                }
                st.stats.misses += want.len() as u64;
            }
            if want.is_empty() {
                continue;
            }
            let miss: Vec<u32> = want.iter().map(|&(i, _)| ids[i]).collect();
            let got = read(&miss)?;
            if got.len() != miss.len() {
                return Err(Error::Invalid(format!(
                    "the RAM tier asked for {} experts and got {}",
                    miss.len(),
                    got.len()
                )));
            }
            let mut st = self.st.lock().map_err(|_| poisoned())?;
            for ((i, slot), r) in want.into_iter().zip(got) {
                // Kept only if the slot still belongs to this expert (a
                // later call may have given it to another meanwhile).
                if let Some(s) = slot.filter(|&s| st.table.slot(layer, ids[i]) == Some(s)) {
                    st.held[s] = Some(r.clone());
                }
                out[i] = Some(r);
            }
        }
        out.into_iter()
            .map(|r| r.ok_or_else(|| Error::Invalid("the RAM tier left an expert unread".into())))
            .collect()
    }

    /// Whether the tier holds expert `e` of `layer` now (nothing counted).
    pub fn holds(&self, layer: usize, e: u32) -> bool {
        self.st
            .lock()
            .is_ok_and(|st| st.table.slot(layer, e).is_some_and(|s| st.held[s].is_some()))
    }

    pub fn stats(&self) -> RamStats {
        self.st.lock().map(|s| s.stats).unwrap_or_default()
    }

    /// Set the hit and miss counts back to zero.
    pub fn reset_stats(&self) {
        if let Ok(mut s) = self.st.lock() {
            s.stats.hits = 0;
            s.stats.misses = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// An expert's bytes: its layer and id, repeated.
    fn blob(layer: usize, e: u32) -> Region {
        let v: Vec<u8> = (0..64)
            .map(|i| (layer as u8) ^ (e as u8).wrapping_mul(31) ^ i)
            .collect();
        Region::whole(Arc::new(v))
    }

    #[test]
    fn held_experts_are_not_read_again_and_bytes_are_right() {
        let tier = RamTier::new(&[0, 1], 16, 8, 64);
        let reads = AtomicU64::new(0);
        let read = |layer: usize| {
            let reads = &reads;
            move |ids: &[u32]| {
                reads.fetch_add(ids.len() as u64, Ordering::Relaxed);
                Ok(ids.iter().map(|&e| blob(layer, e)).collect())
            }
        };
        for round in 0..3 {
            for layer in 0..2 {
                let ids = [3u32, 7, 1];
                let got = tier.get(layer, &ids, read(layer)).unwrap();
                for (r, &e) in got.iter().zip(&ids) {
                    assert_eq!(
                        r.bytes(),
                        blob(layer, e).bytes(),
                        "round {round}, layer {layer}, expert {e}"
                    );
                }
            }
        }
        // Six experts fit in eight slots: read once each.
        assert_eq!(reads.load(Ordering::Relaxed), 6);
        let s = tier.stats();
        assert_eq!((s.hits, s.misses), (12, 6));
        assert!((s.hit_rate() - 12.0 / 18.0).abs() < 1e-12);
    }

    #[test]
    fn more_experts_than_slots_are_served_in_chunks() {
        let tier = RamTier::new(&[0], 64, 4, 64);
        let ids: Vec<u32> = (0..10).collect();
        for _ in 0..2 {
            let got = tier
                .get(0, &ids, |m| Ok(m.iter().map(|&e| blob(0, e)).collect()))
                .unwrap();
            assert_eq!(got.len(), 10);
            for (r, &e) in got.iter().zip(&ids) {
                assert_eq!(r.bytes(), blob(0, e).bytes());
            }
        }
        let s = tier.stats();
        assert_eq!(s.hits + s.misses, 20);
        assert!(s.hits <= 4 * 2, "at most the slots' worth can hit");
    }

    #[test]
    fn a_failed_read_is_reported_and_nothing_stale_is_served() {
        let tier = RamTier::new(&[0], 8, 2, 64);
        let err = tier.get(0, &[1, 2], |_| Err(Error::Invalid("disk on fire".into())));
        assert!(err.unwrap_err().to_string().contains("disk on fire"));
        // The slots given to 1 and 2 hold nothing: they are read again,
        // and then held.
        for _ in 0..2 {
            let got = tier
                .get(0, &[1, 2], |m| Ok(m.iter().map(|&e| blob(0, e)).collect()))
                .unwrap();
            assert_eq!(got[1].bytes(), blob(0, 2).bytes());
        }
        assert_eq!(tier.stats().hits, 2);
        let short = tier.get(0, &[5], |_| Ok(Vec::new()));
        assert!(short.unwrap_err().to_string().contains("got 0"));
    }
}
