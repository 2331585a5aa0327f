//! Streaming detokenisation: text appears as tokens arrive, never cut
//! inside a character (byte-level BPE and byte-fallback tokens such as
//! `<0xE2>` spread one character over several tokens).
//!
//! The method is the one of Hugging Face's text-generation-inference: decode
//! a short window of recent tokens with and without the new ones and emit
//! the difference, holding it back while it ends in an incomplete UTF-8
//! sequence (which decodes to U+FFFD). Decoding a window rather than single
//! tokens keeps word-boundary spaces right for SentencePiece-style decoders.

use super::tokenizer::Tokenizer;
use crate::error::Result;

const REPLACEMENT: char = '\u{FFFD}';

/// Turns a stream of token ids into a stream of text pieces whose
/// concatenation is the decode of all the ids.
#[derive(Debug, Clone)]
pub struct Detokenizer {
    tokenizer: Tokenizer,
    skip_special: bool,
    /// The ids since `prefix_offset` was last moved (older ones are dropped).
    ids: Vec<u32>,
    /// `ids[..prefix_offset]` is context only; `ids[prefix_offset..read_offset]`
    /// has been emitted; `ids[read_offset..]` is pending.
    prefix_offset: usize,
    read_offset: usize,
}

impl Detokenizer {
    /// `skip_special` leaves special tokens out of the text.
    pub fn new(tokenizer: Tokenizer, skip_special: bool) -> Detokenizer {
        Detokenizer {
            tokenizer,
            skip_special,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// Add one token; returns the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let before = self.decode(self.prefix_offset..self.read_offset)?;
        let after = self.decode(self.prefix_offset..self.ids.len())?;
        if after.len() <= before.len() || after.ends_with(REPLACEMENT) || !after.starts_with(&before) {
            return Ok(None);
        }
        let new = after[before.len()..].to_string();
        // The emitted tokens become the context of the next window.
        let drop = self.read_offset;
        self.ids.drain(..drop);
        self.prefix_offset = 0;
        self.read_offset = self.ids.len();
        Ok(Some(new))
    }

    /// The text still held back (an incomplete character at the end of the
    /// stream comes out as U+FFFD, as a full decode would show it).
    pub fn finish(&mut self) -> Result<String> {
        let before = self.decode(self.prefix_offset..self.read_offset)?;
        let after = self.decode(self.prefix_offset..self.ids.len())?;
        self.ids.clear();
        self.prefix_offset = 0;
        self.read_offset = 0;
        Ok(match after.strip_prefix(before.as_str()) {
            Some(rest) => rest.to_string(),
            None => after,
        })
    }

    fn decode(&self, range: std::ops::Range<usize>) -> Result<String> {
        if range.is_empty() {
            return Ok(String::new());
        }
        self.tokenizer.decode(&self.ids[range], self.skip_special)
    }
}
