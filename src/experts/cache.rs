//! The expert cache's bookkeeping, backend-neutral: which (layer, expert)
//! sits in which slot, which slot a miss goes to, what prefetch should
//! copy, and the counters. A backend owns the slot memory and the copies
//! (CUDA: `backend/cuda/cache/`); it asks [`SlotTable::place`] where each
//! expert of a call is and copies the ones marked [`Place::Fill`].
//!
//! Policy. The slots are split in two: a small *probation* ring (FIFO) and
//! the *main* part (CLOCK, second chance). A miss enters main only if it is
//! wanted more often than main's CLOCK victim (a frequency count per
//! expert, halved every so often so that it follows the routing as it
//! drifts — TinyLFU's admission rule); otherwise it is copied into the
//! oldest probation slot and computed from there, so a stream of experts
//! that will not be reused soon passes through probation instead of
//! evicting useful ones. The router's guesses (prefetch) take the same
//! path: a guess of a cold expert is copied into probation; the other
//! copies ahead (the last token's experts while layers reuse them, a whole
//! next layer for a long prefill chunk) take main's victim directly. A
//! probation hit whose count beats main's victim is promoted by swapping
//! the two slots' roles, with no copy. With every expert in a slot
//! (resident) there is no probation.
//!
//! Slots may also be *held* ([`SlotTable::hold`]): given to whole layers
//! for good (`experts::tiers`), out of both parts, never evicted.

use super::budget::GUESS_RANKS;
use super::repeats::RepeatGate;
use super::split::HostShare;
use crate::error::{Error, Result};
use std::collections::{HashMap, VecDeque};

/// Where one requested expert is, or goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Already in this slot.
    Hit(usize),
    /// Copy it into this slot (whatever the slot held is evicted).
    Fill(usize),
    /// Compute it where it is (host memory); no slot.
    Host,
}

impl Place {
    pub fn slot(self) -> Option<usize> {
        match self {
            Place::Hit(s) | Place::Fill(s) => Some(s),
            Place::Host => None,
        }
    }
}

/// Lookups, misses and what became of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableCounts {
    pub hits: u64,
    pub misses: u64,
    /// Misses and guesses that went to probation (not admitted to main).
    pub bypassed: u64,
    /// Misses computed where they are (not copied).
    pub on_host: u64,
    pub prefetched: u64,
    pub prefetch_hits: u64,
    /// Router guesses copied ahead and then used, by rank
    /// ([`crate::experts::CacheStats::rank_copied`]).
    pub rank_copied: [u64; GUESS_RANKS],
    pub rank_used: [u64; GUESS_RANKS],
    /// Of the experts a layer used at one token, how many it used again
    /// at the next (one-token steps).
    pub repeat_seen: u64,
    pub repeat_again: u64,
}

/// The rank of a copy ahead that is not one of the router's ranked
/// guesses (the last token's experts, a whole next layer).
const NO_RANK: u8 = u8::MAX;

/// Main slots looked at for the least wanted one when probation grows.
const COLD_SCAN: usize = 256;

/// The slot table of one cache of `n_slots` slots over `layers × experts`.
pub struct SlotTable {
    n_experts: usize,
    n_slots: usize,
    slot_of: HashMap<(usize, u32), usize>,
    owner: Vec<Option<(usize, u32)>>,
    /// Slot is in the main part (else in probation).
    main: Vec<bool>,
    /// CLOCK reference bits (main).
    referenced: Vec<bool>,
    /// Filled by a copy ahead and not asked for since: its router rank
    /// (`NO_RANK`: not one of the router's ranked guesses).
    guessed: Vec<Option<u8>>,
    /// Given to an expert for good ([`SlotTable::hold`]).
    held: Vec<bool>,
    n_held: usize,
    hand: usize,
    /// Probation slots, the next victim first.
    probation: VecDeque<usize>,
    /// Requests per (layer, expert), halved every `window` requests.
    freq: Vec<u16>,
    requests: u64,
    window: u64,
    /// MoE layers in order (prefetch looks at the next one).
    moe_layers: Vec<usize>,
    /// Per layer, the experts of its last one-token step.
    prev: Vec<Vec<u32>>,
    /// Whether the last token's experts are reused enough to copy.
    repeats: RepeatGate,
    counts: TableCounts,
    climb: Climb,
    /// Main slots below this index are not empty (a prompt's misses look
    /// for empty ones from here: slots only go from empty to full).
    empty_from: usize,
    /// The stream ring: slots out of main and probation that a prompt's
    /// misses pass through (`cache_stream.rs`), the next victim first.
    ring: VecDeque<usize>,
    in_ring: Vec<bool>,
}

