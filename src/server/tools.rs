//! Tool calls: the request's `tools` and `tool_choice`, and the calls a
//! model writes, parsed out of its answer into OpenAI `tool_calls`
//! (arguments as a JSON string). The formats, each found by its own
//! markers, so that no per-model setting is needed:
//!
//! - Qwen3 (Hermes): `<tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>`
//! - Qwen3.5 / Qwen3-Coder: `<tool_call>\n<function=N>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>`
//! - DeepSeek-V3: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\n{...}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>`
//!   (and V3.1's `<｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`)
//! - Kimi-K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.N:0<|tool_call_argument_begin|>{...}<|tool_call_end|><|tool_calls_section_end|>`
//! - GLM-4.5 / 4.6: `<tool_call>N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n</tool_call>`
//! - MiniMax-M2: `<minimax:tool_call>\n<invoke name="N">\n<parameter name="K">V</parameter>\n</invoke>\n</minimax:tool_call>`
//!   (one block may hold several invokes)
//!
//! Text that is not a valid call stays content.

use super::api_error::{ApiError, ApiResult};
use super::openai::Body;
use crate::text::Rng;
use serde_json::{json, Map, Value};
use std::collections::HashMap;

pub const QWEN: (&str, &str) = ("<tool_call>", "</tool_call>");
pub const DEEPSEEK: (&str, &str) = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>");
pub const KIMI: (&str, &str) = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>");
pub const MINIMAX: (&str, &str) = ("<minimax:tool_call>", "</minimax:tool_call>");
const BLOCKS: [(&str, &str); 4] = [QWEN, DEEPSEEK, KIMI, MINIMAX];
/// Most tools a request may offer (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;
/// Most bytes of `tools`, as JSON.
pub const MAX_TOOLS_BYTES: usize = 256 << 10;

/// The request's tools and what it asks of them.
#[derive(Debug, Default)]
pub struct Tools {
    list: Vec<Value>,
    /// `tool_choice: "none"`: the template sees no tools, nothing is parsed.
    none: bool,
    /// A named `tool_choice`: only that tool is shown, and called.
    named: Option<String>,
    /// `tool_choice: "required"`: one of the tools is called.
    required: bool,
    parallel: bool,
}

