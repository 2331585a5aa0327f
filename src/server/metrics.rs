//! `/metrics`: counters over every finished generation, in the Prometheus
//! text format.

use crate::generate::GenerationStats;
use std::fmt::Write;
use std::sync::Mutex;

#[derive(Default)]
struct Totals {
    requests: u64,
    prompt_tokens: u64,
    cached_tokens: u64,
    generated_tokens: u64,
    /// Prompt tokens evaluated (not reused) and the seconds it took.
    prefill_tokens: u64,
    prefill_s: f64,
    /// Tokens after the first of each generation and the seconds they took.
    decode_tokens: u64,
    decode_s: f64,
    decode_bytes: u64,
    cache_hits: u64,
    cache_misses: u64,
}

/// Counters the slots add to; read by `/metrics`.
#[derive(Default)]
pub struct Metrics {
    totals: Mutex<Totals>,
}

/// The figures of the moment that the counters do not hold.
pub struct Gauges {
    pub running: usize,
    pub queued: usize,
    pub slots: usize,
}

impl Metrics {
    fn totals(&self) -> std::sync::MutexGuard<'_, Totals> {
        self.totals.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Add one finished generation.
    pub fn record(&self, s: &GenerationStats) {
        let mut t = self.totals();
        t.requests += 1;
        t.prompt_tokens += s.prompt_tokens as u64;
        t.cached_tokens += s.reused_tokens as u64;
        t.generated_tokens += s.generated_tokens as u64;
        t.prefill_tokens += (s.prompt_tokens - s.reused_tokens) as u64;
        t.prefill_s += s.prefill_s;
        t.decode_tokens += s.generated_tokens.saturating_sub(1) as u64;
        t.decode_s += s.decode_s;
        t.decode_bytes += s.decode_experts.bytes_read;
        for c in [s.prefill_experts.cache, s.decode_experts.cache].into_iter().flatten() {
            t.cache_hits += c.hits;
            t.cache_misses += c.misses;
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self, g: &Gauges) -> String {
        let t = self.totals();
        let ratio = |n: f64, d: f64| if d > 0.0 { n / d } else { 0.0 };
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
            // Writing to a String cannot fail.
            let _ = write!(
                out,
                "# HELP moeflux_{name} {help}\n# TYPE moeflux_{name} {kind}\nmoeflux_{name} {value}\n"
            );
        };
        metric("requests_total", "counter", "Generations finished.", t.requests as f64);
        metric(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens of finished generations.",
            t.prompt_tokens as f64,
        );
        metric(
            "prompt_tokens_cached_total",
            "counter",
            "Prompt tokens a slot already held and did not evaluate again.",
            t.cached_tokens as f64,
        );
        metric(
            "generated_tokens_total",
            "counter",
            "Tokens generated.",
            t.generated_tokens as f64,
        );
        metric(
            "prefill_tokens_per_second",
            "gauge",
            "Prompt tokens evaluated per second, over all generations.",
            ratio(t.prefill_tokens as f64, t.prefill_s),
        );
        metric(
            "decode_tokens_per_second",
            "gauge",
            "Tokens generated per second after each first token, over all generations.",
            ratio(t.decode_tokens as f64, t.decode_s),
        );
        metric(
            "requests_running",
            "gauge",
            "Generations running in a slot.",
            g.running as f64,
        );
        metric(
            "requests_queued",
            "gauge",
            "Generations waiting for a slot.",
            g.queued as f64,
        );
        metric("slots", "gauge", "Inference slots (--parallel).", g.slots as f64);
        metric(
            "expert_cache_hits_total",
            "counter",
            "Device expert-cache hits (0 where there is no cache).",
            t.cache_hits as f64,
        );
        metric(
            "expert_cache_misses_total",
            "counter",
            "Device expert-cache misses (0 where there is no cache).",
            t.cache_misses as f64,
        );
        metric(
            "expert_cache_hit_ratio",
            "gauge",
            "Hits over lookups of the device expert cache (0 before the first lookup or without a cache).",
            ratio(t.cache_hits as f64, (t.cache_hits + t.cache_misses) as f64),
        );
        metric(
            "expert_bytes_per_token",
            "gauge",
            "Expert bytes read from the expert files per decoded token.",
            ratio(t.decode_bytes as f64, t.decode_tokens as f64),
        );
        out
    }
}