/// Hill climbing on the probation size (W-TinyLFU's adaptive window):
/// routing that repeats recent experts wants a large ring (recency), a
/// skewed one a large main part (frequency). Every `period` requests the
/// period's hit rate is compared with the last one's; the size keeps
/// moving the same way while it improves and turns back when it does not.
#[derive(Debug, Clone)]
struct Climb {
    /// The probation size aimed at.
    target: usize,
    step: usize,
    grow: bool,
    period: u64,
    requests: u64,
    hits: u64,
    last: Option<f64>,
    /// Largest probation: every slot but one (none when resident).
    max: usize,
}

impl Climb {
    fn new(n_slots: usize, start: usize, resident: bool) -> Climb {
        Climb {
            target: start,
            step: (n_slots / 16).max(1),
            grow: true,
            period: n_slots.max(256) as u64,
            requests: 0,
            hits: 0,
            last: None,
            max: if resident { 0 } else { n_slots.saturating_sub(1) },
        }
    }

    /// Count one request; at the end of a period, move the target.
    fn count(&mut self, hit: bool) {
        self.requests += 1;
        self.hits += hit as u64;
        if self.requests < self.period {
            return;
        }
        let rate = self.hits as f64 / self.requests as f64;
        if self.last.is_some_and(|l| rate < l) {
            self.grow = !self.grow;
        }
        self.target = match self.grow {
            true => (self.target + self.step).min(self.max),
            false => self.target.saturating_sub(self.step),
        };
        self.last = Some(rate);
        self.requests = 0;
        self.hits = 0;
    }
}

impl SlotTable {
    /// A table of `n_slots` slots for the experts of `moe_layers`, each
    /// with `n_experts` experts; `probation` slots are set aside for
    /// experts that are not admitted (none when every expert fits).
    pub fn new(moe_layers: &[usize], n_experts: usize, n_slots: usize, probation: usize) -> SlotTable {
        let n_layers = moe_layers.iter().max().map_or(0, |m| m + 1);
        let total = moe_layers.len() * n_experts;
        let p = if n_slots >= total { 0 } else { probation.min(n_slots) };
        SlotTable {
            n_experts,
            n_slots,
            slot_of: HashMap::new(),
            owner: vec![None; n_slots],
            main: (0..n_slots).map(|s| s >= p).collect(),
            referenced: vec![false; n_slots],
            guessed: vec![None; n_slots],
            held: vec![false; n_slots],
            n_held: 0,
            hand: 0,
            probation: (0..p).collect(),
            freq: vec![0; n_layers * n_experts],
            requests: 0,
            window: (16 * n_slots).max(total).max(1) as u64,
            moe_layers: moe_layers.to_vec(),
            prev: vec![Vec::new(); n_layers],
            repeats: RepeatGate::default(),
            counts: TableCounts::default(),
            climb: Climb::new(n_slots, p, n_slots >= total),
            empty_from: 0,
            ring: VecDeque::new(),
            in_ring: vec![false; n_slots],
        }
    }

    /// Move slots between main and probation toward the climb's target
    /// (roles only: what the slots hold stays). Called between calls, when
    /// no slot is protected.
    fn resize(&mut self) {
        while self.probation.len() < self.climb.target {
            // The least wanted of main's next slots joins the ring as its
            // oldest.
            let Some(v) = self.coldest_main() else { break };
            self.main[v] = false;
            self.referenced[v] = false;
            self.probation.push_front(v);
        }
        while self.probation.len() > self.climb.target {
            // The ring's oldest joins main, unreferenced.
            let Some(s) = self.probation.pop_front() else { break };
            self.main[s] = true;
            self.referenced[s] = false;
        }
    }

    pub fn n_slots(&self) -> usize {
        self.n_slots
    }

    /// Slots the policy moves: all but the held ones and the stream ring.
    pub fn free_slots(&self) -> usize {
        self.n_slots - self.n_held - self.ring.len()
    }

