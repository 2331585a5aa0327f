//! Reading safetensors files: a little-endian u64 header length, a JSON
//! header `{NAME: {"dtype", "shape", "data_offsets": [start, end]},
//! "__metadata__": {...}}`, then the tensor data (offsets relative to the
//! end of the header). Files are memory-mapped and tensors are byte slices
//! of the map; nothing is copied.

use crate::error::{Error, Result};
use memmap2::{Mmap, UncheckedAdvice};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The largest header we accept (real ones are well under 10 MB).
const MAX_HEADER: u64 = 100 << 20;

/// Element types of safetensors files. The ones moeflux converts have
/// their own variant; anything else is kept by name so that errors can say
/// what was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StDtype {
    Bf16,
    F16,
    F32,
    /// `float8_e4m3fn` (DeepSeek-V3 fp8 weights).
    F8E4M3,
    /// Packed quantized words (MLX).
    U32,
    Other(String),
}

impl StDtype {
    fn parse(s: &str) -> StDtype {
        match s {
            "BF16" => StDtype::Bf16,
            "F16" => StDtype::F16,
            "F32" => StDtype::F32,
            "F8_E4M3" => StDtype::F8E4M3,
            "U32" => StDtype::U32,
            other => StDtype::Other(other.to_string()),
        }
    }

    pub fn name(&self) -> &str {
        match self {
            StDtype::Bf16 => "BF16",
            StDtype::F16 => "F16",
            StDtype::F32 => "F32",
            StDtype::F8E4M3 => "F8_E4M3",
            StDtype::U32 => "U32",
            StDtype::Other(s) => s,
        }
    }

    /// Bytes per element, where the format defines it.
    pub fn size(&self) -> Option<usize> {
        Some(match self.name() {
            "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" => 1,
            "BF16" | "F16" | "I16" | "U16" => 2,
            "F32" | "I32" | "U32" => 4,
            "F64" | "I64" | "U64" => 8,
            _ => return None,
        })
    }
}

/// One tensor of a safetensors file.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub dtype: StDtype,
    pub shape: Vec<usize>,
    /// Byte range in the file (absolute, header included).
    pub start: usize,
    pub end: usize,
}

impl TensorInfo {
    pub fn len(&self) -> usize {
        self.end - self.start
    }
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// An opened, memory-mapped safetensors file.
pub struct SafetensorsFile {
    pub path: PathBuf,
    map: Mmap,
    tensors: BTreeMap<String, TensorInfo>,
}

impl SafetensorsFile {
    /// Map `path` and check its header: every tensor's dtype, shape and
    /// byte range must agree and lie inside the file.
    pub fn open(path: &Path) -> Result<SafetensorsFile> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let bad = |msg: String| Error::format(path, msg);
        if file_len < 8 {
            return Err(bad(format!("{file_len} bytes: too short to be a safetensors file")));
        }
        // SAFETY: the checkpoint is opened read-only and only read; a file
        // changed by another process while we convert is outside what we
        // can guard against (the verification pass would notice).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let tensors = parse_header(&map, path)?;
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            map,
            tensors,
        })
    }

    pub fn tensors(&self) -> impl Iterator<Item = (&String, &TensorInfo)> {
        self.tensors.iter()
    }

    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    /// The bytes of a tensor of this file.
    pub fn data(&self, info: &TensorInfo) -> &[u8] {
        &self.map[info.start..info.end]
    }

    /// Unmap the pages under `data` (bytes of this file's map; anything
    /// else is ignored) once they have been used, so that resident memory
    /// stays small while a large checkpoint streams through. Touching them
    /// again reads them back from the page cache or the file.
    pub fn release(&self, data: &[u8]) {
        let base = self.map.as_ptr() as usize;
        let at = data.as_ptr() as usize;
        if data.is_empty() || at < base || at + data.len() > base + self.map.len() {
            return;
        }
        // SAFETY: the map is a read-only private mapping of a file we never
        // write, so MADV_DONTNEED only drops page-table entries: a later
        // access faults the same file bytes back in. Slices into the range
        // stay valid and see the same contents.
        let _ = unsafe {
            self.map
                .unchecked_advise_range(UncheckedAdvice::DontNeed, at - base, data.len())
        };
    }
}

/// Check the header of a safetensors file whose bytes are `file` (read
/// from `path`, named in errors): the tensors by name, with byte ranges
/// of `file` that each tensor's dtype and shape agree with.
pub fn parse_header(file: &[u8], path: &Path) -> Result<BTreeMap<String, TensorInfo>> {
    let bad = |msg: String| Error::format(path, msg);
    let file_len = file.len() as u64;
    if file.len() < 8 {
        return Err(bad(format!("{file_len} bytes: too short to be a safetensors file")));
    }
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(&file[..8]);
    let header_len = u64::from_le_bytes(len8);
    if header_len > MAX_HEADER || header_len > file_len - 8 {
        return Err(bad(format!(
            "header length {header_len} does not fit the file ({file_len} bytes): not a safetensors file, or truncated"
        )));
    }
    let data_start = 8 + header_len as usize;
    let header: Map<String, Value> = serde_json::from_slice(&file[8..data_start])
        .map_err(|e| bad(format!("safetensors header is not valid JSON: {e}")))?;
    let data_len = file.len() - data_start;
    let mut tensors = BTreeMap::new();
    for (name, v) in &header {
        if name == "__metadata__" {
            continue;
        }
        let info = parse_entry(v, data_len).map_err(|msg| bad(format!("tensor `{name}`: {msg}")))?;
        tensors.insert(
            name.clone(),
            TensorInfo {
                start: info.start + data_start,
                end: info.end + data_start,
                ..info
            },
        );
    }
    Ok(tensors)
}

/// One header entry, offsets relative to the data section.
fn parse_entry(v: &Value, data_len: usize) -> std::result::Result<TensorInfo, String> {
    let obj = v.as_object().ok_or("header entry is not an object")?;
    let dtype = obj
        .get("dtype")
        .and_then(|d| d.as_str())
        .map(StDtype::parse)
        .ok_or("missing `dtype`")?;
    let shape = obj
        .get("shape")
        .and_then(|s| s.as_array())
        .ok_or("missing `shape`")?
        .iter()
        .map(|d| d.as_u64().map(|x| x as usize).ok_or("`shape` holds a non-integer"))
        .collect::<std::result::Result<Vec<usize>, _>>()?;
    let offs = obj
        .get("data_offsets")
        .and_then(|o| o.as_array())
        .filter(|o| o.len() == 2)
        .ok_or("missing `data_offsets`")?;
    let off = |i: usize| {
        offs[i]
            .as_u64()
            .map(|x| x as usize)
            .ok_or("`data_offsets` holds a non-integer")
    };
    let (start, end) = (off(0)?, off(1)?);
    if start > end || end > data_len {
        return Err(format!(
            "data_offsets [{start}, {end}] lie outside the data section ({data_len} bytes): the file is truncated or corrupt"
        ));
    }
    if let Some(es) = dtype.size() {
        let want = shape.iter().try_fold(es, |a, &d| a.checked_mul(d));
        if want != Some(end - start) {
            return Err(format!(
                "shape {shape:?} of {} needs {} bytes, data_offsets give {}",
                dtype.name(),
                want.map(|w| w.to_string()).unwrap_or_else(|| "too many".into()),
                end - start
            ));
        }
    }
    Ok(TensorInfo {
        dtype,
        shape,
        start,
        end,
    })
}
