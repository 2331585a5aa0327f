//! Models from the Hugging Face Hub: `moeflux pull`, and `--model ORG/NAME`.
//!
//! The files go into the cache `huggingface_hub` shares
//! (`models--org--name/{blobs,snapshots,refs}`), so that a model either
//! tool downloaded serves both. Nothing here reads the environment but
//! [`HubOptions::from_env`], and nothing downloads unless asked: the
//! binary decides when to call [`pull`].
//!
//! - `options.rs`: where the Hub and the caches are, the token, offline;
//! - `repo.rs`: `org/name[:QUANT]`;
//! - `api.rs`: the Hub's routes (model info, resolve) and its errors;
//! - `select.rs`: which files a model needs (safetensors or one GGUF quantization);
//! - `download.rs`: one file, resumed, verified, renamed when whole;
//! - `cache.rs`: one repo's folder in the cache;
//! - `pull.rs`: all of it for one model, online or from the cache alone;
//! - `local.rs`: the models in the cache, their conversions, removal.

mod api;
mod cache;
mod download;
mod local;
mod options;
mod pull;
mod repo;
mod select;

pub use api::RemoteFile;
pub use local::{list, packed_path, remove, remove_weights, CachedModel};
pub use options::{HubOptions, DEFAULT_ENDPOINT};
pub use pull::{cached, commit, pull, Pulled};
pub use repo::RepoRef;
pub use select::Format;

/// What a pull reports as it goes.
#[derive(Debug)]
pub enum Event<'a> {
    /// The files are chosen: how many, their bytes, and how many of those
    /// bytes are already here.
    Start { files: usize, total: u64, present: u64 },
    /// A file is next (it may be in the cache already).
    File { name: &'a str, size: u64 },
    /// Bytes written.
    Bytes(u64),
    /// Bytes counted before that will come again (a restarted file).
    Rewind(u64),
    /// The connection broke; the file is resumed.
    Retry { file: &'a str, error: String },
    /// Every file is in the cache.
    Done,
}
