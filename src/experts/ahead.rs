//! Reads ahead of need ([`crate::experts::ExpertStore::read_ahead`]): the
//! experts a later MoE layer is guessed to route to (its router run early
//! on this layer's input), read on the I/O pool while this layer
//! computes, and handed to that layer's read when it asks for them. Where
//! experts come from disk (`O_DIRECT`: the files exceed the memory), a
//! layer's reads otherwise wait for its routing and the disk idles while
//! the layers compute.
//!
//! The reads are held here, outside the RAM tier: an expert read ahead
//! enters the tier only when its layer asks for it, through the tier's own
//! admission, so a wrong guess costs its read and never evicts an expert
//! the tier keeps. Only one layer's guesses are held: a new layer's
//! guesses drop those of any other layer not asked for (wrong guesses).
//!
//! Every guess costs a read of the disk that also serves the misses, and
//! the later guesses (lower router scores) are more often wrong: all of them
//! made decode slower than none on the development VM, a few faster
//! (docs/notes/2026-11-22-to-12-02-benchmark-log.md, "The CPU reads the next
//! layer's guesses ahead from disk"). How many of the best are read is tuned on
//! token times
//! ([`GuessTuner`]), from a quarter of them.

use super::GuessTuner;
use crate::error::{Error, Result};
use crate::format::Region;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// One read ahead: its result once done.
pub(crate) struct Pending {
    got: Mutex<Option<Result<Region>>>,
    done: Condvar,
}

impl Pending {
    fn new() -> Arc<Pending> {
        Arc::new(Pending {
            got: Mutex::new(None),
            done: Condvar::new(),
        })
    }

    /// Called once by the read's task.
    pub(crate) fn finish(&self, r: Result<Region>) {
        let mut g = self.got.lock().unwrap_or_else(|p| p.into_inner());
        *g = Some(r);
        self.done.notify_all();
    }

    /// The read's result, waiting for it.
    pub(crate) fn wait(&self) -> Result<Region> {
        let mut g = self.got.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match g.take() {
                Some(r) => return r,
                None => g = self.done.wait(g).unwrap_or_else(|p| p.into_inner()),
            }
        }
    }
}

/// Counters of the reads ahead.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AheadStats {
    /// Experts read ahead of need.
    pub read: u64,
    /// Of them, asked for by their layer.
    pub used: u64,
}

/// The reads ahead held for one layer.
pub(crate) struct ReadAhead {
    st: Mutex<State>,
    epoch: Instant,
    /// The layer whose guesses mark a token (the second MoE layer's: they
    /// are read during the first).
    pub(crate) token_layer: Option<usize>,
    /// Most experts one call reads ahead (a share of the memory:
    /// `ExpertStore::set_read_ahead`).
    pub(crate) most: usize,
}

struct State {
    layer: Option<usize>,
    held: Vec<(u32, Arc<Pending>)>,
    tuner: GuessTuner,
    /// The guesses a layer's router gives, the count tuned from.
    k: usize,
    stats: AheadStats,
}

impl Default for ReadAhead {
    fn default() -> ReadAhead {
        ReadAhead {
            st: Mutex::new(State {
                layer: None,
                held: Vec::new(),
                tuner: GuessTuner::new(),
                k: 0,
                stats: AheadStats::default(),
            }),
            epoch: Instant::now(),
            token_layer: None,
            most: usize::MAX,
        }
    }
}

fn poisoned() -> Error {
    Error::Invalid("the read-ahead lock was poisoned by a panic".into())
}

impl ReadAhead {
    /// How many of a router's `k` guesses (best first) to read now; a
    /// token begins when `token` (the call for the first layer's guesses).
    pub(crate) fn count(&self, k: usize, token: bool) -> Result<usize> {
        let mut st = self.st.lock().map_err(|_| poisoned())?;
        if st.k != k {
            st.k = k;
            st.tuner = GuessTuner::starting_at(k.div_ceil(4));
        }
        if token {
            let now = self.epoch.elapsed().as_secs_f64();
            st.tuner.token(now, k);
        }
        Ok(st.tuner.count(k))
    }

    /// Hold reads of `experts` of `layer` that are not held yet; returns
    /// the ones to start (each with the [`Pending`] its task finishes).
    /// The guesses of any other layer are dropped first.
    pub(crate) fn start(&self, layer: usize, experts: &[u32]) -> Result<Vec<(u32, Arc<Pending>)>> {
        let mut st = self.st.lock().map_err(|_| poisoned())?;
        if st.layer != Some(layer) {
            st.layer = Some(layer);
            st.held.clear();
        }
        let mut new = Vec::new();
        for &e in experts {
            if st.held.iter().any(|(h, _)| *h == e) {
                continue;
            }
            let p = Pending::new();
            st.held.push((e, p.clone()));
            new.push((e, p));
        }
        st.stats.read += new.len() as u64;
        Ok(new)
    }

