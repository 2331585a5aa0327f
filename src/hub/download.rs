//! One file into the cache: written to `blobs/<blob>.incomplete`, resumed
//! from its length with an HTTP `Range`, checked against the Hub's size
//! and sha256, and only then renamed to `blobs/<blob>`. A broken
//! connection is resumed up to `retries` times; a full disk or a
//! mismatch never leaves a half file under the final name.

use super::api::{Client, RemoteFile};
use super::Event;
use crate::{Error, Result};
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

const CHUNK: usize = 256 << 10;

/// Where a file is fetched from.
pub struct Source<'a> {
    pub client: &'a Client,
    pub repo: &'a str,
    pub commit: &'a str,
    pub retries: u32,
}

/// `blob` with `.incomplete` added.
pub fn incomplete(blob: &Path) -> PathBuf {
    let mut s = blob.as_os_str().to_owned();
    s.push(".incomplete");
    PathBuf::from(s)
}

/// Fetch `f` into `blob` (its final path). Progress: `Event::Bytes` for
/// every byte written, `Event::Rewind` when bytes counted before must be
/// counted again (the server ignored a `Range`).
pub fn fetch(src: &Source, f: &RemoteFile, blob: &Path, on: &mut dyn FnMut(Event)) -> Result<()> {
    let part = incomplete(blob);
    if let Some(dir) = blob.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    let mut file = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(&part)
        .map_err(|e| Error::io(&part, e))?;
    let mut have = file.metadata().map_err(|e| Error::io(&part, e))?.len();
    if have > f.size {
        file.set_len(0).map_err(|e| Error::io(&part, e))?;
        on(Event::Rewind(have));
        have = 0;
    }
    let mut hasher = Sha256::new();
    if f.sha256.is_some() && have > 0 {
        hash_prefix(&mut file, have, &mut hasher).map_err(|e| Error::io(&part, e))?;
    }
    let mut attempt = 0;
    while have < f.size {
        match receive(src, f, &mut file, &part, &mut have, &mut hasher, on) {
            Ok(()) if have >= f.size => break,
            Ok(()) => {
                let e = Error::Hub(format!(
                    "{}: the connection closed after {have} of {} bytes",
                    f.path, f.size
                ));
                retry_or(&mut attempt, src.retries, e, &f.path, on)?;
            }
            Err(Failure::Fatal(e)) => return Err(e),
            Err(Failure::Network(e)) => retry_or(&mut attempt, src.retries, e, &f.path, on)?,
        }
    }
    file.sync_all().map_err(|e| Error::io(&part, e))?;
    drop(file);
    if have != f.size {
        std::fs::remove_file(&part).ok();
        return Err(Error::Hub(format!(
            "{}: received {have} bytes, the Hub says {}; removed it, pull again",
            f.path, f.size
        )));
    }
    if let Some(want) = &f.sha256 {
        let got = hex(&hasher.finalize());
        if &got != want {
            std::fs::remove_file(&part).ok();
            return Err(Error::Hub(format!(
                "{}: sha256 {got} does not match the Hub's {want}: the download was corrupted and is removed; pull again",
                f.path
            )));
        }
    }
    std::fs::rename(&part, blob).map_err(|e| Error::io(blob, e))
}

enum Failure {
    /// The connection or the server: worth another try.
    Network(Error),
    /// The disk, or an answer that will not change.
    Fatal(Error),
}

fn retry_or(attempt: &mut u32, retries: u32, e: Error, path: &str, on: &mut dyn FnMut(Event)) -> Result<()> {
    *attempt += 1;
    if *attempt > retries {
        return Err(e);
    }
    on(Event::Retry {
        file: path,
        error: e.to_string(),
    });
    std::thread::sleep(std::time::Duration::from_millis(200 << (*attempt).min(5)));
    Ok(())
}

/// One request: from `*have` on, appended to `file` and hashed.
fn receive(
    src: &Source,
    f: &RemoteFile,
    file: &mut File,
    part: &Path,
    have: &mut u64,
    hasher: &mut Sha256,
    on: &mut dyn FnMut(Event),
) -> std::result::Result<(), Failure> {
    let dl = match src.client.download(src.repo, src.commit, &f.path, *have) {
        Ok(d) => d,
        Err(e @ Error::Hub(_)) => return Err(Failure::Network(e)),
        Err(e) => return Err(Failure::Fatal(e)),
    };
    if dl.start != *have {
        // The whole file came back: start over.
        file.set_len(0).map_err(|e| Failure::Fatal(Error::io(part, e)))?;
        on(Event::Rewind(*have));
        *have = 0;
        *hasher = Sha256::new();
    }
    let mut reader = dl.reader;
    let mut buf = vec![0u8; CHUNK];
    while *have < f.size {
        let want = CHUNK.min((f.size - *have) as usize);
        let n = match reader.read(&mut buf[..want]) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Failure::Network(Error::Hub(format!("{}: {e}", f.path)))),
        };
        file.write_all(&buf[..n])
            .map_err(|e| Failure::Fatal(disk_error(part, e)))?;
        if f.sha256.is_some() {
            hasher.update(&buf[..n]);
        }
        *have += n as u64;
        on(Event::Bytes(n as u64));
    }
    Ok(())
}

/// A write error, with what to do about a full disk.
fn disk_error(part: &Path, e: std::io::Error) -> Error {
    if e.raw_os_error() == Some(libc::ENOSPC) {
        Error::io(
            part,
            std::io::Error::new(
                e.kind(),
                format!("{e}: free some space and pull again to resume (or delete this partial file)"),
            ),
        )
    } else {
        Error::io(part, e)
    }
}

fn hash_prefix(file: &mut File, len: u64, hasher: &mut Sha256) -> std::io::Result<()> {
    file.seek(SeekFrom::Start(0))?;
    let mut r = (&*file).take(len);
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        hasher.update(&buf[..n]);
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
