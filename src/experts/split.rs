//! Where a step's expert misses are computed: copied to the device and
//! computed there, or computed on the CPU straight from host memory (the
//! page cache) while the copies of the others run — both at once, so that
//! neither PCIe nor the CPU alone sets the floor. The split comes from a
//! cost model: the copy rate measured at start, the CPU's cost per expert
//! (a fixed part and a part per byte) measured at start and corrected by
//! every CPU step that follows.

use crate::error::{Error, Result};

/// `--hybrid`: who computes the experts that are not on the device.
/// `Auto` by default where the expert files are registered with the
/// driver: on the H200 host it decoded faster than `Off` at `0%` and 25% and as
/// fast at 50% (docs/notes/2026-11-22-to-12-02-benchmark-log.md, "Streaming
/// without CUDA graphs"; docs/streaming.md); `Off` by default where misses go
/// through staging buffers
/// (the split was not measured there). See `Options::hybrid` (`options.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hybrid {
    /// Split by the cost model.
    Auto,
    /// Copy every miss (the device computes everything).
    Off,
    /// Compute every miss on the CPU (for testing and comparison).
    Cpu,
}

impl Hybrid {
    pub fn name(self) -> &'static str {
        match self {
            Hybrid::Auto => "auto",
            Hybrid::Off => "off",
            Hybrid::Cpu => "cpu",
        }
    }
}

impl std::fmt::Display for Hybrid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Hybrid {
    type Err = Error;
    fn from_str(s: &str) -> Result<Hybrid> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Hybrid::Auto),
            "off" => Ok(Hybrid::Off),
            "cpu" => Ok(Hybrid::Cpu),
            _ => Err(Error::Invalid(format!(
                "unknown --hybrid `{s}`; expected auto, off or cpu"
            ))),
        }
    }
}

/// How many misses of one call may be computed where they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostShare {
    /// None: every miss is copied.
    Nothing,
    /// Up to this many (those not admitted to the cache first).
    UpTo(usize),
    /// Every miss.
    All,
}

/// The costs the split weighs, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SplitModel {
    pub mode: Hybrid,
    /// Copying one byte to the device.
    pub copy_s_per_byte: f64,
    /// The CPU computing one byte of expert for one token.
    pub cpu_s_per_byte: f64,
    /// The CPU's fixed cost of a step (waking threads, moving the
    /// activations and the result).
    pub cpu_fixed_s: f64,
    /// What the device's share of a step takes besides its copies (its
    /// compute, and copies queued before it): not measured directly, but
    /// moved after every CPU step toward the balance where the CPU's share
    /// and the device's finish together.
    pub gpu_extra_s: f64,
    /// What a step costs the CPU on top when its workers were asleep
    /// (no step for a while): learned from such cold steps, and added
    /// to the CPU's side of a step planned while the CPU is cold, so that
    /// a CPU used now and then is judged at what that costs, and one kept
    /// busy at its warm cost.
    pub cpu_wake_s: f64,
    /// CPU steps observed since start.
    pub observed: u64,
    /// The CPU's kernel and threads, for the summary.
    pub cpu: Option<(&'static str, usize)>,
    /// Steps with misses that the model gave none of to the CPU in a row.
    idle: u32,
    /// Steps left of an exploration burst.
    probe: u32,
    /// The CPU steps' times against their work, for a fit of both costs.
    fit: Fit,
}

/// Exponentially weighted sums of the CPU steps' work `w` (bytes × tokens)
/// and time `t`, for the line `t ≈ fixed + per_byte · w`: the start-up
/// timing runs with hot weights and no copies reading host memory, and
/// a per-byte cost corrected alone fits the steps at one size only
/// (docs/notes/2026-11-22-to-12-02-benchmark-log.md, "The CPU's share handed
/// over first, the split fitted online").
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Fit {
    n: f64,
    w: f64,
    t: f64,
    ww: f64,
    wt: f64,
}

