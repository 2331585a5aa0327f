//! GGUF metadata values (`gguf_type`) and the key-value table of a file.

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A metadata array: one element type for all elements, as in the file.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    Str(Vec<String>),
    /// Arrays of arrays (allowed by the format, unused by llama.cpp).
    Arr(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::Str(v) => v.len(),
            Array::Arr(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as an integer (integer arrays only).
    pub fn int(&self, i: usize) -> Option<i128> {
        Some(match self {
            Array::U8(v) => *v.get(i)? as i128,
            Array::I8(v) => *v.get(i)? as i128,
            Array::U16(v) => *v.get(i)? as i128,
            Array::I16(v) => *v.get(i)? as i128,
            Array::U32(v) => *v.get(i)? as i128,
            Array::I32(v) => *v.get(i)? as i128,
            Array::U64(v) => *v.get(i)? as i128,
            Array::I64(v) => *v.get(i)? as i128,
            _ => return None,
        })
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// Any integer type, widened.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v as i128,
            Value::I8(v) => v as i128,
            Value::U16(v) => v as i128,
            Value::I16(v) => v as i128,
            Value::U32(v) => v as i128,
            Value::I32(v) => v as i128,
            Value::U64(v) => v as i128,
            Value::I64(v) => v as i128,
            _ => return None,
        })
    }
    /// Any number, as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_int().map(|v| v as f64),
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
    /// The type's name as GGUF spells it, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "uint8",
            Value::I8(_) => "int8",
            Value::U16(_) => "uint16",
            Value::I16(_) => "int16",
            Value::U32(_) => "uint32",
            Value::I32(_) => "int32",
            Value::F32(_) => "float32",
            Value::Bool(_) => "bool",
            Value::Str(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "uint64",
            Value::I64(_) => "int64",
            Value::F64(_) => "float64",
        }
    }
}

/// The key-value table of a GGUF file (of the first part of a split
/// model), with typed getters whose errors name the file and the key.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    pub path: PathBuf,
    pub kv: BTreeMap<String, Value>,
}

impl Metadata {
    pub fn new(path: &Path) -> Metadata {
        Metadata {
            path: path.to_path_buf(),
            kv: BTreeMap::new(),
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.kv.get(key)
    }

    fn bad(&self, key: &str, msg: impl std::fmt::Display) -> Error {
        Error::format(&self.path, format!("metadata `{key}`: {msg}"))
    }

    /// An unsigned integer that fits `usize`; `None` when absent.
    pub fn uint_opt(&self, key: &str) -> Result<Option<usize>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        match v.as_int() {
            Some(n) if n >= 0 && n <= usize::MAX as i128 => Ok(Some(n as usize)),
            Some(n) => Err(self.bad(key, format!("{n} is not a valid count"))),
            None => Err(self.bad(key, format!("expected an integer, found {}", v.type_name()))),
        }
    }
    pub fn uint(&self, key: &str) -> Result<usize> {
        self.uint_opt(key)?.ok_or_else(|| self.bad(key, "missing"))
    }
    /// A number (integer or float); `None` when absent.
    pub fn num_opt(&self, key: &str) -> Result<Option<f64>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        match v.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x)),
            Some(x) => Err(self.bad(key, format!("{x} is not finite"))),
            None => Err(self.bad(key, format!("expected a number, found {}", v.type_name()))),
        }
    }
    pub fn str_opt(&self, key: &str) -> Result<Option<&str>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        v.as_str()
            .map(Some)
            .ok_or_else(|| self.bad(key, format!("expected a string, found {}", v.type_name())))
    }
    pub fn str(&self, key: &str) -> Result<&str> {
        self.str_opt(key)?.ok_or_else(|| self.bad(key, "missing"))
    }
    pub fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        v.as_bool()
            .map(Some)
            .ok_or_else(|| self.bad(key, format!("expected a bool, found {}", v.type_name())))
    }
    pub fn array_opt(&self, key: &str) -> Result<Option<&Array>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        v.as_array()
            .map(Some)
            .ok_or_else(|| self.bad(key, format!("expected an array, found {}", v.type_name())))
    }
    /// A count that llama.cpp lets be one value or one per layer (e.g.
    /// `head_count_kv`): the value, or the array's one distinct value.
    pub fn uniform_uint_opt(&self, key: &str) -> Result<Option<usize>> {
        let Some(Value::Array(a)) = self.get(key) else {
            return self.uint_opt(key);
        };
        let first = a.int(0);
        let all_same = (0..a.len()).all(|i| a.int(i).is_some() && a.int(i) == first);
        match first {
            Some(n) if all_same && n >= 0 && n <= usize::MAX as i128 => Ok(Some(n as usize)),
            _ => Err(self.bad(
                key,
                "differs between layers (or is not a list of counts); not supported",
            )),
        }
    }
    /// An error about `key`, naming the file.
    pub fn error(&self, key: &str, msg: impl std::fmt::Display) -> Error {
        self.bad(key, msg)
    }
}
