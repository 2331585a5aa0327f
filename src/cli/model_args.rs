//! The flags that say which model runs where and how its experts move,
//! declared once: `run`, `chat`, `bench` and `logits` flatten
//! [`ModelArgs`] (a `serve` command flattens it too), so that every
//! command has the same flags with the same help.

use anyhow::Context;
use clap::Args;
use moeflux::backend::cuda::CudaOptions;
use moeflux::backend::KvType;
use moeflux::experts::IoMode;
use moeflux::experts::{CacheSize, Hybrid};
use moeflux::notify::Notifier;
use moeflux::{Device, Model, Options};
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Packed model directory (made by `moeflux convert` or `moeflux synth`),
    /// or a Hugging Face model, ORG/NAME[:QUANT], pulled first when it is
    /// not a local path (see `moeflux pull`).
    #[arg(short = 'm', long, visible_alias = "hf-repo", env = "MOEFLUX_ARG_MODEL")]
    pub model: PathBuf,
    /// Device: auto (CUDA when a GPU is present, else the CPU), cpu, cuda
    /// or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: Device,
    /// How experts are read from disk: auto, pread, mmap or direct
    /// (O_DIRECT, for models larger than RAM). auto: on the CPU, mmap
    /// (experts read in place from the page cache) when the expert files
    /// fit in half the available memory, direct when they are larger than
    /// the memory, pread otherwise; on CUDA, pread (the backend maps the
    /// files itself when they fit). Memory is the machine's, or the
    /// cgroup limit's (containers) when that is lower.
    #[arg(long, default_value = "auto")]
    pub io: IoMode,
    /// CPU threads that compute: the CPU backend's, or on CUDA those that
    /// compute misses with --hybrid (0: one per CPU this process may use;
    /// at most that many).
    #[arg(
        short = 't',
        long,
        default_value_t = 0,
        value_name = "N",
        value_parser = threads,
        env = "MOEFLUX_ARG_THREADS"
    )]
    pub threads: usize,
    /// f32 activations in every matrix product. Without it, quantized
    /// products on the CPU round the activations to 16-bit integers per
    /// group where the CPU has AVX-512 VNNI, and CUDA prefill products run
    /// on tensor cores in f16: faster, and within 2e-3 of the exact logits
    /// (SPEC §6).
    #[arg(long)]
    pub exact: bool,
    /// CUDA: device memory for routed experts: auto (free memory less a
    /// margin), a size (8G, 512M) or a share of the expert bytes from 0% to
    /// 100% (0%: only the smallest working set, the rest streamed).
    #[arg(long, default_value = "auto", value_name = "SIZE", value_parser = cache_size)]
    pub expert_cache: CacheSize,
    /// Process memory that keeps experts read from disk, the hottest
    /// first: auto (half of the memory left when --io is direct, else
    /// none: the page cache keeps them), a size (8G) or a share of the
    /// expert bytes (25%); 0 for none.
    #[arg(long, default_value = "auto", value_name = "SIZE", value_parser = cache_size)]
    pub ram_cache: CacheSize,
    /// Do not fetch experts ahead of need: on CUDA, the next layer's
    /// router guesses (and experts of the previous token) in decode and
    /// the whole next layer in long prefill chunks, copied while a layer
    /// computes; on the CPU with --io direct, the next layer's router
    /// guesses read from disk while a layer computes.
    #[arg(long)]
    pub no_prefetch: bool,
    /// CUDA: who computes the experts that miss the device cache: auto
    /// (the CPU computes some from host memory while the others are
    /// copied, split by a cost model measured at start), off (copy them
    /// all) or cpu (compute them all on the CPU) [default: auto where
    /// every expert file is pinned (see --pin-experts), else off].
    #[arg(long, value_name = "MODE")]
    pub hybrid: Option<Hybrid>,
    /// CUDA: where compiled kernels are kept [default:
    /// $XDG_CACHE_HOME/moeflux/kernels, else ~/.cache/moeflux/kernels].
    #[arg(long, value_name = "DIR", env = "MOEFLUX_KERNEL_CACHE")]
    pub kernel_cache: Option<PathBuf>,
    /// CUDA, for measuring: launch kernels one by one instead of through
    /// reused CUDA graphs.
    #[arg(long, hide = true)]
    pub no_cuda_graphs: bool,
    /// CUDA, for measuring: no programmatic dependent launch.
    #[arg(long, hide = true)]
    pub no_pdl: bool,
    /// CUDA, for measuring: a prompt's misses are placed as a decode
    /// step's are (evicting the resident set) instead of streaming.
    #[arg(long, hide = true)]
    pub no_prompt_stream: bool,
    /// CUDA, for measuring: copy expert misses through pinned staging
    /// buffers even where the files could be registered with the driver.
    #[arg(long, hide = true)]
    pub staging: bool,
    /// CUDA: host memory the expert files may lock (registered with the
    /// driver, so that a miss is one copy from there); the layers that do
    /// not fit are read into staging buffers, as many of them as the
    /// device cache can spare held there for good: auto (under a cgroup
    /// memory limit, all of the room but an eighth, at least 2 GiB; on a
    /// host, half of the available memory), a percentage of the expert
    /// files, or a size (8G).
    #[arg(long, value_name = "SIZE", default_value = "auto", value_parser = cache_size)]
    pub pin_experts: CacheSize,
    /// CUDA, for measuring: time the parts of each streamed decode step's
    /// MoE layer on the GPU (`bench` prints them; events end graph
    /// segments, so a traced run is a little slower).
    #[arg(long, hide = true)]
    pub trace_layers: bool,
    /// Check each layer's output for NaN, naming the first layer that
    /// produces one (a copy of the hidden state per layer, so slower).
    /// Without it, a step whose logits are all NaN or -inf still stops
    /// with an error.
    #[arg(long)]
    pub check_nan: bool,
    /// CUDA, for measuring: KiB of one piece of a staged expert copy.
    #[arg(long, hide = true, value_name = "KIB", default_value_t = 512)]
    pub copy_piece_kib: usize,
    /// Tokens each sequence holds, prompt and answer (serve: each of the
    /// --parallel slots) [default: the model's max_position_embeddings,
    /// cut so that the KV caches take at most half of the memory left
    /// after the dense weights].
    #[arg(
        short = 'c',
        long = "ctx-size",
        visible_alias = "ctx",
        value_name = "N",
        env = "MOEFLUX_ARG_CTX_SIZE"
    )]
    pub ctx: Option<usize>,
    /// Element type of the K cache (and of MLA's latent cache): f16, bf16,
    /// q8_0 or f32 [default: f16; f32 with --exact].
    #[arg(long = "cache-type-k", visible_alias = "ctk", value_name = "TYPE")]
    pub cache_type_k: Option<KvType>,
    /// Element type of the V cache: f16, bf16, q8_0 or f32 [default: f16;
    /// f32 with --exact].
    #[arg(long = "cache-type-v", visible_alias = "ctv", value_name = "TYPE")]
    pub cache_type_v: Option<KvType>,
    /// Sequences the memory plan holds a context for (set by `serve
    /// --parallel` and `bench --parallel`).
    #[arg(skip = 1usize)]
    pub sequences: usize,
    /// llama.cpp's flags that mean something else here: refused with
    /// what to use instead.
    #[arg(long = "n-gpu-layers", visible_alias = "gpu-layers", hide = true, value_name = "N",
          allow_hyphen_values = true, value_parser = super::llama::gpu_layers)]
    pub n_gpu_layers: Option<String>,
    #[arg(long = "override-tensor", hide = true, value_name = "PATTERN", value_parser = super::llama::override_tensor)]
    pub override_tensor: Option<String>,
    #[arg(long = "n-cpu-moe", hide = true, value_name = "N", value_parser = super::llama::cpu_moe)]
    pub n_cpu_moe: Option<String>,
    #[arg(long = "cpu-moe", hide = true, num_args = 0..=1, default_missing_value = "",
          value_parser = super::llama::cpu_moe)]
    pub cpu_moe: Option<String>,
    /// llama.cpp's `--jinja`: templates are always Jinja here.
    #[arg(long, hide = true)]
    pub jinja: bool,
}

