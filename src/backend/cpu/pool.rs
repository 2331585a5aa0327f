//! The CPU backend's threads: a rayon pool of its own, one worker per
//! core, in which a whole forward pass runs (`CpuBackend::run`), and
//! beside it the spinning workers (`crate::parallel`) that run the pass's
//! parallel loops.
//!
//! A parallel loop started from a thread outside a pool is queued to the
//! pool and the caller sleeps until a worker has finished it: two thread
//! wake-ups per loop, and a decode step has about ten loops per layer.
//! Started from a worker of the pool, the same loop runs on that worker
//! and the others take parts of it from its queue, so a forward pass
//! entered once through `install` pays the hand-off once.
//!
//! The workers are not pinned to CPUs: on the 16-core device host, pinned
//! and floating workers decoded within the noise of each other (tg32
//! 15.7 / 14.7 against 14.8 / 16.2 tok/s), and pinning would stack two
//! processes on the same cores.

use crate::error::{Error, Result};
use rayon::{ThreadPool, ThreadPoolBuilder};

/// How the pool was set up, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolInfo {
    pub threads: usize,
}

/// A pool of `threads` workers (0: one per CPU this process may use, as
/// `std::thread::available_parallelism` counts them, which honours the
/// affinity mask and a cgroup CPU quota).
pub(crate) fn build(threads: usize) -> Result<(ThreadPool, PoolInfo)> {
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let pool = ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("moeflux-cpu-{i}"))
        .build()
        .map_err(|e| Error::Invalid(format!("cannot start {threads} CPU threads: {e}")))?;
    Ok((pool, PoolInfo { threads }))
}
