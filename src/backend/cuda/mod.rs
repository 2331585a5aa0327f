//! The CUDA backend: every `Backend` op on device buffers, with kernels
//! compiled at run time by NVRTC (see `compile`), and the routed experts
//! in a device cache (see `cache`). Everything except the routed experts
//! lives in GPU memory; the host only takes part where routing decides
//! what to stream. cudarc loads the driver dynamically, so the binary
//! builds and runs on machines without CUDA: `probe` says whether this one
//! has a usable GPU.

mod buf;
mod cache;
mod check;
mod compile;
mod copies;
mod delta_chunk;
mod download;
mod driver;
mod event;
mod flash;
mod format;
mod functions;
mod graph;
mod host_cpu;
mod hostmap;
mod hybrid;
mod kv_cache;
mod matrix;
mod matvec_tc;
mod mixers;
mod moe;
mod moe_groups;
mod moe_mt;
mod moe_routed;
mod ops;
mod options;
mod probe;
mod readback;
mod seqs;
mod staging;
mod tensor;
mod timeline;
mod upload;

pub use buf::CudaBuf;
use cache::SlotBudget;
pub use cache::{CacheSize, CacheStats};
pub use kv_cache::CudaCache;
pub use matrix::CudaMatrix;
pub use options::{CacheReport, CacheRequest, CudaOptions};
pub use probe::LaunchCost;

use super::{
    AttnArgs, AttnSeqs, Backend, CachePair, DeltaArgs, DeltaState, DeltaWeights, KvType, MlaArgs, MoeArgs, MoeInputs,
    RopeArgs, Seg, StatePair, Strided,
};
use crate::error::{Error, Result};
use crate::experts::{ExpertStore, Hybrid};
use crate::format::packed::{Layout, Manifest};
use crate::format::MatrixView;
use crate::notify::Notifier;
use cache::ExpertCache;
use driver::{Check, Gpu};
use std::sync::{Arc, OnceLock};

/// Whether CUDA is usable here: the number of devices, or why not.
pub fn probe() -> std::result::Result<usize, String> {
    driver::probe()
}

pub struct CudaBackend {
    gpu: Arc<Gpu>,
    cache: OnceLock<ExpertCache>,
    /// Page-locked staging for large downloads (`download.rs`).
    stage: download::Stage,
}

/// A GatedDeltaNet call's inputs as the launchers take them.
fn delta_bufs<'a>(
    qkv: &'a CudaBuf,
    a: &'a CudaBuf,
    b: &'a CudaBuf,
    w: DeltaWeights<'a, CudaBackend>,
) -> mixers::DeltaBufs<'a> {
    mixers::DeltaBufs {
        qkv,
        a,
        b,
        conv_w: w.conv_w,
        a_log: w.a_log,
        dt_bias: w.dt_bias,
    }
}

/// Bytes of an expert cache slot for experts of at most `largest` bytes.
pub fn slot_bytes(largest: usize) -> u64 {
    (largest.div_ceil(256) * 256) as u64
}

/// The weight format codes (`FMT_*` of `kernels/common.cuh`, `+ 8` for f16
/// scales) of a packed model's matrices: its dense tensors of two or more
/// dimensions and its experts. An over-estimate is harmless (a module
/// compiled for nothing); a format left out is an error at its first use.
pub fn format_codes(manifest: &Manifest, layout: &Layout) -> Vec<i32> {
    let float = |dtype: &str| match dtype {
        "F32" => Some(0),
        "BF16" => Some(1),
        "F16" => Some(2),
        _ => None,
    };
    let quant = |bits: u32, scales: Option<&str>| {
        let base = match bits {
            2 => 3,
            4 => 4,
            8 => 5,
            _ => return None,
        };
        Some(base + if scales == Some("F16") { format::F16_SCALES } else { 0 })
    };
    let mut codes = Vec::new();
    for (name, t) in &manifest.tensors {
        let code = match (t.dtype.as_str(), t.bits) {
            ("U32", Some(bits)) => {
                let scales = name
                    .strip_suffix(".weight")
                    .and_then(|stem| manifest.tensors.get(&format!("{stem}.scales")))
                    .map(|s| s.dtype.as_str());
                quant(bits, scales)
            }
            (d, _) if t.shape.len() >= 2 => float(d),
            _ => None,
        };
        codes.extend(code);
    }
    for l in layout.layers.values() {
        let dtype = |name: &str| l.components.iter().find(|c| c.name == name).map(|c| c.dtype.as_str());
        let code = match dtype("gate_proj.weight") {
            Some("U32") => quant(l.bits, dtype("gate_proj.scales")),
            Some(d) => float(d),
            None => None,
        };
        codes.extend(code);
    }
    codes.sort_unstable();
    codes.dedup();
    codes
}

