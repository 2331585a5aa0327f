//! `ChatTemplate`: the model's Jinja chat template rendered with
//! `minijinja` the way transformers' `apply_chat_template(..., tokenize=False)`
//! renders it (trim_blocks, lstrip_blocks, loop controls, Python string and
//! dict methods, `tojson` / `raise_exception` / `strftime_now`).

use super::files::TokenizerConfig;
use super::pyjinja;
use crate::error::{Error, Result};
use minijinja::syntax::SyntaxConfig;
use minijinja::value::Value as JValue;
use minijinja::Environment;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// One conversation to render.
#[derive(Debug, Clone, Default)]
pub struct ChatRequest {
    /// OpenAI-style messages: `{"role", "content", "tool_calls"?,
    /// "reasoning_content"?, "tool_call_id"?, ...}`.
    pub messages: Vec<Value>,
    /// Tool (function) definitions, JSON-schema style.
    pub tools: Option<Vec<Value>>,
    /// End with the header of a new assistant turn.
    pub add_generation_prompt: bool,
    /// Further template variables, e.g. `enable_thinking`.
    pub extra: Map<String, Value>,
}

const DEFAULT: &str = "default";
const TOOL_USE: &str = "tool_use";
/// Variables the renderer sets itself; `extra` may not override them.
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];
/// Names a message's reasoning may come under (transformers' order).
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];
/// Most bytes a render may write: a template whose output runs away (a
/// string doubled in a loop) is stopped with an error at this size.
pub const MAX_OUTPUT_BYTES: usize = 64 << 20;
/// Template instructions a render may run: a template that loops for
/// ever, or nearly, is stopped with an error.
pub const FUEL: u64 = 20_000_000;

/// A compiled chat template (one, or a named set with `default` / `tool_use`).
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Whether a `tool_use` template exists (used when tools are given).
    has_tool_use: bool,
    /// Where the template came from (named in errors).
    source: PathBuf,
    /// `bos_token`, `eos_token`, ... as template variables.
    special_tokens: Vec<(&'static str, String)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("has_tool_use", &self.has_tool_use)
            .finish()
    }
}