/// `tools`, `tool_choice` and `parallel_tool_calls`. A named choice
/// narrows what the template shows; `required` and a named choice force a
/// call ([`Tools::forced`], enforced by constrained generation).
pub fn parse(body: &Body) -> ApiResult<Tools> {
    let mut tools = Tools {
        parallel: body.bool("parallel_tool_calls")?.unwrap_or(true),
        ..Tools::default()
    };
    if let Some(v) = body.get("tools") {
        let Some(list) = v.as_array() else {
            return Err(ApiError::field("tools", "`tools` must be a list"));
        };
        if list.len() > MAX_TOOLS {
            return Err(ApiError::field(
                "tools",
                format!("`tools` has {} tools; at most {MAX_TOOLS} are allowed", list.len()),
            ));
        }
        let bytes = serde_json::to_vec(v).map_or(usize::MAX, |b| b.len());
        if bytes > MAX_TOOLS_BYTES {
            return Err(ApiError::field(
                "tools",
                format!("`tools` is {bytes} bytes of JSON; at most {MAX_TOOLS_BYTES} are allowed"),
            ));
        }
        for (i, t) in list.iter().enumerate() {
            let name = t.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            if t.get("type").and_then(Value::as_str) != Some("function") || name.is_none() {
                return Err(ApiError::field(
                    &format!("tools[{i}]"),
                    "each tool must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}",
                ));
            }
        }
        tools.list = list.clone();
    }
    match body.get("tool_choice") {
        None => {}
        Some(Value::String(s)) => match s.as_str() {
            "auto" => {}
            "required" if tools.list.is_empty() => {
                return Err(ApiError::field("tool_choice", "tool_choice `required` needs `tools`"))
            }
            "required" => tools.required = true,
            "none" => tools.none = true,
            other => {
                return Err(ApiError::field(
                    "tool_choice",
                    format!("unknown tool_choice `{other}` (expected auto, none, required or a named function)"),
                ))
            }
        },
        Some(v) => {
            let name = v.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            let Some(name) = name else {
                return Err(ApiError::field(
                    "tool_choice",
                    "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            };
            if !tools.list.iter().any(|t| t["function"]["name"] == name) {
                return Err(ApiError::field(
                    "tool_choice",
                    format!("tool_choice names `{name}`, which is not in `tools`"),
                ));
            }
            tools.named = Some(name.to_string());
        }
    }
    Ok(tools)
}

impl Tools {
    /// The tools the template shows (`None`: no tools).
    pub fn for_template(&self) -> Option<Vec<Value>> {
        if self.none || self.list.is_empty() {
            return None;
        }
        let shown = self
            .list
            .iter()
            .filter(|t| self.named.as_ref().is_none_or(|n| t["function"]["name"] == n.as_str()));
        Some(shown.cloned().collect())
    }

    /// The tools one of which must be called, as (name, parameters schema):
    /// `tool_choice` `required` (every tool shown) or a named function;
    /// `None` when no call is forced.
    pub fn forced(&self) -> Option<Vec<(String, Value)>> {
        if !self.required && self.named.is_none() {
            return None;
        }
        let shown = self.for_template()?;
        let list = shown.iter().filter_map(|t| {
            let f = &t["function"];
            let params = match f.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object"}),
                Some(p) => p.clone(),
            };
            Some((f["name"].as_str()?.to_string(), params))
        });
        Some(list.collect())
    }

    /// `parallel_tool_calls` (default true).
    pub fn parallel(&self) -> bool {
        self.parallel
    }

    /// How to read calls out of the answer; `None` when no tools are offered.
    pub fn parser(&self) -> Option<Parser> {
        let shown = self.for_template()?;
        let schemas = shown
            .iter()
            .filter_map(|t| {
                let f = &t["function"];
                Some((f["name"].as_str()?.to_string(), f["parameters"].clone()))
            })
            .collect();
        Some(Parser {
            schemas,
            parallel: self.parallel,
        })
    }
}

/// Assistant `tool_calls` of the request, for the template: OpenAI sends
/// `arguments` as JSON text, templates iterate them as a mapping.
pub fn calls_for_template(param: &str, calls: &Value) -> ApiResult<Value> {
    let Some(list) = calls.as_array() else {
        return Err(ApiError::field(param, "`tool_calls` must be a list"));
    };
    let mut out = Vec::new();
    for (i, c) in list.iter().enumerate() {
        let mut c = c.clone();
        let Some(f) = c.get_mut("function").and_then(Value::as_object_mut) else {
            return Err(ApiError::field(
                &format!("{param}[{i}].function"),
                "each tool call needs a `function`",
            ));
        };
        if let Some(Value::String(text)) = f.get("arguments") {
            if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(text) {
                f.insert("arguments".into(), v);
            }
        }
        out.push(c);
    }
    Ok(Value::Array(out))
}

/// One parsed call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// JSON text of the arguments object.
    pub arguments: String,
}

impl ToolCall {
    fn new(name: &str, arguments: &Value) -> ToolCall {
        ToolCall {
            id: format!("call_{:016x}", Rng::entropy_seed()),
            name: name.to_string(),
            arguments: arguments.to_string(),
        }
    }

    /// The OpenAI object; a stream's delta carries `index` too.
    pub fn to_json(&self, index: usize, stream: bool) -> Value {
        let mut v = json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        });
        if stream {
            v["index"] = index.into();
        }
        v
    }
}

/// Reads tool calls out of answer text.
#[derive(Debug, Clone)]
pub struct Parser {
    /// Each offered tool's `parameters` schema (to type XML parameters).
    schemas: HashMap<String, Value>,
    /// `parallel_tool_calls`: false keeps the first call only.
    parallel: bool,
}

impl Parser {
    /// The calls of one block (`open` … `close` removed), or `None` when it
    /// is not a valid call.
    fn block(&self, open: &str, inner: &str) -> Option<Vec<ToolCall>> {
        match open {
            o if o == QWEN.0 => self.qwen(inner.trim()).map(|c| vec![c]),
            o if o == DEEPSEEK.0 => deepseek(inner),
            o if o == MINIMAX.0 => self.minimax(inner),
            _ => kimi(inner),
        }
    }