impl CudaBackend {
    /// Open CUDA device `ordinal` with the kernels of every weight format
    /// (compiling them on first use).
    pub fn new(ordinal: usize) -> Result<CudaBackend> {
        CudaBackend::with_options(ordinal, &CudaOptions::default())
    }

    /// As [`CudaBackend::new`], with `opts`.
    pub fn with_options(ordinal: usize, opts: &CudaOptions) -> Result<CudaBackend> {
        CudaBackend::for_formats(ordinal, &compile::FORMAT_CODES, opts, &Notifier::default())
    }

    /// Open CUDA device `ordinal` with the kernels of the weight format
    /// codes `codes` alone (see [`format_codes`]): a first start compiles
    /// fewer modules.
    /// Messages (kernels compiled, expert-cache fallbacks) go to `notify`.
    pub fn for_formats(ordinal: usize, codes: &[i32], opts: &CudaOptions, notify: &Notifier) -> Result<CudaBackend> {
        let gpu = Gpu::open(ordinal, codes, opts, notify)?;
        tensor::allow_shared_memory(&gpu)?;
        mixers::allow_shared_memory(&gpu)?;
        flash::allow_shared_memory(&gpu)?;
        matrix::allow_shared_memory(&gpu)?;
        matvec_tc::allow_shared_memory(&gpu)?;
        Ok(CudaBackend {
            gpu,
            cache: OnceLock::new(),
            stage: download::Stage::default(),
        })
    }

    /// Whether prefill products run on tensor cores (SPEC §6's fast path).
    pub fn tensor_cores(&self) -> bool {
        self.gpu.tensor_cores
    }