    /// Give every expert of `layers` a slot for good, the last main slots
    /// first: from then on each is a hit and never evicted. Returns
    /// `(layer, expert, slot)` of each, for the backend to fill. Called
    /// before any lookup; at least one main slot must stay free.
    pub fn hold(&mut self, layers: &[usize]) -> Result<Vec<(usize, u32, usize)>> {
        let want = layers.len() * self.n_experts;
        let takeable: Vec<usize> = (0..self.n_slots)
            .rev()
            .filter(|&s| self.main[s] && !self.held[s] && self.owner[s].is_none())
            .collect();
        if want >= takeable.len() {
            return Err(Error::Invalid(format!(
                "holding {} layers of {} experts takes {want} slots; {} are free",
                layers.len(),
                self.n_experts,
                takeable.len()
            )));
        }
        for (i, &l) in layers.iter().enumerate() {
            if layers[..i].contains(&l) || (0..self.n_experts as u32).any(|e| self.slot_of.contains_key(&(l, e))) {
                return Err(Error::Invalid(format!("layer {l} is held twice, or after lookups")));
            }
        }
        let mut out = Vec::with_capacity(want);
        let keys = layers
            .iter()
            .flat_map(|&l| (0..self.n_experts as u32).map(move |e| (l, e)));
        for (key, s) in keys.zip(takeable) {
            self.main[s] = false;
            self.held[s] = true;
            self.n_held += 1;
            self.owner[s] = Some(key);
            self.slot_of.insert(key, s);
            out.push((key.0, key.1, s));
        }
        self.climb.max = self.climb.max.min(self.free_slots().saturating_sub(1));
        Ok(out)
    }

    pub fn counts(&self) -> TableCounts {
        self.counts
    }

    /// Forget the counts (e.g. after loading every expert at start).
    pub fn reset_counts(&mut self) {
        self.counts = TableCounts::default();
    }

    /// The slot holding `expert` of `layer`, if any.
    pub fn slot(&self, layer: usize, expert: u32) -> Option<usize> {
        self.slot_of.get(&(layer, expert)).copied()
    }

    fn freq_of(&self, key: (usize, u32)) -> u16 {
        self.freq
            .get(key.0 * self.n_experts + key.1 as usize)
            .copied()
            .unwrap_or(0)
    }

    fn count_request(&mut self, layer: usize, expert: u32) {
        if let Some(f) = self.freq.get_mut(layer * self.n_experts + expert as usize) {
            *f = f.saturating_add(1);
        }
        self.requests += 1;
        if self.requests >= self.window {
            self.requests = 0;
            for f in &mut self.freq {
                *f /= 2;
            }
        }
    }

    /// Main's CLOCK victim: an empty main slot first, else the first main
    /// slot without its reference bit (bits cleared on the way), never a
    /// protected one (`protect` may be empty: none). `None` when no main
    /// slot can be taken.
    fn main_victim(&mut self, protect: &[bool]) -> Option<usize> {
        let protect = |s: usize| protect.get(s).copied().unwrap_or(false);
        // Two turns clear every bit, so a takeable slot is found if any.
        for _ in 0..2 * self.n_slots {
            let h = self.hand;
            self.hand = (h + 1) % self.n_slots;
            if !self.main[h] || protect(h) {
                continue;
            }
            if self.owner[h].is_none() {
                return Some(h);
            }
            if self.referenced[h] {
                self.referenced[h] = false;
                continue;
            }
            return Some(h);
        }
        None
    }

    /// The oldest probation slot this call does not use — unless what it
    /// holds is wanted more often than main's victim: then it joins
    /// main in place and main's victim's slot, emptied, is used instead
    /// (W-TinyLFU: the ring's victim competes with main's).
    fn probation_victim(&mut self, protect: &[bool]) -> Option<usize> {
        let i = self.probation.iter().position(|&s| !protect[s])?;
        let s = self.probation.remove(i)?;
        if let Some(x) = self.owner[s] {
            let wanted = |t: &Self, v: usize| t.owner[v].is_none_or(|o| t.freq_of(x) > t.freq_of(o));
            if let Some(v) = self.main_victim(protect).filter(|&v| wanted(self, v)) {
                self.evict(v);
                self.main[v] = false;
                self.main[s] = true;
                self.referenced[s] = false;
                self.probation.push_back(v);
                return Some(v);
            }
        }
        self.probation.push_back(s);
        Some(s)
    }

