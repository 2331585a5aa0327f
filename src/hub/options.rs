//! Where the Hub is, who we are to it, and where its files are kept:
//! given by the caller, or read once from the environment the way
//! `huggingface_hub` reads it ([`HubOptions::from_env`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The Hub that serves models unless `HF_ENDPOINT` names another.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

#[derive(Clone, Debug)]
pub struct HubOptions {
    /// Base URL of the Hub, without a trailing `/`.
    pub endpoint: String,
    /// Bearer token for gated and private repos.
    pub token: Option<String>,
    /// The `huggingface_hub` cache: `models--org--name/{blobs,snapshots,refs}`.
    pub cache_dir: PathBuf,
    /// Where checkpoints converted into the packed layout are kept.
    pub packed_dir: PathBuf,
    /// Use only the cache; never ask the Hub.
    pub offline: bool,
    /// Honour `HTTPS_PROXY` / `NO_PROXY` and the like.
    pub system_proxy: bool,
    /// Times a file download is resumed after the connection breaks.
    pub retries: u32,
    /// Connect and per-read timeout.
    pub timeout: Duration,
}

impl HubOptions {
    /// Options with the Hub at `endpoint` and both caches under `root`
    /// (`root/hub`, `root/packed`); no token, online, no proxy.
    pub fn new(endpoint: &str, root: &Path) -> HubOptions {
        HubOptions {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token: None,
            cache_dir: root.join("hub"),
            packed_dir: root.join("packed"),
            offline: false,
            system_proxy: false,
            retries: 3,
            timeout: Duration::from_secs(30),
        }
    }

    /// The options `huggingface_hub` would use: `HF_ENDPOINT`, `HF_TOKEN`
    /// (else the file `HF_TOKEN_PATH`, else `HF_HOME/token`), `HF_HUB_CACHE`
    /// (else `HF_HOME/hub`; `HF_HOME` defaults to
    /// `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`) and
    /// `HF_HUB_OFFLINE`. Converted models go to `MOEFLUX_MODELS`, else
    /// `$XDG_CACHE_HOME/moeflux/models`, else `~/.cache/moeflux/models`.
    pub fn from_env() -> HubOptions {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let cache_home = var("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache")))
            .unwrap_or_else(|| PathBuf::from(".cache"));
        let hf_home = var("HF_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| cache_home.join("huggingface"));
        let cache_dir = var("HF_HUB_CACHE")
            .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home.join("hub"));
        let token_file = var("HF_TOKEN_PATH")
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home.join("token"));
        let token = var("HF_TOKEN")
            .or_else(|| var("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| std::fs::read_to_string(token_file).ok())
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| is_true(&v));
        let packed_dir = var("MOEFLUX_MODELS")
            .map(PathBuf::from)
            .unwrap_or_else(|| cache_home.join("moeflux").join("models"));
        HubOptions {
            endpoint: var("HF_ENDPOINT")
                .unwrap_or_else(|| DEFAULT_ENDPOINT.into())
                .trim_end_matches('/')
                .to_string(),
            token,
            cache_dir,
            packed_dir,
            offline,
            system_proxy: true,
            retries: 5,
            timeout: Duration::from_secs(60),
        }
    }

    /// The page of `repo` on the Hub (where a gated model's terms are accepted).
    pub fn repo_url(&self, repo: &str) -> String {
        format!("{}/{repo}", self.endpoint)
    }
}

/// `1`, `true`, `yes`, `on` (any case), as `huggingface_hub` reads flags.
fn is_true(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
}
