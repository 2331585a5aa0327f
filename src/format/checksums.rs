//! `checksums.json`: a fast checksum (XXH3-64) of every file of a packed
//! model and of every expert of each expert file, written by `convert` and
//! `synth` and checked by `inspect --verify`, so that flipped bytes are
//! found and named (the file, and the expert) instead of used silently.
//! Models packed before it existed have no such file and still open.
//!
//! ```json
//! {"algorithm": "xxh3-64",
//!  "files": {"model_weights.bin": "0123456789abcdef", ...},
//!  "experts": {"packed_experts/layer_00.bin": ["…", ...]}}
//! ```

use crate::error::{Error, Result};
use crate::format::outdir::{check_cancel, MARKER};
use crate::format::packed::{expert_file_name, Layout, EXPERTS_DIR};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

pub const CHECKSUMS_FILE: &str = "checksums.json";
pub const ALGORITHM: &str = "xxh3-64";
/// Bytes read at a time from a file that is not an expert file.
const CHUNK: usize = 8 << 20;

/// The contents of `checksums.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checksums {
    pub algorithm: String,
    /// Relative path (with `/`) → checksum, 16 hex digits.
    pub files: BTreeMap<String, String>,
    /// Expert file (relative path) → one checksum per expert.
    #[serde(default)]
    pub experts: BTreeMap<String, Vec<String>>,
}

/// What [`verify`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    /// The model has no `checksums.json` (packed before it was written).
    NoChecksums,
    /// Every file and every expert matched.
    Ok { files: usize, experts: usize },
}

fn hex(h: u64) -> String {
    format!("{h:016x}")
}

/// The checksum of the file at `path` and, when `expert_size` is given,
/// of each of its `expert_size`-byte experts.
fn hash_file(path: &Path, expert_size: Option<usize>) -> Result<(String, Vec<String>)> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut whole = Xxh3::new();
    let mut experts = Vec::new();
    let size = expert_size.unwrap_or(CHUNK).max(1);
    let mut buf = vec![0u8; size];
    loop {
        let mut got = 0;
        while got < size {
            match f.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(path, e)),
            }
        }
        if got == 0 {
            break;
        }
        whole.update(&buf[..got]);
        if expert_size.is_some() {
            experts.push(hex(xxh3_64(&buf[..got])));
        }
        if got < size {
            break;
        }
    }
    Ok((hex(whole.digest()), experts))
}

/// Every file under `dir` but `checksums.json` and the temporary marker,
/// as relative paths with `/`.
fn list_files(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let abs = dir.join(&rel);
        for e in std::fs::read_dir(&abs).map_err(|e| Error::io(&abs, e))? {
            let e = e.map_err(|err| Error::io(&abs, err))?;
            let r = rel.join(e.file_name());
            let kind = e.file_type().map_err(|err| Error::io(e.path(), err))?;
            if kind.is_dir() {
                stack.push(r);
            } else if kind.is_file() {
                let name = r.to_string_lossy().replace('\\', "/");
                if name != CHECKSUMS_FILE && name != MARKER {
                    out.push(name);
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The expert size of each expert file of the model in `dir`.
fn expert_sizes(dir: &Path) -> Result<BTreeMap<String, usize>> {
    let layout = Layout::read(dir)?;
    Ok(layout
        .layers
        .iter()
        .filter_map(|(k, l)| {
            let i = k.parse::<usize>().ok()?;
            Some((format!("{EXPERTS_DIR}/{}", expert_file_name(i)), l.expert_size))
        })
        .collect())
}

/// The checksums of every file of the packed model in `dir`.
pub fn compute(dir: &Path, cancel: Option<&AtomicBool>) -> Result<Checksums> {
    let sizes = expert_sizes(dir)?;
    let names = list_files(dir)?;
    let hashed: Vec<(String, String, Vec<String>)> = names
        .par_iter()
        .map(|name| {
            check_cancel(cancel)?;
            let (whole, experts) = hash_file(&dir.join(name), sizes.get(name).copied())?;
            Ok((name.clone(), whole, experts))
        })
        .collect::<Result<_>>()?;
    let mut sums = Checksums {
        algorithm: ALGORITHM.into(),
        files: BTreeMap::new(),
        experts: BTreeMap::new(),
    };
    for (name, whole, experts) in hashed {
        if !experts.is_empty() {
            sums.experts.insert(name.clone(), experts);
        }
        sums.files.insert(name, whole);
    }
    Ok(sums)
}

/// Compute and write `dir/checksums.json`.
pub fn write(dir: &Path, cancel: Option<&AtomicBool>) -> Result<()> {
    let sums = compute(dir, cancel)?;
    let path = dir.join(CHECKSUMS_FILE);
    let text = serde_json::to_string_pretty(&sums).map_err(|e| Error::format(&path, e.to_string()))?;
    std::fs::write(&path, text).map_err(|e| Error::io(&path, e))
}

/// `dir/checksums.json`, or `None` when the model has none.
pub fn read(dir: &Path) -> Result<Option<Checksums>> {
    let path = dir.join(CHECKSUMS_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&path, e)),
    };
    let sums: Checksums = serde_json::from_slice(&bytes).map_err(|err| Error::Json {
        path: path.clone(),
        err,
    })?;
    if sums.algorithm != ALGORITHM {
        return Err(Error::format(
            &path,
            format!("algorithm `{}`; this build checks {ALGORITHM}", sums.algorithm),
        ));
    }
    for name in sums.files.keys().chain(sums.experts.keys()) {
        let p = Path::new(name);
        if p.is_absolute() || p.components().any(|c| !matches!(c, std::path::Component::Normal(_))) {
            return Err(Error::format(&path, format!("`{name}` is not a path inside the model")));
        }
    }
    Ok(Some(sums))
}

/// Check every file (and expert) that `checksums.json` lists; the error
/// names the first that does not match (the expert, where the file has
/// per-expert checksums).
pub fn verify(dir: &Path) -> Result<Verified> {
    let Some(sums) = read(dir)? else {
        return Ok(Verified::NoChecksums);
    };
    let sizes = expert_sizes(dir)?;
    let results: Vec<Result<usize>> = sums
        .files
        .par_iter()
        .map(|(name, want)| {
            let path = dir.join(name);
            let listed = sums.experts.get(name);
            let size = listed.and(sizes.get(name).copied());
            let (whole, experts) = hash_file(&path, size)?;
            if let Some(listed) = listed {
                if let Some(i) = (0..listed.len().max(experts.len())).find(|&i| listed.get(i) != experts.get(i)) {
                    return Err(Error::format(
                        &path,
                        format!(
                            "expert {i} does not match its checksum in {CHECKSUMS_FILE} (the file is corrupt or was changed)"
                        ),
                    ));
                }
            }
            if &whole != want {
                return Err(Error::format(
                    &path,
                    format!(
                        "does not match its checksum in {CHECKSUMS_FILE} ({ALGORITHM} {whole}, recorded {want}): the file is corrupt or was changed"
                    ),
                ));
            }
            Ok(listed.map_or(0, Vec::len))
        })
        .collect();
    // The first bad file in the listing's order.
    let mut experts = 0;
    for r in results {
        experts += r?;
    }
    Ok(Verified::Ok {
        files: sums.files.len(),
        experts,
    })
}
