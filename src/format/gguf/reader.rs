//! Parsing a GGUF header from the bytes of a file: magic `GGUF`, version
//! (2 or 3, little-endian), tensor count and key-value count (u64), the
//! key-value pairs, the tensor infos (name, dims, type, offset), then
//! padding to `general.alignment` (default 32) and the data section.
//!
//! Every length and count read from the file is checked against the bytes
//! that are left (and an absolute bound) before anything is allocated for
//! it; every tensor's size, alignment and range are checked against the
//! file. Nothing here reads tensor data.

use super::meta::{Array, Metadata, Value};
use super::types::GgmlType;
use crate::error::{Error, Result};
use std::collections::HashSet;
use std::path::Path;

pub const MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: usize = 32;
/// Tensors or key-value pairs in one file (DeepSeek-V3 has about 1,900
/// tensors).
const MAX_ENTRIES: u64 = 1 << 20;
/// Bytes of a key or a tensor name (the format allows 65,535 for keys;
/// ggml limits tensor names to 63).
const MAX_NAME: u64 = 65_535;
/// Bytes of a string value (chat templates and embedded tokenizer JSON
/// are the long ones).
const MAX_STRING: u64 = 1 << 28;
/// Elements of one array (vocabularies and merge lists are ~10^5-10^6).
const MAX_ARRAY: u64 = 1 << 26;
/// Nesting of arrays of arrays.
const MAX_DEPTH: usize = 4;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;

/// One tensor of a GGUF file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the length of a row (contiguous), the last
    /// is the outermost. A PyTorch `[out, in]` matrix is `[in, out]` here.
    pub dims: Vec<usize>,
    pub ty: GgmlType,
    /// Absolute byte offset in its file.
    pub offset: usize,
    /// Bytes of data.
    pub size: usize,
}

impl TensorInfo {
    /// The shape in PyTorch order (outermost first).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }
    /// Elements of a row (`dims[0]`).
    pub fn row_len(&self) -> usize {
        self.dims.first().copied().unwrap_or(1)
    }
    /// Rows: the product of every dim but the first.
    pub fn rows(&self) -> usize {
        self.dims.iter().skip(1).product()
    }
    /// Bytes of a row.
    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.row_len()).unwrap_or(0)
    }
}

/// A parsed GGUF header.
#[derive(Debug, Clone)]
pub struct Header {
    pub version: u32,
    pub alignment: usize,
    pub meta: Metadata,
    /// In file order.
    pub tensors: Vec<TensorInfo>,
    /// Offset of the data section (tensor offsets in the file are relative
    /// to it; [`TensorInfo::offset`] is absolute).
    pub data_start: usize,
}

/// Reads little-endian values off the front of the file's bytes; every
/// read checks the bytes left.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn left(&self) -> u64 {
        (self.b.len() - self.at) as u64
    }
    fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::format(self.path, format!("{msg}"))
    }
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.left() {
            return Err(self.err(format!(
                "{} at byte {} needs {n} bytes, {} are left: the file is truncated or corrupt",
                what(),
                self.at,
                self.left()
            )));
        }
        let s = &self.b[self.at..self.at + n as usize];
        self.at += n as usize;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N as u64, what)?);
        Ok(a)
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }
    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }
    /// A string: u64 length, then that many bytes; `max` bounds the length.
    fn string_bytes(&mut self, max: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let n = self.u64(what)?;
        if n > max {
            return Err(self.err(format!("{}: length {n} exceeds the limit of {max}", what())));
        }
        self.take(n, what)
    }
    /// A name (key or tensor name): valid UTF-8.
    fn name(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let b = self.string_bytes(MAX_NAME, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.err(format!("{} is not valid UTF-8", what())))
    }
}

/// Bytes the smallest element of a value type takes, for bounding counts.
fn min_size(ty: u32) -> u64 {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => 1,
    }
}

