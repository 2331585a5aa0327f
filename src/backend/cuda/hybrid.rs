//! Misses computed on the CPU while the GPU copies and computes the
//! others (`--hybrid`; the split is `experts::split`'s). For a one-token
//! step: the token's activations come back with its expert ids (one
//! sync), the CPU computes the experts left on the host straight from the
//! page cache (the registered mapping, or reads), the GPU runs the rest
//! meanwhile, and the CPU's weighted sum is added to the output on the
//! device after the GPU's.
//!
//! The CPU's share is handed to its workers (`host_cpu`) first, then the
//! GPU's share is issued (asynchronous copies and launches), and this
//! thread goes on issuing the layer's later launches; the sum is added by
//! a kernel that waits for it on the GPU.

use super::buf::CudaBuf;
use super::cache::ExpertCache;
use super::driver::Gpu;
use super::host_cpu::{HostCpu, HostSum, Work};
use crate::backend::cpu::moe::{routed_to, Routed};
use crate::cuda_args;
use crate::error::{Error, Result};
use crate::experts::{ExpertStore, Hybrid, SplitModel};
use crate::format::MatrixView;

/// Tokens up to which a decode step (`MoeArgs::decode`: one token of
/// each sequence) may split its misses: 8 sequences route about 57
/// experts a layer, 1.1 tokens each, so the CPU's cost per expert is
/// still about one token's. Prefill chunks never split (they reuse each
/// copied expert across tokens). (SPEC §6: "up to 16 sequences"; a
/// number of its own, though it equals `PDL_MAX_TOKENS` today.)
pub(crate) const HYBRID_TOKENS: usize = 16;

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

/// `out += sum` once the CPU has written the sum: the kernel reads the
/// sum's units over the bus until they show the step's number (no copy
/// is queued, which could wait behind the expert copies filling the
/// link; `host_cpu` has the units).
pub(crate) fn add_sum(gpu: &Gpu, out: &mut CudaBuf, s: HostSum) -> Result<()> {
    out.want("hybrid sum output", s.len)?;
    let (yp, up, l, seq) = (out.read(gpu)?, s.units, s.len as i64, s.seq);
    gpu.launch(
        gpu.k.add_units,
        ((s.len.div_ceil(3 * 256)).clamp(1, 64) as u32, 1, 1),
        256,
        0,
        cuda_args![yp, up, l, seq],
    )
}

/// Wait for the CPU's last step and give its time to the split model.
fn settle(cache: &ExpertCache, cpu: &HostCpu) -> Result<()> {
    match cpu.finish()? {
        Some(r) => cache.observe_host(r.size.0, r.size.1, r.size.2, r.secs, r.gpu_first, r.cold),
        None => Ok(()),
    }
}

/// Wait for the CPU's step, if the cache has a CPU (before reading
/// expert files into staging buffers, which would take the CPU's cores).
pub(crate) fn wait_cpu(cache: &ExpertCache) -> Result<()> {
    match cache.host_cpu() {
        Some(cpu) => settle(cache, cpu),
        None => Ok(()),
    }
}

/// Hand the CPU the weighted sum of `experts` for the tokens of `s`,
/// issue `gpu_part`, and return while the CPU computes; [`add_sum`] adds
/// the sum to the step's output once it is written.
pub(crate) fn with_cpu_part(
    cache: &ExpertCache,
    store: &ExpertStore,
    layer: usize,
    experts: &[u32],
    s: &HostStep,
    gpu_part: impl FnOnce() -> Result<()>,
) -> Result<HostSum> {
    let cpu = cache.host_cpu().ok_or_else(|| Error::Backend {
        backend: "cuda",
        msg: "misses were left on the host with no CPU to compute them".into(),
    })?;
    settle(cache, cpu)?;
    let routed: Vec<Routed> = experts
        .iter()
        .map(|&e| routed_to(e, s.ids, s.weights, s.n, s.k))
        .collect();
    let pairs: usize = routed.iter().map(|r| r.toks.len()).sum();
    let bytes = store.layer_layout(layer)?.expert_size as u64;
    let work = Work {
        x: s.x[..s.n * s.hidden].to_vec(),
        n: s.n,
        hidden: s.hidden,
        inter: s.inter,
        mats: host_mats(cache, store, layer, experts)?,
        routed,
        size: (experts.len(), bytes, pairs.div_ceil(experts.len().max(1))),
    };
    cpu.start(work, gpu_part)
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
        let mut best = f64::MAX;
        for _ in 0..4 {
            let work = Work {
                x: x.clone(),
                n: 1,
                hidden,
                inter,
                mats: mats[..c].to_vec(),
                routed: routed.clone(),
                size: (c, 0, 1),
            };
            cpu.start(work, || Ok(()))?;
            if let Some(r) = cpu.finish()? {
                best = best.min(r.secs);
            }
        }
        Ok(best)
    };
    let (one, four) = (time(1)?, time(n)? * 4.0 / n as f64);
    let bytes = store.layer_layout(layer)?.expert_size as u64;
    Ok(SplitModel::new(mode, copy_bps()?, bytes, one, four).on_cpu(cpu.kernel().name(), cpu.threads()))
}