    /// The read ahead of expert `e` of `layer`, if one is held (taken:
    /// a second call finds none).
    pub(crate) fn take(&self, layer: usize, e: u32) -> Result<Option<Arc<Pending>>> {
        let mut st = self.st.lock().map_err(|_| poisoned())?;
        if st.layer != Some(layer) {
            return Ok(None);
        }
        let Some(i) = st.held.iter().position(|(h, _)| *h == e) else {
            return Ok(None);
        };
        st.stats.used += 1;
        Ok(Some(st.held.swap_remove(i).1))
    }

    pub(crate) fn stats(&self) -> AheadStats {
        self.st.lock().map(|s| s.stats).unwrap_or_default()
    }

    pub(crate) fn reset_stats(&self) {
        if let Ok(mut s) = self.st.lock() {
            s.stats = AheadStats::default();
        }
    }
}

/// The experts to read ahead of `guesses` (`[n, k]`, each token's best
/// first): the first `take` ranks of every token, rank by rank (every
/// token's best, then every token's second, ...), each expert once,
/// skipping ids past `experts` and those `held` (the RAM tier's), at most
/// `most` of them (the best ranks kept).
pub(crate) fn pick(
    guesses: &[u32],
    k: usize,
    take: usize,
    experts: usize,
    most: usize,
    held: impl Fn(u32) -> bool,
) -> Vec<u32> {
    let mut want = Vec::new();
    let mut seen = vec![false; experts];
    for rank in 0..take.min(k) {
        for &e in guesses.iter().skip(rank).step_by(k.max(1)) {
            let Some(s) = seen.get_mut(e as usize) else {
                continue;
            };
            if !*s && !held(e) {
                if want.len() == most {
                    return want;
                }
                want.push(e);
            }
            *s = true;
        }
    }
    want
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_go_rank_by_rank_once_each_within_the_cap() {
        let g = [4, 11, 1, 11, 5, 2, 6, 4, 3];
        assert_eq!(pick(&g, 3, 2, 16, usize::MAX, |_| false), vec![4, 11, 6, 5]);
        assert_eq!(pick(&g, 3, 3, 16, usize::MAX, |_| false), vec![4, 11, 6, 5, 1, 2, 3]);
        assert_eq!(
            pick(&g, 3, 2, 16, 3, |_| false),
            vec![4, 11, 6],
            "the cap keeps the best ranks"
        );
        assert_eq!(
            pick(&g, 3, 2, 16, usize::MAX, |e| e == 11),
            vec![4, 6, 5],
            "held: skipped"
        );
        assert_eq!(
            pick(&g, 3, 2, 6, usize::MAX, |_| false),
            vec![4, 5],
            "past the experts: skipped"
        );
        assert_eq!(pick(&g, 3, 9, 16, usize::MAX, |_| false).len(), 7, "take past k: k");
    }

    fn region(v: u8) -> Region {
        Region::whole(Arc::new(vec![v; 4]))
    }

    #[test]
    fn a_layer_takes_what_was_read_ahead_for_it_once() {
        let ra = ReadAhead::default();
        let started = ra.start(3, &[5, 9, 5]).unwrap();
        assert_eq!(started.iter().map(|s| s.0).collect::<Vec<_>>(), vec![5, 9], "5 once");
        assert!(ra.start(3, &[9]).unwrap().is_empty(), "held already");
        for (e, p) in &started {
            p.finish(Ok(region(*e as u8)));
        }
        assert!(ra.take(4, 5).unwrap().is_none(), "another layer");
        let p = ra.take(3, 5).unwrap().expect("held");
        assert_eq!(p.wait().unwrap().bytes(), &[5, 5, 5, 5]);
        assert!(ra.take(3, 5).unwrap().is_none(), "taken once");
        assert_eq!(ra.stats(), AheadStats { read: 2, used: 1 });
    }

    #[test]
    fn a_new_layer_drops_the_guesses_not_asked_for() {
        let ra = ReadAhead::default();
        ra.start(1, &[2, 3]).unwrap();
        let started = ra.start(2, &[3]).unwrap();
        assert_eq!(started.len(), 1, "layer 2's expert 3 is a read of its own");
        assert!(ra.take(1, 2).unwrap().is_none(), "layer 1's guesses are gone");
        assert!(ra.take(2, 3).unwrap().is_some());
    }

    #[test]
    fn the_count_starts_at_a_quarter_and_stays_in_range() {
        let ra = ReadAhead::default();
        assert_eq!(ra.count(8, false).unwrap(), 2);
        assert_eq!(ra.count(6, false).unwrap(), 2, "a new k starts again");
        for _ in 0..200 {
            let c = ra.count(8, true).unwrap();
            assert!((1..=8).contains(&c));
        }
    }

    #[test]
    fn a_read_is_waited_for_and_its_error_returned() {
        let ra = ReadAhead::default();
        let (_, p) = ra.start(0, &[1]).unwrap().pop().unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            p.finish(Err(Error::Invalid("disk on fire".into())));
        });
        let e = ra.take(0, 1).unwrap().unwrap().wait().unwrap_err();
        assert!(e.to_string().contains("disk on fire"), "{e}");
        t.join().unwrap();
    }
}
