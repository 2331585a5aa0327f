//! The models in the cache: what `moeflux list` shows, `--remove`
//! deletes, and where a checkpoint's packed conversion is kept.

use super::cache::RepoCache;
use super::repo::repo_folder;
use super::HubOptions;
use crate::format::packed::MANIFEST_FILE;
use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// One repo of the cache.
#[derive(Clone, Debug)]
pub struct CachedModel {
    pub repo: String,
    /// Bytes of its blobs (the source files).
    pub bytes: u64,
    /// It holds `.safetensors` weights / `.gguf` files.
    pub safetensors: bool,
    pub gguf: bool,
    /// Packed conversions (one per commit) and their bytes.
    pub packed: Vec<PathBuf>,
    pub packed_bytes: u64,
}

/// Where the packed conversion of `repo` at `commit` is kept.
pub fn packed_path(opts: &HubOptions, repo: &str, commit: &str) -> PathBuf {
    opts.packed_dir.join(repo.replace('/', "--")).join(commit)
}

/// The models in the cache and those converted, by repo.
pub fn list(opts: &HubOptions) -> Result<Vec<CachedModel>> {
    let mut repos: Vec<String> = Vec::new();
    for name in dir_names(&opts.cache_dir)? {
        if let Some(r) = name.strip_prefix("models--") {
            repos.push(r.replacen("--", "/", 1));
        }
    }
    for name in dir_names(&opts.packed_dir)? {
        let r = name.replacen("--", "/", 1);
        if !repos.contains(&r) {
            repos.push(r);
        }
    }
    repos.sort();
    Ok(repos.into_iter().map(|r| describe(opts, r)).collect())
}

fn describe(opts: &HubOptions, repo: String) -> CachedModel {
    let cache = RepoCache::new(&opts.cache_dir, &repo);
    let mut m = CachedModel {
        bytes: dir_bytes(&cache.dir.join("blobs")),
        safetensors: false,
        gguf: false,
        packed: Vec::new(),
        packed_bytes: 0,
        repo,
    };
    for commit in dir_names(&cache.dir.join("snapshots")).unwrap_or_default() {
        for (f, _) in cache.snapshot_files(&commit) {
            m.safetensors |= f.ends_with(".safetensors");
            m.gguf |= f.ends_with(".gguf");
        }
    }
    let pdir = opts.packed_dir.join(m.repo.replace('/', "--"));
    for commit in dir_names(&pdir).unwrap_or_default() {
        let p = pdir.join(commit);
        if p.join(MANIFEST_FILE).is_file() {
            m.packed_bytes += dir_bytes(&p);
            m.packed.push(p);
        }
    }
    m
}

/// Delete `repo` from the cache and its conversions; the bytes freed.
pub fn remove(opts: &HubOptions, repo: &str) -> Result<u64> {
    let dirs = [
        opts.cache_dir.join(repo_folder(repo)),
        opts.packed_dir.join(repo.replace('/', "--")),
    ];
    if !dirs.iter().any(|d| d.is_dir()) {
        return Err(Error::Invalid(format!(
            "{repo} is not in the cache ({})",
            opts.cache_dir.display()
        )));
    }
    let mut freed = 0;
    for d in dirs.iter().filter(|d| d.is_dir()) {
        freed += dir_bytes(d);
        std::fs::remove_dir_all(d).map_err(|e| Error::io(d, e))?;
    }
    Ok(freed)
}

/// Remove the weight files of `repo` at `commit` (snapshot links and the
/// blobs no other snapshot links to), keeping its small files and refs
/// (a converted model no longer needs them); the bytes freed.
pub fn remove_weights(opts: &HubOptions, repo: &str, commit: &str, weights: &[String]) -> Result<u64> {
    let cache = RepoCache::new(&opts.cache_dir, repo);
    let snap = cache.snapshot(commit);
    let mut freed = 0;
    for w in weights {
        let link = snap.join(w);
        let Ok(target) = std::fs::canonicalize(&link) else {
            continue;
        };
        std::fs::remove_file(&link).map_err(|e| Error::io(&link, e))?;
        if !linked_elsewhere(&cache, &target) {
            freed += std::fs::metadata(&target).map_or(0, |m| m.len());
            std::fs::remove_file(&target).map_err(|e| Error::io(&target, e))?;
        }
    }
    Ok(freed)
}

/// Whether a link of any snapshot still points at `blob`.
fn linked_elsewhere(cache: &RepoCache, blob: &Path) -> bool {
    dir_names(&cache.dir.join("snapshots"))
        .unwrap_or_default()
        .iter()
        .any(|c| {
            cache
                .snapshot_files(c)
                .iter()
                .any(|(f, _)| std::fs::canonicalize(cache.snapshot(c).join(f)).is_ok_and(|t| t == blob))
        })
}

fn dir_names(dir: &Path) -> Result<Vec<String>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir, e)),
    };
    let mut out: Vec<String> = rd
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    Ok(out)
}

/// The bytes of the regular files under `dir` (links not followed).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}
