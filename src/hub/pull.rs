//! `pull`: resolve a revision, choose the files, download what the cache
//! lacks, link the snapshot. Offline, the same from the cache alone.

use super::api::{Client, RemoteFile};
use super::cache::RepoCache;
use super::download::{self, Source};
use super::select::{self, Choice, Format};
use super::{Event, HubOptions, RepoRef};
use crate::{Error, Result};
use std::path::PathBuf;

/// A model in the cache, complete.
#[derive(Clone, Debug)]
pub struct Pulled {
    pub repo: String,
    pub commit: String,
    pub format: Format,
    /// `snapshots/<commit>`.
    pub snapshot: PathBuf,
    /// The weight files (paths in the repo).
    pub weights: Vec<String>,
    /// What to open: the snapshot directory (safetensors) or the first
    /// GGUF file.
    pub path: PathBuf,
    /// Bytes downloaded by this call.
    pub downloaded: u64,
}

/// Download `model` at `revision` into the cache (only what is missing),
/// or with `opts.offline` find it there. `on` hears the progress.
pub fn pull(opts: &HubOptions, model: &RepoRef, revision: &str, on: &mut dyn FnMut(Event)) -> Result<Pulled> {
    if opts.offline {
        return cached(opts, model, revision);
    }
    let client = Client::new(opts);
    let info = client.info(&model.repo, revision)?;
    let cache = RepoCache::new(&opts.cache_dir, &model.repo);
    let commit = info.commit.as_str();
    let by_path = |p: &str| info.files.iter().find(|f| f.path == p);
    let paths: Vec<&str> = info.files.iter().map(|f| f.path.as_str()).collect();
    let src = Source {
        client: &client,
        repo: &model.repo,
        commit,
        retries: opts.retries,
    };
    let mut quiet = |_: Event| {};
    let (format, mut wanted, weights) = match select::choose(&model.repo, &paths, model.selector.as_deref())? {
        Choice::Safetensors { meta, index, weights } => {
            let weights = match &index {
                Some(i) => {
                    // The index names the shards: it comes first, on its own.
                    let f = by_path(i).ok_or_else(|| Error::Hub(format!("{}: {i} vanished", model.repo)))?;
                    let path = ensure(&src, &cache, f, &mut quiet)?.0;
                    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
                    select::index_shards(&text)?
                }
                None => weights,
            };
            let mut all = meta;
            all.extend(weights.iter().cloned());
            (Format::Safetensors, all, weights)
        }
        Choice::Gguf { files } => (Format::Gguf, files.clone(), files),
    };
    wanted.dedup();
    let mut files = Vec::with_capacity(wanted.len());
    for w in &wanted {
        let f = by_path(w).ok_or_else(|| {
            Error::Hub(format!(
                "{}: {} names `{w}`, which the repo does not have",
                model.repo,
                select::INDEX
            ))
        })?;
        files.push(f);
    }
    let total: u64 = files.iter().map(|f| f.size).sum();
    let present: u64 = files.iter().map(|f| present_bytes(&cache, commit, f)).sum();
    on(Event::Start {
        files: files.len(),
        total,
        present,
    });
    let mut downloaded = 0;
    for f in files {
        let (_, got) = ensure(&src, &cache, f, on)?;
        downloaded += got;
    }
    cache.write_ref(revision, commit)?;
    on(Event::Done);
    finish(&cache, model, commit, format, weights, downloaded)
}

