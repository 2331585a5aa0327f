//! Constrained decoding: a grammar (a JSON schema, any JSON object, or a
//! Lark grammar) that `llguidance` turns, token by token, into the set of
//! token ids that may come next. The generator sets the logits of every
//! other id to −∞ before sampling (SPEC.md §7), feeds the sampled token
//! back, and ends when the grammar is complete.
//!
//! ```text
//! let grammars = GrammarCompiler::new(&tokenizer)?;        // once per tokenizer
//! let c = grammars.json_schema(&schema)?;                  // per request
//! let req = Request { constraint: Some(c), ..Request::new(&prompt, params) };
//! ```

use super::Tokenizer;
use crate::error::{Error, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

/// JSON is written in one layout: `{"a": 1, "b": [2, 3]}`, no other
/// whitespace, so that a small model cannot wander off into blank space.
fn json_layout() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// Compiles grammars against one tokenizer's vocabulary. Built once (the
/// token trie of a large vocabulary takes a moment), shared by requests.
#[derive(Clone)]
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler").finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// The vocabulary of `tokenizer` as bytes; its end-of-sequence ids are
    /// what a complete grammar allows.
    pub fn new(tokenizer: &Tokenizer) -> Result<GrammarCompiler> {
        let words = tokenizer.token_bytes()?;
        let n = words.len();
        let eos: Vec<u32> = tokenizer
            .eos_ids()
            .iter()
            .copied()
            .filter(|&id| (id as usize) < n)
            .collect();
        let Some(&first) = eos.first() else {
            return Err(Error::Grammar(
                "the tokenizer has no end-of-sequence token inside its vocabulary".into(),
            ));
        };
        let info = TokRxInfo::new(n as u32, first);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(grammar)?;
        factory.quiet();
        Ok(GrammarCompiler {
            factory: Arc::new(factory),
        })
    }

    /// Any JSON object (OpenAI's `json_object`).
    pub fn json_object(&self) -> Result<Constraint> {
        self.json_schema(&json!({"type": "object"}))
    }

    /// A JSON value valid against `schema` (draft 2020-12, as far as
    /// llguidance follows it; an unknown or contradictory keyword is an
    /// error, not ignored).
    pub fn json_schema(&self, schema: &Value) -> Result<Constraint> {
        if !schema.is_object() {
            return Err(Error::Grammar("a JSON schema must be an object".into()));
        }
        let mut schema = schema.clone();
        if let Some(map) = schema.as_object_mut() {
            map.entry("x-guidance").or_insert_with(json_layout);
        }
        self.compile(TopLevelGrammar::from_json_schema(schema))
    }

    /// Text in a Lark grammar (llguidance's dialect: `%json {schema}`
    /// embeds a JSON schema, `<[ID]>` is a token by id).
    pub fn lark(&self, grammar: &str) -> Result<Constraint> {
        self.compile(TopLevelGrammar::from_lark(grammar.to_string()))
    }

    /// `text` as a Lark grammar item: a special token of the vocabulary as
    /// `<[ID]>` (grammar strings never match special tokens), else a
    /// quoted string.
    pub fn literal(&self, text: &str) -> String {
        match self.factory.tok_env().tok_trie().get_special_token(text) {
            Some(id) => format!("<[{id}]>"),
            None => Value::String(text.to_string()).to_string(),
        }
    }

    /// `schema` as a Lark grammar item (`%json {...}`), in the JSON layout
    /// of [`GrammarCompiler::json_schema`].
    pub fn lark_json(schema: &Value) -> String {
        let mut schema = schema.clone();
        if let Some(map) = schema.as_object_mut() {
            map.entry("x-guidance").or_insert_with(json_layout);
        }
        format!("%json {schema}")
    }

    fn compile(&self, g: TopLevelGrammar) -> Result<Constraint> {
        let factory = &self.factory;
        let parser = std::panic::catch_unwind(AssertUnwindSafe(|| factory.create_parser(g)))
            .map_err(|_| Error::Grammar("the grammar compiler failed".into()))?
            .map_err(grammar)?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(grammar(e));
        }
        // Some grammars compile but fail at their first token (a schema
        // that refers to itself with nothing to end it): find out now,
        // before a request that uses one is accepted.
        let first = std::panic::catch_unwind(AssertUnwindSafe(|| matcher.compute_mask().map(|_| ())))
            .map_err(|_| Error::Grammar("the grammar compiler failed".into()))?;
        first.map_err(grammar)?;
        Ok(Constraint { matcher })
    }
}

/// The longest grammar error message kept (llguidance's can hold a dump
/// of its state).
const MESSAGE_CHARS: usize = 400;

/// The first line of llguidance's message, shortened.
fn grammar(e: impl std::fmt::Display) -> Error {
    let text = e.to_string();
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
    let mut msg: String = line.chars().take(MESSAGE_CHARS).collect();
    if msg.len() < line.len() {
        msg.push('…');
    }
    Error::Grammar(msg)
}

/// One generation's grammar and how far it has got.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("complete", &self.is_complete())
            .finish_non_exhaustive()
    }
}

impl Constraint {
    /// Set the logits `[vocab]` of the ids the grammar does not allow next
    /// to −∞ (ids past the tokenizer's vocabulary never fit).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let allowed = self.matcher.compute_mask().map_err(grammar)?;
        let n = allowed.len();
        for (id, l) in logits.iter_mut().enumerate() {
            if id >= n || !allowed.is_allowed(id as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Move past `token`, which [`Constraint::mask`] allowed.
    pub fn accept(&mut self, token: u32) -> Result<()> {
        self.matcher.consume_token(token).map_err(grammar)
    }

    /// Nothing more may follow: the grammar is complete.
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_layout_is_options_llguidance_reads() {
        let opts: llguidance::JsonCompileOptions = serde_json::from_value(json_layout()).unwrap();
        assert!(!opts.whitespace_flexible);
        assert_eq!(opts.key_separator, ": ");
    }
}
