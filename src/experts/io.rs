//! How expert bytes come off the disk: one open layer file, read in one of
//! three modes (plain `pread`, a shared memory map, or `O_DIRECT`).

use super::Memory;
use crate::error::{Error, Result};
use crate::format::{AlignedBytes, Region};
use memmap2::{Advice, Mmap};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Block size that `O_DIRECT` offsets, lengths and buffer addresses are
/// rounded to (the largest logical block size in common use).
pub const DIRECT_ALIGN: usize = 4096;

/// How expert bytes come off the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoMode {
    /// Chosen when the store opens ([`IoMode::resolve`]): `Mmap` when the
    /// expert files fit in half the available memory, `Direct` when they
    /// are larger than all of it, `Pread` in between.
    #[default]
    Auto,
    /// One `pread` per expert into an owned buffer (page cache as the host cache).
    Pread,
    /// Map each layer file; experts are zero-copy views of the map.
    Mmap,
    /// `O_DIRECT` reads that bypass the page cache (models larger than RAM).
    Direct,
}

impl IoMode {
    pub fn name(self) -> &'static str {
        match self {
            IoMode::Auto => "auto",
            IoMode::Pread => "pread",
            IoMode::Mmap => "mmap",
            IoMode::Direct => "direct",
        }
    }
}

impl IoMode {
    /// The mode `Auto` stands for when the expert files hold
    /// `expert_bytes` and the process may use `mem` (`None`: unknown;
    /// both the machine's memory and its cgroup limit count, see
    /// [`Memory`]): read in place from the page cache (`Mmap`, no copy)
    /// when the files fit in half the available memory; `Direct` when
    /// they are larger than all the memory the process may hold (the
    /// page cache could never keep them); `Pread` otherwise. Other modes
    /// are returned as they are.
    pub fn resolve(self, expert_bytes: u64, mem: Option<Memory>) -> IoMode {
        match (self, mem) {
            (IoMode::Auto, Some(m)) if expert_bytes <= m.available / 2 => IoMode::Mmap,
            (IoMode::Auto, Some(m)) if expert_bytes > m.total => IoMode::Direct,
            (IoMode::Auto, _) => IoMode::Pread,
            (mode, _) => mode,
        }
    }
}

impl std::fmt::Display for IoMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for IoMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<IoMode> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(IoMode::Auto),
            "pread" => Ok(IoMode::Pread),
            "mmap" => Ok(IoMode::Mmap),
            "direct" => Ok(IoMode::Direct),
            _ => Err(Error::Invalid(format!(
                "unknown I/O mode `{s}`; expected auto, pread, mmap or direct"
            ))),
        }
    }
}

/// One opened expert file and what reads it.
pub(crate) struct ExpertFile {
    path: PathBuf,
    file: File,
    /// The whole file mapped (mode `Mmap` only).
    map: Option<Arc<Mmap>>,
    direct: bool,
}