/// How much of the sums each CPU step keeps (a window of ~100 steps).
const FIT_KEEP: f64 = 0.99;

/// The fit is used once this many steps are in it and their work spreads
/// by at least this coefficient of variation (else a line through them
/// is not defined well enough, and only the per-byte cost moves).
const FIT_MIN_STEPS: u64 = 32;
const FIT_MIN_CV: f64 = 0.15;

impl Fit {
    fn add(&mut self, w: f64, t: f64) {
        let k = FIT_KEEP;
        *self = Fit {
            n: k * self.n + 1.0,
            w: k * self.w + w,
            t: k * self.t + t,
            ww: k * self.ww + w * w,
            wt: k * self.wt + w * t,
        };
    }

    /// (fixed seconds, seconds per unit of work), when well defined and
    /// both positive.
    fn line(&self) -> Option<(f64, f64)> {
        if self.n <= 0.0 {
            return None;
        }
        let (mw, mt) = (self.w / self.n, self.t / self.n);
        let var = self.ww / self.n - mw * mw;
        if var.is_nan() || var <= (FIT_MIN_CV * mw).powi(2) {
            return None;
        }
        let per = (self.wt / self.n - mw * mt) / var;
        let fixed = mt - per * mw;
        (per > 0.0 && fixed >= 0.0 && per.is_finite() && fixed.is_finite()).then_some((fixed, per))
    }
}

/// After this many steps with misses in a row that give the CPU nothing,
/// the CPU gets one miss a step for [`PROBE_STEPS`] steps, so that an
/// estimate spoiled by slow steps can recover. A burst, not a single
/// step: the CPU's workers sleep after a while without work, and the
/// first step after such a pause pays their waking (a cold step, which
/// the fit leaves out, [`SplitModel::observe`]); the next ones show the
/// cost of a CPU kept busy. On the H200 host, a start that judged the CPU slow
/// almost never gave it a step, and decoded slower than the split that kept the
/// CPU busy (docs/notes/2026-11-22-to-12-02-benchmark-log.md, "The split
/// starving its own measurements").
const EXPLORE_EVERY: u32 = 64;
const PROBE_STEPS: u32 = 8;

/// How much of the old estimate each observation keeps.
const KEEP: f64 = 0.9;

/// How far one CPU step moves [`SplitModel::gpu_extra_s`].
const NUDGE_S: f64 = 2e-6;

/// The most it may reach (a millisecond: several times a decode step's
/// share), so that it comes back soon when the device speeds up.
const MAX_EXTRA_S: f64 = 1e-3;

impl SplitModel {
    /// From the copy rate (bytes/s) and two timings of the CPU at start:
    /// `one` second(s) for one expert of `bytes`, `four` for four.
    pub fn new(mode: Hybrid, copy_bps: f64, bytes: u64, one: f64, four: f64) -> SplitModel {
        let b = bytes.max(1) as f64;
        let per = ((four - one) / 3.0).max(one / 4.0).max(1e-9);
        SplitModel {
            mode,
            copy_s_per_byte: 1.0 / copy_bps.max(1.0),
            cpu_s_per_byte: per / b,
            cpu_fixed_s: (one - per).max(0.0),
            gpu_extra_s: 0.0,
            cpu_wake_s: 0.0,
            observed: 0,
            cpu: None,
            idle: 0,
            probe: 0,
            fit: Fit::default(),
        }
    }

    /// The same, naming the CPU's kernel and threads.
    pub fn on_cpu(self, kernel: &'static str, threads: usize) -> SplitModel {
        SplitModel {
            cpu: Some((kernel, threads)),
            ..self
        }
    }

