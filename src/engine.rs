//! `Model`: a packed model directory opened on a device — the dense
//! weights made resident, the expert files opened for streaming.

use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{self, CacheReport, CacheRequest, CudaBackend, CudaOptions};
use crate::backend::KvTypes;
use crate::check;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::experts::{CacheStats, ExpertStore, IoMode, MemoryPlan, PlanInput};
use crate::format::packed::{expert_file_name, Layout, WeightsFile, EXPERTS_DIR, LAYOUT_FILE, WEIGHTS_FILE};
use crate::format::watch::FileWatch;
use crate::model::{Net, SeqStep, State};
use crate::notify::Notifier;
pub use crate::options::{Device, Options};
use std::path::Path;
use std::sync::Arc;

/// The backend-specific network (a closed set of backends).
pub(crate) enum Engine {
    Cpu(Box<Net<CpuBackend>>),
    Cuda(Box<Net<CudaBackend>>),
}

/// The backend-specific per-sequence state.
pub(crate) enum EngineState {
    Cpu(State<CpuBackend>),
    Cuda(State<CudaBackend>),
}

/// The recurrent layers' state of a sequence, copied on its device (a
/// checkpoint: `Net::save_recurrent`).
pub(crate) enum EngineCheckpoint {
    Cpu(Vec<(Vec<f32>, Vec<f32>)>),
    Cuda(Vec<(cuda::CudaBuf, cuda::CudaBuf)>),
}

/// `$body` with `$n` bound to the network, whichever the backend.
macro_rules! with_net {
    ($engine:expr, $n:ident => $body:expr) => {
        match $engine {
            Engine::Cpu($n) => $body,
            Engine::Cuda($n) => $body,
        }
    };
}

/// `$body` with the network and a state of the same backend.
macro_rules! with_net_state {
    ($engine:expr, $st:expr, $n:ident, $s:ident => $body:expr) => {
        match ($engine, $st) {
            (Engine::Cpu($n), EngineState::Cpu($s)) => $body,
            (Engine::Cuda($n), EngineState::Cuda($s)) => $body,
            _ => Err(Error::Invalid("a session state of another device".into())),
        }
    };
}

/// The device `Auto` resolves to (said through `notify` when it is the CPU).
fn choose(device: Device, notify: &Notifier) -> Device {
    match device {
        Device::Auto => match cuda::probe() {
            Ok(_) => Device::Cuda(0),
            Err(why) => {
                notify.say(&format!("device: cpu ({why})"));
                Device::Cpu
            }
        },
        d => d,
    }
}

