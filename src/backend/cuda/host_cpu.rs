//! The CPU that computes expert misses beside the GPU (`--hybrid`): the
//! products' kernel and spinning workers of its own (`crate::parallel`:
//! a step is ~100 µs of work, and waking rayon's sleeping workers took
//! 60–200 µs per loop on the 16-core device host), driven by a runner
//! thread of their own. The thread that drives the GPU hands a step over
//! ([`HostCpu::start`]) and goes on issuing the GPU's share and the
//! layer's later launches;
//! the kernel that adds the CPU's sum (`add_units`) waits on the GPU
//! until the step has written it. (When that thread
//! computed the step itself, the GPU waited after each step for the
//! combine and the next layer's launches to be captured:
//! docs/notes/2026-11-22-to-12-02-benchmark-log.md, "Where a streamed MoE
//! layer's time goes".)

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

/// The sum as the device reads it: units of `UNIT_FLOATS` floats of the
/// sum, then the step's number (u32), 16 bytes each, the floats stored
/// before the number (release order). The device reads a unit whole in
/// one load (one read over the bus, which sees a snapshot of its cache
/// line), so a unit that shows this step's number holds this step's
/// floats: the sum reaches the GPU in one trip over the bus once it is
/// written, where a flag polled first and the sum read next took two.
const UNIT_FLOATS: usize = 3;
const UNIT_BYTES: usize = 16;

/// Units of a sum of `len` floats.
fn units(len: usize) -> usize {
    len.div_ceil(UNIT_FLOATS)
}

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
    /// The step came [`COLD_GAP`] or more after the one before: the
    /// workers had gone to sleep, and its time includes their waking.
    pub cold: bool,
}

/// A step that starts this long after the last one started finds the
/// workers asleep: they spin for `parallel::SPIN` after their last task,
/// and a decode step's share takes well under that.
const COLD_GAP: std::time::Duration = crate::parallel::SPIN.saturating_mul(2);

/// Whether a step handed over at `now` finds the workers asleep, the
/// last one having been handed over at `last`.
fn cold(last: Option<Instant>, now: Instant) -> bool {
    last.is_none_or(|t| now.duration_since(t) >= COLD_GAP)
}

/// A step handed over: its sum `[n, hidden]` (`len` floats) as units
/// where the device reads them, each showing `seq` once written.
pub(crate) struct HostSum {
    pub units: u64,
    pub len: usize,
    pub seq: u32,
}

struct Steps {
    /// Recorded after the GPU's share of a step, and the step whose share
    /// it was last recorded after (the step starts before its record).
    issued: Arc<Event>,
    recorded: Arc<AtomicU32>,
    /// Page-locked: the sum's units; and their device address.
    mem: Option<(Arc<Pinned>, u64)>,
    seq: u32,
    /// The last step's outcome, filled in by it.
    outcome: Arc<Mutex<Option<Result<Report>>>>,
    /// When the last step was handed over.
    last_start: Option<Instant>,
}

/// The units of one step's sum, written by [`Units::write`]; dropped
/// unwritten (the step panicked), they are written as zeros, so that the
/// GPU does not wait forever (the failure is reported by
/// [`HostCpu::finish`]).
struct Units<'a> {
    /// `units(len) · UNIT_BYTES` bytes, 16-byte aligned.
    out: &'a mut [u8],
    seq: u32,
    written: bool,
}

impl Units<'_> {
    /// Each unit's floats, then its number.
    fn write(&mut self, sum: &[f32]) {
        for (u, unit) in self.out.chunks_exact_mut(UNIT_BYTES).enumerate() {
            let p = unit.as_mut_ptr();
            for j in 0..UNIT_FLOATS {
                let v = sum.get(u * UNIT_FLOATS + j).copied().unwrap_or(0.0);
                // SAFETY: inside the unit; the device may read it at any
                // time, hence a volatile store.
                unsafe { (p as *mut f32).add(j).write_volatile(v) };
            }
            // SAFETY: the unit's last 4 bytes, aligned (units are 16-byte
            // aligned); stored after its floats.
            unsafe { AtomicU32::from_ptr((p as *mut u32).add(UNIT_FLOATS)) }.store(self.seq, Ordering::Release);
        }
        self.written = true;
    }
}