fn read_value(c: &mut Cursor, ty: u32, key: &str, depth: usize) -> Result<Value> {
    let what = || format!("metadata `{key}`");
    Ok(match ty {
        0 => Value::U8(c.arr::<1>(&what)?[0]),
        1 => Value::I8(c.arr::<1>(&what)?[0] as i8),
        2 => Value::U16(u16::from_le_bytes(c.arr(&what)?)),
        3 => Value::I16(i16::from_le_bytes(c.arr(&what)?)),
        4 => Value::U32(c.u32(&what)?),
        5 => Value::I32(i32::from_le_bytes(c.arr(&what)?)),
        6 => Value::F32(f32::from_le_bytes(c.arr(&what)?)),
        7 => Value::Bool(read_bool(c, key)?),
        8 => Value::Str(String::from_utf8_lossy(c.string_bytes(MAX_STRING, &what)?).into_owned()),
        9 => Value::Array(read_array(c, key, depth)?),
        10 => Value::U64(c.u64(&what)?),
        11 => Value::I64(i64::from_le_bytes(c.arr(&what)?)),
        12 => Value::F64(f64::from_le_bytes(c.arr(&what)?)),
        t => return Err(c.err(format!("metadata `{key}`: unknown value type {t}"))),
    })
}

fn read_bool(c: &mut Cursor, key: &str) -> Result<bool> {
    match c.arr::<1>(&|| format!("metadata `{key}`"))?[0] {
        0 => Ok(false),
        1 => Ok(true),
        b => Err(c.err(format!("metadata `{key}`: bool holds {b}, not 0 or 1"))),
    }
}

/// An array: element type (u32), count (u64), elements.
fn read_array(c: &mut Cursor, key: &str, depth: usize) -> Result<Array> {
    let what = || format!("metadata `{key}` (array)");
    if depth >= MAX_DEPTH {
        return Err(c.err(format!("metadata `{key}`: arrays nested deeper than {MAX_DEPTH}")));
    }
    let ty = c.u32(&what)?;
    if ty > 12 {
        return Err(c.err(format!("metadata `{key}`: array of unknown value type {ty}")));
    }
    let n = c.u64(&what)?;
    if n > MAX_ARRAY || n.saturating_mul(min_size(ty)) > c.left() {
        return Err(c.err(format!(
            "metadata `{key}`: array of {n} elements does not fit the {} bytes left (limit {MAX_ARRAY})",
            c.left()
        )));
    }
    let n = n as usize;
    macro_rules! list {
        ($variant:ident, $read:expr) => {{
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push($read);
            }
            Array::$variant(v)
        }};
    }
    Ok(match ty {
        0 => Array::U8(c.take(n as u64, &what)?.to_vec()),
        1 => Array::I8(c.take(n as u64, &what)?.iter().map(|&b| b as i8).collect()),
        2 => list!(U16, u16::from_le_bytes(c.arr(&what)?)),
        3 => list!(I16, i16::from_le_bytes(c.arr(&what)?)),
        4 => list!(U32, c.u32(&what)?),
        5 => list!(I32, i32::from_le_bytes(c.arr(&what)?)),
        6 => list!(F32, f32::from_le_bytes(c.arr(&what)?)),
        7 => list!(Bool, read_bool(c, key)?),
        8 => list!(
            Str,
            String::from_utf8_lossy(c.string_bytes(MAX_STRING, &what)?).into_owned()
        ),
        9 => list!(Arr, read_array(c, key, depth + 1)?),
        10 => list!(U64, c.u64(&what)?),
        11 => list!(I64, i64::from_le_bytes(c.arr(&what)?)),
        _ => list!(F64, f64::from_le_bytes(c.arr(&what)?)),
    })
}

/// A count of entries, bounded by the limit and by the bytes left at
/// `min_bytes` each.
fn count(c: &mut Cursor, what: &str, min_bytes: u64) -> Result<u64> {
    let n = c.u64(&|| what.to_string())?;
    if n > MAX_ENTRIES || n.saturating_mul(min_bytes) > c.left() {
        return Err(c.err(format!(
            "{what} {n} does not fit the {} bytes left (limit {MAX_ENTRIES})",
            c.left()
        )));
    }
    Ok(n)
}

