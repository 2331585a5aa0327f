//! Measurements of the device itself, for the kernel microbenchmark
//! (tests/cuda_kernels.rs): device-to-device copy bandwidth, and what one
//! small kernel launch costs on a stream and as a node of a CUDA graph.

use super::buf::{CudaBuf, DevMem};
use super::driver::Check;
use super::{ops, CudaBackend};
use crate::error::Result;
use cudarc::driver::sys;
use std::time::Instant;

/// What one launch of a tiny kernel costs, in µs.
#[derive(Debug, Clone, Copy)]
pub struct LaunchCost {
    /// Host time to enqueue one launch.
    pub enqueue_us: f64,
    /// Launches back to back on the stream, until the GPU is done.
    pub stream_us: f64,
    /// The same launches captured in one graph, replayed.
    pub graph_us: f64,
    /// The same launches as the backend issues them with graphs on
    /// (captured in segments, each updated and launched; see `graph`).
    pub segments_us: f64,
}

/// Launches per measurement.
const LAUNCHES: usize = 2000;

impl CudaBackend {
    /// Device-to-device copy bandwidth in GB/s, counting bytes read plus
    /// bytes written (best of 10 copies of 1 GiB).
    pub fn device_copy_bandwidth(&self) -> Result<f64> {
        self.gpu.bind()?;
        let bytes = 1usize << 30;
        let (a, b) = (DevMem::new(&self.gpu, bytes)?, DevMem::new(&self.gpu, bytes)?);
        self.gpu.memset_zero(a.ptr(), bytes)?;
        self.gpu.sync()?;
        let mut best = f64::MAX;
        for _ in 0..10 {
            let t = Instant::now();
            self.gpu.dtod(b.ptr(), a.ptr(), bytes)?;
            self.gpu.sync()?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(2.0 * bytes as f64 / best / 1e9)
    }

    /// The cost of one launch of the `add` kernel on 256 floats.
    pub fn launch_cost(&self) -> Result<LaunchCost> {
        self.gpu.bind()?;
        let gpu = &self.gpu;
        let x = CudaBuf::from_host(gpu, &[1.0f32; 256])?;
        let mut y = CudaBuf::from_host(gpu, &[0.0f32; 256])?;
        let run = |y: &mut CudaBuf| -> Result<()> {
            for _ in 0..LAUNCHES {
                ops::add(gpu, y, &x, 256)?;
            }
            Ok(())
        };
        let graphs = gpu.graphs();
        gpu.set_graphs(true)?;
        let mut segments = f64::MAX;
        for _ in 0..3 {
            gpu.sync()?;
            let t = Instant::now();
            run(&mut y)?;
            gpu.sync()?;
            segments = segments.min(t.elapsed().as_secs_f64());
        }
        gpu.set_graphs(false)?;
        run(&mut y)?;
        gpu.sync()?;
        let t = Instant::now();
        run(&mut y)?;
        let enqueue = t.elapsed().as_secs_f64();
        gpu.sync()?;
        let stream = t.elapsed().as_secs_f64();
        let mut graph = std::ptr::null_mut();
        let mut exec = std::ptr::null_mut();
        // SAFETY: the compute stream is idle; the captured kernels read and
        // write `x` and `y`, which outlive the graph's launches below.
        unsafe {
            sys::cuStreamBeginCapture_v2(
                gpu.stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            .check("beginning a capture")?;
            let r = run(&mut y);
            sys::cuStreamEndCapture(gpu.stream, &mut graph).check("ending a capture")?;
            r?;
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0).check("instantiating a graph")?;
        }
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            // SAFETY: `exec` was instantiated above.
            unsafe { sys::cuGraphLaunch(exec, gpu.stream) }.check("launching a graph")?;
            gpu.sync()?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        // SAFETY: created above, destroyed once, after the stream is idle.
        unsafe {
            sys::cuGraphExecDestroy(exec).check("destroying a graph")?;
            sys::cuGraphDestroy(graph).check("destroying a graph")?;
        }
        gpu.set_graphs(graphs)?;
        let us = |s: f64| s * 1e6 / LAUNCHES as f64;
        Ok(LaunchCost {
            enqueue_us: us(enqueue),
            stream_us: us(stream),
            graph_us: us(best),
            segments_us: us(segments),
        })
    }
}