/// `--threads`: from 0 (one per CPU) to the CPUs this process may use
/// (more only take turns on them, and workers that spin wait for each other).
fn threads(s: &str) -> Result<usize, String> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    match s.trim().parse::<usize>() {
        Ok(n) if n <= cpus => Ok(n),
        _ => Err(format!(
            "expected a number from 0 (one thread per CPU) to {cpus} (the CPUs this process may use)"
        )),
    }
}

/// The largest cache size a flag takes: 1024 TiB (larger ones are
/// typing slips, or overflow the count of bytes).
const MOST_BYTES: u64 = 1 << 50;

/// `--expert-cache`, `--ram-cache`, `--pin-experts`: auto, a share from
/// 0% to 100% or a size from 0 to 1024T.
fn cache_size(s: &str) -> Result<CacheSize, String> {
    let size: CacheSize = s.parse().map_err(|e: moeflux::Error| e.to_string())?;
    match size {
        CacheSize::Bytes(n) if n > MOST_BYTES => Err(format!(
            "cache size `{s}`: expected a size from 0 to 1024T, a share of the expert bytes from 0% to 100%, or auto"
        )),
        _ => Ok(size),
    }
}

impl ModelArgs {
    /// `--model ORG/NAME[:QUANT]` that is not a local path: pulled and
    /// made ready, then the local path replaces it.
    pub fn resolve(&mut self, prep: super::pull::Prepare) -> anyhow::Result<()> {
        self.model = super::pull::resolve_model(&self.model, prep)?;
        Ok(())
    }

