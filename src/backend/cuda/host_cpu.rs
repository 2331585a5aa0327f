//! The CPU that computes expert misses beside the GPU (`--hybrid`): the
//! products' kernel and spinning workers of its own (`crate::parallel`:
//! a step is ~100 µs of work, and waking rayon's sleeping workers took
//! 60–200 µs per loop on the 16-core device host), driven by a runner
//! thread of their own. The thread that drives the GPU hands a step over
//! ([`HostCpu::start`]) and goes on issuing the GPU's share and the
//! layer's later launches;
//! the kernel that adds the CPU's sum (`add_when`) waits on the GPU for
//! a flag that the step sets once the sum is written. (When that thread
//! computed the step itself, the GPU waited after each step for the
//! combine and the next layer's launches to be captured: 45–60 µs a
//! layer on the H200, BENCHMARKS "Where a streamed MoE layer's time
//! goes".)

use super::buf::Pinned;
use super::driver::{Event, Gpu};
use crate::backend::cpu::matmul::Kernel;
use crate::backend::cpu::moe::{apply, Routed};
use crate::error::{Error, Result};
use crate::format::MatrixView;
use crate::parallel::{SpinPool, SpinRunner};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Bytes before the sum in the step's page-locked buffer: the flag.
const FLAG_BYTES: usize = 256;

/// The CPU that computes misses: the products' kernel and the workers.
pub(crate) struct HostCpu {
    kernel: Kernel,
    threads: usize,
    runner: SpinRunner,
    st: Mutex<Steps>,
    gpu: Arc<Gpu>,
}

/// One step's work: the activations `[n, hidden]`, the experts'
/// matrices and the tokens routed to each.
pub(crate) struct Work {
    pub x: Vec<f32>,
    pub n: usize,
    pub hidden: usize,
    pub inter: usize,
    pub mats: Vec<[MatrixView; 3]>,
    pub routed: Vec<Routed>,
    /// (experts, bytes of one expert, tokens per expert), for the report.
    pub size: (usize, u64, usize),
}

/// What a finished step tells (for the split model).
pub(crate) struct Report {
    pub size: (usize, u64, usize),
    /// Seconds the CPU took, and whether the GPU's share was done by then.
    pub secs: f64,
    pub gpu_first: bool,
}

/// A step handed over: its sum `[n, hidden]` (`len` floats) where the
/// device reads it, and the flag that reaches `seq` once it is written.
pub(crate) struct HostSum {
    pub sum: u64,
    pub len: usize,
    pub flag: u64,
    pub seq: u32,
}

struct Steps {
    /// Recorded after the GPU's share of a step, and the step whose share
    /// it was last recorded after (the step starts before its record).
    issued: Arc<Event>,
    recorded: Arc<AtomicU32>,
    /// Page-locked: the flag (u32), then from `FLAG_BYTES` the sum; and
    /// its device address.
    mem: Option<(Arc<Pinned>, u64)>,
    seq: u32,
    /// The last step's outcome, filled in by it.
    outcome: Arc<Mutex<Option<Result<Report>>>>,
}

/// Sets the flag when dropped: after the sum is written, or when the
/// step fails or panics (the GPU must not wait forever; the failure is
/// reported by [`HostCpu::finish`]).
struct Flag<'a>(&'a AtomicU32, u32);

impl Drop for Flag<'_> {
    fn drop(&mut self) {
        self.0.store(self.1, Ordering::Release);
    }
}

