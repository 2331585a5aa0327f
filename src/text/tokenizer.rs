//! `Tokenizer`: Hugging Face `tokenizers` reading the model's
//! `tokenizer.json`, plus the special tokens and EOS ids from the files
//! beside it.

use super::files::{model_config_eos_ids, GenerationDefaults, TokenizerConfig};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A loaded tokenizer. Cheap to clone (the vocabulary is shared).
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    /// The `tokenizer.json` it was read from (named in errors).
    path: PathBuf,
    bos_token: Option<String>,
    eos_token: Option<String>,
    eos_ids: Vec<u32>,
    /// Ids `[0, vocab_size)` are valid, added tokens included.
    vocab_size: usize,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size)
            .field("eos_ids", &self.eos_ids)
            .finish()
    }
}

/// The end-of-sequence ids of the model in `dir` that do not need the
/// tokenizer: `generation_config.json`'s `eos_token_id` (an int or a list),
/// else `config.json`'s.
pub fn model_eos_ids(dir: &Path) -> Result<Option<Vec<u32>>> {
    Ok(GenerationDefaults::from_dir(dir)?
        .eos_token_id
        .or(model_config_eos_ids(dir)?))
}

impl Tokenizer {
    /// Read `dir/tokenizer.json` (required) and, where present,
    /// `tokenizer_config.json`, `generation_config.json` and `config.json`.
    ///
    /// EOS ids come from `generation_config.json` `eos_token_id` (an int or a
    /// list), else `config.json`'s, else the `eos_token` of
    /// `tokenizer_config.json`.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Tokenizer> {
        let dir = dir.as_ref();
        let path = dir.join("tokenizer.json");
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let config = TokenizerConfig::from_dir(dir)?;
        Tokenizer::from_bytes(&bytes, &path, config, model_eos_ids(dir)?)
    }

    /// A tokenizer from the bytes of a `tokenizer.json` read from `path`
    /// (named in errors), its `tokenizer_config.json`, and the EOS ids of
    /// the model's other files (else the config's `eos_token`).
    pub fn from_bytes(
        bytes: &[u8],
        path: &Path,
        config: TokenizerConfig,
        eos_ids: Option<Vec<u32>>,
    ) -> Result<Tokenizer> {
        // The tokenizers crate panics on some malformed files (a decoder
        // whose fields do not parse); that is refused like any other error.
        let parsed = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(bytes)).map_err(|_| {
            Error::format(
                path,
                "not a usable tokenizer.json: the tokenizer library failed to read it",
            )
        })?;
        let inner = parsed.map_err(|e| Error::format(path, format!("not a usable tokenizer.json: {e}")))?;
        // Ids need not be dense (a WordLevel vocabulary may skip some): the
        // ids the tokenizer can produce are below the largest one + 1.
        let largest = inner
            .get_vocab(true)
            .into_values()
            .max()
            .map_or(0, |id| id as usize + 1);
        let mut tok = Tokenizer {
            vocab_size: inner.get_vocab_size(true).max(largest),
            inner: Arc::new(inner),
            path: path.to_path_buf(),
            bos_token: config.bos_token,
            eos_token: config.eos_token,
            eos_ids: Vec::new(),
        };
        tok.eos_ids = match eos_ids {
            Some(ids) => ids,
            None => tok.eos_token.iter().filter_map(|t| tok.token_to_id(t)).collect(),
        };
        Ok(tok)
    }

    /// Token ids of `text`. `add_special_tokens` applies the tokenizer's
    /// post-processor (e.g. a BOS); a rendered chat prompt already holds its
    /// special tokens and is encoded with `false`, as transformers does.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .guard("encode", || self.inner.encode(text, add_special_tokens))?
            .map_err(|e| Error::format(&self.path, format!("encode failed: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// `f` (a call into the tokenizers crate), with a panic of it (some
    /// malformed files load and then panic at use, e.g. a post-processor
    /// naming a token that is not there) turned into an error naming the
    /// file.
    fn guard<T>(&self, what: &str, f: impl FnOnce() -> T) -> Result<T> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|_| {
            Error::format(
                &self.path,
                format!("{what} failed: the tokenizer library panicked on this tokenizer.json"),
            )
        })
    }

    /// [`Tokenizer::encode`], with the byte offset in `text` where each
    /// token's text ends (0 for a token the tokenizer adds).
    pub fn encode_with_ends(&self, text: &str, add_special_tokens: bool) -> Result<(Vec<u32>, Vec<usize>)> {
        let enc = self
            .guard("encode", || self.inner.encode(text, add_special_tokens))?
            .map_err(|e| Error::format(&self.path, format!("encode failed: {e}")))?;
        let ends = enc.get_offsets().iter().map(|&(_, end)| end).collect();
        Ok((enc.get_ids().to_vec(), ends))
    }

    /// Text of `ids`; `skip_special` leaves out special tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(Error::TokenOutOfRange {
                token: bad,
                vocab: self.vocab_size,
            });
        }
        self.guard("decode", || self.inner.decode(ids, skip_special))?
            .map_err(|e| Error::format(&self.path, format!("decode failed: {e}")))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Ids that end generation.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// The bytes each token id stands for (`[vocab]`; special tokens start
    /// with `0xFF`, which no UTF-8 text holds), read again from
    /// `tokenizer.json`: what a grammar matches token ids against.
    pub fn token_bytes(&self) -> Result<Vec<Vec<u8>>> {
        let bytes = std::fs::read(&self.path).map_err(|e| Error::io(&self.path, e))?;
        let json: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| Error::Json {
            path: self.path.clone(),
            err: e,
        })?;
        llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| Error::format(&self.path, format!("cannot read the tokens as bytes: {e}")))
    }

    /// The `tokenizer.json` this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