fn open_cuda(
    ordinal: usize,
    config: &ModelConfig,
    wf: &WeightsFile,
    store: &Arc<ExpertStore>,
    opts: &Options,
) -> Result<(Net<CudaBackend>, CacheReport, MemoryPlan)> {
    let codes = crate::backend::cuda::format_codes(&wf.manifest, store.layout());
    let cuda = CudaOptions {
        tensor_cores: opts.cuda.tensor_cores && !opts.exact,
        ..opts.cuda.clone()
    };
    let b = CudaBackend::for_formats(ordinal, &codes, &cuda, &opts.notify)?;
    opts.notify
        .say(&format!("device: cuda:{ordinal} ({})", b.device_name()));
    let mut net = Net::load(b, config, wf)?;
    net.set_kv_types(opts.kv_types())?;
    let moe: Vec<usize> = (0..config.layers.len())
        .filter(|&i| config.layers[i].ffn == crate::config::FfnKind::Moe)
        .collect();
    let min_slots = config.num_experts_per_tok * if opts.prefetch { 2 } else { 1 };
    let mut largest = 0;
    for &l in &moe {
        largest = largest.max(store.layer_layout(l)?.expert_size);
    }
    let plan = PlanInput {
        free: net.b.free_memory()?,
        margin: DEVICE_MARGIN_BYTES,
        activations: chunk_activation_bytes(config, prefill_chunk(config, Device::Cuda(ordinal))) as u64,
        kv_per_token: net.kv_bytes_per_token() as u64,
        sequences: opts.sequences,
        model_ctx: config.max_position_embeddings,
        asked: opts.ctx,
        min_experts: if moe.is_empty() {
            0
        } else {
            min_slots as u64 * cuda::slot_bytes(largest)
        },
    }
    .plan()?;
    opts.notify.say(&plan.describe());
    let req = CacheRequest {
        size: opts.expert_cache,
        prefetch: opts.prefetch,
        // One layer's experts, and with prefetch as many again, so that the
        // next layer's guessed experts (its router run on this layer's
        // input) are copied while this layer computes. (Three layers' worth
        // also let the previous token's experts be copied: slower on the
        // H100; docs/notes/2026-11-22-to-12-02-benchmark-log.md, "The
        // streaming core: slot table, hybrid misses, skewed routing".)
        min_slots,
        room: plan.expert_room,
        hybrid: opts.hybrid,
        host_threads: opts.threads,
        exact: opts.exact,
    };
    let r = net.b.attach_experts(store, &moe, req)?;
    let gb = |b: u64| b as f64 / 1e9;
    if r.resident {
        opts.notify.say(&format!(
            "expert cache: all {} experts resident ({:.2} GB, loaded in {:.1} s)",
            r.experts,
            gb(r.expert_bytes),
            r.load_s
        ));
    } else {
        opts.notify.say(&format!(
            "expert cache: {:.2} GB, {} of {} experts ({:.0}% of {:.2} GB{}); the rest stream from the host{}",
            gb(r.budget_bytes),
            r.slots,
            r.experts,
            100.0 * r.slots as f64 / r.experts.max(1) as f64,
            gb(r.expert_bytes),
            if r.minimum { ", the smallest working set" } else { "" },
            if opts.prefetch { ", prefetch on" } else { "" }
        ));
        if let Some(m) = &r.split {
            opts.notify.say(&m.describe());
        }
    }
    Ok((net, r, plan))
}

/// The CPU's context: the model's, or `-c`; without `-c`, cut so that the
/// caches of every sequence take at most half of the memory the process
/// may still take (they are only touched as they are written, so nothing
/// else is reserved).
fn cpu_plan(net: &Net<CpuBackend>, config: &ModelConfig, opts: &Options) -> Result<MemoryPlan> {
    let free = crate::experts::Memory::read().map_or(u64::MAX, |m| m.available);
    PlanInput {
        free,
        margin: 0,
        activations: 0,
        kv_per_token: net.kv_bytes_per_token() as u64,
        sequences: opts.sequences,
        model_ctx: config.max_position_embeddings,
        asked: opts.ctx,
        min_experts: 0,
    }
    .plan()
}

/// A loaded model. Sessions borrow it; several may share one.
pub struct Model {
    pub(crate) engine: Engine,
    /// CUDA: how the expert cache was set up.
    cache: Option<CacheReport>,
    pub(crate) store: Arc<ExpertStore>,
    config: ModelConfig,
    name: String,
    /// What tells this model from another ([`Model::identity`]).
    identity: String,
    /// The files it reads while it runs, checked before each evaluation.
    files: FileWatch,
    /// Tokens per prefill chunk of a new session ([`Model::prefill_chunk`]).
    chunk: usize,
    /// The context and KV caches settled at open.
    plan: MemoryPlan,
    kv: KvTypes,
}

/// Tokens evaluated together by `eval_prompt` on the CPU (and the least
/// on CUDA).
pub const DEFAULT_CHUNK: usize = 512;
/// Activation memory a CUDA prefill chunk may take.
const CHUNK_ACTIVATION_BYTES: usize = 1 << 30;
/// Device memory kept free outside the plan (the driver's, cuBLAS-free
/// kernels' scratch, fragmentation).
const DEVICE_MARGIN_BYTES: u64 = 1 << 30;
/// The longest CUDA prefill chunk.
const MAX_CUDA_CHUNK: usize = 4096;