fn poisoned() -> Error {
    Error::Backend {
        backend: "cuda",
        msg: "the hybrid CPU step's lock was poisoned by a panic".into(),
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
        let err = |e: std::io::Error| Error::Invalid(format!("cannot start {threads} CPU threads for --hybrid: {e}"));
        let runner = SpinRunner::new(SpinPool::new(threads).map_err(err)?).map_err(err)?;
        Ok(HostCpu {
            kernel: Kernel::choose(exact),
            threads,
            runner,
            st: Mutex::new(Steps {
                issued: Arc::new(Event::new(gpu)?),
                recorded: Arc::new(AtomicU32::new(0)),
                mem: None,
                seq: 0,
                outcome: Arc::new(Mutex::new(None)),
            }),
            gpu: gpu.clone(),
        })
    }

    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Wait for the last step; its report, or its error.
    pub fn finish(&self) -> Result<Option<Report>> {
        let panicked = self.runner.wait();
        let st = self.st.lock().map_err(|_| poisoned())?;
        let out = st.outcome.lock().map_err(|_| poisoned())?.take();
        match (out, panicked) {
            (_, true) => Err(Error::Backend {
                backend: "cuda",
                msg: "a hybrid CPU step panicked".into(),
            }),
            (Some(r), _) => r.map(Some),
            (None, _) => Ok(None),
        }
    }

    /// Hand `w` to the workers, then issue `gpu_part` (the GPU's experts,
    /// which wait for their copies anyway, and the next layer's guessed
    /// copies; this call, with `gpu_part` inside it, was 6% of the host
    /// thread's time at 0%, ~16 µs a layer, that the CPU's share waited
    /// through when it was handed over last) and return: the step's sum is
    /// to be added by a kernel that waits for its flag.
    /// The last step must be finished ([`HostCpu::finish`]), and the
    /// kernel that read its sum done (it precedes the wait for this
    /// step's routing on the compute stream).
    pub fn start(&self, w: Work, gpu_part: impl FnOnce() -> Result<()>) -> Result<HostSum> {
        if w.mats.len() != w.routed.len() || w.x.len() < w.n * w.hidden {
            return Err(Error::Invalid(format!(
                "hybrid step: {} experts with {} token lists, x of {} for {} tokens of {}",
                w.mats.len(),
                w.routed.len(),
                w.x.len(),
                w.n,
                w.hidden
            )));
        }
        let len = w.n * w.hidden;
        let mut st = self.st.lock().map_err(|_| poisoned())?;
        if st.mem.as_ref().is_none_or(|(m, _)| m.len() < FLAG_BYTES + 4 * len) {
            st.mem = None;
            let m = Pinned::new(&self.gpu, (FLAG_BYTES + 4 * len).next_multiple_of(64 << 10))?;
            // SAFETY: fresh; nothing else refers to it yet.
            unsafe { m.range_mut(0, FLAG_BYTES) }.fill(0);
            let dev = m.device_ptr()?;
            st.mem = Some((Arc::new(m), dev));
        }
        let Some((mem, dev)) = st.mem.clone() else {
            unreachable!("allocated above")
        };
        st.seq = st.seq.wrapping_add(1);
        let seq = st.seq;
        let (issued, recorded, outcome, kernel, gpu) = (
            st.issued.clone(),
            st.recorded.clone(),
            st.outcome.clone(),
            self.kernel,
            self.gpu.clone(),
        );
        self.runner.submit(Box::new(move || {
            // SAFETY: the buffer's first 4 bytes are the flag, aligned; the
            // sum follows, which only this step writes (see `start`).
            let (flag, sum) = unsafe {
                (
                    AtomicU32::from_ptr(mem.range_mut(0, 4).as_mut_ptr() as *mut u32),
                    bytemuck::cast_slice_mut::<u8, f32>(mem.range_mut(FLAG_BYTES, 4 * len)),
                )
            };
            let guard = Flag(flag, seq);
            let t0 = Instant::now();
            sum.fill(0.0);
            let r = apply(kernel, &w.x, w.n, w.hidden, w.inter, &w.mats, &w.routed, sum);
            let secs = t0.elapsed().as_secs_f64();
            drop(guard);
            // (Not yet recorded: the host had not issued the GPU's share.)
            let gpu_first = recorded.load(Ordering::Acquire) == seq && gpu.bind().is_ok() && issued.done();
            if let Ok(mut o) = outcome.lock() {
                *o = Some(r.map(|()| Report {
                    size: w.size,
                    secs,
                    gpu_first,
                }));
            }
        }));
        gpu_part()?;
        // Recording launches what graph capture holds back.
        st.issued.record(self.gpu.stream)?;
        st.recorded.store(seq, Ordering::Release);
        Ok(HostSum {
            sum: dev + FLAG_BYTES as u64,
            len,
            flag: dev,
            seq,
        })
    }
}
