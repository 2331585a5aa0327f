//! The small JSON files beside `tokenizer.json`: `tokenizer_config.json`
//! (special tokens, chat template), `generation_config.json` (EOS ids and
//! default sampling) and the EOS id in `config.json`. Every one is optional;
//! a file that exists but does not parse is an error naming it.

use crate::error::{Error, Result};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// Read a JSON object file, `Ok(None)` when it does not exist.
pub(crate) fn read_optional_object(path: &Path) -> Result<Option<Map<String, Value>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(map)) => Ok(Some(map)),
        Ok(_) => Err(Error::format(path, "expected a JSON object")),
        Err(source) => Err(Error::Json {
            path: path.to_path_buf(),
            err: source,
        }),
    }
}

/// A special-token field: a plain string or an `AddedToken` object
/// (`{"content": "...", ...}`, with or without `"__type"`); `null` is absent.
fn token_field(map: &Map<String, Value>, key: &str) -> Option<String> {
    match map.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// What the text layer uses from `tokenizer_config.json`.
#[derive(Debug, Clone, Default)]
pub struct TokenizerConfig {
    pub path: PathBuf,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub unk_token: Option<String>,
    pub pad_token: Option<String>,
    /// `chat_template` as written: a string, or a list of `{name, template}`.
    pub chat_template: Option<Value>,
}

impl TokenizerConfig {
    /// `dir/tokenizer_config.json`; an empty config when the file is absent.
    pub fn from_dir(dir: &Path) -> Result<TokenizerConfig> {
        let path = dir.join("tokenizer_config.json");
        let Some(map) = read_optional_object(&path)? else {
            return Ok(TokenizerConfig {
                path,
                ..TokenizerConfig::default()
            });
        };
        Ok(TokenizerConfig::from_map(&map, path))
    }

    /// Parse the bytes of a `tokenizer_config.json` read from `path`.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<TokenizerConfig> {
        match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(map)) => Ok(TokenizerConfig::from_map(&map, path.to_path_buf())),
            Ok(_) => Err(Error::format(path, "expected a JSON object")),
            Err(err) => Err(Error::Json {
                path: path.to_path_buf(),
                err,
            }),
        }
    }

    fn from_map(map: &Map<String, Value>, path: PathBuf) -> TokenizerConfig {
        TokenizerConfig {
            bos_token: token_field(map, "bos_token"),
            eos_token: token_field(map, "eos_token"),
            unk_token: token_field(map, "unk_token"),
            pad_token: token_field(map, "pad_token"),
            chat_template: map.get("chat_template").filter(|v| !v.is_null()).cloned(),
            path,
        }
    }

    /// The special tokens a chat template sees as variables, as transformers
    /// passes them (`bos_token`, `eos_token`, `unk_token`, `pad_token`).
    pub fn special_tokens(&self) -> Vec<(&'static str, String)> {
        let fields = [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
            ("unk_token", &self.unk_token),
            ("pad_token", &self.pad_token),
        ];
        fields
            .into_iter()
            .filter_map(|(k, v)| v.clone().map(|v| (k, v)))
            .collect()
    }
}

/// `eos_token_id` as written: an integer or a list of integers.
fn eos_ids_field(map: &Map<String, Value>, path: &Path) -> Result<Option<Vec<u32>>> {
    let bad = || Error::format(path, "`eos_token_id` must be an integer or a list of integers");
    let as_id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(bad);
    match map.get("eos_token_id") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items.iter().map(as_id).collect::<Result<_>>().map(Some),
        Some(v) => Ok(Some(vec![as_id(v)?])),
    }
}

/// The EOS id in `config.json` (top level or `text_config`), when present.
pub(crate) fn model_config_eos_ids(dir: &Path) -> Result<Option<Vec<u32>>> {
    let path = dir.join("config.json");
    let Some(map) = read_optional_object(&path)? else {
        return Ok(None);
    };
    if let Some(ids) = eos_ids_field(&map, &path)? {
        return Ok(Some(ids));
    }
    match map.get("text_config") {
        Some(Value::Object(text)) => eos_ids_field(text, &path),
        _ => Ok(None),
    }
}

/// `generation_config.json`: EOS ids and the model authors' default sampling.
/// Every field is optional; an absent file gives all `None`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    pub eos_token_id: Option<Vec<u32>>,
    /// `false` means greedy decoding (the sampling fields are then ignored).
    pub do_sample: Option<bool>,
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub max_new_tokens: Option<usize>,
}

impl GenerationDefaults {
    /// `dir/generation_config.json`, or all `None` when it is absent.
    pub fn from_dir(dir: &Path) -> Result<GenerationDefaults> {
        let path = dir.join("generation_config.json");
        match std::fs::read(&path) {
            Ok(bytes) => GenerationDefaults::parse(&bytes, &path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(GenerationDefaults::default()),
            Err(e) => Err(Error::io(&path, e)),
        }
    }

    /// Parse the bytes of a `generation_config.json` read from `path`
    /// (named in every error, with the key at fault).
    pub fn parse(bytes: &[u8], path: &Path) -> Result<GenerationDefaults> {
        match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(map)) => GenerationDefaults::from_map(&map, path),
            Ok(_) => Err(Error::format(path, "expected a JSON object")),
            Err(err) => Err(Error::Json {
                path: path.to_path_buf(),
                err,
            }),
        }
    }

    fn from_map(map: &Map<String, Value>, path: &Path) -> Result<GenerationDefaults> {
        // Each number with the range it must lie in (what sampling accepts).
        let float = |key: &str| -> Result<Option<f32>> {
            let (ok, want): (fn(f32) -> bool, &str) = match key {
                "temperature" => (|x| x >= 0.0, "a number ≥ 0"),
                "top_p" => (|x| x > 0.0 && x <= 1.0, "a number in (0, 1]"),
                "min_p" => (|x| (0.0..=1.0).contains(&x), "a number in [0, 1]"),
                _ => (|x| x > 0.0, "a number > 0"),
            };
            match map.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(|x| x as f32)
                    .filter(|&x| x.is_finite() && ok(x))
                    .map(Some)
                    .ok_or_else(|| Error::format(path, format!("`{key}` must be {want}, found {v}"))),
            }
        };
        let count = |key: &str| -> Result<Option<usize>> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .map(Some)
                    .ok_or_else(|| Error::format(path, format!("`{key}` must be a non-negative integer"))),
            }
        };
        let do_sample = match map.get("do_sample") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(_) => return Err(Error::format(path, "`do_sample` must be true or false")),
        };
        Ok(GenerationDefaults {
            eos_token_id: eos_ids_field(map, path)?,
            do_sample,
            temperature: float("temperature")?,
            top_k: count("top_k")?,
            top_p: float("top_p")?,
            min_p: float("min_p")?,
            repetition_penalty: float("repetition_penalty")?,
            max_new_tokens: count("max_new_tokens")?,
        })
    }
}