    fn qwen(&self, inner: &str) -> Option<ToolCall> {
        if inner.starts_with('{') {
            let v: Value = serde_json::from_str(inner).ok()?;
            let name = v.get("name")?.as_str()?;
            let args = match v.get("arguments").or_else(|| v.get("parameters")) {
                None => json!({}),
                Some(Value::String(s)) => serde_json::from_str::<Value>(s).ok().filter(Value::is_object)?,
                Some(a @ Value::Object(_)) => a.clone(),
                Some(_) => return None,
            };
            return Some(ToolCall::new(name, &args));
        }
        let Some(rest) = inner.strip_prefix("<function=") else {
            return self.glm(inner);
        };
        let (name, rest) = rest.split_once('>')?;
        let body = rest.trim_end().strip_suffix("</function>")?;
        let schema = self.schemas.get(name);
        let mut args = Map::new();
        let mut rest = body.trim();
        while !rest.is_empty() {
            let p = rest.strip_prefix("<parameter=")?;
            let (key, p) = p.split_once('>')?;
            let (value, p) = p.split_once("</parameter>")?;
            let value = value.strip_prefix('\n').unwrap_or(value);
            let value = value.strip_suffix('\n').unwrap_or(value);
            args.insert(key.to_string(), typed(schema, key, value));
            rest = p.trim_start();
        }
        Some(ToolCall::new(name, &Value::Object(args)))
    }

    /// GLM's `N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>…`.
    fn glm(&self, inner: &str) -> Option<ToolCall> {
        let (name, mut rest) = match inner.split_once("<arg_key>") {
            Some((name, _)) => (name.trim(), &inner[name.len()..]),
            None => (inner.trim(), ""),
        };
        let name_char = |c: char| c.is_alphanumeric() || "_-.:".contains(c);
        if name.is_empty() || !name.chars().all(name_char) {
            return None;
        }
        let schema = self.schemas.get(name);
        let mut args = Map::new();
        rest = rest.trim();
        while !rest.is_empty() {
            let (key, p) = rest.strip_prefix("<arg_key>")?.split_once("</arg_key>")?;
            let (value, p) = p.trim_start().strip_prefix("<arg_value>")?.split_once("</arg_value>")?;
            args.insert(key.trim().to_string(), typed(schema, key.trim(), value));
            rest = p.trim_start();
        }
        Some(ToolCall::new(name, &Value::Object(args)))
    }

    /// MiniMax-M2's `<invoke name="N"><parameter name="K">V</parameter>…</invoke>`, one or more.
    fn minimax(&self, inner: &str) -> Option<Vec<ToolCall>> {
        let mut calls = Vec::new();
        let mut rest = inner.trim();
        while !rest.is_empty() {
            let (name, p) = rest.strip_prefix("<invoke name=\"")?.split_once("\">")?;
            let (body, after) = p.split_once("</invoke>")?;
            let schema = self.schemas.get(name);
            let mut args = Map::new();
            let mut b = body.trim();
            while !b.is_empty() {
                let (key, q) = b.strip_prefix("<parameter name=\"")?.split_once("\">")?;
                let (value, q) = q.split_once("</parameter>")?;
                let value = value.strip_prefix('\n').unwrap_or(value);
                let value = value.strip_suffix('\n').unwrap_or(value);
                args.insert(key.to_string(), typed(schema, key, value));
                b = q.trim_start();
            }
            calls.push(ToolCall::new(name, &Value::Object(args)));
            rest = after.trim();
        }
        (!calls.is_empty()).then_some(calls)
    }

    fn keep(&self, calls: &mut Vec<ToolCall>, new: Vec<ToolCall>) {
        for c in new {
            if self.parallel || calls.is_empty() {
                calls.push(c);
            }
        }
    }
}

/// An XML parameter's value: text where the schema says string (or says
/// nothing), else the JSON it holds when it holds some.
fn typed(schema: Option<&Value>, key: &str, value: &str) -> Value {
    let kind = schema.and_then(|s| s["properties"][key]["type"].as_str());
    match kind {
        None | Some("string") => Value::String(value.to_string()),
        Some(_) => serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string())),
    }
}

fn deepseek(inner: &str) -> Option<Vec<ToolCall>> {
    const BEGIN: &str = "<｜tool▁call▁begin｜>";
    const END: &str = "<｜tool▁call▁end｜>";
    const SEP: &str = "<｜tool▁sep｜>";
    let mut calls = Vec::new();
    let mut rest = inner.trim();
    while !rest.is_empty() {
        let (call, after) = rest.strip_prefix(BEGIN)?.split_once(END)?;
        let (head, tail) = call.split_once(SEP)?;
        let (name, args) = if head == "function" {
            let (name, args) = tail.split_once('\n')?;
            let args = args.trim().strip_prefix("```json")?.strip_suffix("```")?;
            (name.trim(), args)
        } else {
            (head.trim(), tail)
        };
        calls.push(ToolCall::new(name, &json_object(args)?));
        rest = after.trim();
    }
    (!calls.is_empty()).then_some(calls)
}

