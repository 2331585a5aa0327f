//! `logprobs` in OpenAI's two shapes: chat's `{"content": [{"token",
//! "logprob", "bytes", "top_logprobs"}]}` and text completions'
//! `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`.

use crate::generate::TokenLogprob;
use crate::text::Tokenizer;
use serde_json::{json, Map, Value};

fn text(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

fn entry(tok: &Tokenizer, id: u32, logprob: f32) -> Value {
    let t = text(tok, id);
    json!({"token": t, "logprob": finite(logprob), "bytes": t.as_bytes()})
}

/// −∞ has no JSON: OpenAI's floor for "never" instead.
fn finite(lp: f32) -> f32 {
    lp.max(-9999.0)
}

/// Chat's shape.
pub fn chat(tok: &Tokenizer, lps: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|l| {
            let mut e = entry(tok, l.token, l.logprob);
            e["top_logprobs"] = l.top.iter().map(|&(id, lp)| entry(tok, id, lp)).collect();
            e
        })
        .collect();
    json!({"content": content})
}

/// Text completions' shape; `offset` is where the first token's text
/// starts in the whole answer (a stream's earlier chunks).
pub fn completion(tok: &Tokenizer, lps: &[TokenLogprob], mut offset: usize) -> Value {
    let (mut tokens, mut logprobs, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for l in lps {
        let t = text(tok, l.token);
        offsets.push(offset);
        offset += t.len();
        tokens.push(t);
        logprobs.push(finite(l.logprob));
        let top: Map<String, Value> = l
            .top
            .iter()
            .map(|&(id, lp)| (text(tok, id), json!(finite(lp))))
            .collect();
        tops.push(Value::Object(top));
    }
    json!({"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets})
}

/// A stream's log-probabilities: held until a chunk goes out to carry them.
pub struct Pending {
    tok: Tokenizer,
    held: Vec<TokenLogprob>,
    sent: usize,
}

impl Pending {
    pub fn new(tok: Tokenizer) -> Pending {
        Pending {
            tok,
            held: Vec::new(),
            sent: 0,
        }
    }

    pub fn push(&mut self, lps: Vec<TokenLogprob>) {
        self.held.extend(lps);
    }

    /// At the end: hold whatever of the whole answer's `all` is unsent.
    pub fn rest(&mut self, all: &[TokenLogprob]) {
        self.held = all.get(self.sent..).unwrap_or_default().to_vec();
    }

    /// Put the held entries on the first of `chunks` (chat's shape, or
    /// with `text_offset` from `offset` the completions' one).
    pub fn attach(&mut self, chunks: &mut [Value], completion_offset: Option<usize>) {
        let Some(first) = chunks.first_mut() else {
            return;
        };
        let v = match completion_offset {
            Some(at) => completion(&self.tok, &self.held, at),
            None => chat(&self.tok, &self.held),
        };
        first["choices"][0]["logprobs"] = v;
        self.sent += self.held.len();
        self.held.clear();
    }
}
