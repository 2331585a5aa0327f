//! How to open a model: the device ([`Device`]) and the [`Options`] of
//! `Model::open`, each field a flag of the CLI (`cli/model_args.rs`).

use crate::backend::cuda::CudaOptions;
use crate::backend::{KvType, KvTypes};
use crate::error::{Error, Result};
use crate::experts::{CacheSize, Hybrid, IoMode};
use crate::notify::Notifier;

/// Which device computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// CUDA (device 0) when a driver and a GPU are present, CPU otherwise.
    #[default]
    Auto,
    Cpu,
    /// CUDA device N.
    Cuda(usize),
}

impl std::str::FromStr for Device {
    type Err = Error;
    /// `auto`, `cpu`, `cuda` (device 0) or `cuda:N`.
    fn from_str(s: &str) -> Result<Device> {
        let bad = || Error::Invalid(format!("unknown device `{s}` (expected auto, cpu, cuda or cuda:N)"));
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            other => match other.strip_prefix("cuda:") {
                Some(n) => n.parse().map(Device::Cuda).map_err(|_| bad()),
                None => Err(bad()),
            },
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Auto => f.write_str("auto"),
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// How to open a model.
#[derive(Debug, Clone)]
pub struct Options {
    pub device: Device,
    pub io_mode: IoMode,
    /// Threads of the expert I/O pool.
    pub io_threads: usize,
    /// CPU: threads that compute (0: one per CPU the process may use).
    pub threads: usize,
    /// f32 activations in every matrix product. Off, quantized products on
    /// the CPU round the activations to 16-bit integers where the CPU has
    /// AVX-512 VNNI, and CUDA prefill products run on tensor cores with
    /// f16 weights and activations (`CudaOptions::tensor_cores`); both
    /// are faster, and within SPEC §6's fast-path tolerance of the exact
    /// products.
    pub exact: bool,
    /// CUDA: device memory for routed experts (`Auto`: what is free after
    /// the dense weights, less a margin).
    pub expert_cache: CacheSize,
    /// Process memory that keeps experts read from disk (the RAM tier;
    /// `Auto`: half of the memory left where reads go around the page
    /// cache with `O_DIRECT`, none otherwise; `Percent` of the experts'
    /// bytes).
    pub ram_cache: CacheSize,
    /// Fetch experts ahead of need while a layer computes: CUDA copies the
    /// next layer's router guesses (and the last token's experts while
    /// layers reuse them; in a long prefill chunk, the whole next layer);
    /// the CPU reading from disk (`O_DIRECT`) reads the guesses.
    pub prefetch: bool,
    /// CUDA: who computes the experts that miss the cache: split between
    /// copies to the device and the CPU by a cost model (`Auto`), all
    /// copied (`Off`), or all on the CPU (`Cpu`, for testing). `None`, the
    /// default: `Auto` where the expert files are mapped and registered
    /// with the driver (they fit in half of the available memory), `Off`
    /// where misses go through staging buffers (not measured with the
    /// split).
    pub hybrid: Option<Hybrid>,
    /// CUDA: settings of the backend (graphs, PDL, staging, kernel cache).
    pub cuda: CudaOptions,
    /// Where the messages of opening go (the device chosen, kernels
    /// compiled, the expert cache, fallbacks); dropped by default.
    pub notify: Notifier,
    /// Positions each session holds (`-c`); `None`: the model's
    /// `max_position_embeddings`, cut where the memory plan needs
    /// ([`crate::experts::PlanInput`]).
    pub ctx: Option<usize>,
    /// Sessions the memory plan holds a context for (`serve --parallel`).
    pub sequences: usize,
    /// The KV caches' element types (`--cache-type-k`, `--cache-type-v`);
    /// `None`: f32 with `exact`, else f16.
    pub cache_type_k: Option<KvType>,
    pub cache_type_v: Option<KvType>,
}

impl Options {
    /// The KV caches' element types these options ask for.
    pub fn kv_types(&self) -> KvTypes {
        let default = if self.exact { KvType::F32 } else { KvType::F16 };
        KvTypes {
            k: self.cache_type_k.unwrap_or(default),
            v: self.cache_type_v.unwrap_or(default),
        }
    }
}

impl Default for Options {
    fn default() -> Options {
        Options {
            device: Device::Auto,
            io_mode: IoMode::default(),
            io_threads: 8,
            threads: 0,
            exact: false,
            expert_cache: CacheSize::Auto,
            ram_cache: CacheSize::Auto,
            prefetch: true,
            hybrid: None,
            cuda: CudaOptions::default(),
            notify: Notifier::default(),
            ctx: None,
            sequences: 1,
            cache_type_k: None,
            cache_type_v: None,
        }
    }
}
