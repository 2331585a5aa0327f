//! What a generation measured: expert traffic, device-cache counters and
//! per-phase times over spans of the run, and the counters they are taken
//! from.

use crate::experts::CacheStats;
use crate::experts::StatsSnapshot;
use crate::model::timing::PhaseTimes;
use serde::Serialize;
use std::time::Instant;

/// Expert traffic over a span of the run, as the expert store (and on
/// CUDA the device expert cache) counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ExpertTraffic {
    /// Experts read from the expert files.
    pub experts_read: u64,
    pub bytes_read: u64,
    /// Seconds spent reading (summed over parallel readers).
    pub read_s: f64,
    /// Wall-clock seconds during which at least one read was in flight.
    pub read_wall_s: f64,
    /// The device expert cache, where the backend keeps one.
    pub cache: Option<CacheTraffic>,
}

/// Counters of a device expert cache over a span of the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CacheTraffic {
    pub hits: u64,
    pub misses: u64,
    /// Experts copied ahead of need.
    pub prefetched: u64,
    /// Hits on experts that prefetch had copied.
    pub prefetch_hits: u64,
    /// Bytes copied host → device.
    pub bytes_copied: u64,
    /// Seconds the device waited for experts to arrive.
    pub stall_s: f64,
}

impl CacheTraffic {
    /// Hits over lookups; `None` before the first lookup.
    pub fn hit_rate(&self) -> Option<f64> {
        let n = self.hits + self.misses;
        (n > 0).then(|| self.hits as f64 / n as f64)
    }
}

impl ExpertTraffic {
    pub(super) fn between(a: &Mark, b: &Mark) -> ExpertTraffic {
        let (x, y) = (&a.experts, &b.experts);
        let cache = match (&a.cache, &b.cache) {
            (Some(c), Some(d)) => Some(CacheTraffic {
                hits: d.hits.saturating_sub(c.hits),
                misses: d.misses.saturating_sub(c.misses),
                prefetched: d.prefetched.saturating_sub(c.prefetched),
                prefetch_hits: d.prefetch_hits.saturating_sub(c.prefetch_hits),
                bytes_copied: d.bytes_copied.saturating_sub(c.bytes_copied),
                stall_s: d.stall_ns.saturating_sub(c.stall_ns) as f64 * 1e-9,
            }),
            _ => None,
        };
        ExpertTraffic {
            experts_read: y.experts_read.saturating_sub(x.experts_read),
            bytes_read: y.bytes_read.saturating_sub(x.bytes_read),
            read_s: y.read_ns.saturating_sub(x.read_ns) as f64 * 1e-9,
            read_wall_s: y.busy_ns.saturating_sub(x.busy_ns) as f64 * 1e-9,
            cache,
        }
    }

    /// The time the computation waited for experts: the cache's stall time
    /// where there is a device cache (its reads overlap compute), else the
    /// wall time during which a read was in flight (parallel reads counted
    /// once, so that it never exceeds the time that passed).
    pub fn wait_s(&self) -> f64 {
        self.cache.map_or(self.read_wall_s, |c| c.stall_s)
    }
}

/// Seconds per phase of the forward pass over a span of the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PhaseBreakdown {
    pub attention: f64,
    pub routing: f64,
    /// Waiting for experts ([`ExpertTraffic::wait_s`]), at most the
    /// experts phase.
    pub expert_io_wait: f64,
    /// The experts phase less the I/O wait.
    pub expert_compute: f64,
    /// Dense MLPs and shared experts.
    pub dense_ffn: f64,
    pub lm_head: f64,
}

impl PhaseBreakdown {
    pub(super) fn between(a: &PhaseTimes, b: &PhaseTimes, io_wait: f64) -> PhaseBreakdown {
        let experts = b.experts - a.experts;
        // The wait falls inside the experts phase; clamp measurement noise
        // so that the phases add up to the time they cover.
        let io_wait = io_wait.clamp(0.0, experts.max(0.0));
        PhaseBreakdown {
            attention: b.attention - a.attention,
            routing: b.routing - a.routing,
            expert_io_wait: io_wait,
            expert_compute: experts - io_wait,
            dense_ffn: b.dense_ffn - a.dense_ffn,
            lm_head: b.lm_head - a.lm_head,
        }
    }

    /// Sum of the phases.
    pub fn total(&self) -> f64 {
        self.attention + self.routing + self.expert_io_wait + self.expert_compute + self.dense_ffn + self.lm_head
    }
}

/// What one generation measured. Prefill is the evaluation of the prompt
/// (past the reused prefix, including any rewind); decode is everything
/// after the first token.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    /// Prompt tokens the session already held and did not evaluate again.
    pub reused_tokens: usize,
    /// Tokens generated, an end-of-sequence token included.
    pub generated_tokens: usize,
    pub prefill_s: f64,
    /// Prompt tokens evaluated per second.
    pub prefill_tok_s: f64,
    /// From the first generated token to the last.
    pub decode_s: f64,
    /// Tokens per second after the first.
    pub decode_tok_s: f64,
    /// From the start of the request to the first generated token.
    pub time_to_first_token_s: f64,
    pub prefill_experts: ExpertTraffic,
    pub decode_experts: ExpertTraffic,
    /// Expert bytes read per decoded token.
    pub decode_bytes_per_token: f64,
    /// Present when the request asked for timing.
    pub prefill_phases: Option<PhaseBreakdown>,
    pub decode_phases: Option<PhaseBreakdown>,
}

/// Counters at one instant.
#[derive(Clone, Copy)]
pub(super) struct Mark {
    pub at: Instant,
    pub experts: StatsSnapshot,
    pub cache: Option<CacheStats>,
    pub phases: PhaseTimes,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_breakdown_splits_experts_into_io_and_compute() {
        let a = PhaseTimes::default();
        let b = PhaseTimes {
            attention: 1.0,
            routing: 0.5,
            experts: 3.0,
            dense_ffn: 0.25,
            lm_head: 0.125,
        };
        let p = PhaseBreakdown::between(&a, &b, 2.0);
        assert_eq!(p.expert_io_wait, 2.0);
        assert_eq!(p.expert_compute, 1.0);
        assert_eq!(p.total(), 4.875);
        // A wait longer than the phase is cut to it: the phases still add up.
        let p = PhaseBreakdown::between(&a, &b, 5.0);
        assert_eq!((p.expert_io_wait, p.expert_compute), (3.0, 0.0));
        assert_eq!(p.total(), 4.875);
    }
}