impl ExpertFile {
    /// Open `path` (already checked to be `len` bytes) for `mode`.
    /// `Direct` on a filesystem that refuses `O_DIRECT` returns `Ok(None)`:
    /// the caller falls back to `Pread`.
    pub fn open(path: &Path, len: u64, mode: IoMode) -> Result<Option<ExpertFile>> {
        match mode {
            IoMode::Auto | IoMode::Pread => ExpertFile::open_pread(path).map(Some),
            IoMode::Mmap => {
                let file = File::open(path).map_err(|e| Error::io(path, e))?;
                // SAFETY: the file is opened read-only; moeflux never writes a
                // packed model in place (convert and synth write a temp dir and rename).
                let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
                if map.len() as u64 != len {
                    return Err(Error::format(
                        path,
                        format!("mapped {} bytes, expected {len}", map.len()),
                    ));
                }
                Ok(Some(ExpertFile {
                    path: path.to_path_buf(),
                    file,
                    map: Some(Arc::new(map)),
                    direct: false,
                }))
            }
            IoMode::Direct => {
                let file = match OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) {
                    Ok(f) => f,
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
                    Err(e) => return Err(Error::io(path, e)),
                };
                let ef = ExpertFile {
                    path: path.to_path_buf(),
                    file,
                    map: None,
                    direct: true,
                };
                // Some filesystems accept the flag at open and refuse the reads.
                match ef.read_direct(0, len.min(DIRECT_ALIGN as u64) as usize) {
                    Ok(_) => Ok(Some(ef)),
                    Err(Error::Io { err, .. }) if err.raw_os_error() == Some(libc::EINVAL) => Ok(None),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Open `path` for plain `pread`.
    pub fn open_pread(path: &Path) -> Result<ExpertFile> {
        Ok(ExpertFile {
            path: path.to_path_buf(),
            file: File::open(path).map_err(|e| Error::io(path, e))?,
            map: None,
            direct: false,
        })
    }

    /// The `len` bytes at `off`. A mapped file hands out a view, after
    /// asking the kernel to start reading the range when `advise` (the
    /// compute that follows faults in what is not there yet).
    pub fn read(&self, off: u64, len: usize, advise: bool) -> Result<Region> {
        if let Some(map) = &self.map {
            let start = off as usize;
            if advise {
                let _ = map.advise_range(Advice::WillNeed, start, len);
            }
            return Ok(Region::new(map.clone(), start, len));
        }
        if self.direct {
            return self.read_direct(off, len);
        }
        let mut buf = AlignedBytes::zeroed(len);
        self.file
            .read_exact_at(buf.as_mut_slice(), off)
            .map_err(|e| Error::io(&self.path, e))?;
        Ok(Region::whole(Arc::new(buf)))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Read the `dst.len()` bytes at `off` into `dst` (a caller-owned
    /// buffer, e.g. pinned staging memory for device copies).
    pub fn read_into(&self, off: u64, dst: &mut [u8]) -> Result<()> {
        if let Some(map) = &self.map {
            let start = off as usize;
            dst.copy_from_slice(&map[start..start + dst.len()]);
            return Ok(());
        }
        if self.direct {
            let a = DIRECT_ALIGN;
            if (dst.as_ptr() as usize).is_multiple_of(a)
                && (off as usize).is_multiple_of(a)
                && dst.len().is_multiple_of(a)
            {
                // Aligned already (pinned staging pieces): straight in.
                let n = dst.len();
                return self.read_direct_at(off, dst, n, off + n as u64);
            }
            let r = self.read_direct(off, dst.len())?;
            dst.copy_from_slice(r.bytes());
            return Ok(());
        }
        self.file.read_exact_at(dst, off).map_err(|e| Error::io(&self.path, e))
    }

    /// `O_DIRECT` reads at `start` into `dst` (both aligned to
    /// [`DIRECT_ALIGN`]) until at least `need` bytes have come: the file
    /// may end inside the last block. `end` names the offset wanted, for
    /// the error.
    fn read_direct_at(&self, start: u64, dst: &mut [u8], need: usize, end: u64) -> Result<()> {
        let mut got = 0usize;
        while got < need {
            if !got.is_multiple_of(DIRECT_ALIGN) {
                return Err(Error::format(
                    &self.path,
                    format!(
                        "short O_DIRECT read at offset {}: the file ends early",
                        start + got as u64
                    ),
                ));
            }
            match self.file.read_at(&mut dst[got..], start + got as u64) {
                Ok(0) => {
                    return Err(Error::io(
                        &self.path,
                        std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            format!("end of file before offset {end}"),
                        ),
                    ))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(&self.path, e)),
            }
        }
        Ok(())
    }

    /// Read the aligned blocks covering `[off, off + len)` into an aligned
    /// buffer and return the requested sub-range of it.
    fn read_direct(&self, off: u64, len: usize) -> Result<Region> {
        let a = DIRECT_ALIGN as u64;
        let start = off - off % a;
        let end = (off + len as u64).div_ceil(a) * a;
        let span = (end - start) as usize;
        let need = (off + len as u64 - start) as usize;
        // One spare block so that the data can start at an aligned address.
        let mut buf = AlignedBytes::zeroed(span + DIRECT_ALIGN);
        let slice = buf.as_mut_slice();
        let pad = slice.as_ptr().align_offset(DIRECT_ALIGN);
        let dst = &mut slice[pad..pad + span];
        self.read_direct_at(start, dst, need, off + len as u64)?;
        let inner = pad + (off - start) as usize;
        Ok(Region::new(Arc::new(buf), inner, len))
    }
}
