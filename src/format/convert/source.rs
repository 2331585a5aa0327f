//! A source checkpoint directory: `config.json`, the safetensors shards
//! (one `model.safetensors`, or the files named by
//! `model.safetensors.index.json`, or every `*.safetensors`), the MLX
//! `quantization` block and the DeepSeek fp8 settings.

use super::names::{self, Name};
use crate::config::ModelConfig;
use crate::error::{read_json, Error, Result};
use crate::format::gguf::{GgmlType, GgufModel};
use crate::format::quant::check_bits;
use crate::format::safetensors::{SafetensorsFile, StDtype, TensorInfo};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

pub const INDEX_FILE: &str = "model.safetensors.index.json";

impl Loc {
    /// The name as the checkpoint spells it (GGUF: its index).
    fn name(&self) -> String {
        match self {
            Loc::Shard { name, .. } => name.clone(),
            Loc::Gguf { index, .. } => format!("GGUF tensor {index}"),
        }
    }
}

/// MLX affine quantization settings: the default and the per-module
/// overrides, keyed by module path (`model.layers.0.mlp.gate`).
#[derive(Debug, Clone, PartialEq)]
pub struct MlxQuant {
    pub bits: u32,
    pub group_size: usize,
    /// `None`: the module is left unquantized.
    pub overrides: BTreeMap<String, Option<(u32, usize)>>,
}

impl MlxQuant {
    /// `(bits, group_size)` the config gives for a module path.
    pub fn for_module(&self, path: &str) -> Option<(u32, usize)> {
        match self.overrides.get(path) {
            Some(o) => *o,
            None => Some((self.bits, self.group_size)),
        }
    }
}

/// One source tensor.
#[derive(Clone, Copy)]
pub struct Tensor<'a> {
    /// The name as the checkpoint spells it.
    pub name: &'a str,
    pub dtype: &'a StDtype,
    /// Logical shape, in elements (PyTorch order).
    pub shape: &'a [usize],
    pub data: &'a [u8],
    /// A GGUF tensor in a block format (not F32/F16/BF16): its type.
    pub ggml: Option<GgmlType>,
}

pub(super) enum Loc {
    Shard {
        shard: usize,
        name: String,
    },
    Gguf {
        /// Index in `GgufModel::tensors`.
        index: usize,
        dtype: StDtype,
        shape: Vec<usize>,
        ggml: Option<GgmlType>,
    },
}

