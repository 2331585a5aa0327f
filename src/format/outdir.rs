//! Writing a model directory (`convert`, `synth`) without leaving a mess:
//! everything goes into a temporary sibling `DST.tmp-<pid>` that is
//! removed on any error or cancellation and renamed over `DST` only at the
//! end. The temporary siblings of runs that died without cleaning up
//! (SIGKILL, power loss) are removed by the next run to the same `DST`.

use crate::error::{Error, Result};
use crate::format::packed::MANIFEST_FILE;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

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
        Ok(TempDir { path, installed: false })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Move the finished directory to `dst`, replacing what
    /// [`check_destination`] allows (checked again now). The old `dst` is
    /// renamed aside first, so that a failure leaves one of the two whole.
    pub fn install(mut self, dst: &Path, force: bool) -> Result<()> {
        check_destination(dst, force)?;
        if dst.symlink_metadata().is_ok() {
            let mut old = dst.as_os_str().to_os_string();
            old.push(format!(".old-{}", std::process::id()));
            let old = PathBuf::from(old);
            std::fs::rename(dst, &old).map_err(|e| Error::io(dst, e))?;
            if let Err(e) = std::fs::rename(&self.path, dst) {
                let _ = std::fs::rename(&old, dst);
                return Err(Error::io(dst, e));
            }
            self.installed = true;
            let removed = if old.symlink_metadata().is_ok_and(|m| m.is_dir()) {
                std::fs::remove_dir_all(&old)
            } else {
                std::fs::remove_file(&old)
            };
            return removed.map_err(|e| Error::io(&old, e));
        }
        std::fs::rename(&self.path, dst).map_err(|e| Error::io(dst, e))?;
        self.installed = true;
        Ok(())
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

/// Remove `NAME.tmp-<pid>` of dead processes in `parent` (and the
/// `.NAME.synth-tmp` of older versions of synth); returns notes.
fn remove_stale(parent: &Path, name: &str) -> Result<Vec<String>> {
    let prefix = format!("{name}.tmp-");
    let legacy = format!(".{name}.synth-tmp");
    let mut notes = Vec::new();
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Ok(notes);
    };
    for e in entries.filter_map(|e| e.ok()) {
        let file = e.file_name().to_string_lossy().into_owned();
        let pid = match file.strip_prefix(&prefix).map(str::parse::<u32>) {
            Some(Ok(pid)) => Some(pid),
            Some(Err(_)) => continue,
            None if file == legacy => None,
            None => continue,
        };
        let path = e.path();
        match pid {
            Some(p) if p != std::process::id() && alive(p) => notes.push(format!(
                "{} belongs to process {p}, which is still running (another conversion?); left alone",
                path.display()
            )),
            _ => {
                std::fs::remove_dir_all(&path).map_err(|err| Error::io(&path, err))?;
                let by = pid.map_or("an older version".to_string(), |p| format!("process {p}, now gone"));
                notes.push(format!("removed {}, left by an interrupted run ({by})", path.display()));
            }
        }
    }
    Ok(notes)
}