    /// The device's name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn device_name(&self) -> &str {
        &self.gpu.name
    }

    /// Free device memory, bytes.
    pub fn free_memory(&self) -> Result<u64> {
        Ok(self.gpu.mem_info()?.0 as u64)
    }
    pub fn ordinal(&self) -> usize {
        self.gpu.ordinal
    }

    /// Give the routed experts of `store` (layers `moe_layers`) a device
    /// cache of `size`; when it holds them all they are loaded now.
    pub fn attach_experts(
        &self,
        store: &Arc<ExpertStore>,
        moe_layers: &[usize],
        req: CacheRequest,
    ) -> Result<CacheReport> {
        self.gpu.bind()?;
        let mut expert_bytes = 0u64;
        let mut largest = 0usize;
        for &l in moe_layers {
            let s = store.layer_layout(l)?.expert_size;
            expert_bytes += (s * store.num_experts()) as u64;
            largest = largest.max(s);
        }
        let experts = moe_layers.len() * store.num_experts();
        if experts == 0 {
            return Ok(CacheReport {
                budget_bytes: 0,
                expert_bytes: 0,
                slots: 0,
                experts: 0,
                resident: true,
                minimum: false,
                load_s: 0.0,
                split: None,
                pinned_layers: 0,
                held_layers: 0,
            });
        }
        let slot = slot_bytes(largest);
        let (slots, minimum) = req.size.slots(&SlotBudget {
            slot_bytes: slot,
            experts,
            expert_bytes,
            min_slots: req.min_slots,
            room: req.room,
        })?;
        let t0 = std::time::Instant::now();
        // Probation holds misses that are not admitted: an eighth of the
        // slots, at most two tokens' experts of a layer or a prefill
        // launch's worth (experts::cache measures the choice).
        let probation = (slots / 8).min((2 * req.min_slots).max(moe::STREAM_CHUNK));
        let cache = ExpertCache::new(&self.gpu, store, moe_layers, slots, probation, req.prefetch)?;
        let load_s = t0.elapsed().as_secs_f64();
        if !cache.resident() {
            // Every streamed MoE step waits for its routing on the host, so
            // graph segments stay short: on the H200 decode ran as fast or
            // faster launching directly, prefill the same
            // (docs/notes/2026-11-22-to-12-02-benchmark-log.md, "Streaming
            // without CUDA graphs").
            self.gpu.set_graphs(false)?;
        }
        let hybrid = req.hybrid.unwrap_or(match cache.copies_queue_only() {
            true => Hybrid::Auto,
            false => Hybrid::Off,
        });
        let split = match (cache.resident(), hybrid, moe_layers.first()) {
            (false, Hybrid::Auto | Hybrid::Cpu, Some(&l)) => {
                let cpu = host_cpu::HostCpu::new(&self.gpu, req.host_threads, req.exact)?;
                let m = hybrid::measure(hybrid, &cpu, &cache, store, l, || {
                    self.pinned_copy_bandwidth().map(|g| g * 1e9)
                })?;
                cache.set_split(m, cpu)?;
                Some(m)
            }
            _ => None,
        };
        let report = CacheReport {
            budget_bytes: slots as u64 * slot,
            expert_bytes,
            slots,
            experts,
            resident: cache.resident(),
            minimum,
            load_s,
            split,
            pinned_layers: cache.pinned_layers(),
            held_layers: cache.held_layers(),
        };
        self.cache
            .set(cache)
            .map_err(|_| Error::Invalid("the CUDA backend already has an expert cache".into()))?;
        Ok(report)
    }

    /// The expert cache's counters, once one is attached.
    pub fn cache_stats(&self) -> Option<CacheStats> {
        self.cache.get().map(|c| c.stats())
    }

    /// Host→device bandwidth from pinned memory, in GB/s (best of 5 copies
    /// of 256 MiB on the copy stream): the floor of streamed experts.
    pub fn pinned_copy_bandwidth(&self) -> Result<f64> {
        self.gpu.bind()?;
        let bytes = 256usize << 20;
        let host = buf::Pinned::new(&self.gpu, bytes)?;
        let dev = buf::DevMem::new(&self.gpu, bytes)?;
        self.gpu.sync()?;
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            // SAFETY: both ranges are `bytes` long and owned here.
            unsafe {
                cudarc::driver::sys::cuMemcpyHtoDAsync_v2(
                    dev.ptr(),
                    host.as_ptr() as *const std::ffi::c_void,
                    bytes,
                    self.gpu.copy,
                )
                .check("copy bandwidth")?;
                cudarc::driver::sys::cuStreamSynchronize(self.gpu.copy).check("copy bandwidth")?;
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(bytes as f64 / best / 1e9)
    }

    /// The attached cache when it holds `store`'s experts.
    fn cache_for(&self, store: &ExpertStore) -> Option<&ExpertCache> {
        self.cache.get().filter(|c| c.store_id() == store.id())
    }
}

impl Backend for CudaBackend {
    type Buf = CudaBuf;
    type Matrix = CudaMatrix;
    type Cache = CudaCache;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn synchronize(&self) -> Result<()> {
        self.gpu.bind()?;
        self.gpu.sync()
    }

    fn begin_pass(&self, tokens: usize) {
        self.gpu
            .pdl_pass
            .store(tokens <= driver::PDL_MAX_TOKENS, std::sync::atomic::Ordering::Relaxed);
    }