impl Drop for Units<'_> {
    fn drop(&mut self) {
        if !self.written {
            self.write(&[]);
        }
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
                last_start: None,
            }),
            gpu: gpu.clone(),
        })
    }

    /// Whether the workers are still awake: a step was handed over less
    /// than [`COLD_GAP`] ago.
    pub fn warm(&self) -> bool {
        self.st.lock().is_ok_and(|st| !cold(st.last_start, Instant::now()))
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
    /// to be added by a kernel that reads its units until they show the
    /// step's number (`hybrid::add_sum`).
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
        let bytes = units(len) * UNIT_BYTES;
        let mut st = self.st.lock().map_err(|_| poisoned())?;
        if st.mem.as_ref().is_none_or(|(m, _)| m.len() < bytes) {
            st.mem = None;
            let m = Pinned::new(&self.gpu, bytes.next_multiple_of(64 << 10))?;
            // Fresh units show the last step's number: not yet written.
            // SAFETY: fresh; nothing else refers to it yet.
            let all = unsafe { m.range_mut(0, m.len() / UNIT_BYTES * UNIT_BYTES) };
            Units {
                out: all,
                seq: st.seq,
                written: false,
            }
            .write(&[]);
            let dev = m.device_ptr()?;
            st.mem = Some((Arc::new(m), dev));
        }
        let Some((mem, dev)) = st.mem.clone() else {
            unreachable!("allocated above")
        };
        st.seq = st.seq.wrapping_add(1);
        let seq = st.seq;
        let now = Instant::now();
        let cold = cold(st.last_start, now);
        st.last_start = Some(now);
        let (issued, recorded, outcome, kernel, gpu) = (
            st.issued.clone(),
            st.recorded.clone(),
            st.outcome.clone(),
            self.kernel,
            self.gpu.clone(),
        );
        self.runner.submit(Box::new(move || {
            // SAFETY: the units, which only this step writes (see `start`:
            // the kernel that read the last step's is done).
            let mut out = Units {
                out: unsafe { mem.range_mut(0, bytes) },
                seq,
                written: false,
            };
            let t0 = Instant::now();
            let mut sum = vec![0f32; len];
            let r = apply(kernel, &w.x, w.n, w.hidden, w.inter, &w.mats, &w.routed, &mut sum);
            out.write(&sum);
            let secs = t0.elapsed().as_secs_f64();
            drop(out);
            // (Not yet recorded: the host had not issued the GPU's share.)
            let gpu_first = recorded.load(Ordering::Acquire) == seq && gpu.bind().is_ok() && issued.done();
            if let Ok(mut o) = outcome.lock() {
                *o = Some(r.map(|()| Report {
                    size: w.size,
                    secs,
                    gpu_first,
                    cold,
                }));
            }
        }));
        gpu_part()?;
        // Recording launches what graph capture holds back.
        st.issued.record(self.gpu.stream)?;
        st.recorded.store(seq, Ordering::Release);
        Ok(HostSum { units: dev, len, seq })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `units` 16-byte units, aligned as page-locked memory is.
    fn buffer(units: usize) -> Vec<u128> {
        vec![0u128; units]
    }

    fn unit(b: &[u8], u: usize) -> ([f32; UNIT_FLOATS], u32) {
        let w = |i: usize| u32::from_le_bytes(b[u * UNIT_BYTES + 4 * i..][..4].try_into().unwrap());
        ([f32::from_bits(w(0)), f32::from_bits(w(1)), f32::from_bits(w(2))], w(3))
    }

    #[test]
    fn a_sum_is_written_as_units_of_three_floats_and_the_step() {
        let sum: Vec<f32> = (0..7).map(|i| i as f32 + 0.5).collect();
        let mut mem = buffer(units(sum.len()));
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut mem);
        Units {
            out: bytes,
            seq: 9,
            written: false,
        }
        .write(&sum);
        let b: &[u8] = bytemuck::cast_slice(&mem);
        assert_eq!(units(7), 3);
        assert_eq!(unit(b, 0), ([0.5, 1.5, 2.5], 9));
        assert_eq!(unit(b, 1), ([3.5, 4.5, 5.5], 9));
        assert_eq!(unit(b, 2), ([6.5, 0.0, 0.0], 9), "the last unit is padded with zeros");
    }

    #[test]
    fn units_dropped_unwritten_still_show_the_step() {
        let mut mem = buffer(4);
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut mem);
            let _units = Units {
                out: bytes,
                seq: 3,
                written: false,
            };
            panic!("a step that fails");
        }))
        .expect_err("the step panicked");
        let b: &[u8] = bytemuck::cast_slice(&mem);
        for u in 0..4 {
            assert_eq!(
                unit(b, u),
                ([0.0; UNIT_FLOATS], 3),
                "unit {u}: the GPU would wait forever"
            );
        }
    }
}
