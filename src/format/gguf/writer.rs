//! A small GGUF writer (version 3, little-endian): metadata and tensors
//! whose bytes are already in their block format. For tests, fixtures and
//! tools; the engine only reads.

use super::meta::{Array, Value};
use super::reader::{DEFAULT_ALIGNMENT, MAGIC};
use super::types::GgmlType;

/// A GGUF file being put together in memory.
#[derive(Debug, Default)]
pub struct GgufWriter {
    kv: Vec<(String, Value)>,
    /// Name, ggml-order dims, type, bytes.
    tensors: Vec<(String, Vec<usize>, GgmlType, Vec<u8>)>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::Str(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn array_type_id(a: &Array) -> u32 {
    match a {
        Array::U8(_) => 0,
        Array::I8(_) => 1,
        Array::U16(_) => 2,
        Array::I16(_) => 3,
        Array::U32(_) => 4,
        Array::I32(_) => 5,
        Array::F32(_) => 6,
        Array::Bool(_) => 7,
        Array::Str(_) => 8,
        Array::Arr(_) => 9,
        Array::U64(_) => 10,
        Array::I64(_) => 11,
        Array::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::Str(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&array_type_id(a).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr, $f:expr) => {
            for x in $v {
                #[allow(clippy::redundant_closure_call)]
                $f(out, x);
            }
        };
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => out.extend(v.iter().map(|&x| x as u8)),
        Array::U16(v) => each!(v, |o: &mut Vec<u8>, x: &u16| o.extend_from_slice(&x.to_le_bytes())),
        Array::I16(v) => each!(v, |o: &mut Vec<u8>, x: &i16| o.extend_from_slice(&x.to_le_bytes())),
        Array::U32(v) => each!(v, |o: &mut Vec<u8>, x: &u32| o.extend_from_slice(&x.to_le_bytes())),
        Array::I32(v) => each!(v, |o: &mut Vec<u8>, x: &i32| o.extend_from_slice(&x.to_le_bytes())),
        Array::F32(v) => each!(v, |o: &mut Vec<u8>, x: &f32| o.extend_from_slice(&x.to_le_bytes())),
        Array::Bool(v) => out.extend(v.iter().map(|&x| x as u8)),
        Array::Str(v) => each!(v, |o: &mut Vec<u8>, x: &String| put_str(o, x)),
        Array::Arr(v) => each!(v, |o: &mut Vec<u8>, x: &Array| put_array(o, x)),
        Array::U64(v) => each!(v, |o: &mut Vec<u8>, x: &u64| o.extend_from_slice(&x.to_le_bytes())),
        Array::I64(v) => each!(v, |o: &mut Vec<u8>, x: &i64| o.extend_from_slice(&x.to_le_bytes())),
        Array::F64(v) => each!(v, |o: &mut Vec<u8>, x: &f64| o.extend_from_slice(&x.to_le_bytes())),
    }
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Add a key (in order; the writer does not check for duplicates, so
    /// that tests can write bad files).
    pub fn kv(&mut self, key: &str, value: Value) -> &mut Self {
        self.kv.push((key.to_string(), value));
        self
    }

    /// Add a tensor: `dims` in ggml order (row length first), `data` the
    /// bytes of its blocks.
    pub fn tensor(&mut self, name: &str, dims: &[usize], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        self.tensors.push((name.to_string(), dims.to_vec(), ty, data));
        self
    }

    /// The file's bytes, with tensors aligned to `general.alignment` when
    /// that key was added as a uint32, else 32.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self
            .kv
            .iter()
            .find_map(|(k, v)| match v {
                Value::U32(a) if k == "general.alignment" && a.is_power_of_two() => Some(*a as usize),
                _ => None,
            })
            .unwrap_or(DEFAULT_ALIGNMENT);
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_str(&mut out, k);
            out.extend_from_slice(&type_id(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut at = 0usize;
        for (name, dims, ty, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&(*d as u64).to_le_bytes());
            }
            out.extend_from_slice(&ty.number().to_le_bytes());
            out.extend_from_slice(&(at as u64).to_le_bytes());
            at = (at + data.len()).div_ceil(align) * align;
        }
        out.resize(out.len().div_ceil(align) * align, 0);
        for (_, _, _, data) in &self.tensors {
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(align) * align, 0);
        }
        out
    }
}