/// `model` from the cache alone: the commit `revision` named last, and
/// the files it needs all present.
pub fn cached(opts: &HubOptions, model: &RepoRef, revision: &str) -> Result<Pulled> {
    let cache = RepoCache::new(&opts.cache_dir, &model.repo);
    let offline = |msg: String| Error::HubOffline {
        repo: model.to_string(),
        msg,
    };
    let commit = cache.resolve(revision).ok_or_else(|| {
        offline(format!(
            "revision `{revision}` is not in the cache ({})",
            cache.dir.display()
        ))
    })?;
    let present = cache.snapshot_files(&commit);
    let paths: Vec<&str> = present.iter().map(|(p, _)| p.as_str()).collect();
    let choice = select::choose(&model.repo, &paths, model.selector.as_deref()).map_err(|e| offline(e.to_string()))?;
    let (format, weights) = match choice {
        Choice::Safetensors { index, weights, .. } => {
            let weights = match index {
                Some(i) => {
                    let p = cache.snapshot(&commit).join(i);
                    let text = std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?;
                    select::index_shards(&text)?
                }
                None => weights,
            };
            (Format::Safetensors, weights)
        }
        Choice::Gguf { files } => (Format::Gguf, files),
    };
    if let Some(w) = weights.iter().find(|w| !paths.contains(&w.as_str())) {
        return Err(offline(format!("the cached snapshot {commit} lacks {w}")));
    }
    if format == Format::Safetensors && !paths.contains(&"config.json") {
        return Err(offline(format!("the cached snapshot {commit} lacks config.json")));
    }
    finish(&cache, model, &commit, format, weights, 0)
}

fn finish(
    cache: &RepoCache,
    model: &RepoRef,
    commit: &str,
    format: Format,
    weights: Vec<String>,
    downloaded: u64,
) -> Result<Pulled> {
    let snapshot = cache.snapshot(commit);
    let path = match format {
        Format::Safetensors => snapshot.clone(),
        Format::Gguf => snapshot.join(weights.first().map(String::as_str).unwrap_or_default()),
    };
    Ok(Pulled {
        repo: model.repo.clone(),
        commit: commit.to_string(),
        format,
        snapshot,
        weights,
        path,
        downloaded,
    })
}

/// The bytes of `f` already here: all of them when it is in the snapshot
/// or its blob is, else those of a partial download.
fn present_bytes(cache: &RepoCache, commit: &str, f: &RemoteFile) -> u64 {
    let blob = cache.blob(&f.blob);
    if cache.size(commit, &f.path) == Some(f.size) || std::fs::metadata(&blob).is_ok_and(|m| m.len() == f.size) {
        return f.size;
    }
    std::fs::metadata(download::incomplete(&blob)).map_or(0, |m| m.len().min(f.size))
}

/// `f` in the snapshot: linked to its blob, downloaded first when the
/// blob is missing. Returns the snapshot path and the bytes downloaded.
fn ensure(src: &Source, cache: &RepoCache, f: &RemoteFile, on: &mut dyn FnMut(Event)) -> Result<(PathBuf, u64)> {
    on(Event::File {
        name: &f.path,
        size: f.size,
    });
    if cache.size(src.commit, &f.path) == Some(f.size) {
        return Ok((cache.snapshot(src.commit).join(&f.path), 0));
    }
    let blob = cache.blob(&f.blob);
    let mut got = 0;
    if !std::fs::metadata(&blob).is_ok_and(|m| m.len() == f.size) {
        let before = std::fs::metadata(download::incomplete(&blob)).map_or(0, |m| m.len());
        download::fetch(src, f, &blob, on)?;
        got = f.size.saturating_sub(before);
    }
    let path = cache.link(src.commit, &f.path, &f.blob)?;
    Ok((path, got))
}

/// The commit `revision` of `repo` names: asked of the Hub (and recorded
/// in `refs/`), or offline, the one recorded last.
pub fn commit(opts: &HubOptions, repo: &str, revision: &str) -> Result<String> {
    let cache = RepoCache::new(&opts.cache_dir, repo);
    if opts.offline {
        return cache.resolve(revision).ok_or_else(|| Error::HubOffline {
            repo: repo.to_string(),
            msg: format!("revision `{revision}` is not in the cache ({})", cache.dir.display()),
        });
    }
    let info = Client::new(opts).info(repo, revision)?;
    cache.write_ref(revision, &info.commit)?;
    Ok(info.commit)
}
