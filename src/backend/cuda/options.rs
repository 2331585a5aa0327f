//! The CUDA backend's settings (`CudaOptions`), what its expert cache is
//! asked for (`CacheRequest`) and what it set up (`CacheReport`).

use super::CacheSize;
use crate::experts::{Hybrid, SplitModel};

/// What [`super::CudaBackend::attach_experts`] set up.
#[derive(Debug, Clone, Copy)]
pub struct CacheReport {
    pub budget_bytes: u64,
    pub expert_bytes: u64,
    pub slots: usize,
    pub experts: usize,
    pub resident: bool,
    /// The size asked for was below the smallest working set (one layer's
    /// active experts), which was used instead.
    pub minimum: bool,
    pub load_s: f64,
    /// How misses are split between copies and the CPU (streaming only).
    pub split: Option<SplitModel>,
    /// MoE layers whose files are locked in host memory (registered with
    /// the driver), and those held in the device cache for good
    /// (`experts::tiers`; streaming only).
    pub pinned_layers: usize,
    pub held_layers: usize,
}

/// How [`super::CudaBackend::attach_experts`] sizes and runs the expert cache.
#[derive(Debug, Clone, Copy)]
pub struct CacheRequest {
    pub size: CacheSize,
    /// Device memory the cache may take at most (the memory plan's
    /// `expert_room`: free memory less the KV caches, activations and a
    /// margin).
    pub room: u64,
    /// Copy experts ahead of need.
    pub prefetch: bool,
    /// The smallest working set in experts: the active experts of one
    /// layer (two layers' worth with prefetch).
    pub min_slots: usize,
    /// Who computes the misses (`experts::split`); `None`: the default,
    /// `Auto` where the expert files are registered with the driver (the
    /// case measured), `Off` where misses are read into staging buffers.
    pub hybrid: Option<Hybrid>,
    /// The CPU threads that compute misses (0: one per CPU the process
    /// may use), and whether their products are exact (SPEC §6).
    pub host_threads: usize,
    pub exact: bool,
}

/// Settings of the CUDA backend. The defaults are what moeflux runs with;
/// the others exist to measure one mechanism against its absence
/// (`tools/device/run.sh`).
#[derive(Debug, Clone, PartialEq)]
pub struct CudaOptions {
    /// Record kernel launches into reused CUDA graphs (`graph.rs`).
    pub graphs: bool,
    /// Programmatic dependent launch on compute capability 9.0 and later.
    pub pdl: bool,
    /// Copy expert misses through pinned staging buffers even where the
    /// expert files could be registered with the driver.
    pub staging: bool,
    /// Bytes of one piece of a staged expert copy (512 KiB by default).
    pub copy_piece_bytes: usize,
    /// Host memory the expert files may lock, registered with the driver
    /// so that a miss is one DMA (`experts::tiers`): `Auto` is
    /// `experts::memory::pin_budget`; a percentage is of the expert
    /// files' bytes.
    pub pin: CacheSize,
    /// Where compiled kernels are kept (`None`:
    /// `$XDG_CACHE_HOME/moeflux/kernels`, else `~/.cache/moeflux/kernels`).
    pub kernel_cache: Option<std::path::PathBuf>,
    /// Prefill products on tensor cores (compute capability 8.0 and later):
    /// weights and activations rounded to f16, sums in f32, SPEC §6's fast
    /// path. Off (`Options::exact`), every product runs in f32.
    pub tensor_cores: bool,
    /// Time the parts of each streamed decode step's MoE layer on the GPU
    /// (`timeline.rs`; `bench` prints them).
    pub trace_layers: bool,
    /// A prompt's chunk uses the experts the cache holds and streams its
    /// misses through probation (`experts/cache_stream.rs`); off, its
    /// misses are placed as a decode step's are.
    pub prompt_stream: bool,
}

impl Default for CudaOptions {
    fn default() -> CudaOptions {
        CudaOptions {
            graphs: true,
            pdl: true,
            staging: false,
            copy_piece_bytes: 512 << 10,
            pin: CacheSize::Auto,
            kernel_cache: None,
            tensor_cores: true,
            trace_layers: false,
            prompt_stream: true,
        }
    }
}
