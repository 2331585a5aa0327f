//! The chat save file (`moeflux chat`'s `/save` and `/load`): a
//! conversation and the session state that continues it.
//!
//! Little-endian: the magic `MFLXCHAT`, a u32 version, a u64 length `n`,
//! `n` bytes of JSON `{"model": str, "identity": str, "messages": [{"role":
//! str, ...}], "tokens": [u32]}`, the session's MFLX snapshot (SPEC.md
//! §4), and, from version 2, a u32 CRC-32 of everything before it. Version
//! 1 (no checksum) is still read. `identity` ([`Model::identity`]) is
//! compared with the model a save is loaded into; saves written before it
//! existed have none and load into any model that accepts their state.

use crate::checksum::{crc32, split_trailer};
use crate::engine::Model;
use crate::error::{Error, Result};
use crate::session::Session;
use serde_json::{Map, Value};
use std::io::{Read, Write};
use std::path::Path;

pub const MAGIC: &[u8; 8] = b"MFLXCHAT";
/// The version written.
pub const VERSION: u32 = 2;
/// Magic, version and JSON length.
const HEAD: usize = 8 + 4 + 8;
/// The longest conversation JSON read.
pub const MAX_JSON: u64 = 256 << 20;

/// A decoded save; `state` borrows the snapshot bytes of the buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatSave<'a> {
    pub version: u32,
    pub model: String,
    /// The identity of the model that wrote it (absent in older saves).
    pub identity: Option<String>,
    pub messages: Vec<Value>,
    pub tokens: Vec<u32>,
    pub state: &'a [u8],
}

/// The bytes of a save of `messages` whose rendered tokens the session
/// holds (`tokens`, as many as its positions).
pub fn encode(session: &Session<'_>, messages: &[Value], tokens: &[u32]) -> Result<Vec<u8>> {
    let meta = serde_json::json!({
        "model": session.model().name(),
        "identity": session.model().identity(),
        "messages": messages,
        "tokens": tokens,
    });
    let meta = serde_json::to_vec(&meta).map_err(|e| Error::Invalid(format!("chat save: {e}")))?;
    let mut buf = Vec::with_capacity(HEAD + meta.len() + session.state_size() + 4);
    buf.extend_from_slice(MAGIC);
    buf.extend_from_slice(&VERSION.to_le_bytes());
    buf.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    buf.extend_from_slice(&meta);
    session.save_state(&mut buf)?;
    let crc = crc32(&buf);
    buf.extend_from_slice(&crc.to_le_bytes());
    Ok(buf)
}

/// Check and decode the bytes of a save read from `path` (named in errors).
/// The snapshot itself is checked when it is loaded.
pub fn decode<'a>(buf: &'a [u8], path: &Path) -> Result<ChatSave<'a>> {
    let bad = |msg: String| Error::format(path, msg);
    if buf.len() < HEAD || &buf[..8] != MAGIC {
        return Err(bad("not a moeflux chat save (no MFLXCHAT header)".into()));
    }
    let version = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]);
    let body = match version {
        1 => buf,
        2 => {
            let (body, stored) = split_trailer(buf).ok_or_else(|| bad("truncated before its checksum".into()))?;
            let actual = crc32(body);
            if actual != stored {
                return Err(bad(format!(
                    "checksum mismatch (stored {stored:08x}, computed {actual:08x}): the file is corrupt"
                )));
            }
            body
        }
        v => return Err(bad(format!("chat save version {v}; this build reads 1 and 2"))),
    };
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(&buf[12..HEAD]);
    let meta_len = u64::from_le_bytes(len8);
    let meta_end = usize::try_from(meta_len)
        .ok()
        .and_then(|n| n.checked_add(HEAD))
        .filter(|&end| end <= body.len())
        .ok_or_else(|| {
            bad(format!(
                "conversation length {meta_len} runs past the end of the file ({} bytes)",
                buf.len()
            ))
        })?;
    let meta: Value =
        serde_json::from_slice(&body[HEAD..meta_end]).map_err(|e| bad(format!("conversation JSON: {e}")))?;
    let meta = meta
        .as_object()
        .ok_or_else(|| bad("conversation JSON is not an object".into()))?;
    let identity = match meta.get("identity") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => return Err(bad(format!("`identity` must be a string, found {}", kind(v)))),
    };
    Ok(ChatSave {
        version,
        model: model_field(meta).map_err(bad)?,
        identity,
        messages: messages_field(meta).map_err(bad)?,
        tokens: tokens_field(meta).map_err(bad)?,
        state: &body[meta_end..],
    })
}

fn model_field(meta: &Map<String, Value>) -> std::result::Result<String, String> {
    match meta.get("model") {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(format!("`model` must be a string, found {}", kind(v))),
        None => Err("`model` is missing".into()),
    }
}