    /// One line for the run's summary.
    pub fn describe(&self) -> String {
        let on = match self.cpu {
            Some((kernel, threads)) => format!(", {threads} threads, kernel {kernel}"),
            None => String::new(),
        };
        match self.mode {
            Hybrid::Off => "hybrid: off (every miss copied to the device)".into(),
            Hybrid::Cpu => format!("hybrid: cpu (every miss computed on the CPU from host memory{on})"),
            Hybrid::Auto => format!(
                "hybrid: misses split between copies ({:.1} GB/s) and the CPU ({:.1} GB/s + {:.0} µs a step{}{on})",
                1e-9 / self.copy_s_per_byte,
                1e-9 / self.cpu_s_per_byte,
                self.cpu_fixed_s * 1e6,
                match self.cpu_wake_s > 0.0 {
                    true => format!(", {:.0} µs more after a pause", self.cpu_wake_s * 1e6),
                    false => String::new(),
                }
            ),
        }
    }

    /// Predicted seconds for the CPU to compute `c` experts of `bytes`
    /// for `tokens` tokens each.
    pub fn cpu_s(&self, c: usize, bytes: u64, tokens: usize) -> f64 {
        if c == 0 {
            return 0.0;
        }
        self.cpu_fixed_s + (c * tokens.max(1)) as f64 * bytes as f64 * self.cpu_s_per_byte
    }

    /// Predicted seconds to copy `g` experts of `bytes`.
    pub fn copy_s(&self, g: usize, bytes: u64) -> f64 {
        g as f64 * bytes as f64 * self.copy_s_per_byte
    }

    /// How many of `misses` experts of `bytes` (each routed to `tokens`
    /// tokens on average) the CPU should compute so that the copies of
    /// the rest and the CPU finish soonest; `warm`: the CPU's workers are
    /// awake (else its side costs [`SplitModel::cpu_wake_s`] more).
    pub fn host_share(&self, misses: usize, bytes: u64, tokens: usize, warm: bool) -> HostShare {
        match self.mode {
            Hybrid::Off => return HostShare::Nothing,
            Hybrid::Cpu => return HostShare::All,
            Hybrid::Auto => {}
        }
        let wake = if warm { 0.0 } else { self.cpu_wake_s };
        let cpu = |c: usize| match c {
            0 => 0.0,
            c => self.cpu_s(c, bytes, tokens) + wake,
        };
        let cost = |c: usize| (self.copy_s(misses - c, bytes) + self.gpu_extra_s).max(cpu(c));
        let best = (0..=misses).min_by(|&a, &b| cost(a).total_cmp(&cost(b))).unwrap_or(0);
        match best {
            0 => HostShare::Nothing,
            c => HostShare::UpTo(c),
        }
    }

    /// [`SplitModel::host_share`] for a step about to run: after
    /// [`EXPLORE_EVERY`] steps in a row with misses and nothing for the
    /// CPU, the next [`PROBE_STEPS`] steps with misses give it one (steps
    /// without misses neither count nor break the row).
    pub fn plan(&mut self, misses: usize, bytes: u64, tokens: usize, warm: bool) -> HostShare {
        let share = self.host_share(misses, bytes, tokens, warm);
        if self.mode != Hybrid::Auto || misses == 0 {
            return share;
        }
        if share != HostShare::Nothing {
            self.idle = 0;
            self.probe = self.probe.saturating_sub(1);
            return share;
        }
        if self.probe > 0 {
            self.probe -= 1;
            return HostShare::UpTo(1);
        }
        self.idle += 1;
        if self.idle >= EXPLORE_EVERY {
            self.idle = 0;
            self.probe = PROBE_STEPS - 1;
            return HostShare::UpTo(1);
        }
        HostShare::Nothing
    }