    fn evict(&mut self, s: usize) {
        if let Some(old) = self.owner[s].take() {
            self.slot_of.remove(&old);
        }
    }

    /// Of the next main slots from the hand (at most [`COLD_SCAN`]), an
    /// empty one or the one asked for least (called between calls, when no
    /// slot is protected).
    fn coldest_main(&mut self) -> Option<usize> {
        let mut best: Option<(u16, usize)> = None;
        for i in 0..self.n_slots.min(COLD_SCAN) {
            let s = (self.hand + i) % self.n_slots;
            if !self.main[s] {
                continue;
            }
            let f = match self.owner[s] {
                None => return Some(s),
                Some(k) => self.freq_of(k),
            };
            if best.is_none_or(|(bf, _)| f < bf) {
                best = Some((f, s));
            }
        }
        best.map(|(_, s)| s).or_else(|| self.main_victim(&[]))
    }

    /// Whether `key` should take main's victim `v` (an empty slot always).
    fn admits(&self, key: (usize, u32), v: usize) -> bool {
        match self.owner[v] {
            None => true,
            Some(old) => self.freq_of(key) >= self.freq_of(old),
        }
    }

    /// Whether guesses of `n` experts a layer go through admission: only
    /// where the free slots hold `n` for every MoE layer (a token's
    /// guesses). In a smaller cache nothing stays until the next token,
    /// so what a guess would evict is not asked for again anyway, and the
    /// counts that admission compares say nothing (at 16 slots admission was
    /// slower: docs/notes/2026-11-22-to-12-02-benchmark-log.md, "The router's
    /// guesses through the cache's admission").
    fn guesses_admitted(&self, n: usize) -> bool {
        self.free_slots() >= self.moe_layers.len() * n
    }

    /// Where each of `experts` (distinct) of `layer` is or goes. `guess`:
    /// a prefetch (not counted as a request; hits are left alone). At most
    /// [`SlotTable::n_slots`] experts per call.
    pub fn place(&mut self, layer: usize, experts: &[u32], guess: bool) -> Result<Vec<Place>> {
        self.place_split(layer, experts, guess, |_| HostShare::Nothing)
    }

    /// [`SlotTable::place`], with some misses left where they are
    /// ([`Place::Host`]): `plan` is told how many experts missed and says
    /// how many may stay — those not admitted to main first, or every miss
    /// with [`HostShare::All`].
    pub fn place_split(
        &mut self,
        layer: usize,
        experts: &[u32],
        guess: bool,
        plan: impl FnOnce(usize) -> HostShare,
    ) -> Result<Vec<Place>> {
        self.place_ranked(layer, experts, guess, None, plan)
    }

    /// [`SlotTable::place`] for a router's guesses, `ranks[i]` the rank of
    /// `experts[i]` among them (0: the best), counted by rank.
    pub fn place_guesses(&mut self, layer: usize, experts: &[u32], ranks: &[u8]) -> Result<Vec<Place>> {
        if ranks.len() != experts.len() {
            return Err(Error::Invalid(format!(
                "{} ranks for {} guessed experts",
                ranks.len(),
                experts.len()
            )));
        }
        self.place_ranked(layer, experts, true, Some(ranks), |_| HostShare::Nothing)
    }

