//! The text files of a GGUF model: a Hugging Face `tokenizer.json` built
//! from `tokenizer.ggml.*` (GPT-2-style byte-level BPE: tokens, types,
//! merges, and the pre-tokenizer that `tokenizer.ggml.pre` names, with
//! the regexes llama.cpp uses for it), a `tokenizer_config.json` (special
//! tokens, chat template) and a `generation_config.json` (special ids,
//! `general.sampling.*` defaults).

use super::meta::{Array, Metadata};
use crate::error::Result;
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// llama.cpp's token types (`llama_token_type`).
const CONTROL: i128 = 3;
const USER_DEFINED: i128 = 4;

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const DEEPSEEK3: [&str; 3] = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];
const O200K: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// llama.cpp's `default` (and a missing `tokenizer.ggml.pre`).
const DEFAULT: [&str; 4] = [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"];

/// The `tokenizer.ggml.pre` names understood.
pub const PRE_TOKENIZERS: &str = "default, gpt-2, llama3 / llama-bpe, qwen2, qwen35, deepseek-v3, gpt-4o / llama4, minimax-m2, glm4 (and their llama.cpp aliases)";

/// The split regexes of a `tokenizer.ggml.pre` (applied one after the
/// other, each splitting the pieces of the last, as llama.cpp does), and
/// whether BPE skips merges for words that are whole tokens.
fn pre_regexes(pre: &str) -> Option<(Vec<&'static str>, bool)> {
    Some(match pre {
        "default" => (DEFAULT.to_vec(), false),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum"
        | "exaone4" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" => (vec![GPT2], false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" => {
            (vec![LLAMA3], true)
        }
        "dbrx" | "smaug-bpe" | "glm4" | "chatglm-bpe" => (vec![LLAMA3], false),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "megrez" | "stablelm2" | "hunyuan" => (vec![QWEN2], false),
        "qwen35" => (vec![QWEN35], false),
        "deepseek-v3" | "hunyuan-dense" => (DEEPSEEK3.to_vec(), false),
        "gpt-4o" | "llama4" | "minimax-m2" => (vec![O200K], false),
        _ => return None,
    })
}

fn byte_level(use_regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": use_regex})
}

/// The strings of `tokenizer.ggml.tokens`.
fn tokens(meta: &Metadata) -> Result<&[String]> {
    match meta.array_opt("tokenizer.ggml.tokens")? {
        Some(Array::Str(t)) if !t.is_empty() => Ok(t),
        Some(_) => Err(meta.error("tokenizer.ggml.tokens", "expected a non-empty list of strings")),
        None => Err(meta.error("tokenizer.ggml.tokens", "missing: the file has no vocabulary")),
    }
}

/// A special token id that must name a token.
fn token_id(meta: &Metadata, key: &str, n: usize) -> Result<Option<usize>> {
    match meta.uint_opt(key)? {
        Some(id) if id >= n => Err(meta.error(key, format!("{id} is outside the vocabulary of {n}"))),
        id => Ok(id),
    }
}

/// `tokenizer.json` of a GGUF model with a GPT-2-style BPE vocabulary.
pub fn tokenizer_json(meta: &Metadata) -> Result<Value> {
    let model = meta.str_opt("tokenizer.ggml.model")?.unwrap_or("");
    if model != "gpt2" {
        return Err(meta.error(
            "tokenizer.ggml.model",
            format!("`{model}`: only GPT-2-style BPE vocabularies (`gpt2`) are read so far"),
        ));
    }
    let pre = meta.str_opt("tokenizer.ggml.pre")?.unwrap_or("default");
    let Some((regexes, ignore_merges)) = pre_regexes(pre) else {
        return Err(meta.error(
            "tokenizer.ggml.pre",
            format!("`{pre}` is not a pre-tokenizer moeflux knows; known: {PRE_TOKENIZERS}"),
        ));
    };
    let toks = tokens(meta)?;
    let types = meta.array_opt("tokenizer.ggml.token_type")?;
    if let Some(t) = types.filter(|t| t.len() != toks.len()) {
        return Err(meta.error(
            "tokenizer.ggml.token_type",
            format!("{} types for {} tokens", t.len(), toks.len()),
        ));
    }
    let mut vocab = Map::new();
    let mut seen = HashMap::new();
    let mut added = vec![];
    for (id, tok) in toks.iter().enumerate() {
        if let Some(first) = seen.insert(tok.as_str(), id) {
            return Err(meta.error(
                "tokenizer.ggml.tokens",
                format!("`{tok}` is token {first} and token {id}"),
            ));
        }
        vocab.insert(tok.clone(), json!(id));
        let ty = types.and_then(|t| t.int(id)).unwrap_or(1);
        if ty == CONTROL || ty == USER_DEFINED {
            added.push(json!({
                "id": id, "content": tok, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": ty == CONTROL,
            }));
        }
    }
    let merges: Vec<Value> = match meta.array_opt("tokenizer.ggml.merges")? {
        None => vec![],
        Some(Array::Str(m)) => m
            .iter()
            .enumerate()
            // Split at the first space after the first character (a space
            // can itself be a token), as llama.cpp does.
            .map(|(i, m)| match m.char_indices().skip(1).find(|c| c.1 == ' ') {
                Some((at, _)) => Ok(json!([&m[..at], &m[at + 1..]])),
                None => Err(meta.error("tokenizer.ggml.merges", format!("merge {i} `{m}` is not two tokens"))),
            })
            .collect::<Result<_>>()?,
        Some(_) => return Err(meta.error("tokenizer.ggml.merges", "expected a list of strings")),
    };
    let pre_tokenizer = if regexes == [GPT2] {
        byte_level(true)
    } else {
        let mut seq: Vec<Value> = regexes
            .iter()
            .map(|r| json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false}))
            .collect();
        seq.push(byte_level(false));
        json!({"type": "Sequence", "pretokenizers": seq})
    };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor(meta, toks)?,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges,
        },
    }))
}

