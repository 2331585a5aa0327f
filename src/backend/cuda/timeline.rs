//! Where a streamed decode step's MoE layer spends the GPU's time
//! (`CudaOptions::trace_layers`, for measuring): timed events on the
//! compute stream at six points of each step, read back one step later.
//!
//! A layer's period, from one step's routing to the next one's, is cut
//! into the parts that `experts::budget::LAYER_PARTS` names; their sum is the period. Recording an event
//! ends the graph segment being captured (`graph.rs`), so a traced run
//! launches a few more, shorter graphs than an untraced one.

use super::driver::{Event, Gpu};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::sync::{Arc, Mutex};

/// The points of a step, in the order they are reached.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) enum Mark {
    /// The routing is queued; the host is about to wait for its ids.
    Route = 0,
    /// The ids are back and the misses' copies issued: the compute stream
    /// is about to wait for them.
    Wait,
    /// The wait for the copies is queued.
    Copied,
    /// The GPU's expert launches are queued.
    Experts,
    /// The host's work after the experts is queued: the combine is next
    /// (a step whose pairs' addresses were carried to `moe_down_combine`
    /// has combined in its experts' launch: its next part then holds only
    /// the CPU's sum).
    Add,
    /// The combine and the kernel that adds the CPU's sum, once the CPU
    /// has written it (`hybrid::add_sum`), are queued: the rest of the
    /// layer and the next one up to its routing are next.
    Summed,
}

const MARKS: usize = crate::experts::budget::LAYER_PARTS.len();

// The parts of a layer's period, each from one mark to the next (the last
// from `Summed` to the next step's `Route`), are named by
// `experts::budget::LAYER_PARTS`.

struct State {
    /// This step's events and the last step's.
    cur: Vec<Event>,
    prev: Vec<Event>,
    /// Marks recorded this step (`None`: no step is being traced).
    next: Option<usize>,
    /// Whether `prev` holds a whole step.
    prev_whole: bool,
    ns: [u64; MARKS],
    steps: u64,
    /// When this step's ids came back to the host, when its copies were
    /// issued, and the host's time summed over the steps: [ids back →
    /// copies issued, copies issued → the next step's routing].
    ids_back: Option<std::time::Instant>,
    issued: Option<std::time::Instant>,
    host_ns: [u64; 2],
}

pub(crate) struct Timeline {
    gpu: Arc<Gpu>,
    st: Mutex<State>,
}

fn lock_err() -> Error {
    Error::Backend {
        backend: "cuda",
        msg: "the timeline lock was poisoned by a panic".into(),
    }
}

/// Milliseconds from `a` to `b` (both complete), as nanoseconds.
fn elapsed_ns(a: &Event, b: &Event) -> Result<u64> {
    let mut ms = 0f32;
    // SAFETY: two timed events of the bound context, both complete.
    unsafe { sys::cuEventElapsedTime_v2(&mut ms, a.raw(), b.raw()) }
        .result()
        .map_err(|e| Error::Backend {
            backend: "cuda",
            msg: format!("reading a timeline event: {e:?}"),
        })?;
    Ok((ms.max(0.0) as f64 * 1e6) as u64)
}

impl Timeline {
    pub fn new(gpu: &Arc<Gpu>) -> Result<Timeline> {
        let set = || (0..MARKS).map(|_| Event::timed(gpu)).collect::<Result<Vec<_>>>();
        Ok(Timeline {
            gpu: gpu.clone(),
            st: Mutex::new(State {
                cur: set()?,
                prev: set()?,
                next: None,
                prev_whole: false,
                ns: [0; MARKS],
                steps: 0,
                ids_back: None,
                issued: None,
                host_ns: [0; 2],
            }),
        })
    }

    /// Reach `m` in the step being traced (`Route` begins one). Marks a
    /// step skipped are recorded here too (their part is then empty); a
    /// mark already passed is ignored.
    pub fn mark(&self, m: Mark) -> Result<()> {
        let mut st = self.st.lock().map_err(|_| lock_err())?;
        let from = match (m, st.next) {
            (Mark::Route, _) => 0,
            (_, Some(n)) if n <= m as usize => n,
            _ => return Ok(()),
        };
        if m == Mark::Route {
            if let Some(t) = st.issued.take() {
                st.host_ns[1] += t.elapsed().as_nanos() as u64;
            }
            if st.next.is_some() {
                // The last step ended without its later marks: drop it.
                st.prev_whole = false;
            } else {
                let s = &mut *st;
                std::mem::swap(&mut s.cur, &mut s.prev);
            }
        }
        for i in from..=m as usize {
            st.cur[i].record(self.gpu.stream)?;
        }
        st.next = Some(m as usize + 1);
        if m == Mark::Wait {
            let now = std::time::Instant::now();
            if let Some(t) = st.ids_back.take() {
                st.host_ns[0] += (now - t).as_nanos() as u64;
            }
            st.issued = Some(now);
        }
        if m == Mark::Wait && st.prev_whole {
            // The ids came back after this step's Route: the last step's
            // events and this one are complete.
            // (An event not yet complete drops the step.)
            let ns: Result<Vec<u64>> = (0..MARKS)
                .map(|i| elapsed_ns(&st.prev[i], if i + 1 < MARKS { &st.prev[i + 1] } else { &st.cur[0] }))
                .collect();
            if let Ok(ns) = ns {
                for (acc, p) in st.ns.iter_mut().zip(ns) {
                    *acc += p;
                }
                st.steps += 1;
            }
            st.prev_whole = false;
        }
        if m == Mark::Summed {
            st.next = None;
            st.prev_whole = true;
        }
        Ok(())
    }

    /// The ids of the step being traced are back on the host.
    pub fn ids_back(&self) {
        if let Ok(mut st) = self.st.lock() {
            if st.next.is_some() {
                st.ids_back = Some(std::time::Instant::now());
            }
        }
    }

    /// Nanoseconds in each part summed over the steps measured, their
    /// count, and the host's nanoseconds [from a step's ids to its copies
    /// issued, from there to the next step's routing] (summed over the
    /// same steps, give or take one).
    pub fn totals(&self) -> ([u64; MARKS], u64, [u64; 2]) {
        self.st.lock().map(|s| (s.ns, s.steps, s.host_ns)).unwrap_or_default()
    }
}