fn kimi(inner: &str) -> Option<Vec<ToolCall>> {
    const BEGIN: &str = "<|tool_call_begin|>";
    const END: &str = "<|tool_call_end|>";
    const ARGS: &str = "<|tool_call_argument_begin|>";
    let mut calls = Vec::new();
    let mut rest = inner.trim();
    while !rest.is_empty() {
        let (call, after) = rest.strip_prefix(BEGIN)?.split_once(END)?;
        let (id, args) = call.split_once(ARGS)?;
        let id = id.trim();
        let name = id.rsplit_once(':').map_or(id, |(n, _)| n);
        let name = name.strip_prefix("functions.").unwrap_or(name);
        calls.push(ToolCall {
            id: id.to_string(),
            ..ToolCall::new(name, &json_object(args)?)
        });
        rest = after.trim();
    }
    (!calls.is_empty()).then_some(calls)
}

fn json_object(text: &str) -> Option<Value> {
    serde_json::from_str::<Value>(text.trim()).ok().filter(Value::is_object)
}

/// The earliest block opening in `text`: (byte offset, open, close).
fn find_open(text: &str) -> Option<(usize, &'static str, &'static str)> {
    BLOCKS
        .iter()
        .filter_map(|&(o, c)| text.find(o).map(|at| (at, o, c)))
        .min_by_key(|b| b.0)
}

/// Length of the longest suffix of `text` that begins a block opening.
fn partial_open(text: &str) -> usize {
    BLOCKS
        .iter()
        .flat_map(|(o, _)| (1..o.len()).filter(|&n| o.is_char_boundary(n)).map(move |n| &o[..n]))
        .filter(|p| text.ends_with(p))
        .map(str::len)
        .max()
        .unwrap_or(0)
}

/// Split a whole answer into its content and its tool calls.
pub fn extract(parser: Parser, text: &str) -> (String, Vec<ToolCall>) {
    let mut s = ToolStream::new(Some(parser));
    let (mut content, mut calls) = s.push(text);
    let (rest, more) = s.finish();
    content.push_str(&rest);
    calls.extend(more);
    if !calls.is_empty() && content.trim().is_empty() {
        content.clear();
    }
    (content, calls)
}

/// Tool calls out of streamed text: text that may begin a call is held
/// back until its block ends.
pub struct ToolStream {
    parser: Option<Parser>,
    held: String,
    calls: usize,
}

impl ToolStream {
    pub fn new(parser: Option<Parser>) -> ToolStream {
        ToolStream {
            parser,
            held: String::new(),
            calls: 0,
        }
    }

    /// Feed a piece of answer; returns the content ready and the calls
    /// completed. The cost is that of the text held, whatever the tools.
    pub fn push(&mut self, text: &str) -> (String, Vec<ToolCall>) {
        let Some(parser) = &self.parser else {
            return (text.to_string(), Vec::new());
        };
        self.held.push_str(text);
        let (mut content, mut calls) = (String::new(), Vec::new());
        loop {
            let Some((at, open, close)) = find_open(&self.held) else {
                let keep = partial_open(&self.held);
                content.extend(self.held.drain(..self.held.len() - keep));
                break;
            };
            content.extend(self.held.drain(..at));
            let Some(end) = self.held[open.len()..].find(close) else {
                break;
            };
            let block: String = self.held.drain(..open.len() + end + close.len()).collect();
            match parser.block(open, &block[open.len()..block.len() - close.len()]) {
                Some(found) => keep(parser, &mut self.calls, &mut calls, found),
                None => content.push_str(&block),
            }
        }
        (content, calls)
    }

    /// The end of the answer: a block left open is a call if it parses
    /// (a model may stop without the closing tag), else content.
    pub fn finish(&mut self) -> (String, Vec<ToolCall>) {
        let rest = std::mem::take(&mut self.held);
        let mut calls = Vec::new();
        if let (Some(parser), Some((0, open, _))) = (&self.parser, find_open(&rest)) {
            if let Some(found) = parser.block(open, &rest[open.len()..]) {
                keep(parser, &mut self.calls, &mut calls, found);
                return (String::new(), calls);
            }
        }
        (rest, calls)
    }
}

/// Add `found` to `calls`; `sent` counts the calls of the whole answer
/// (without `parallel_tool_calls`, only the first is kept).
fn keep(parser: &Parser, sent: &mut usize, calls: &mut Vec<ToolCall>, found: Vec<ToolCall>) {
    let before = calls.len();
    if !parser.parallel && *sent > 0 {
        return;
    }
    parser.keep(calls, found);
    *sent += calls.len() - before;
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;