    /// A CPU step computed `c` experts of `bytes` for `tokens` tokens each
    /// in `secs`, and finished `last` (after the device's share) or not:
    /// fit both CPU costs to the recent steps where their sizes spread
    /// enough, else move the per-byte cost toward what this one showed;
    /// and move the device's extra time toward the balance. A `cold` step
    /// (the CPU's workers had gone to sleep before it) tells neither: what
    /// it took beyond the warm estimate is its waking
    /// ([`SplitModel::cpu_wake_s`]).
    pub fn observe(&mut self, c: usize, bytes: u64, tokens: usize, secs: f64, last: bool, cold: bool) {
        if cold {
            if c > 0 && secs.is_finite() {
                let wake = (secs - self.cpu_s(c, bytes, tokens)).max(0.0);
                self.cpu_wake_s = KEEP * self.cpu_wake_s + (1.0 - KEEP) * wake;
            }
            return;
        }
        self.gpu_extra_s = match last {
            true => (self.gpu_extra_s - NUDGE_S).max(0.0),
            false => (self.gpu_extra_s + NUDGE_S).min(MAX_EXTRA_S),
        };
        let work = (c * tokens.max(1)) as f64 * bytes as f64;
        if work <= 0.0 || !secs.is_finite() {
            return;
        }
        self.observed += 1;
        self.fit.add(work, secs);
        if let Some((fixed, per)) = self.fit.line().filter(|_| self.observed >= FIT_MIN_STEPS) {
            self.cpu_fixed_s = fixed;
            self.cpu_s_per_byte = per;
            return;
        }
        // Steps of one size: both costs scaled toward what this one
        // showed (geometrically), so that a start that overstated the
        // fixed cost recovers from one-expert steps as well.
        let predicted = self.cpu_fixed_s + work * self.cpu_s_per_byte;
        if predicted > 0.0 && secs > 0.0 {
            let k = (secs / predicted).clamp(0.1, 10.0).powf(1.0 - KEEP);
            self.cpu_fixed_s *= k;
            self.cpu_s_per_byte = (self.cpu_s_per_byte * k).max(1e-15);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    #[test]
    fn modes_parse_and_force_the_extremes() {
        assert_eq!("AUTO".parse::<Hybrid>().unwrap(), Hybrid::Auto);
        assert_eq!("off".parse::<Hybrid>().unwrap(), Hybrid::Off);
        assert_eq!("cpu".parse::<Hybrid>().unwrap(), Hybrid::Cpu);
        assert!("gpu"
            .parse::<Hybrid>()
            .unwrap_err()
            .to_string()
            .contains("auto, off or cpu"));
        let m = |mode| SplitModel::new(mode, 50e9, 2 * MB, 1e-4, 2e-4);
        assert_eq!(m(Hybrid::Off).host_share(8, 2 * MB, 1, true), HostShare::Nothing);
        assert_eq!(m(Hybrid::Cpu).host_share(8, 2 * MB, 1, true), HostShare::All);
    }

    #[test]
    fn the_split_balances_copy_and_cpu() {
        // Copies at 50 GB/s, the CPU at 25 GB/s with no fixed cost: the
        // CPU should take a third of the misses.
        let bytes = 2 * MB;
        let per = bytes as f64 / 25e9;
        let m = SplitModel::new(Hybrid::Auto, 50e9, bytes, per, 4.0 * per);
        assert!(m.cpu_fixed_s.abs() < 1e-12);
        assert_eq!(m.host_share(9, bytes, 1, true), HostShare::UpTo(3));
        // Prefill-like steps (many tokens per expert) leave it to copies.
        assert_eq!(m.host_share(9, bytes, 16, true), HostShare::Nothing);
        // A fixed cost larger than copying everything: nothing to the CPU.
        let slow = SplitModel::new(Hybrid::Auto, 50e9, bytes, 1e-3, 1e-3 + 3.0 * per);
        assert_eq!(slow.host_share(8, bytes, 1, true), HostShare::Nothing);
        assert_eq!(m.host_share(0, bytes, 1, true), HostShare::Nothing);
    }

    #[test]
    fn observations_correct_the_cpu_estimate() {
        let bytes = 2 * MB;
        let per = bytes as f64 / 25e9;
        let mut m = SplitModel::new(Hybrid::Auto, 50e9, bytes, per, 4.0 * per);
        // The CPU turns out four times slower than measured at start.
        for _ in 0..100 {
            m.observe(3, bytes, 1, 12.0 * per, true, false);
        }
        assert!((m.cpu_s_per_byte * bytes as f64 / per - 4.0).abs() < 0.05);
        assert_eq!(m.host_share(9, bytes, 1, true), HostShare::UpTo(1));
        assert_eq!(m.observed, 100);
        m.observe(0, bytes, 1, 1.0, true, false);
        m.observe(3, bytes, 1, f64::NAN, true, false);
        assert_eq!(m.observed, 100, "empty or broken observations are ignored");
    }

    #[test]
    fn steps_of_several_sizes_fit_both_cpu_costs() {
        // Measured at start: 27 µs and 67.8 GB/s. The steps show 50 µs and
        // 80 GB/s, in sizes of 1 to 4 experts.
        let bytes = 1_769_472u64;
        let one = 27e-6 + bytes as f64 / 67.8e9;
        let mut m = SplitModel::new(Hybrid::Auto, 55e9, bytes, one, 27e-6 + 4.0 * bytes as f64 / 67.8e9);
        assert!((m.cpu_fixed_s - 27e-6).abs() < 1e-7);
        for i in 0..300 {
            let c = 1 + i % 4;
            m.observe(c, bytes, 1, 50e-6 + (c as f64 * bytes as f64) / 80e9, i % 2 == 0, false);
        }
        assert!((m.cpu_fixed_s - 50e-6).abs() < 1e-6, "fixed {}", m.cpu_fixed_s);
        assert!(
            (1.0 / m.cpu_s_per_byte / 80e9 - 1.0).abs() < 0.01,
            "{} B/s",
            1.0 / m.cpu_s_per_byte
        );
        // Balanced against 55 GB/s copies: 6 misses split 3 / 3 (50 + 66
        // µs of CPU against 97 µs of copies), where the start-up costs
        // gave the CPU 3 as well; 2 misses go to the link alone.
        assert_eq!(m.host_share(6, bytes, 1, true), HostShare::UpTo(3));
        assert_eq!(m.host_share(2, bytes, 1, true), HostShare::Nothing);
    }

    #[test]
    fn a_device_that_finishes_last_gets_less() {
        // Copies and CPU equally fast: half the misses to the CPU, until
        // the device's share keeps finishing after the CPU's.
        let bytes = 2 * MB;
        let per = bytes as f64 / 50e9;
        let mut m = SplitModel::new(Hybrid::Auto, 50e9, bytes, per, 4.0 * per);
        assert_eq!(m.host_share(8, bytes, 1, true), HostShare::UpTo(4));
        for _ in 0..100 {
            m.observe(4, bytes, 1, 4.0 * per, false, false);
        }
        assert!(m.gpu_extra_s > 0.0);
        let more = match m.host_share(8, bytes, 1, true) {
            HostShare::UpTo(c) => c,
            other => panic!("{other:?}"),
        };
        assert!(more > 4, "the CPU should take more than 4 of 8, took {more}");
        // And back once the CPU is the one that finishes last.
        for _ in 0..1000 {
            m.observe(4, bytes, 1, 4.0 * per, true, false);
        }
        assert_eq!(m.gpu_extra_s, 0.0);
        assert_eq!(m.host_share(8, bytes, 1, true), HostShare::UpTo(4));
    }

    #[test]
    fn a_cpu_judged_too_slow_is_measured_again() {
        let bytes = 2 * MB;
        let mut m = SplitModel::new(Hybrid::Auto, 50e9, bytes, 1e-3, 2e-3);
        // Steps of 8, 1 and 0 misses in turn: the ones without misses do
        // not break the row, the ones with a single miss count in it.
        let plans: Vec<HostShare> = (0..3 * 2 * EXPLORE_EVERY)
            .map(|i| m.plan([8, 1, 0][i as usize % 3], bytes, 1, true))
            .collect();
        let tries = plans.iter().filter(|p| **p == HostShare::UpTo(1)).count();
        assert_eq!(tries, 3 * PROBE_STEPS as usize, "{plans:?}");
        assert!(plans
            .iter()
            .all(|p| matches!(p, HostShare::Nothing | HostShare::UpTo(1))));
        // A burst is consecutive steps with misses.
        let first = plans.iter().position(|p| *p == HostShare::UpTo(1)).unwrap();
        let with_misses: Vec<&HostShare> = plans[first..]
            .iter()
            .enumerate()
            .filter(|(i, _)| (first + i) % 3 != 2)
            .map(|(_, p)| p)
            .collect();
        assert!(with_misses[..PROBE_STEPS as usize]
            .iter()
            .all(|p| **p == HostShare::UpTo(1)));
        assert_eq!(with_misses[PROBE_STEPS as usize], &HostShare::Nothing);
        assert_eq!(
            m.plan(0, bytes, 1, true),
            HostShare::Nothing,
            "no misses, nothing to give"
        );
    }

    /// A CPU whose start-up timing came out ten times too slow, steps of
    /// 0–3 misses, and cold steps (the workers asleep after a few steps
    /// without work) that cost 250 µs more: the model must find the warm
    /// cost and keep the CPU busy.
    #[test]
    fn a_pessimistic_start_recovers_despite_cold_steps() {
        let bytes = 1_769_472u64;
        let copy = |c: usize| c as f64 * bytes as f64 / 55e9;
        let warm_s = |c: usize| 30e-6 + c as f64 * 25e-6;
        let mut m = SplitModel::new(Hybrid::Auto, 55e9, bytes, 300e-6, 400e-6);
        let mut last_cpu: Option<usize> = None;
        let (mut busy, mut could) = (0, 0);
        for i in 0..6000usize {
            let misses = [2, 1, 3, 0, 2, 1, 2][i % 7];
            let warm = last_cpu.is_some_and(|l| i - l < 6);
            let c = match m.plan(misses, bytes, 1, warm) {
                HostShare::Nothing => 0,
                HostShare::UpTo(c) => c.min(misses),
                HostShare::All => misses,
            };
            if i >= 5000 && misses >= 2 {
                could += 1;
                busy += (c > 0) as usize;
            }
            if c == 0 {
                continue;
            }
            let cold = !warm;
            last_cpu = Some(i);
            let secs = warm_s(c) + if cold { 250e-6 } else { 0.0 };
            m.observe(c, bytes, 1, secs, secs > copy(misses - c) + 28e-6, cold);
        }
        assert!(
            busy * 10 >= could * 9,
            "the CPU took a share in {busy} of {could} steps: {m:?}"
        );
        let one = m.cpu_s(1, bytes, 1);
        assert!(
            (40e-6..80e-6).contains(&one),
            "one expert predicted at {} µs",
            one * 1e6
        );
        // Cold, a 2-miss step is not worth waking the CPU for; warm it is.
        assert!(m.cpu_wake_s > 20e-6, "waking: {} µs", m.cpu_wake_s * 1e6);
        assert_eq!(m.host_share(2, bytes, 1, false), HostShare::Nothing);
        assert_eq!(m.host_share(2, bytes, 1, true), HostShare::UpTo(1));
    }

    #[test]
    fn cold_steps_do_not_move_the_model() {
        let bytes = 2 * MB;
        let mut m = SplitModel::new(Hybrid::Auto, 50e9, bytes, 50e-6, 110e-6);
        let before = m;
        // A step 10× slower than usual, after the workers slept: only the
        // cost of waking them moves.
        m.observe(1, bytes, 1, 500e-6, true, true);
        assert_eq!(
            (m.cpu_fixed_s, m.cpu_s_per_byte, m.gpu_extra_s, m.observed),
            (before.cpu_fixed_s, before.cpu_s_per_byte, before.gpu_extra_s, 0)
        );
        assert!((m.cpu_wake_s - 0.1 * (500e-6 - before.cpu_s(1, bytes, 1))).abs() < 1e-9);
        m.observe(1, bytes, 1, 500e-6, true, false);
        assert!(m.cpu_s_per_byte > before.cpu_s_per_byte && m.observed == 1);
    }
}