pub struct Source {
    pub dir: PathBuf,
    /// `config.json` as read.
    pub config_json: Value,
    pub config: ModelConfig,
    pub(super) shards: Vec<SafetensorsFile>,
    /// Normalized name → where it lives.
    pub(super) tensors: BTreeMap<String, Loc>,
    /// Source tensors left out, with the reason.
    pub skipped: Vec<(String, &'static str)>,
    pub mlx: Option<MlxQuant>,
    /// fp8 block size `[rows, cols]` of `weight_scale_inv` (DeepSeek-V3).
    pub fp8_block: [usize; 2],
    /// A GGUF file (`dir` is its path); its tensors are listed in `tensors`.
    pub gguf: Option<GgufModel>,
    /// Files to write beside the weights, made from the GGUF metadata
    /// (tokenizer, chat template, generation defaults): `(name, contents)`.
    pub texts: Vec<(&'static str, String)>,
}

impl Source {
    pub fn open(dir: &Path) -> Result<Source> {
        if !dir.is_dir() {
            return Err(Error::Invalid(format!("{} is not a directory", dir.display())));
        }
        let cpath = dir.join("config.json");
        let config_json: Value = read_json(&cpath)?;
        let config = ModelConfig::from_json(&config_json)?;
        let mlx = mlx_quant(&config_json)?;
        let fp8_block = fp8_block(&config_json)?;
        let (files, index) = shard_files(dir)?;
        let mut shards = Vec::with_capacity(files.len());
        for f in &files {
            shards.push(SafetensorsFile::open(f)?);
        }
        if let Some(map) = &index {
            for (name, file) in map {
                let Some(s) = shards
                    .iter()
                    .find(|s| s.path.file_name().is_some_and(|n| n == file.as_str()))
                else {
                    continue;
                };
                if s.get(name).is_none() {
                    return Err(Error::format(
                        &s.path,
                        format!("tensor `{name}` is listed for this file in {INDEX_FILE} but is not in it"),
                    ));
                }
            }
        }
        let mut tensors: BTreeMap<String, Loc> = BTreeMap::new();
        let mut skipped = Vec::new();
        for (i, s) in shards.iter().enumerate() {
            for (raw, _) in s.tensors() {
                match names::normalize(raw, &config) {
                    Name::Skip(why) => skipped.push((raw.clone(), why)),
                    Name::Keep(n) => {
                        if let Some(prev) = tensors.get(&n) {
                            return Err(Error::format(
                                dir,
                                format!("tensors `{}` and `{raw}` are the same tensor `{n}`", prev.name()),
                            ));
                        }
                        tensors.insert(
                            n,
                            Loc::Shard {
                                shard: i,
                                name: raw.clone(),
                            },
                        );
                    }
                }
            }
        }
        Ok(Source {
            dir: dir.to_path_buf(),
            config_json,
            config,
            shards,
            tensors,
            skipped,
            mlx,
            fp8_block,
            gguf: None,
            texts: Vec::new(),
        })
    }

    /// A tensor by normalized name.
    pub fn get(&self, name: &str) -> Option<Tensor<'_>> {
        match self.tensors.get(name)? {
            Loc::Shard { shard, name } => {
                let shard = &self.shards[*shard];
                let info: &TensorInfo = shard.get(name)?;
                Some(Tensor {
                    name,
                    dtype: &info.dtype,
                    shape: &info.shape,
                    data: shard.data(info),
                    ggml: None,
                })
            }
            Loc::Gguf {
                index,
                dtype,
                shape,
                ggml,
            } => {
                let g = self.gguf.as_ref()?;
                let t = g.tensors.get(*index)?;
                Some(Tensor {
                    name: &t.info.name,
                    dtype,
                    shape,
                    data: g.data(t),
                    ggml: *ggml,
                })
            }
        }
    }

    /// Unmap the pages of source bytes that have been converted (see
    /// [`SafetensorsFile::release`]).
    pub fn release(&self, data: &[u8]) {
        for s in &self.shards {
            s.release(data);
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Normalized names of every tensor that is not skipped.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.tensors.keys()
    }

    pub fn shard_paths(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|s| s.path.as_path())
    }

    /// Bytes of the tensors that are not skipped, split into
    /// `(dense, experts)`.
    pub fn sizes(&self) -> (u64, u64) {
        let mut out = (0u64, 0u64);
        for n in self.tensors.keys() {
            let len = self.get(n).map_or(0, |t| t.data.len() as u64);
            if names::is_expert(n) {
                out.1 += len;
            } else {
                out.0 += len;
            }
        }
        out
    }
}

/// The weight map of a `model.safetensors.index.json` read from `path`
/// (named in errors): tensor name → shard file, each a plain file name of
/// the checkpoint's directory.
pub fn parse_index(bytes: &[u8], path: &Path) -> Result<BTreeMap<String, String>> {
    let index: Value = serde_json::from_slice(bytes).map_err(|err| Error::Json {
        path: path.to_path_buf(),
        err,
    })?;
    let wm = index
        .get("weight_map")
        .and_then(|w| w.as_object())
        .ok_or_else(|| Error::format(path, "no `weight_map` object"))?;
    let mut map = BTreeMap::new();
    for (k, v) in wm {
        let f = v
            .as_str()
            .ok_or_else(|| Error::format(path, format!("`weight_map.{k}` is not a file name")))?;
        let plain = matches!(
            Path::new(f).components().collect::<Vec<_>>().as_slice(),
            [std::path::Component::Normal(n)] if n.len() == f.len()
        );
        if !plain || f.contains('\\') {
            return Err(Error::format(
                path,
                format!("`weight_map.{k}`: `{f}` is not a plain file name"),
            ));
        }
        map.insert(k.clone(), f.to_string());
    }
    Ok(map)
}

/// The shard files, and the index's weight map when there is one.
#[allow(clippy::type_complexity)]
fn shard_files(dir: &Path) -> Result<(Vec<PathBuf>, Option<BTreeMap<String, String>>)> {
    let ipath = dir.join(INDEX_FILE);
    if ipath.is_file() {
        let bytes = std::fs::read(&ipath).map_err(|e| Error::io(&ipath, e))?;
        let map = parse_index(&bytes, &ipath)?;
        let files: BTreeSet<&String> = map.values().collect();
        let mut out = Vec::with_capacity(files.len());
        for f in files {
            let p = dir.join(f);
            if !p.is_file() {
                return Err(Error::format(
                    &p,
                    format!(
                        "shard missing: {INDEX_FILE} lists `{f}`, but there is no such file (incomplete download?)"
                    ),
                ));
            }
            out.push(p);
        }
        return Ok((out, Some(map)));
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok((vec![single], None));
    }
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut out = Vec::new();
    for entry in rd {
        let p = entry.map_err(|e| Error::io(dir, e))?.path();
        if p.extension().is_some_and(|x| x == "safetensors") && p.is_file() {
            out.push(p);
        }
    }
    if out.is_empty() {
        return Err(Error::format(
            dir,
            "no weights: expected model.safetensors, or shards with model.safetensors.index.json",
        ));
    }
    out.sort();
    Ok((out, None))
}

/// The object that holds `key`: the top level, or `text_config`.
fn find_obj<'a>(root: &'a Value, key: &str) -> Option<&'a Map<String, Value>> {
    root.get(key)
        .or_else(|| root.get("text_config").and_then(|t| t.get(key)))
        .and_then(|v| v.as_object())
}