/// [`Model::identity`] of the model in `dir`.
fn identity(dir: &Path, cfg: &ModelConfig) -> Result<String> {
    let path = dir.join(crate::format::packed::MANIFEST_FILE);
    let manifest = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
    Ok(format!(
        "{} (hidden {}, {} layers, {} experts, vocab {}, manifest crc32 {:08x})",
        cfg.model_type,
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_experts,
        cfg.vocab_size,
        crate::checksum::crc32(&manifest)
    ))
}

/// f32 bytes per token of a CUDA prefill chunk: the routed pairs' [hidden]
/// and [2·inter] rows, and about sixteen [hidden] buffers of the layer.
fn activation_bytes_per_token(cfg: &ModelConfig) -> usize {
    let (h, k, inter) = (cfg.hidden_size, cfg.num_experts_per_tok, cfg.moe_intermediate_size);
    4 * (k * (h + 2 * inter) + 16 * h)
}

/// The activations of a prefill chunk of `chunk` tokens.
fn chunk_activation_bytes(cfg: &ModelConfig, chunk: usize) -> usize {
    chunk * activation_bytes_per_token(cfg)
}

/// Tokens per prefill chunk for `cfg` on `device`. CUDA: as long as the
/// activations allow, up to 4096 — every expert a chunk needs is read (and
/// while streaming, copied) once for all its tokens, so longer chunks were
/// faster on the H100, streamed and resident
/// (docs/notes/2026-11-22-to-12-02-benchmark-log.md, "Prefill chunk length on
/// CUDA"). The CPU keeps 512.
fn prefill_chunk(cfg: &ModelConfig, device: Device) -> usize {
    match device {
        Device::Cuda(_) => {
            let per_token = activation_bytes_per_token(cfg);
            let fit = (CHUNK_ACTIVATION_BYTES / per_token.max(1)).clamp(DEFAULT_CHUNK, MAX_CUDA_CHUNK);
            // A power of two at most `fit`.
            1 << fit.ilog2()
        }
        _ => DEFAULT_CHUNK,
    }
}