fn messages_field(meta: &Map<String, Value>) -> std::result::Result<Vec<Value>, String> {
    let list = match meta.get("messages") {
        Some(Value::Array(a)) => a,
        Some(v) => return Err(format!("`messages` must be a list, found {}", kind(v))),
        None => return Err("`messages` is missing".into()),
    };
    for (i, m) in list.iter().enumerate() {
        match m.get("role") {
            Some(Value::String(_)) => {}
            _ => return Err(format!("`messages[{i}]` is not an object with a string `role`")),
        }
    }
    Ok(list.clone())
}

fn tokens_field(meta: &Map<String, Value>) -> std::result::Result<Vec<u32>, String> {
    let list = match meta.get("tokens") {
        Some(Value::Array(a)) => a,
        Some(v) => return Err(format!("`tokens` must be a list, found {}", kind(v))),
        None => return Err("`tokens` is missing".into()),
    };
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            t.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| format!("`tokens[{i}]` is {t}, not a token id"))
        })
        .collect()
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Decode a save and load its state into `session`. Everything is checked
/// first (header, checksum, JSON, token ids, that the state holds as many
/// positions as there are tokens): on error the session is exactly as it
/// was. On success the session holds the conversation's tokens.
pub fn load<'a>(session: &mut Session<'_>, buf: &'a [u8], path: &Path) -> Result<ChatSave<'a>> {
    let save = decode(buf, path)?;
    let this = session.model().identity();
    if let Some(saved) = save.identity.as_deref().filter(|&id| id != this) {
        return Err(Error::format(
            path,
            format!("saved from another model ({saved}); this model is {this}"),
        ));
    }
    session
        .load_conversation(save.state, &save.tokens)
        .map_err(|e| Error::format(path, format!("session state: {e}")))?;
    Ok(save)
}

/// Read the save at `path` for a session over `model`, bounded: the
/// header is read and checked first (magic, version, the conversation's
/// declared length), then at most as many bytes as a save of this model
/// can hold (its state at a full context); anything longer is refused
/// before it is read.
pub fn read_file(model: &Model, path: &Path) -> Result<Vec<u8>> {
    let bad = |msg: String| Error::format(path, msg);
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut head = [0u8; HEAD];
    let mut got = 0;
    while got < HEAD {
        match f.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io(path, e)),
        }
    }
    if got < HEAD || &head[..8] != MAGIC {
        return Err(bad("not a moeflux chat save (no MFLXCHAT header)".into()));
    }
    let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    if !(1..=VERSION).contains(&version) {
        return Err(bad(format!("chat save version {version}; this build reads 1 and 2")));
    }
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(&head[12..HEAD]);
    let meta_len = u64::from_le_bytes(len8);
    if meta_len > MAX_JSON {
        return Err(bad(format!(
            "conversation length {meta_len} is over the limit of {MAX_JSON} bytes"
        )));
    }
    let limit = (HEAD as u64 + 4)
        .saturating_add(meta_len)
        .saturating_add(model.state_size(model.n_ctx()) as u64);
    let mut buf = head.to_vec();
    f.take(limit.saturating_sub(HEAD as u64).saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|e| Error::io(path, e))?;
    if buf.len() as u64 > limit {
        return Err(bad(format!(
            "longer than a save of this model can be ({limit} bytes at most)"
        )));
    }
    Ok(buf)
}

/// Write `bytes` to a new temporary file beside `path` (an unpredictable
/// name, created exclusively, so never through a link someone planted),
/// then rename it over `path` (replacing a link there, not writing through
/// it): a failed save leaves an earlier file whole and no temporary file.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| Error::Invalid(format!("{}: not a file name", path.display())))?;
    let (tmp, mut file) = create_temp(path, name)?;
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io(&tmp, e));
    drop(file);
    let done = written.and_then(|()| std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e)));
    if done.is_err() {
        std::fs::remove_file(&tmp).ok();
    }
    done
}

/// A new file `.NAME.<random>.tmp` beside `path`, created with `O_EXCL`.
fn create_temp(path: &Path, name: &std::ffi::OsStr) -> Result<(std::path::PathBuf, std::fs::File)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut last = None;
    for _ in 0..16 {
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{:016x}.tmp", crate::text::Rng::entropy_seed()));
        let tmp = path.with_file_name(tmp_name);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
        {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some((tmp, e)),
            Err(e) => return Err(Error::io(&tmp, e)),
        }
    }
    let (tmp, e) = last.ok_or_else(|| Error::Invalid("no temporary name".into()))?;
    Err(Error::io(tmp, e))
}
