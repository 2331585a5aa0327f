//! Per-phase wall time of the forward pass, for `--timing`. Off by
//! default: when on, the backend is synchronized at phase boundaries so
//! that asynchronous devices are charged to the right phase.

use crate::backend::Backend;
use crate::error::Result;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Token mixing: GQA / GatedDeltaNet / MLA, with their norms (the
    /// input norm computed together with the previous layer's residual add).
    Attention,
    /// The matrix products that read the MoE block's input: the router's
    /// (the logits), with the shared expert's gate, up and gate logit in
    /// the same call.
    Routing,
    /// The routed experts: choosing them from the logits (inside the
    /// backend's `moe`, on the device where there is one), reading and
    /// computing them.
    Experts,
    /// Dense MLPs and shared experts.
    DenseFfn,
    /// Final norm, lm_head, logits back to the host.
    LmHead,
}

const N: usize = 5;

/// Accumulated nanoseconds per phase.
#[derive(Debug, Default)]
pub struct PhaseTimer {
    enabled: AtomicBool,
    ns: [AtomicU64; N],
}

/// A copy of the accumulated times, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseTimes {
    pub attention: f64,
    pub routing: f64,
    pub experts: f64,
    pub dense_ffn: f64,
    pub lm_head: f64,
}

impl PhaseTimer {
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Run `f`, charging its time to `phase` when timing is on.
    pub fn measure<B: Backend, T>(&self, b: &B, phase: Phase, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if !self.enabled() {
            return f();
        }
        b.synchronize()?;
        let t0 = Instant::now();
        let out = f()?;
        b.synchronize()?;
        self.ns[phase as usize].fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(out)
    }

    pub fn snapshot(&self) -> PhaseTimes {
        let s = |p: Phase| self.ns[p as usize].load(Ordering::Relaxed) as f64 * 1e-9;
        PhaseTimes {
            attention: s(Phase::Attention),
            routing: s(Phase::Routing),
            experts: s(Phase::Experts),
            dense_ffn: s(Phase::DenseFfn),
            lm_head: s(Phase::LmHead),
        }
    }

    pub fn reset(&self) {
        for a in &self.ns {
            a.store(0, Ordering::Relaxed);
        }
    }
}
