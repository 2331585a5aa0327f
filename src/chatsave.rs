//! The chat save file (`moeflux chat`'s `/save` and `/load`): a
//! conversation and the session state that continues it.
//!
//! Little-endian: the magic `MFLXCHAT`, a u32 version, a u64 length `n`,
//! `n` bytes of JSON `{"model": str, "messages": [{"role": str, ...}],
//! "tokens": [u32]}`, the session's MFLX snapshot (SPEC.md §4), and, from
//! version 2, a u32 CRC-32 of everything before it. Version 1 (no
//! checksum) is still read.

use crate::checksum::{crc32, split_trailer};
use crate::error::{Error, Result};
use crate::session::Session;
use serde_json::{Map, Value};
use std::path::Path;

pub const MAGIC: &[u8; 8] = b"MFLXCHAT";
/// The version written.
pub const VERSION: u32 = 2;
/// Magic, version and JSON length.
const HEAD: usize = 8 + 4 + 8;

/// A decoded save; `state` borrows the snapshot bytes of the buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatSave<'a> {
    pub version: u32,
    pub model: String,
    pub messages: Vec<Value>,
    pub tokens: Vec<u32>,
    pub state: &'a [u8],
}

/// The bytes of a save of `messages` whose rendered tokens the session
/// holds (`tokens`, as many as its positions).
pub fn encode(session: &Session<'_>, messages: &[Value], tokens: &[u32]) -> Result<Vec<u8>> {
    let meta = serde_json::json!({
        "model": session.model().name(),
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
    Ok(ChatSave {
        version,
        model: model_field(meta).map_err(bad)?,
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
    session
        .load_conversation(save.state, &save.tokens)
        .map_err(|e| Error::format(path, format!("session state: {e}")))?;
    Ok(save)
}

/// Write `bytes` to a temporary file beside `path`, then rename it over
/// `path`: a failed save leaves an earlier file whole.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| Error::Invalid(format!("{}: not a file name", path.display())))?;
    let mut tmp_name = name.to_os_string();
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    std::fs::write(&tmp, bytes).map_err(|e| Error::io(&tmp, e))?;
    if let Err(e) = std::fs::rename(&tmp, path) {
        std::fs::remove_file(&tmp).ok();
        return Err(Error::io(path, e));
    }
    Ok(())
}