impl Model {
    pub fn open(dir: &Path, opts: &Options) -> Result<Model> {
        // The checks of `check::problems`, stopping at the first.
        check::not_a_source_checkpoint(dir)?;
        let config = ModelConfig::from_dir(dir)?;
        let wf = WeightsFile::open(dir)?;
        let layout_path = dir.join(EXPERTS_DIR).join(LAYOUT_FILE);
        Layout::read(dir)?.validate_model(&config, &layout_path)?;
        let device = choose(opts.device, &opts.notify);
        // CUDA keeps its own choice for `Auto`: it maps the files itself
        // when they fit and otherwise reads misses with pread, the page
        // cache holding what it can (faster than O_DIRECT in a 16 GB cgroup
        // with 18 GB of experts: docs/streaming.md, "Measured").
        let io_mode = match (device, opts.io_mode) {
            (Device::Cuda(_), IoMode::Auto) => IoMode::Pread,
            (_, mode) => mode,
        };
        let mut store = ExpertStore::open(dir, config.num_hidden_layers, io_mode, opts.io_threads)?;
        let files = FileWatch::new(
            std::iter::once(dir.join(WEIGHTS_FILE)).chain(
                (0..config.num_hidden_layers)
                    .filter(|&i| store.layout().layer(i).is_some())
                    .map(|i| dir.join(EXPERTS_DIR).join(expert_file_name(i))),
            ),
        )?;
        if io_mode == IoMode::Direct && store.mode() != IoMode::Direct {
            opts.notify.say(&format!(
                "warning: the filesystem refuses O_DIRECT; reading experts with {} instead",
                store.mode()
            ));
        }
        if let Some(e) = check::moe_layouts(&config, store.layout()).into_iter().next() {
            return Err(e);
        }
        if opts.io_mode == IoMode::Auto && device == Device::Cpu {
            let mem = store
                .memory()
                .map_or_else(|| "memory unknown".to_string(), |m| m.to_string());
            opts.notify.say(&format!(
                "experts: io {} (chosen by --io auto for {} of expert files; {mem})",
                store.mode(),
                crate::experts::memory::human_size(store.expert_bytes())
            ));
        }
        let ram = store.set_ram_tier(opts.ram_cache)?;
        if ram > 0 {
            opts.notify.say(&format!(
                "experts: RAM tier of {} for experts read from disk ({}% of them)",
                crate::experts::memory::human_size(ram),
                100 * ram / store.expert_bytes().max(1)
            ));
        }
        // The CPU reads its guesses ahead where experts come from disk.
        if !matches!(device, Device::Cuda(_)) && opts.prefetch && store.mode() == IoMode::Direct {
            store.set_read_ahead(true);
            opts.notify
                .say("experts: the next layer's guessed experts read ahead from disk (--no-prefetch: off)");
        }
        // Shared with the CUDA expert cache's staging thread.
        let store = Arc::new(store);
        let mut cache = None;
        let cpu = || -> Result<(Engine, MemoryPlan)> {
            let b = CpuBackend::with_options(opts.threads, opts.exact)?;
            let mut net = Net::load(b, &config, &wf)?;
            net.set_kv_types(opts.kv_types())?;
            let plan = cpu_plan(&net, &config, opts)?;
            if plan.capped {
                opts.notify.say(&plan.describe());
            }
            Ok((Engine::Cpu(Box::new(net)), plan))
        };
        let (engine, plan) = match device {
            Device::Cuda(i) => match open_cuda(i, &config, &wf, &store, opts) {
                Ok((net, r, plan)) => {
                    cache = Some(r);
                    (Engine::Cuda(Box::new(net)), plan)
                }
                Err(e) if opts.device == Device::Auto => {
                    opts.notify.say(&format!("device: cpu (CUDA device {i} failed: {e})"));
                    cpu()?
                }
                Err(e) => return Err(e),
            },
            _ => cpu()?,
        };
        Ok(Model {
            engine,
            cache,
            store,
            name: wf.manifest.model.clone(),
            identity: identity(dir, &config)?,
            files,
            chunk: prefill_chunk(&config, device),
            plan,
            kv: opts.kv_types(),
            config,
        })
    }

