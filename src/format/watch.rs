//! The files a running model reads, watched for change. The dense weights
//! and (by default on the CPU) the expert files are memory-mapped: a file
//! truncated under the mapping ends the process with SIGBUS at the first
//! touch of a page past its new end, and one rewritten in place changes
//! the weights silently. Every evaluation first compares each file's
//! device, inode, length and modification time with what they were when
//! the model opened, and fails, naming the file, when one differs; the
//! model then refuses every evaluation until it is opened again. (A change
//! that lands during a step, after its check, is not caught.)

use crate::error::{Error, Result};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What tells a file from its changed self.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl Stamp {
    fn of(path: &Path) -> std::io::Result<Stamp> {
        let m = std::fs::metadata(path)?;
        Ok(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
        })
    }
}

/// A model's files as they were when it opened.
#[derive(Debug, Default)]
pub struct FileWatch {
    files: Vec<(PathBuf, Stamp)>,
}

const RESTART: &str =
    "the files of a model must not change while it runs; open it again (restart moeflux) to use the new files";

impl FileWatch {
    /// Note the state of each of `paths` now.
    pub fn new(paths: impl IntoIterator<Item = PathBuf>) -> Result<FileWatch> {
        let files = paths
            .into_iter()
            .map(|p| Stamp::of(&p).map_err(|e| Error::io(&p, e)).map(|s| (p, s)))
            .collect::<Result<_>>()?;
        Ok(FileWatch { files })
    }

    /// The files watched.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|(p, _)| p.as_path())
    }

    /// An error naming the first file that is gone or changed since
    /// [`FileWatch::new`].
    pub fn check(&self) -> Result<()> {
        for (path, was) in &self.files {
            let now = match Stamp::of(path) {
                Ok(s) => s,
                Err(e) => {
                    return Err(Error::format(
                        path,
                        format!("cannot be read any more since the model was opened ({e}); {RESTART}"),
                    ))
                }
            };
            if now == *was {
                continue;
            }
            let what = if now.len != was.len {
                format!("its length went from {} to {} bytes", was.len, now.len)
            } else if (now.dev, now.ino) != (was.dev, was.ino) {
                "it was replaced by another file".to_string()
            } else {
                "it was rewritten".to_string()
            };
            return Err(Error::format(
                path,
                format!("changed since the model was opened ({what}); {RESTART}"),
            ));
        }
        Ok(())
    }
}