impl ChatTemplate {
    /// The template of a model directory: `chat_template.jinja` if present,
    /// else `tokenizer_config.json`'s `chat_template` (a string, or a list of
    /// `{name, template}`). `Ok(None)` when the model has none.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Option<ChatTemplate>> {
        let dir = dir.as_ref();
        let config = TokenizerConfig::from_dir(dir)?;
        let special = config.special_tokens();
        let jinja = dir.join("chat_template.jinja");
        match std::fs::read_to_string(&jinja) {
            Ok(text) => return ChatTemplate::new(&text, &jinja, special).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&jinja, e)),
        }
        ChatTemplate::from_config(&config)
    }

    /// The template `tokenizer_config.json` holds (a string, or a list of
    /// `{name, template}`), `Ok(None)` when it has none.
    pub fn from_config(config: &TokenizerConfig) -> Result<Option<ChatTemplate>> {
        let special = config.special_tokens();
        let path = config.path.clone();
        match &config.chat_template {
            None => Ok(None),
            Some(Value::String(text)) => ChatTemplate::new(text, &path, special).map(Some),
            Some(Value::Array(list)) => {
                let mut named = Vec::new();
                for item in list {
                    let name = item.get("name").and_then(Value::as_str);
                    let text = item.get("template").and_then(Value::as_str);
                    match (name, text) {
                        (Some(n), Some(t)) => named.push((n.to_string(), t.to_string())),
                        _ => {
                            return Err(Error::format(
                                &path,
                                "`chat_template` list entries need string `name` and `template`",
                            ))
                        }
                    }
                }
                ChatTemplate::named(named, &path, special).map(Some)
            }
            Some(_) => Err(Error::format(&path, "`chat_template` must be a string or a list")),
        }
    }

    /// One template from its source text. `origin` names it in errors;
    /// `special_tokens` become variables (`bos_token`, `eos_token`, ...).
    pub fn new(template: &str, origin: &Path, special_tokens: Vec<(&'static str, String)>) -> Result<ChatTemplate> {
        ChatTemplate::named(
            vec![(DEFAULT.to_string(), template.to_string())],
            origin,
            special_tokens,
        )
    }

    fn named(
        templates: Vec<(String, String)>,
        origin: &Path,
        special_tokens: Vec<(&'static str, String)>,
    ) -> Result<ChatTemplate> {
        if !templates.iter().any(|(n, _)| n == DEFAULT) {
            return Err(Error::format(origin, "no chat template named `default`"));
        }
        let has_tool_use = templates.iter().any(|(n, _)| n == TOOL_USE);
        let mut env = environment(origin)?;
        for (name, text) in templates {
            env.add_template_owned(name.clone(), text)
                .map_err(|e| Error::format(origin, format!("chat template `{name}`: {}", describe(&e))))?;
        }
        Ok(ChatTemplate {
            env,
            has_tool_use,
            source: origin.to_path_buf(),
            special_tokens,
        })
    }

    /// Render `req` to the prompt text (special tokens included as text).
    pub fn render(&self, req: &ChatRequest) -> Result<String> {
        let name = if req.tools.is_some() && self.has_tool_use {
            TOOL_USE
        } else {
            DEFAULT
        };
        let template = self.env.get_template(name).map_err(|e| self.error(&e))?;
        let mut vars = Map::new();
        for (k, v) in &self.special_tokens {
            vars.insert((*k).to_string(), Value::String(v.clone()));
        }
        for (k, v) in &req.extra {
            if RESERVED.contains(&k.as_str()) {
                return Err(Error::Invalid(format!(
                    "chat template variable `{k}` is set by the request itself"
                )));
            }
            vars.insert(k.clone(), v.clone());
        }
        let messages = req.messages.iter().map(prepare_message).collect::<Result<Vec<_>>>()?;
        vars.insert("messages".into(), Value::Array(messages));
        vars.insert(
            "tools".into(),
            req.tools.clone().map(Value::Array).unwrap_or(Value::Null),
        );
        vars.insert("documents".into(), Value::Null);
        vars.insert("add_generation_prompt".into(), Value::Bool(req.add_generation_prompt));
        let mut out = Bounded::default();
        match template.render_captured_to(JValue::from(minijinja::value::Serde(&vars)), &mut out) {
            Ok(_) => {}
            Err(_) if out.over => {
                return Err(Error::Invalid(format!(
                    "chat template {}: its output is over {MAX_OUTPUT_BYTES} bytes",
                    self.source.display()
                )))
            }
            Err(e) if e.kind() == minijinja::ErrorKind::OutOfFuel => {
                return Err(Error::Invalid(format!(
                    "chat template {}: rendering took more than {FUEL} steps",
                    self.source.display()
                )))
            }
            Err(e) => return Err(self.error(&e)),
        }
        String::from_utf8(out.bytes).map_err(|_| {
            Error::Invalid(format!(
                "chat template {}: its output is not UTF-8",
                self.source.display()
            ))
        })
    }

    fn error(&self, e: &minijinja::Error) -> Error {
        Error::Invalid(format!("chat template {}: {}", self.source.display(), describe(e)))
    }
}

/// A render's output, refused past [`MAX_OUTPUT_BYTES`].
#[derive(Default)]
struct Bounded {
    bytes: Vec<u8>,
    over: bool,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_OUTPUT_BYTES {
            self.over = true;
            return Err(std::io::Error::other("the chat template's output is too large"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A message as transformers hands it to the template: keys whose value is
/// `null` dropped, and the reasoning copied under `reasoning_content` and
/// `thinking` whichever name it came under.
fn prepare_message(message: &Value) -> Result<Value> {
    let Value::Object(fields) = message else {
        return Err(Error::Invalid(format!(
            "chat message must be a JSON object, got {message}"
        )));
    };
    let present = fields.iter().filter(|(_, v)| !v.is_null());
    let reasoning = REASONING_FIELDS
        .iter()
        .find_map(|k| fields.get(*k).filter(|v| !v.is_null()));
    let Some(r) = reasoning else {
        return Ok(Value::Object(present.map(|(k, v)| (k.clone(), v.clone())).collect()));
    };
    // Python: {"thinking": r, **message, "reasoning_content": r}. Key order
    // matters to templates that iterate a message.
    let mut out = Map::new();
    out.insert("thinking".to_string(), r.clone());
    for (k, v) in present {
        out.insert(k.clone(), v.clone());
    }
    out.insert("reasoning_content".to_string(), r.clone());
    Ok(Value::Object(out))
}

fn environment(origin: &Path) -> Result<Environment<'static>> {
    let mut env = Environment::new();
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| Error::format(origin, format!("chat template syntax: {e}")))?;
    env.set_syntax(syntax);
    env.set_fuel(Some(FUEL));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", pyjinja::tojson);
    env.add_function("raise_exception", pyjinja::raise_exception);
    env.add_function("strftime_now", pyjinja::strftime_now);
    Ok(env)
}

/// The error and its chain (minijinja keeps the template line in the detail).
fn describe(e: &minijinja::Error) -> String {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}
