//! The CPU that computes expert misses beside the GPU (`--hybrid`): the
//! products' kernel and spinning workers of its own (`crate::parallel`):
//! a step is ~100 µs of work, and waking rayon's sleeping workers took
//! 60–200 µs per loop on the 16-core device host.

use super::buf::Pinned;
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
    /// The CPU's weighted sum of a step `[n, hidden]`, in page-locked
    /// memory that the kernel adding it reads over the bus: no copy is
    /// queued behind the expert copies that may fill the link (grown on
    /// demand; see [`Workers::sum`]).
    sum: Option<Pinned>,
    gpu: Arc<Gpu>,
}

impl Workers {
    pub fn pool(&self) -> &SpinPool {
        &self.pool
    }

    /// The pool, a zeroed sum of `len` floats and its device address. The kernel
    /// that read the last sum has finished: every CPU step follows the
    /// wait for its routing on the compute stream, which that kernel
    /// precedes.
    pub fn step(&mut self, len: usize) -> Result<(&SpinPool, &mut [f32], u64)> {
        let bytes = len * 4;
        if self.sum.as_ref().is_none_or(|p| p.len() < bytes) {
            self.sum = None;
            self.sum = Some(Pinned::new(&self.gpu, bytes.next_multiple_of(64 << 10))?);
        }
        let Some(p) = self.sum.as_ref() else {
            unreachable!("allocated above")
        };
        let dev = p.device_ptr()?;
        // SAFETY: only this step uses the buffer (see above), and it
        // holds at least `bytes` bytes, 64-KiB aligned by the driver.
        let s = unsafe { bytemuck::cast_slice_mut::<u8, f32>(p.range_mut(0, bytes)) };
        s.fill(0.0);
        Ok((&self.pool, s, dev))
    }
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
                sum: None,
                gpu: gpu.clone(),
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

    /// `cpu::moe::apply` on the workers' pool (`Workers::pool`): `s` is
    /// (tokens, hidden, inter).
    pub fn apply(
        &self,
        w: &SpinPool,
        x: &[f32],
        s: (usize, usize, usize),
        mats: &[[MatrixView; 3]],
        routed: &[Routed],
        out: &mut [f32],
    ) -> Result<()> {
        w.install(|| apply(self.kernel, x, s.0, s.1, s.2, mats, routed, out))
    }
}
