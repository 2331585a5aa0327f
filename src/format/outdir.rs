//! Writing a model directory (`convert`, `synth`) without leaving a mess:
//! everything goes into a temporary sibling `DST.tmp-<pid>` that is
//! removed on any error or cancellation and renamed over `DST` only at the
//! end. The temporary siblings of runs that died without cleaning up
//! (SIGKILL, power loss) are removed by the next run to the same `DST`,
//! but only directories that hold [`MARKER`] (written when moeflux made
//! them): a user's own `DST.tmp-123` is never touched. A `DST.old-<pid>`
//! (the replaced model, renamed aside by a run killed during the final
//! swap) is put back as `DST` when `DST` is missing, and removed otherwise.

use crate::error::{Error, Result};
use crate::format::packed::MANIFEST_FILE;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The file that marks a directory as moeflux's own temporary one.
pub const MARKER: &str = ".moeflux-partial";

/// Write [`MARKER`] into `dir`.
fn mark(dir: &Path) -> Result<()> {
    let path = dir.join(MARKER);
    let text = format!(
        "A directory moeflux (process {}) is writing or replacing; removed by the next run when that process is gone.\n",
        std::process::id()
    );
    std::fs::write(&path, text).map_err(|e| Error::io(&path, e))
}

/// `Err(Error::Cancelled)` once `cancel` is set.
pub fn check_cancel(cancel: Option<&AtomicBool>) -> Result<()> {
    if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
        Err(Error::Cancelled)
    } else {
        Ok(())
    }
}

/// `dst` may be written: it does not exist or is an empty directory, or
/// `force` is given and it is a packed model directory (never anything
/// else, even with `force`).
pub fn check_destination(dst: &Path, force: bool) -> Result<()> {
    if dst.symlink_metadata().is_err() {
        return Ok(());
    }
    if dst.is_dir() && std::fs::read_dir(dst).map_err(|e| Error::io(dst, e))?.next().is_none() {
        return Ok(());
    }
    if !force {
        return Err(Error::Exists(dst.to_path_buf()));
    }
    if dst.join(MANIFEST_FILE).is_file() {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{} exists and is not a packed model directory (it has no {MANIFEST_FILE}); refusing to replace it even with --force",
            dst.display()
        )))
    }
}

/// A temporary directory beside the destination, removed when dropped
/// unless [`TempDir::install`] moved it into place.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
    installed: bool,
}

