//! Kernel launches replayed as CUDA graphs. A small launch costs ~4 µs on
//! a stream in the lent VM and ~1 µs as a node of a graph (tests/
//! cuda_kernels.rs measures both), and a decode step is ~600 small
//! launches. So the compute stream captures launches in segments of up to
//! [`SEGMENT`] kernels (shorter right after a host wait); each segment is
//! ended and launched as one graph as soon as it is full or anything else
//! must run on the stream (a copy, a fill, an event, a driver allocation,
//! a wait). Segments are numbered
//! from the last host wait, and segment i keeps its executable graph,
//! updated in place with the next capture's parameters (positions and
//! buffers change from one token to the next; the kernels do not), so the
//! costly instantiation happens once. The GPU runs a segment while the
//! host captures the next. Order is unchanged: every segment is one chain
//! launched on the compute stream in turn.

use super::check::Check;
use crate::error::Result;
use cudarc::driver::sys;

/// Most launches in one graph.
const SEGMENT: usize = 64;
/// Launches in the first graph after a host wait (doubling up to SEGMENT).
const FIRST_SEGMENT: usize = 8;

/// Capture state of the compute stream.
#[derive(Default)]
pub(crate) struct Segments {
    capturing: bool,
    /// Launches in the segment being captured.
    launches: usize,
    /// Index of the segment being captured since the last host wait.
    seg: usize,
    /// The executable graph of each segment index.
    execs: Vec<sys::CUgraphExec>,
}

// SAFETY: driver handles, used under the Gpu's mutex only.
unsafe impl Send for Segments {}

impl Segments {
    /// Before a launch on `stream`: start capturing if not already.
    pub fn begin(&mut self, stream: sys::CUstream) -> Result<()> {
        if !self.capturing {
            // SAFETY: the stream is valid and not capturing.
            unsafe { sys::cuStreamBeginCapture_v2(stream, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED) }
                .check("beginning a graph capture")?;
            self.capturing = true;
            self.launches = 0;
        }
        Ok(())
    }

    /// After a launch: the segment is launched once it is full. After a
    /// host wait the GPU is idle, so the first segments are short (8, 16,
    /// 32 launches) and it starts working while the host captures the rest.
    pub fn launched(&mut self, stream: sys::CUstream) -> Result<()> {
        self.launches += 1;
        if self.launches >= (FIRST_SEGMENT << self.seg.min(4)).min(SEGMENT) {
            self.flush(stream)?;
        }
        Ok(())
    }

    /// End the capture, if any, and launch what it holds.
    pub fn flush(&mut self, stream: sys::CUstream) -> Result<()> {
        if !self.capturing {
            return Ok(());
        }
        self.capturing = false;
        let mut graph = std::ptr::null_mut();
        // SAFETY: the stream is capturing (begun by `begin`).
        unsafe { sys::cuStreamEndCapture(stream, &mut graph) }.check("ending a graph capture")?;
        let r = self.launch(graph, stream);
        // SAFETY: the executable graph keeps its own copy of the nodes.
        unsafe {
            let _ = sys::cuGraphDestroy(graph);
        }
        self.seg += 1;
        r
    }

    fn launch(&mut self, graph: sys::CUgraph, stream: sys::CUstream) -> Result<()> {
        if self.execs.len() <= self.seg {
            self.execs.resize(self.seg + 1, std::ptr::null_mut());
        }
        let exec = &mut self.execs[self.seg];
        if !exec.is_null() {
            // SAFETY: both handles are valid; launches already queued keep
            // the parameters they were launched with.
            let mut info: sys::CUgraphExecUpdateResultInfo = unsafe { std::mem::zeroed() };
            let ok = unsafe { sys::cuGraphExecUpdate_v2(*exec, graph, &mut info) }
                .result()
                .is_ok();
            if !ok {
                // SAFETY: destroyed once; queued launches finish first.
                unsafe {
                    let _ = sys::cuGraphExecDestroy(*exec);
                }
                *exec = std::ptr::null_mut();
            }
        }
        if exec.is_null() {
            // SAFETY: `graph` is a complete captured graph.
            unsafe { sys::cuGraphInstantiateWithFlags(exec, graph, 0) }.check("instantiating a graph")?;
        }
        // SAFETY: `exec` is instantiated in this context.
        unsafe { sys::cuGraphLaunch(*exec, stream) }.check("launching a graph")
    }

    /// The host waited for the stream: the next capture is segment 0.
    pub fn restart(&mut self) {
        self.seg = 0;
    }

    /// Destroy the executable graphs (the stream must be idle).
    pub fn destroy(&mut self) {
        for e in self.execs.drain(..) {
            if !e.is_null() {
                // SAFETY: created by `launch`, destroyed once.
                unsafe {
                    let _ = sys::cuGraphExecDestroy(e);
                }
            }
        }
    }
}