    fn place_ranked(
        &mut self,
        layer: usize,
        experts: &[u32],
        guess: bool,
        ranks: Option<&[u8]>,
        plan: impl FnOnce(usize) -> HostShare,
    ) -> Result<Vec<Place>> {
        if experts.len() > self.n_slots {
            return Err(Error::Invalid(format!(
                "{} experts asked of a cache of {} slots",
                experts.len(),
                self.n_slots
            )));
        }
        if let Some(&e) = experts.iter().find(|&&e| e as usize >= self.n_experts) {
            return Err(Error::Invalid(format!(
                "expert {e} asked of a layer of {} experts",
                self.n_experts
            )));
        }
        if !guess {
            self.resize();
        }
        let mut out = vec![Place::Hit(0); experts.len()];
        let mut protect = vec![false; self.n_slots];
        let mut misses = Vec::new();
        for (i, &e) in experts.iter().enumerate() {
            if !guess {
                self.count_request(layer, e);
                self.climb.count(self.slot(layer, e).is_some());
            }
            match self.slot(layer, e) {
                Some(s) => {
                    out[i] = Place::Hit(s);
                    protect[s] = true;
                    if !guess {
                        self.counts.hits += 1;
                        if let Some(r) = self.guessed[s].take() {
                            self.counts.prefetch_hits += 1;
                            if let Some(u) = self.counts.rank_used.get_mut(r as usize) {
                                *u += 1;
                            }
                        }
                        if self.held[s] || self.in_ring[s] {
                            // Held for good, or streaming: no policy to tell.
                        } else if self.main[s] {
                            self.referenced[s] = true;
                        } else {
                            self.promote(s, (layer, e), &protect);
                        }
                    }
                }
                None => misses.push(i),
            }
        }
        let host = if misses.is_empty() {
            HostShare::Nothing
        } else {
            plan(misses.len())
        };
        let mut host_left = match host {
            HostShare::Nothing => 0,
            HostShare::UpTo(c) => c,
            HostShare::All => usize::MAX,
        };
        let n_misses = misses.len();
        for (j, i) in misses.into_iter().enumerate() {
            let key = (layer, experts[i]);
            if host == HostShare::All && !guess {
                self.counts.misses += 1;
                self.counts.on_host += 1;
                out[i] = Place::Host;
                continue;
            }
            let v = self.main_victim(&protect);
            let admitted = v.is_some_and(|v| self.admits(key, v));
            // Those not admitted first; admitted ones too when the share
            // is larger than what is left of the misses.
            if !guess && host_left > 0 && (!admitted || host_left >= n_misses - j) {
                host_left -= 1;
                self.counts.misses += 1;
                self.counts.on_host += 1;
                out[i] = Place::Host;
                continue;
            }
            // A router's guess goes through admission like a miss: a cold
            // guess taking main's victim pushed out an expert wanted more
            // often (`right_guesses_do_not_add_copies`). Other copies
            // ahead (the last token's experts, a whole next layer for a
            // prefill chunk) are all but sure and take it as CLOCK would,
            // and so do guesses where the slots do not hold a token's
            // guesses ([`SlotTable::guesses_admitted`]).
            let sure = guess && (ranks.is_none() || !self.guesses_admitted(experts.len()));
            let s = match v {
                Some(v) if admitted || sure => v,
                _ => match self.probation_victim(&protect) {
                    Some(p) => {
                        self.counts.bypassed += 1;
                        p
                    }
                    // Probation is full of this call's experts: take main's.
                    None => {
                        v.ok_or_else(|| Error::Invalid("the expert cache has no slot left for this call".into()))?
                    }
                },
            };
            self.evict(s);
            self.owner[s] = Some(key);
            self.slot_of.insert(key, s);
            self.referenced[s] = !guess;
            let rank = ranks.map_or(NO_RANK, |r| r[i]);
            self.guessed[s] = guess.then_some(rank);
            protect[s] = true;
            if guess {
                self.counts.prefetched += 1;
                if let Some(c) = self.counts.rank_copied.get_mut(rank as usize) {
                    *c += 1;
                }
            } else {
                self.counts.misses += 1;
            }
            out[i] = Place::Fill(s);
        }
        Ok(out)
    }

    /// A probation hit in slot `p` wanted more often than main's victim
    /// swaps roles with it: `p` joins main, the victim's slot (emptied)
    /// joins probation as its next victim.
    fn promote(&mut self, p: usize, key: (usize, u32), protect: &[bool]) {
        let Some(v) = self.main_victim(protect) else {
            return;
        };
        if !self.admits(key, v) {
            return;
        }
        self.evict(v);
        self.main[v] = false;
        self.main[p] = true;
        self.referenced[p] = true;
        self.referenced[v] = false;
        if let Some(i) = self.probation.iter().position(|&s| s == p) {
            self.probation.remove(i);
        }
        self.probation.push_front(v);
    }
}

// Planning copies ahead of need: `predict`, `guess_fits`, `next_layer_for_all`.
#[path = "cache_ahead.rs"]
mod ahead;

// A prompt's chunks: hits where they are, misses into room that evicts nothing.
#[path = "cache_stream.rs"]
mod stream;

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