fn quant_field(v: &Value, field: &str) -> Result<usize> {
    v.as_u64()
        .map(|x| x as usize)
        .ok_or_else(|| Error::config(field, format!("expected an integer, found {v}")))
}

fn check_mode(q: &Map<String, Value>, field: &str) -> Result<()> {
    match q.get("mode").and_then(|m| m.as_str()) {
        None | Some("affine") => Ok(()),
        Some(m) => Err(Error::config(
            field,
            format!("quantization mode `{m}` is not supported (only MLX `affine`)"),
        )),
    }
}

fn check_width(bits: usize, field: &str) -> Result<u32> {
    let b = bits as u32;
    if bits > 32 || !check_bits(b) {
        return Err(Error::config(
            field,
            format!("{bits}-bit quantization is not supported (moeflux reads 2, 4 or 8-bit affine MLX weights)"),
        ));
    }
    Ok(b)
}

/// The MLX `quantization` block (or an MLX-style `quantization_config`).
fn mlx_quant(root: &Value) -> Result<Option<MlxQuant>> {
    let q = match find_obj(root, "quantization") {
        Some(q) => q,
        None => match find_obj(root, "quantization_config") {
            Some(q) if q.contains_key("bits") && !q.contains_key("quant_method") => q,
            _ => return Ok(None),
        },
    };
    let field = |k: &str| format!("quantization.{k}");
    check_mode(q, "quantization.mode")?;
    let bits = check_width(
        quant_field(q.get("bits").unwrap_or(&Value::Null), "quantization.bits")?,
        "quantization.bits",
    )?;
    let group_size = quant_field(q.get("group_size").unwrap_or(&Value::Null), "quantization.group_size")?;
    let mut overrides = BTreeMap::new();
    for (k, v) in q {
        match v {
            Value::Object(o) => {
                check_mode(o, &field(&format!("{k}.mode")))?;
                let b = match o.get("bits") {
                    Some(b) => check_width(
                        quant_field(b, &field(&format!("{k}.bits")))?,
                        &field(&format!("{k}.bits")),
                    )?,
                    None => bits,
                };
                let g = match o.get("group_size") {
                    Some(g) => quant_field(g, &field(&format!("{k}.group_size")))?,
                    None => group_size,
                };
                overrides.insert(k.clone(), Some((b, g)));
            }
            Value::Bool(false) => {
                overrides.insert(k.clone(), None);
            }
            _ => {}
        }
    }
    Ok(Some(MlxQuant {
        bits,
        group_size,
        overrides,
    }))
}

/// `quantization_config` of Hugging Face checkpoints: only DeepSeek-style
/// block fp8 is read; other methods are refused by name.
fn fp8_block(root: &Value) -> Result<[usize; 2]> {
    let default = [128, 128];
    let Some(q) = find_obj(root, "quantization_config") else {
        return Ok(default);
    };
    let Some(method) = q.get("quant_method").and_then(|m| m.as_str()) else {
        return Ok(default);
    };
    if method != "fp8" {
        return Err(Error::config(
            "quantization_config.quant_method",
            format!("`{method}` checkpoints are not supported (bf16/f16/f32, DeepSeek fp8, or MLX affine)"),
        ));
    }
    if let Some(fmt) = q.get("fmt").and_then(|f| f.as_str()) {
        // DeepSeek writes `e4m3`, MiniMax-M2 the dtype's name.
        if fmt != "e4m3" && fmt != "float8_e4m3fn" {
            return Err(Error::config(
                "quantization_config.fmt",
                format!("fp8 format `{fmt}` is not supported (e4m3 / float8_e4m3fn)"),
            ));
        }
    }
    match q.get("weight_block_size") {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Array(a)) if a.len() == 2 => {
            let r = quant_field(&a[0], "quantization_config.weight_block_size")?;
            let c = quant_field(&a[1], "quantization_config.weight_block_size")?;
            if r == 0 || c == 0 {
                return Err(Error::config(
                    "quantization_config.weight_block_size",
                    "must be positive",
                ));
            }
            Ok([r, c])
        }
        Some(v) => Err(Error::config(
            "quantization_config.weight_block_size",
            format!("expected [rows, cols], found {v}"),
        )),
    }
}
