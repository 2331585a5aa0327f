//! Wall time per kind of CPU operation, for `--timing` (off by default:
//! two clock reads per operation when on). What the forward pass spends
//! outside these operations is the model's own glue (allocation, copies
//! between them).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// The kinds of operation timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// `linear` and `linear_many` (dense products; the router).
    Products,
    /// RMS norms, gated or not.
    Norms,
    /// Adds, SwiGLU, sigmoid gates, strided copies, embeddings.
    Elementwise,
    /// RoPE and GQA / MLA attention over the cache.
    Attention,
    /// GatedDeltaNet conv and recurrence.
    Recurrence,
    /// The MoE step's routing and expert reads (page-cache or pread).
    MoeRead,
    /// The MoE step's products and combination.
    MoeCompute,
}

const OPS: [(Op, &str); 7] = [
    (Op::Products, "products"),
    (Op::Norms, "norms"),
    (Op::Elementwise, "elementwise"),
    (Op::Attention, "attention"),
    (Op::Recurrence, "recurrence"),
    (Op::MoeRead, "moe read"),
    (Op::MoeCompute, "moe compute"),
];

/// Time and calls of one kind of operation.
#[derive(Debug, Clone, PartialEq)]
pub struct OpTime {
    pub name: &'static str,
    pub secs: f64,
    pub calls: u64,
}

#[derive(Debug, Default)]
pub(crate) struct OpProfile {
    on: AtomicBool,
    ns: [AtomicU64; OPS.len()],
    calls: [AtomicU64; OPS.len()],
}

impl OpProfile {
    pub fn set_enabled(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// `f`, its time charged to `op` when profiling is on.
    #[inline]
    pub fn time<T>(&self, op: Op, f: impl FnOnce() -> T) -> T {
        if !self.on.load(Ordering::Relaxed) {
            return f();
        }
        let t0 = Instant::now();
        let out = f();
        self.ns[op as usize].fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.calls[op as usize].fetch_add(1, Ordering::Relaxed);
        out
    }

    pub fn snapshot(&self) -> Vec<OpTime> {
        OPS.iter()
            .map(|&(op, name)| OpTime {
                name,
                secs: self.ns[op as usize].load(Ordering::Relaxed) as f64 * 1e-9,
                calls: self.calls[op as usize].load(Ordering::Relaxed),
            })
            .collect()
    }

    pub fn reset(&self) {
        for (n, c) in self.ns.iter().zip(&self.calls) {
            n.store(0, Ordering::Relaxed);
            c.store(0, Ordering::Relaxed);
        }
    }
}