/// Check the header of a GGUF file whose bytes are `file` (read from
/// `path`, named in errors).
pub fn parse(file: &[u8], path: &Path) -> Result<Header> {
    let mut c = Cursor { b: file, at: 0, path };
    let magic = c.arr::<4>(&|| "the GGUF magic".into())?;
    if &magic != MAGIC {
        return Err(c.err(format!("not a GGUF file (starts with {magic:02x?}, not \"GGUF\")")));
    }
    let version = c.u32(&|| "the version".into())?;
    match version {
        2 | 3 => {}
        1 => return Err(c.err("GGUF version 1 is not supported: convert the model again")),
        v if matches!(v.swap_bytes(), 2 | 3) => {
            return Err(c.err("a big-endian GGUF file: only little-endian files are supported"))
        }
        v => return Err(c.err(format!("unsupported GGUF version {v} (2 and 3 are read)"))),
    }
    let n_tensors = count(&mut c, "tensor count", 32)?;
    let n_kv = count(&mut c, "metadata count", 13)?;

    let mut meta = Metadata::new(path);
    for i in 0..n_kv {
        let key = c.name(&|| format!("metadata key {i}"))?;
        let ty = c.u32(&|| format!("metadata `{key}` type"))?;
        let value = read_value(&mut c, ty, &key, 0)?;
        if meta.kv.contains_key(&key) {
            return Err(c.err(format!("metadata `{key}` appears twice")));
        }
        meta.kv.insert(key, value);
    }
    let alignment = match meta.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if a.is_power_of_two() => *a as usize,
        Some(v) => return Err(meta.error("general.alignment", format!("{v:?}: expected a uint32 power of two"))),
    };

    let mut tensors = Vec::with_capacity(n_tensors.min(4096) as usize);
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        let t = read_tensor_info(&mut c, i)?;
        if !names.insert(t.name.clone()) {
            return Err(c.err(format!("tensor `{}` appears twice", t.name)));
        }
        tensors.push(t);
    }
    let data_start = c.at.div_ceil(alignment) * alignment;
    let data_len = file.len().saturating_sub(data_start);
    for t in &mut tensors {
        let bad = |msg: String| Error::format(path, format!("tensor `{}`: {msg}", t.name));
        if !t.offset.is_multiple_of(alignment) {
            return Err(bad(format!(
                "offset {} is not a multiple of the alignment {alignment}",
                t.offset
            )));
        }
        match t.offset.checked_add(t.size) {
            Some(end) if end <= data_len => {}
            _ => {
                return Err(bad(format!(
                    "data [{}, +{}) lies outside the data section ({data_len} bytes): the file is truncated or corrupt",
                    t.offset, t.size
                )))
            }
        }
        t.offset += data_start;
    }
    check_overlaps(&tensors, path)?;
    Ok(Header {
        version,
        alignment,
        meta,
        tensors,
        data_start,
    })
}

/// One tensor info: name, n_dims (u32), dims (u64 each), type (u32),
/// offset (u64, relative to the data section, kept relative here).
fn read_tensor_info(c: &mut Cursor, i: u64) -> Result<TensorInfo> {
    let name = c.name(&|| format!("tensor {i} name"))?;
    let path = c.path;
    let what = || format!("tensor `{name}`");
    let bad = |msg: String| Error::format(path, format!("tensor `{name}`: {msg}"));
    let n_dims = c.u32(&what)?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(bad(format!("{n_dims} dimensions (1 to {MAX_DIMS} are allowed)")));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64(&what)?);
    }
    let ty = GgmlType::from_u32(c.u32(&what)?);
    let offset = c.u64(&what)?;
    let Some((block_elems, block_bytes)) = ty.block() else {
        return Err(bad(format!("unknown tensor type {}", ty.number())));
    };
    let elems = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    let Some(elems) = elems.filter(|&e| e <= i64::MAX as u64) else {
        return Err(bad(format!("dims {dims:?} overflow")));
    };
    if !dims[0].is_multiple_of(block_elems as u64) {
        return Err(bad(format!(
            "rows of {} elements are not whole {} blocks of {block_elems}",
            dims[0],
            ty.name()
        )));
    }
    let size = (elems / block_elems as u64)
        .checked_mul(block_bytes as u64)
        .filter(|&s| s <= isize::MAX as u64 && offset <= isize::MAX as u64)
        .ok_or_else(|| bad(format!("dims {dims:?} of {} are too large", ty.name())))?;
    let dims: Option<Vec<usize>> = dims.iter().map(|&d| usize::try_from(d).ok()).collect();
    Ok(TensorInfo {
        name: name.clone(),
        dims: dims.ok_or_else(|| bad("dims too large".into()))?,
        ty,
        offset: offset as usize,
        size: size as usize,
    })
}

/// No two tensors may share bytes.
fn check_overlaps(tensors: &[TensorInfo], path: &Path) -> Result<()> {
    let mut by_start: Vec<&TensorInfo> = tensors.iter().filter(|t| t.size > 0).collect();
    by_start.sort_by_key(|t| t.offset);
    for w in by_start.windows(2) {
        if w[0].offset + w[0].size > w[1].offset {
            return Err(Error::format(
                path,
                format!("tensors `{}` and `{}` overlap", w[0].name, w[1].name),
            ));
        }
    }
    Ok(())
}