    pub fn options(&self) -> Options {
        Options {
            device: self.device,
            io_mode: self.io,
            threads: self.threads,
            exact: self.exact,
            expert_cache: self.expert_cache,
            ram_cache: self.ram_cache,
            prefetch: !self.no_prefetch,
            hybrid: self.hybrid,
            cuda: CudaOptions {
                graphs: !self.no_cuda_graphs,
                pdl: !self.no_pdl,
                staging: self.staging,
                copy_piece_bytes: self.copy_piece_kib.max(4) << 10,
                pin: self.pin_experts,
                kernel_cache: self.kernel_cache.clone(),
                tensor_cores: true,
                trace_layers: self.trace_layers,
                prompt_stream: !self.no_prompt_stream,
            },
            // What opening has to say (device, kernels, expert cache) goes to stderr.
            notify: Notifier::new(|m| eprintln!("{m}")),
            ctx: self.ctx,
            sequences: self.sequences.max(1),
            cache_type_k: self.cache_type_k,
            cache_type_v: self.cache_type_v,
            ..Options::default()
        }
    }

    /// Open the model; a flag that does nothing on the device it runs on
    /// is named on stderr.
    pub fn open_model(&self) -> anyhow::Result<Model> {
        let dir = &self.model;
        let model = Model::open(dir, &self.options()).with_context(|| format!("opening {}", dir.display()))?;
        model.set_check_nan(self.check_nan);
        for note in self.idle_flags(&model) {
            eprintln!("note: {note}");
        }
        Ok(model)
    }

    /// The flags given that have no effect on `model`'s device.
    fn idle_flags(&self, model: &Model) -> Vec<String> {
        let mut notes = Vec::new();
        let cache = model.expert_cache();
        if cache.is_none() {
            let device = model.device_name();
            if self.expert_cache != CacheSize::Auto {
                notes.push(format!(
                    "--expert-cache has no effect on the {device}, which reads experts through the page cache"
                ));
            }
            if self.no_prefetch && model.expert_store().mode() != IoMode::Direct {
                notes.push(format!(
                    "--no-prefetch has no effect on the {device} unless experts are read with --io direct"
                ));
            }
            if self.hybrid.is_some() {
                notes.push(format!("--hybrid has no effect on the {device}"));
            }
            if self.pin_experts != CacheSize::Auto {
                notes.push(format!("--pin-experts has no effect on the {device}"));
            }
        } else if self.threads != 0 && (self.hybrid == Some(Hybrid::Off) || cache.is_some_and(|c| c.resident)) {
            notes.push("--threads has no effect on CUDA without --hybrid misses".into());
        }
        if cache.is_some_and(|c| c.resident) {
            if self.no_prefetch {
                notes.push("--no-prefetch has no effect: every expert is resident on the device".into());
            }
            if self.hybrid.is_some() {
                notes.push("--hybrid has no effect: every expert is resident on the device".into());
            }
            if self.pin_experts != CacheSize::Auto {
                notes.push("--pin-experts has no effect: every expert is resident on the device".into());
            }
        }
        notes
    }
}
