//! A record of which experts each token was routed to, for measuring
//! routing (expert popularity, reuse between tokens) on any backend. Off
//! by default; when on, every MoE layer copies its router logits back to
//! the host and routes them again with [`super::router::route`], the
//! function the CPU backend routes with (the CUDA backend routes the same
//! logits on the device).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The experts of one token at one MoE layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRecord {
    pub layer: usize,
    /// The token's position in its sequence.
    pub pos: usize,
    /// The chosen experts, in the router's order (largest score first).
    pub experts: Vec<u32>,
}

#[derive(Debug, Default)]
pub struct RouteTrace {
    enabled: AtomicBool,
    records: Mutex<Vec<RouteRecord>>,
}

impl RouteTrace {
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Record the routes of `n` tokens at positions `pos0..` of `layer`:
    /// `ids` holds `k` experts per token.
    pub fn push(&self, layer: usize, pos0: usize, ids: &[u32], k: usize) {
        let Ok(mut records) = self.records.lock() else { return };
        for (t, experts) in ids.chunks_exact(k).enumerate() {
            records.push(RouteRecord {
                layer,
                pos: pos0 + t,
                experts: experts.to_vec(),
            });
        }
    }

    /// The records so far, in the order they were made (layer by layer
    /// within a forward pass); the trace is left empty.
    pub fn take(&self) -> Vec<RouteRecord> {
        self.records
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default()
    }
}