    /// Tokens per prefill chunk that new sessions start with (512 on the
    /// CPU; on CUDA up to 4096, as the activations of the model allow).
    pub fn prefill_chunk(&self) -> usize {
        self.chunk
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
    pub fn n_vocab(&self) -> usize {
        self.config.vocab_size
    }
    /// Positions a session holds: `-c`, or the model's context as the
    /// memory plan allows.
    pub fn n_ctx(&self) -> usize {
        self.plan.ctx
    }
    /// The memory plan settled at open (on the CPU: the context, and the
    /// caches' bytes once they are written).
    pub fn memory_plan(&self) -> MemoryPlan {
        self.plan
    }
    /// The KV caches' element types.
    pub fn kv_types(&self) -> KvTypes {
        self.kv
    }
    /// KV cache bytes of one position, over all layers.
    pub fn kv_bytes_per_token(&self) -> usize {
        with_net!(&self.engine, n => n.kv_bytes_per_token())
    }
    /// KV cache bytes of one position in one attention layer (0 for a
    /// model without one).
    pub fn kv_bytes_per_token_layer(&self) -> usize {
        let layers = self
            .config
            .layers
            .iter()
            .filter(|l| l.attn != crate::config::AttnKind::Linear)
            .count();
        self.kv_bytes_per_token().checked_div(layers).unwrap_or(0)
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    /// What tells this model from another of the same shape: its type and
    /// shapes, and a CRC-32 of its manifest (`model_weights.json`, which
    /// holds every dense tensor's place and, from convert, checksums).
    /// Chat saves record it.
    pub fn identity(&self) -> &str {
        &self.identity
    }
    pub fn device_name(&self) -> &'static str {
        match &self.engine {
            Engine::Cpu(_) => "cpu",
            Engine::Cuda(_) => "cuda",
        }
    }
    /// On CUDA, whether prefill products run on tensor cores (SPEC §6's
    /// fast path); None on the CPU.
    pub fn cuda_tensor_cores(&self) -> Option<bool> {
        match &self.engine {
            Engine::Cpu(_) => None,
            Engine::Cuda(n) => Some(n.b.tensor_cores()),
        }
    }
    /// The CPU backend's product kernel (None on CUDA).
    pub fn cpu_kernel(&self) -> Option<crate::backend::cpu::matmul::Kernel> {
        match &self.engine {
            Engine::Cpu(n) => Some(n.b.kernel()),
            Engine::Cuda(_) => None,
        }
    }
    /// The CPU backend's threads (None on CUDA).
    pub fn cpu_threads(&self) -> Option<crate::backend::cpu::PoolInfo> {
        match &self.engine {
            Engine::Cpu(n) => Some(n.b.pool_info()),
            Engine::Cuda(_) => None,
        }
    }
    /// `f` on the threads that compute (the CPU backend's pool; the
    /// caller's thread on CUDA), e.g. to measure what they can read.
    pub fn on_compute_threads<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.engine {
            Engine::Cpu(n) => n.b.run(f),
            Engine::Cuda(_) => f(),
        }
    }
    /// The GPU's name on CUDA.
    pub fn gpu_name(&self) -> Option<&str> {
        match &self.engine {
            Engine::Cuda(n) => Some(n.b.device_name()),
            Engine::Cpu(_) => None,
        }
    }
    /// The RAM tier's counters, when the model has one (`Options::ram_cache`).
    pub fn ram_stats(&self) -> Option<crate::experts::RamStats> {
        self.store.ram_stats()
    }
    /// CUDA: how the expert cache was set up.
    pub fn expert_cache(&self) -> Option<CacheReport> {
        self.cache
    }
    /// CUDA: the expert cache's counters so far.
    pub fn expert_cache_stats(&self) -> Option<CacheStats> {
        match &self.engine {
            Engine::Cuda(n) => n.b.cache_stats(),
            Engine::Cpu(_) => None,
        }
    }
    /// CUDA: host→device bandwidth from pinned memory, GB/s.
    pub fn pinned_copy_bandwidth(&self) -> Option<Result<f64>> {
        match &self.engine {
            Engine::Cuda(n) => Some(n.b.pinned_copy_bandwidth()),
            Engine::Cpu(_) => None,
        }
    }
    pub fn expert_store(&self) -> &ExpertStore {
        &self.store
    }

    pub(crate) fn new_state(&self, capacity: usize) -> Result<EngineState> {
        Ok(match &self.engine {
            Engine::Cpu(n) => EngineState::Cpu(n.new_state(capacity)?),
            Engine::Cuda(n) => EngineState::Cuda(n.new_state(capacity)?),
        })
    }

    /// `st` back to empty, its caches kept (`Net::reset_state`).
    pub(crate) fn reset_state(&self, st: &mut EngineState) -> Result<()> {
        with_net_state!(&self.engine, st, n, s => n.reset_state(s))
    }

    fn timer(&self) -> &crate::model::timing::PhaseTimer {
        with_net!(&self.engine, n => &n.timer)
    }

