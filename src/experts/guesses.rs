//! How many of a router's guesses to copy ahead when misses may also be
//! computed on the CPU (`--hybrid auto`), or to read ahead from disk
//! (`ExpertStore::read_ahead`).
//!
//! In a one-token step the next MoE layer's router, run early on this
//! layer's input, guesses its experts; copying the guesses keeps the link
//! busy while this layer computes. Every guess costs link time, and the
//! later guesses (lower router scores) are more often wrong; a miss the
//! guesses did not cover can be computed on the CPU instead. With fewer
//! guesses the link carries less, the CPU more: where the balance lies
//! depends on the machine and on the model's routing, so it is found by
//! measuring. The tuner times windows of tokens, moves the count one step
//! at a time and keeps going while tokens get faster (by a margin above
//! chance), turning back otherwise (so it stays at the best count or next
//! to it).

/// Where the count starts: three quarters of the guesses. On the H100 host 6 of
/// 8 was at least as fast as 8 at every cache size measured, and the best count
/// lay below it (docs/notes/2026-11-22-to-12-02-benchmark-log.md, "Hybrid
/// misses on spinning workers, guesses tuned").
fn start(k: usize) -> usize {
    (3 * k).div_ceil(4).max(1)
}

/// Tokens timed before the count moves.
const WINDOW: u32 = 16;

/// A move is kept only when the window after it is faster by this share:
/// windows differ by a few percent by chance, and a count moved on chance
/// alone drifts away from all guesses where fewer do not pay.
const MARGIN: f64 = 0.02;

/// A token this many times slower than the window's mean so far is a
/// pause between requests, not a measurement.
const PAUSE: f64 = 4.0;

/// The count of guesses to copy, tuned on token times.
#[derive(Debug, Clone, PartialEq)]
pub struct GuessTuner {
    /// The count now (0: not started).
    count: usize,
    /// +1 or −1: where the next move goes.
    dir: isize,
    /// The mark of the last token, in seconds.
    last: Option<f64>,
    /// Tokens and their seconds in this window.
    seen: u32,
    sum: f64,
    /// The count the window before measured, and its mean.
    before: Option<(usize, f64)>,
}

impl Default for GuessTuner {
    fn default() -> Self {
        GuessTuner::new()
    }
}

impl GuessTuner {
    pub fn new() -> GuessTuner {
        GuessTuner::starting_at(0)
    }

    /// A tuner whose count starts at `count` (0: three quarters of the
    /// guesses).
    pub fn starting_at(count: usize) -> GuessTuner {
        GuessTuner {
            count,
            dir: -1,
            last: None,
            seen: 0,
            sum: 0.0,
            before: None,
        }
    }

    /// How many of `k` guesses to copy now.
    pub fn count(&self, k: usize) -> usize {
        match self.count {
            0 => start(k),
            c => c.min(k),
        }
    }

    /// A token began at `now` seconds, the router guessing `k` experts.
    pub fn token(&mut self, now: f64, k: usize) {
        if k == 0 {
            return;
        }
        if self.count == 0 {
            self.count = start(k);
        }
        let last = self.last.replace(now);
        let Some(dt) = last.map(|l| now - l) else {
            return;
        };
        if !dt.is_finite() || dt <= 0.0 || (self.seen > 0 && dt > PAUSE * self.sum / self.seen as f64) {
            return;
        }
        self.sum += dt;
        self.seen += 1;
        if self.seen < WINDOW {
            return;
        }
        let mean = self.sum / self.seen as f64;
        self.seen = 0;
        self.sum = 0.0;
        let here = self.count;
        match self.before {
            // Not faster than where it came from by the margin: back to the
            // count before, measured afresh, and the other way next.
            Some((_, m)) if mean >= m * (1.0 - MARGIN) => {
                let (c, _) = self.before.take().unwrap_or((here, mean));
                self.count = c;
                self.dir = -self.dir;
                return;
            }
            // Faster (or the first window): on in the same direction.
            _ => self.before = Some((here, mean)),
        }
        let next = here as isize + self.dir;
        if next < 1 || next > k as isize {
            self.dir = -self.dir;
        }
        self.count = (here as isize + self.dir).clamp(1, k as isize) as usize;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drive the tuner with token times `time(count)` for `tokens` tokens;
    /// the counts it used, one per token.
    fn drive(time: impl Fn(usize) -> f64, k: usize, tokens: usize) -> Vec<usize> {
        let mut t = GuessTuner::new();
        let mut now = 0.0;
        let mut used = Vec::new();
        for _ in 0..tokens {
            t.token(now, k);
            let c = t.count(k);
            used.push(c);
            now += time(c);
        }
        used
    }

    #[test]
    fn it_settles_at_the_fastest_count() {
        // Fastest with 4 of 8 guesses.
        let used = drive(|c| 0.010 + 0.001 * (c as f64 - 4.0).abs(), 8, 2000);
        let tail = &used[1000..];
        let at = |c| tail.iter().filter(|&&u| u == c).count();
        assert!(tail.iter().all(|&c| (3..=5).contains(&c)), "strayed: {:?}", &tail[..64]);
        assert!(
            at(4) > at(3) && at(4) > at(5),
            "4: {}, 3: {}, 5: {}",
            at(4),
            at(3),
            at(5)
        );
    }

    #[test]
    fn it_stays_near_all_when_every_guess_pays() {
        let used = drive(|c| 0.020 - 0.001 * c as f64, 8, 2000);
        assert!(used[1000..].iter().all(|&c| c >= 7));
    }

    #[test]
    fn noise_alone_does_not_move_it() {
        // Every count equally fast, ±1% from token to token.
        let jitter = |c: usize| 0.010 * (1.0 + 0.01 * ((c * 7919 % 13) as f64 / 6.0 - 1.0));
        let mut t = GuessTuner::new();
        let (mut now, mut used) = (0.0, Vec::new());
        for i in 0..2000usize {
            t.token(now, 8);
            used.push(t.count(8));
            now += jitter(i);
        }
        let (lo, hi) = (used.iter().min(), used.iter().max());
        assert!(lo >= Some(&5) && hi <= Some(&7), "drifted to {lo:?}..{hi:?} from 6");
    }

    #[test]
    fn pauses_are_not_measured_and_counts_stay_in_range() {
        let mut t = GuessTuner::new();
        assert_eq!(t.count(8), 6, "three quarters before any measurement");
        assert_eq!(GuessTuner::new().count(1), 1);
        let mut now = 0.0;
        for i in 0..500 {
            t.token(now, 8);
            assert!((1..=8).contains(&t.count(8)));
            // Every 50th token follows a pause of a second.
            now += if i % 50 == 49 { 1.0 } else { 0.01 };
        }
        assert!(t.sum < 1.0, "a pause was counted: {}", t.sum);
        assert_eq!(t.count(3), t.count(8).min(3), "a smaller k caps the count");
        t.token(now, 0);
    }
}
