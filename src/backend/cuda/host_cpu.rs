//! The CPU that computes expert misses beside the GPU (`--hybrid`): the
//! products' kernel and spinning workers of its own (`crate::parallel`):
//! a step is ~100 µs of work, and waking rayon's sleeping workers took
//! 60–200 µs per loop on the 16-core device host.

use super::driver::{Event, Gpu};
use crate::backend::cpu::matmul::Kernel;
use crate::backend::cpu::moe::{apply, Routed};
use crate::error::{Error, Result};
use crate::format::MatrixView;
use crate::parallel::SpinPool;
use std::sync::{Arc, Mutex};

/// The CPU that computes misses: the products' kernel and the workers.
pub(crate) struct HostCpu {
    kernel: Kernel,
    threads: usize,
    /// One step at a time uses them.
    step: Mutex<Workers>,
}

pub(crate) struct Workers {
    pool: SpinPool,
    /// Recorded after the GPU's share of a step.
    pub issued: Event,
}

impl HostCpu {
    /// `threads` workers (0: one per CPU the process may use), with exact
    /// products or the fastest kernel (SPEC §6).
    pub fn new(gpu: &Arc<Gpu>, threads: usize, exact: bool) -> Result<HostCpu> {
        let threads = match threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let pool = SpinPool::new(threads)
            .map_err(|e| Error::Invalid(format!("cannot start {threads} CPU threads for --hybrid: {e}")))?;
        Ok(HostCpu {
            kernel: Kernel::choose(exact),
            threads,
            step: Mutex::new(Workers {
                pool,
                issued: Event::new(gpu)?,
            }),
        })
    }

    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The workers, for one step.
    pub fn lock(&self) -> Result<std::sync::MutexGuard<'_, Workers>> {
        self.step.lock().map_err(|_| Error::Backend {
            backend: "cuda",
            msg: "the hybrid CPU workers' lock was poisoned by a panic".into(),
        })
    }

    /// `cpu::moe::apply` on the workers: `s` is (tokens, hidden, inter).
    pub fn apply(
        &self,
        w: &Workers,
        x: &[f32],
        s: (usize, usize, usize),
        mats: &[[MatrixView; 3]],
        routed: &[Routed],
        out: &mut [f32],
    ) -> Result<()> {
        w.pool
            .install(|| apply(self.kernel, x, s.0, s.1, s.2, mats, routed, out))
    }
}