/// BOS / EOS added around each sequence where the file asks for them.
fn post_processor(meta: &Metadata, toks: &[String]) -> Result<Value> {
    let n = toks.len();
    let bos = token_id(meta, "tokenizer.ggml.bos_token_id", n)?
        .filter(|_| meta.bool_opt("tokenizer.ggml.add_bos_token").ok().flatten() == Some(true));
    let eos = token_id(meta, "tokenizer.ggml.eos_token_id", n)?
        .filter(|_| meta.bool_opt("tokenizer.ggml.add_eos_token").ok().flatten() == Some(true));
    if bos.is_none() && eos.is_none() {
        return Ok(Value::Null);
    }
    let special = |id: usize| json!({"SpecialToken": {"id": toks[id], "type_id": 0}});
    let seq = |s: &str| json!({"Sequence": {"id": s, "type_id": 0}});
    let (mut single, mut pair, mut specials) = (vec![], vec![], Map::new());
    for (part, id) in [(0, bos), (1, eos)] {
        let Some(id) = id else { continue };
        specials.insert(
            toks[id].clone(),
            json!({"id": toks[id], "ids": [id], "tokens": [toks[id]]}),
        );
        if part == 0 {
            single.push(special(id));
            pair.push(special(id));
        }
    }
    single.push(seq("A"));
    pair.push(seq("A"));
    pair.push(seq("B"));
    if let Some(id) = eos {
        single.push(special(id));
        pair.push(special(id));
    }
    Ok(json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials}))
}

/// The chat template (`tokenizer.chat_template`).
pub fn chat_template(meta: &Metadata) -> Result<Option<String>> {
    Ok(meta.str_opt("tokenizer.chat_template")?.map(str::to_string))
}

/// `tokenizer_config.json`: the special tokens by text, whether BOS is
/// added, and the chat template.
pub fn tokenizer_config(meta: &Metadata) -> Result<Value> {
    let toks = tokens(meta)?;
    let mut c = Map::new();
    for (field, key) in [
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id"),
        ("pad_token", "tokenizer.ggml.padding_token_id"),
    ] {
        let v = token_id(meta, key, toks.len())?.map(|id| json!(toks[id]));
        c.insert(field.into(), v.unwrap_or(Value::Null));
    }
    c.insert(
        "add_bos_token".into(),
        json!(meta.bool_opt("tokenizer.ggml.add_bos_token")?.unwrap_or(false)),
    );
    if let Some(t) = chat_template(meta)? {
        c.insert("chat_template".into(), json!(t));
    }
    Ok(Value::Object(c))
}

/// `generation_config.json`: BOS, the end-of-generation ids (EOS, EOT,
/// EOM), padding, and the sampling defaults of `general.sampling.*`.
pub fn generation_config(meta: &Metadata) -> Result<Value> {
    let n = tokens(meta)?.len();
    let mut c = Map::new();
    if let Some(id) = token_id(meta, "tokenizer.ggml.bos_token_id", n)? {
        c.insert("bos_token_id".into(), json!(id));
    }
    let mut eos = vec![];
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(id) = token_id(meta, key, n)?.filter(|id| !eos.contains(id)) {
            eos.push(id);
        }
    }
    match eos.len() {
        0 => {}
        1 => {
            c.insert("eos_token_id".into(), json!(eos[0]));
        }
        _ => {
            c.insert("eos_token_id".into(), json!(eos));
        }
    }
    if let Some(id) = token_id(meta, "tokenizer.ggml.padding_token_id", n)? {
        c.insert("pad_token_id".into(), json!(id));
    }
    for (key, field) in [
        ("general.sampling.temp", "temperature"),
        ("general.sampling.top_k", "top_k"),
        ("general.sampling.top_p", "top_p"),
        ("general.sampling.min_p", "min_p"),
        ("general.sampling.penalty_repeat", "repetition_penalty"),
    ] {
        if let Some(v) = meta.num_opt(key)? {
            let v = if field == "top_k" {
                json!(v as i64)
            } else {
                json!((v as f32).to_string().parse::<f64>().unwrap_or(v))
            };
            c.insert(field.into(), v);
        }
    }
    Ok(Value::Object(c))
}