    fn alloc(&self, len: usize) -> Result<CudaBuf> {
        self.gpu.bind()?;
        CudaBuf::zeroed(&self.gpu, len)
    }
    fn upload(&self, data: &[f32]) -> Result<CudaBuf> {
        self.gpu.bind()?;
        CudaBuf::from_host(&self.gpu, data)
    }
    fn download(&self, buf: &CudaBuf, off: usize, out: &mut [f32]) -> Result<()> {
        download::download(&self.gpu, &self.stage, buf, off, out)
    }
    fn alloc_cache(&self, t: KvType, rows: usize, width: usize) -> Result<CudaCache> {
        self.gpu.bind()?;
        CudaCache::new(&self.gpu, t, rows, width)
    }
    fn cache_store(&self, src: &CudaBuf, src_row: usize, n: usize, cache: &mut CudaCache, row0: usize) -> Result<()> {
        self.gpu.bind()?;
        kv_cache::store(&self.gpu, src, src_row, n, cache, row0)
    }
    fn cache_download(&self, cache: &CudaCache, row0: usize, out: &mut [f32]) -> Result<()> {
        self.gpu.bind()?;
        let rows = kv_cache::load(&self.gpu, cache, row0, out.len() / cache.width().max(1))?;
        self.download(&rows, 0, out)
    }
    fn download_parts(&self, buf: &CudaBuf, parts: &[(usize, usize)]) -> Result<Vec<Vec<f32>>> {
        download::download_parts(&self.gpu, &self.stage, buf, parts)
    }
    fn matrix(&self, m: &MatrixView) -> Result<CudaMatrix> {
        self.gpu.bind()?;
        CudaMatrix::upload(&self.gpu, m)
    }

    fn linear(&self, w: &CudaMatrix, x: &CudaBuf, n: usize, y: &mut CudaBuf) -> Result<()> {
        self.gpu.bind()?;
        w.linear(&self.gpu, x, n, y)
    }
    fn linear_many(&self, ws: &[&CudaMatrix], x: &CudaBuf, n: usize, ys: &mut [&mut CudaBuf]) -> Result<()> {
        self.gpu.bind()?;
        CudaMatrix::linear_many(&self.gpu, ws, x, n, ys)
    }
    fn swiglu_linear(
        &self,
        w: &CudaMatrix,
        gate: &CudaBuf,
        up: &CudaBuf,
        n: usize,
        inter: usize,
        y: &mut CudaBuf,
    ) -> Result<()> {
        self.gpu.bind()?;
        if inter != w.cols {
            return Err(Error::Invalid(format!(
                "swiglu_linear: inputs of width {inter} for a matrix of {} columns",
                w.cols
            )));
        }
        w.swiglu_linear(&self.gpu, gate, up, n, y)
    }
    fn embed(&self, table: &CudaMatrix, tokens: &[u32], y: &mut CudaBuf) -> Result<()> {
        self.gpu.bind()?;
        table.embed(&self.gpu, tokens, y)
    }

    fn rms_norm(&self, x: &CudaBuf, w: &CudaBuf, rows: usize, dim: usize, eps: f32, y: &mut CudaBuf) -> Result<()> {
        self.gpu.bind()?;
        ops::rms_norm(&self.gpu, x, None, w, rows, dim, eps, y)
    }
    fn gated_rms_norm(
        &self,
        x: &CudaBuf,
        z: &CudaBuf,
        w: &CudaBuf,
        rows: usize,
        dim: usize,
        eps: f32,
        y: &mut CudaBuf,
    ) -> Result<()> {
        self.gpu.bind()?;
        ops::rms_norm(&self.gpu, x, Some(z), w, rows, dim, eps, y)
    }
    fn add_rms_norm(
        &self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        w: &CudaBuf,
        rows: usize,
        dim: usize,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.gpu.bind()?;
        ops::add_rms_norm(&self.gpu, x, y, w, rows, dim, eps, out)
    }
    fn add(&self, y: &mut CudaBuf, x: &CudaBuf, len: usize) -> Result<()> {
        self.gpu.bind()?;
        ops::add(&self.gpu, y, x, len)
    }
    fn add_scaled_rows(
        &self,
        y: &mut CudaBuf,
        x: &CudaBuf,
        scale: &CudaBuf,
        rows: usize,
        dim: usize,
        sigmoid: bool,
    ) -> Result<()> {
        self.gpu.bind()?;
        ops::add_scaled_rows(&self.gpu, y, x, scale, rows, dim, sigmoid)
    }
    fn swiglu(&self, gate: &CudaBuf, up: &CudaBuf, len: usize, y: &mut CudaBuf) -> Result<()> {
        self.gpu.bind()?;
        ops::swiglu(&self.gpu, gate, up, len, y)
    }
    fn sigmoid_mul(&self, x: &mut CudaBuf, gate: &CudaBuf, len: usize) -> Result<()> {
        self.gpu.bind()?;
        ops::sigmoid_mul(&self.gpu, x, gate, len)
    }
    fn copy(&self, src: &CudaBuf, dst: &mut CudaBuf, s: Strided) -> Result<()> {
        self.gpu.bind()?;
        ops::copy(&self.gpu, src, dst, s)
    }