impl TempDir {
    /// Create `DST.tmp-<pid>`, first removing the temporary directories
    /// that dead runs left beside `dst`; what was removed (or left alone
    /// because its process still runs) is added to `notes`.
    pub fn beside(dst: &Path, notes: &mut Vec<String>) -> Result<TempDir> {
        let name = dst
            .file_name()
            .ok_or_else(|| Error::Invalid(format!("destination {} has no directory name", dst.display())))?;
        let parent = parent_of(dst);
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        notes.extend(remove_stale(parent, &name.to_string_lossy())?);
        let mut tmp = name.to_os_string();
        tmp.push(format!(".tmp-{}", std::process::id()));
        let path = parent.join(tmp);
        std::fs::create_dir(&path).map_err(|e| Error::io(&path, e))?;
        let dir = TempDir { path, installed: false };
        mark(&dir.path)?;
        Ok(dir)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Move the finished directory to `dst`, replacing what
    /// [`check_destination`] allows (checked again now). The old `dst` is
    /// renamed aside first (marked, so that a run killed before the end
    /// leaves it for the next run to restore), so that a failure leaves
    /// one of the two whole.
    pub fn install(mut self, dst: &Path, force: bool) -> Result<()> {
        check_destination(dst, force)?;
        let marker = dst.join(MARKER);
        if dst.symlink_metadata().is_ok() {
            let mut old = dst.as_os_str().to_os_string();
            old.push(format!(".old-{}", std::process::id()));
            let old = PathBuf::from(old);
            if dst.is_dir() {
                mark(dst)?;
            }
            if let Err(e) = std::fs::rename(dst, &old) {
                let _ = std::fs::remove_file(&marker);
                return Err(Error::io(dst, e));
            }
            if let Err(e) = std::fs::rename(&self.path, dst) {
                if std::fs::rename(&old, dst).is_ok() {
                    let _ = std::fs::remove_file(&marker);
                }
                return Err(Error::io(dst, e));
            }
            self.installed = true;
            std::fs::remove_file(&marker).map_err(|e| Error::io(&marker, e))?;
            let removed = if old.symlink_metadata().is_ok_and(|m| m.is_dir()) {
                std::fs::remove_dir_all(&old)
            } else {
                std::fs::remove_file(&old)
            };
            return removed.map_err(|e| Error::io(&old, e));
        }
        std::fs::rename(&self.path, dst).map_err(|e| Error::io(dst, e))?;
        self.installed = true;
        std::fs::remove_file(&marker).map_err(|e| Error::io(&marker, e))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.installed {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

fn parent_of(dst: &Path) -> &Path {
    dst.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Whether process `pid` exists (it may be another program that reused
/// the number; then its directory is left alone, and named).
fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } == 0 {
        return true;
    }
    std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Clean what dead runs left in `parent` beside `NAME`: their marked
/// `NAME.tmp-<pid>` directories are removed, a marked `NAME.old-<pid>` is
/// renamed back to `NAME` when that is missing (the run died between the
/// two renames of the swap) and removed otherwise; the `.NAME.synth-tmp`
/// of older versions of synth is removed. Anything else with such a name
/// (a file, a directory without the marker, one whose process still runs)
/// is left alone and named in the returned notes.
fn remove_stale(parent: &Path, name: &str) -> Result<Vec<String>> {
    let tmp_prefix = format!("{name}.tmp-");
    let old_prefix = format!("{name}.old-");
    let legacy = format!(".{name}.synth-tmp");
    let dst = parent.join(name);
    let mut notes = Vec::new();
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Ok(notes);
    };
    for e in entries.filter_map(|e| e.ok()) {
        let file = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        let (pid, old) = if let Some(n) = file.strip_prefix(&tmp_prefix) {
            (n, false)
        } else if let Some(n) = file.strip_prefix(&old_prefix) {
            (n, true)
        } else {
            if file == legacy && path.symlink_metadata().is_ok_and(|m| m.is_dir()) {
                std::fs::remove_dir_all(&path).map_err(|err| Error::io(&path, err))?;
                notes.push(format!(
                    "removed {}, left by an interrupted run (an older version)",
                    path.display()
                ));
            }
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        let is_dir = path.symlink_metadata().is_ok_and(|m| m.is_dir());
        if !is_dir || !path.join(MARKER).is_file() {
            notes.push(format!(
                "{} was not made by moeflux (it is {}); left alone",
                path.display(),
                if is_dir {
                    "a directory without the marker file"
                } else {
                    "not a directory"
                }
            ));
            continue;
        }
        if pid != std::process::id() && alive(pid) {
            notes.push(format!(
                "{} belongs to process {pid}, which is still running (another conversion?); left alone",
                path.display()
            ));
            continue;
        }
        if old && dst.symlink_metadata().is_err() {
            std::fs::rename(&path, &dst).map_err(|err| Error::io(&path, err))?;
            let marker = dst.join(MARKER);
            std::fs::remove_file(&marker).map_err(|err| Error::io(&marker, err))?;
            notes.push(format!(
                "restored {} from {}, left by a run (process {pid}, now gone) interrupted while replacing it",
                dst.display(),
                path.display()
            ));
            continue;
        }
        std::fs::remove_dir_all(&path).map_err(|err| Error::io(&path, err))?;
        notes.push(format!(
            "removed {}, left by an interrupted run (process {pid}, now gone)",
            path.display()
        ));
    }
    Ok(notes)
}