    /// Check each layer's output for NaN (`--check-nan`): a step that
    /// produces one fails with an error naming the layer. It copies the
    /// residual stream to the host after every layer, so it is off by
    /// default; without it, logits that are all NaN or −∞ are still an
    /// error, without the layer.
    pub fn set_check_nan(&self, on: bool) {
        with_net!(&self.engine, n => &n.check_nan).store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Turn the per-phase timing of `--timing` on or off (it synchronizes
    /// the device at phase boundaries, so it costs a little when on).
    pub fn set_timing(&self, on: bool) {
        self.timer().set_enabled(on);
        if let Engine::Cpu(n) = &self.engine {
            n.b.set_profiling(on);
        }
    }

    /// CPU: seconds and calls per kind of operation while timing was on
    /// (None on CUDA).
    pub fn cpu_op_times(&self) -> Option<Vec<crate::backend::cpu::OpTime>> {
        match &self.engine {
            Engine::Cpu(n) => Some(n.b.op_times()),
            Engine::Cuda(_) => None,
        }
    }

    /// Seconds spent per phase since the model was opened (or `reset_timing`).
    pub fn phase_times(&self) -> crate::model::timing::PhaseTimes {
        self.timer().snapshot()
    }

    pub fn reset_timing(&self) {
        self.timer().reset();
        if let Engine::Cpu(n) = &self.engine {
            n.b.reset_profile();
        }
    }

    fn trace(&self) -> &crate::model::trace::RouteTrace {
        with_net!(&self.engine, n => &n.trace)
    }

    /// Record which experts every token is routed to at every MoE layer
    /// (off by default; when on, each MoE layer copies its router logits
    /// to the host). Read the records with [`Model::take_route_trace`].
    pub fn set_route_trace(&self, on: bool) {
        self.trace().set_enabled(on);
    }

    /// The routing records made since the last call, in evaluation order.
    pub fn take_route_trace(&self) -> Vec<crate::model::trace::RouteRecord> {
        self.trace().take()
    }

    pub(crate) fn has_recurrent_layers(&self) -> bool {
        with_net!(&self.engine, n => n.has_recurrent_layers())
    }

    pub(crate) fn state_size(&self, len: usize) -> usize {
        with_net!(&self.engine, n => n.state_size(len))
    }

    pub(crate) fn save_state(&self, st: &EngineState, len: usize, out: &mut Vec<u8>) -> Result<()> {
        with_net_state!(&self.engine, st, n, s => n.save_state(s, len, out))
    }

    pub(crate) fn save_recurrent(&self, st: &EngineState) -> Result<EngineCheckpoint> {
        match (&self.engine, st) {
            (Engine::Cpu(n), EngineState::Cpu(s)) => n.save_recurrent(s).map(EngineCheckpoint::Cpu),
            (Engine::Cuda(n), EngineState::Cuda(s)) => n.save_recurrent(s).map(EngineCheckpoint::Cuda),
            _ => Err(Error::Invalid("a session state of another device".into())),
        }
    }

    pub(crate) fn load_recurrent(&self, st: &mut EngineState, c: &EngineCheckpoint) -> Result<()> {
        match (&self.engine, st, c) {
            (Engine::Cpu(n), EngineState::Cpu(s), EngineCheckpoint::Cpu(c)) => n.load_recurrent(s, c),
            (Engine::Cuda(n), EngineState::Cuda(s), EngineCheckpoint::Cuda(c)) => n.load_recurrent(s, c),
            _ => Err(Error::Invalid("a checkpoint of another device".into())),
        }
    }

    pub(crate) fn load_state(&self, buf: &[u8], max_len: usize) -> Result<(EngineState, usize)> {
        match &self.engine {
            Engine::Cpu(n) => n.load_state(buf, max_len).map(|(s, l)| (EngineState::Cpu(s), l)),
            Engine::Cuda(n) => n.load_state(buf, max_len).map(|(s, l)| (EngineState::Cuda(s), l)),
        }
    }

    pub(crate) fn forward(&self, st: &mut EngineState, tokens: &[u32], pos0: usize, all: bool) -> Result<Vec<f32>> {
        self.files.check()?;
        let out = match (&self.engine, st) {
            (Engine::Cpu(n), EngineState::Cpu(s)) => {
                n.b.run_for(tokens.len(), || n.forward(s, &self.store, tokens, pos0, all))
            }
            (Engine::Cuda(n), EngineState::Cuda(s)) => n.forward(s, &self.store, tokens, pos0, all),
            _ => Err(Error::Invalid("a session state of another device".into())),
        }?;
        let first = if all { pos0 } else { pos0 + tokens.len() - 1 };
        check_logits(&out, self.n_vocab(), first)?;
        Ok(out)
    }

    /// One forward pass over several sequences (`Net::forward_batch`).
    pub(crate) fn forward_batch(&self, steps: &mut [EngineStep<'_>]) -> Result<Vec<Vec<f32>>> {
        self.files.check()?;
        let out = match &self.engine {
            Engine::Cpu(n) => {
                let tokens = steps.iter().map(|s| s.tokens.len()).sum();
                let mut seqs = seq_steps(steps)?;
                n.b.run_for(tokens, || n.forward_batch(&mut seqs, &self.store))
            }
            Engine::Cuda(n) => n.forward_batch(&mut seq_steps(steps)?, &self.store),
        }?;
        for (s, logits) in steps.iter().zip(&out) {
            let first = if s.all { s.pos0 } else { s.pos0 + s.tokens.len() - 1 };
            check_logits(logits, self.n_vocab(), first)?;
        }
        Ok(out)
    }
}

/// An error when a row of `logits` (`[rows, vocab]`, the first at position
/// `first`) has no usable value: all NaN or −∞ (sampling could only pick a
/// token at random, and the text would be noise).
fn check_logits(logits: &[f32], vocab: usize, first: usize) -> Result<()> {
    for (r, row) in logits.chunks(vocab.max(1)).enumerate() {
        if row.iter().all(|v| v.is_nan() || *v == f32::NEG_INFINITY) {
            let what = if row.iter().all(|v| v.is_nan()) {
                "NaN"
            } else {
                "NaN or −∞"
            };
            return Err(Error::Numeric(format!(
                "the logits at position {} are all {what}: the model's weights or its computation are broken (--check-nan names the first layer that outputs NaN; `moeflux inspect --verify` checks the files)",
                first + r
            )));
        }
    }
    Ok(())
}

/// A backend's own variant of [`EngineState`].
trait StateOf: crate::backend::Backend {
    fn state_of(s: &mut EngineState) -> Option<&mut State<Self>>;
}

impl StateOf for CpuBackend {
    fn state_of(s: &mut EngineState) -> Option<&mut State<Self>> {
        match s {
            EngineState::Cpu(s) => Some(s),
            EngineState::Cuda(_) => None,
        }
    }
}

impl StateOf for CudaBackend {
    fn state_of(s: &mut EngineState) -> Option<&mut State<Self>> {
        match s {
            EngineState::Cuda(s) => Some(s),
            EngineState::Cpu(_) => None,
        }
    }
}

/// One sequence's part of [`Model::forward_batch`].
pub(crate) struct EngineStep<'s> {
    pub state: &'s mut EngineState,
    pub tokens: &'s [u32],
    pub pos0: usize,
    pub all: bool,
}

/// The steps with their states of backend `B`, or an error for a state of
/// another device.
fn seq_steps<'s, B: StateOf>(steps: &'s mut [EngineStep<'_>]) -> Result<Vec<SeqStep<'s, B>>> {
    steps
        .iter_mut()
        .map(|s| {
            let state =
                B::state_of(s.state).ok_or_else(|| Error::Invalid("a session state of another device".into()))?;
            Ok(SeqStep {
                state,
                tokens: s.tokens,
                pos0: s.pos0,
                all: s.all,
            })
        })
        .collect()
}
