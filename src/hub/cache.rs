//! One repo's folder in the `huggingface_hub` cache:
//! `models--org--name/blobs/<sha>`, `snapshots/<commit>/<file>` (relative
//! symlinks to the blobs) and `refs/<revision>` (the commit it named
//! last), so that files downloaded by either tool serve both.

use super::repo::repo_folder;
use crate::{Error, Result};
use std::path::{Path, PathBuf};

pub struct RepoCache {
    pub dir: PathBuf,
}

impl RepoCache {
    pub fn new(cache_dir: &Path, repo: &str) -> RepoCache {
        RepoCache {
            dir: cache_dir.join(repo_folder(repo)),
        }
    }

    pub fn blob(&self, name: &str) -> PathBuf {
        self.dir.join("blobs").join(name)
    }

    pub fn snapshot(&self, commit: &str) -> PathBuf {
        self.dir.join("snapshots").join(commit)
    }

    /// The commit `revision` named when it was last resolved: `refs/<revision>`,
    /// or `revision` itself when it is a commit with a snapshot.
    pub fn resolve(&self, revision: &str) -> Option<String> {
        if let Ok(s) = std::fs::read_to_string(self.dir.join("refs").join(revision)) {
            let s = s.trim();
            if super::api::is_commit(s) {
                return Some(s.to_string());
            }
        }
        (super::api::is_commit(revision) && self.snapshot(revision).is_dir()).then(|| revision.to_string())
    }

    /// Record that `revision` names `commit` (nothing for a commit itself).
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<()> {
        if revision == commit {
            return Ok(());
        }
        let path = self.dir.join("refs").join(revision);
        if std::fs::read_to_string(&path).is_ok_and(|s| s.trim() == commit) {
            return Ok(());
        }
        let parent = path.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        std::fs::write(&tmp, commit).map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))
    }

    /// Point `snapshots/<commit>/<file>` at `blobs/<blob>` (a relative
    /// symlink, as `huggingface_hub` makes); returns the snapshot path.
    pub fn link(&self, commit: &str, file: &str, blob: &str) -> Result<PathBuf> {
        let path = self.snapshot(commit).join(file);
        let parent = path.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        let depth = file.split('/').count() + 1;
        let target = Path::new(&"../".repeat(depth)).join("blobs").join(blob);
        if path.symlink_metadata().is_ok() {
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
        }
        std::os::unix::fs::symlink(&target, &path).map_err(|e| Error::io(&path, e))?;
        Ok(path)
    }

    /// The size of `file` in the snapshot of `commit`, following its link
    /// (`None`: absent or a dangling link).
    pub fn size(&self, commit: &str, file: &str) -> Option<u64> {
        std::fs::metadata(self.snapshot(commit).join(file))
            .ok()
            .map(|m| m.len())
    }

    /// Every file of the snapshot of `commit` with its size, paths relative
    /// to the snapshot (`/`-separated); dangling links left out.
    pub fn snapshot_files(&self, commit: &str) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        walk(&self.snapshot(commit), "", &mut out);
        out.sort();
        out
    }
}

fn walk(dir: &Path, prefix: &str, out: &mut Vec<(String, u64)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        match std::fs::metadata(e.path()) {
            Ok(m) if m.is_dir() => walk(&e.path(), &rel, out),
            Ok(m) => out.push((rel, m.len())),
            Err(_) => {}
        }
    }
}