    fn rope(&self, x: &mut CudaBuf, inv_freq: &CudaBuf, a: RopeArgs) -> Result<()> {
        self.gpu.bind()?;
        mixers::rope(&self.gpu, x, inv_freq, a)
    }
    fn attention(&self, q: &CudaBuf, k: &CudaCache, v: &CudaCache, a: AttnArgs, out: &mut CudaBuf) -> Result<()> {
        self.gpu.bind()?;
        mixers::attention(&self.gpu, q, k, v, a, out)
    }
    fn mla_attention(
        &self,
        q: &CudaBuf,
        latent: &CudaCache,
        k_pe: &CudaCache,
        kv_b: &CudaBuf,
        a: MlaArgs,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.gpu.bind()?;
        ops::mla_attention(&self.gpu, q, latent, k_pe, kv_b, a, out)
    }
    fn gated_delta(
        &self,
        qkv: &CudaBuf,
        a: &CudaBuf,
        b: &CudaBuf,
        w: DeltaWeights<'_, Self>,
        state: DeltaState<'_, Self>,
        args: DeltaArgs,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.gpu.bind()?;
        let bufs = delta_bufs(qkv, a, b, w);
        mixers::gated_delta(&self.gpu, bufs, state.conv, state.ssm, args, out)
    }

    fn attention_seqs(
        &self,
        x: AttnSeqs<'_, Self>,
        caches: &mut [CachePair<'_, Self>],
        segs: &[Seg],
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.gpu.bind()?;
        let bufs = mixers::AttnBufs {
            q: x.q,
            k: x.k,
            v: x.v,
            inv_freq: x.inv_freq,
        };
        let caches: Vec<(&CudaCache, &CudaCache)> = caches.iter().map(|(k, v)| (&**k, &**v)).collect();
        mixers::attention_seqs(&self.gpu, bufs, (x.rope, x.attn), &caches, segs, out)
    }

    fn gated_delta_seqs(
        &self,
        qkv: &mut CudaBuf,
        a: &mut CudaBuf,
        b: &mut CudaBuf,
        w: DeltaWeights<'_, Self>,
        states: &mut [StatePair<'_, Self>],
        segs: &[Seg],
        args: DeltaArgs,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.gpu.bind()?;
        let bufs = delta_bufs(qkv, a, b, w);
        let states: Vec<(&CudaBuf, &CudaBuf)> = states.iter().map(|(c, s)| (&**c, &**s)).collect();
        mixers::gated_delta_seqs(&self.gpu, bufs, &states, segs, args, out)
    }

    fn moe(&self, m: MoeInputs<'_, CudaBuf>, a: MoeArgs<'_>, out: &mut CudaBuf) -> Result<()> {
        self.gpu.bind()?;
        let cache = self.cache_for(m.store);
        moe::moe(&self.gpu, cache, m, a, out)
    }

    fn wants_moe_hint(&self, store: &ExpertStore, n: usize) -> bool {
        // One token's guesses: batched steps copy their misses as they route.
        n == 1 && self.cache_for(store).is_some_and(|c| c.prefetching())
    }
}
