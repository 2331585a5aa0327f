//! Misses computed on the CPU while the GPU copies and computes the
//! others (`--hybrid`; the split is `experts::split`'s). For a one-token
//! step: the token's activations come back with its expert ids (one
//! sync), the CPU computes the experts left on the host straight from the
//! page cache (the registered mapping, or reads), the GPU runs the rest
//! meanwhile, and the CPU's weighted sum is added to the output on the
//! device after the GPU's.
//!
//! The GPU's share is issued first (asynchronous copies and launches),
//! then this thread joins the CPU's workers (`host_cpu`) on its share.

use super::buf::CudaBuf;
use super::cache::ExpertCache;
use super::driver::Gpu;
use super::host_cpu::HostCpu;
use crate::backend::cpu::moe::{routed_to, Routed};
use crate::error::{Error, Result};
use crate::experts::{ExpertStore, Hybrid, SplitModel};
use crate::format::MatrixView;
use std::sync::Arc;
use std::time::Instant;

/// Tokens up to which a step may split its misses (decode and speculative
/// steps; longer prefill chunks reuse each copied expert across tokens).
pub(crate) const HYBRID_TOKENS: usize = 4;

/// What the CPU is given of one step: the host copies of the routing and
/// of the activations `[n, hidden]`.
pub(crate) struct HostStep<'a> {
    pub ids: &'a [u32],
    pub weights: &'a [f32],
    pub x: &'a [f32],
    pub n: usize,
    pub k: usize,
    pub hidden: usize,
    pub inter: usize,
}

/// The matrices of `experts` of `layer`, from host memory.
fn host_mats(cache: &ExpertCache, store: &ExpertStore, layer: usize, experts: &[u32]) -> Result<Vec<[MatrixView; 3]>> {
    let layout = store.layer_layout(layer)?;
    cache
        .host_regions(store, layer, experts)?
        .iter()
        .map(|r| layout.matrices(r, store.group_size()))
        .collect()
}

/// The CPU's weighted sum of a step `[n, hidden]`, where the device reads
/// it (page-locked host memory): [`add_sum`] adds it to the output.
pub(crate) struct HostSum {
    ptr: u64,
    len: usize,
}

/// `out += sum`, the kernel reading the sum over the bus. No copy is
/// queued: a copy on the compute stream could wait behind the expert
/// copies that fill the link (the next layer's guesses), and so hold up
/// every later layer.
pub(crate) fn add_sum(gpu: &Gpu, out: &mut CudaBuf, sum: HostSum) -> Result<()> {
    super::ops::add_from(gpu, out, sum.ptr, sum.len)
}

/// Issue `gpu_part`, then compute on `cpu` the weighted sum of `experts`
/// for the tokens of `s` while the device works; the CPU's sum `[n,
/// hidden]` is returned, to be added to the step's output by [`add_sum`].
pub(crate) fn with_cpu_part(
    gpu: &Arc<Gpu>,
    cache: &ExpertCache,
    store: &ExpertStore,
    layer: usize,
    experts: &[u32],
    s: &HostStep,
    gpu_part: impl FnOnce() -> Result<()>,
) -> Result<HostSum> {
    let mats = host_mats(cache, store, layer, experts)?;
    let routed: Vec<Routed> = experts
        .iter()
        .map(|&e| routed_to(e, s.ids, s.weights, s.n, s.k))
        .collect();
    let cpu = cache.host_cpu().ok_or_else(|| Error::Backend {
        backend: "cuda",
        msg: "misses were left on the host with no CPU to compute them".into(),
    })?;
    let mut w = cpu.lock()?;
    gpu_part()?;
    // Recording launches what graph capture holds back.
    w.issued.record(gpu.stream)?;
    let len = s.n * s.hidden;
    let (pool, sum, ptr) = w.step(len)?;
    let t0 = Instant::now();
    cpu.apply(pool, s.x, (s.n, s.hidden, s.inter), &mats, &routed, sum)?;
    let secs = t0.elapsed().as_secs_f64();
    let cpu_last = w.issued.done();
    drop(w);
    let pairs: usize = routed.iter().map(|r| r.toks.len()).sum();
    let bytes = store.layer_layout(layer)?.expert_size as u64;
    cache.observe_host(
        experts.len(),
        bytes,
        pairs.div_ceil(experts.len().max(1)),
        secs,
        cpu_last,
    )?;
    Ok(HostSum { ptr, len })
}

/// The split model for a cache that streams: the copy rate `copy_bps`
/// measured by the caller and the CPU timed here on one and on four
/// experts of `layer` (best of three each, after a first touch that pages
/// them in). `Cpu` and `Off` need no timing.
pub(crate) fn measure(
    mode: Hybrid,
    cpu: &HostCpu,
    cache: &ExpertCache,
    store: &ExpertStore,
    layer: usize,
    copy_bps: impl FnOnce() -> Result<f64>,
) -> Result<SplitModel> {
    if mode != Hybrid::Auto {
        return Ok(SplitModel::new(mode, 1.0, 1, 0.0, 0.0).on_cpu(cpu.kernel().name(), cpu.threads()));
    }
    let n = store.num_experts().min(4);
    let ids: Vec<u32> = (0..n as u32).collect();
    let mats = host_mats(cache, store, layer, &ids)?;
    let (hidden, inter) = match mats.first() {
        Some([gate, _, _]) => (gate.cols, gate.rows),
        None => return Err(Error::Invalid(format!("layer {layer} has no experts to time"))),
    };
    let x = vec![0.01f32; hidden];
    let time = |c: usize| -> Result<f64> {
        let routed: Vec<Routed> = (0..c)
            .map(|_| Routed {
                toks: vec![0],
                wts: vec![1.0],
            })
            .collect();
        let w = cpu.lock()?;
        let mut best = f64::MAX;
        for _ in 0..4 {
            let mut out = vec![0f32; hidden];
            let t0 = Instant::now();
            cpu.apply(w.pool(), &x, (1, hidden, inter), &mats[..c], &routed, &mut out)?;
            best = best.min(t0.elapsed().as_secs_f64());
        }
        Ok(best)
    };
    let (one, four) = (time(1)?, time(n)? * 4.0 / n as f64);
    let bytes = store.layer_layout(layer)?.expert_size as u64;
    Ok(SplitModel::new(mode, copy_bps()?, bytes, one, four).on_cpu(cpu.kernel().name(), cpu.threads()))
}
