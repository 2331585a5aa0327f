//! Whether the experts a layer used at the last token are worth copying
//! ahead of its next step.
//!
//! After a one-token step of a layer, the experts the *next* MoE layer
//! used at the previous token may be copied ahead (`SlotTable::predict`):
//! a trained model often routes consecutive tokens to the same experts.
//! Random routers do not (a layer reuses ~k/E of them, 3% for 8 of 256),
//! and there such copies are link time taken from the router's guesses
//! and the misses. The gate counts, for every one-token step, how many of
//! the layer's experts at the token before it used again, and lets the
//! copies run only while that share is at least [`REPEAT_MIN`]. The share
//! is measured whether or not the copies run, so the gate follows the
//! routing both ways.

/// Copies of the last token's experts run while a layer uses at least
/// this share of them again at its next token. A router's guess of a
/// lower rank that is used this often is about where more guesses stop
/// paying (the guess counts tuned on token times ended where the next rank was
/// used most of the time: docs/notes/2026-11-22-to-12-02-benchmark-log.md, "The
/// last token's experts copied only while layers reuse them"); an expert used
/// again is
/// often already in a slot and then costs nothing, so the bar is lower.
pub const REPEAT_MIN: f64 = 0.5;

/// Experts looked at before the gate opens (~32 one-token layer steps of
/// 8 experts; it is closed until then).
const FIRST: u64 = 256;

/// The counts are halved when they reach this, so that the share follows
/// the last few thousand experts.
const WINDOW: u64 = 8192;

/// Experts a layer used at one token, and how many of them at the next.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RepeatGate {
    seen: u64,
    again: u64,
}

impl RepeatGate {
    /// A layer's step used `again` of the `seen` experts it used at the
    /// token before.
    pub fn step(&mut self, seen: usize, again: usize) {
        self.seen += seen as u64;
        self.again += again.min(seen) as u64;
        if self.seen >= WINDOW {
            self.seen /= 2;
            self.again /= 2;
        }
    }

    /// The share used again, once enough experts were looked at.
    pub fn share(&self) -> Option<f64> {
        (self.seen >= FIRST).then(|| self.again as f64 / self.seen as f64)
    }

    /// Whether the last token's experts should be copied ahead now.
    pub fn open(&self) -> bool {
        self.share().is_some_and(|s| s >= REPEAT_MIN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_until_measured_then_follows_the_share() {
        let mut g = RepeatGate::default();
        assert!(!g.open() && g.share().is_none());
        // Random routing: 1 of 8 again at most.
        for i in 0..100 {
            g.step(8, (i % 4 == 0) as usize);
        }
        assert!(g.share().unwrap() < 0.05 && !g.open(), "{:?}", g.share());
        // The routing turns sticky: 6 of 8 again; the window forgets.
        for _ in 0..2000 {
            g.step(8, 6);
        }
        assert!((g.share().unwrap() - 0.75).abs() < 0.02 && g.open(), "{:?}", g.share());
        // And back.
        for _ in 0..2000 {
            g.step(8, 1);
        }
        assert!(!g.open(), "{:?}", g.share());
        // Nonsense counts are capped.
        let mut h = RepeatGate::default();
        h.step(300, 900);
        assert_eq!(h.share(), Some(1.0));
    }
}
