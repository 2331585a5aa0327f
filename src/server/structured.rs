//! Constrained generation for a request (SPEC.md §7): `response_format`
//! (`json_object`, `json_schema`) and a forced tool call (`tool_choice`
//! `required` or a named function) in the model's own call format, each a
//! grammar compiled with the model's [`GrammarCompiler`].

use super::api_error::{ApiError, ApiResult};
use super::openai::Body;
use super::tools::{Tools, DEEPSEEK, KIMI, QWEN};
use super::Ready;
use crate::text::{Constraint, GrammarCompiler};
use serde_json::{json, Value};

/// The grammar compiler of the model's tokenizer, built on first use.
fn compiler<'r>(ready: &'r Ready, param: &str) -> ApiResult<&'r GrammarCompiler> {
    let built = ready
        .grammars
        .get_or_init(|| GrammarCompiler::new(&ready.text.tokenizer).map_err(|e| e.to_string()));
    built.as_ref().map_err(|e| {
        ApiError::field(
            param,
            format!("structured output is not available with this model's tokenizer: {e}"),
        )
    })
}

/// `response_format`: `None` for `text` or none given.
pub fn response_format(ready: &Ready, body: &Body) -> ApiResult<Option<Constraint>> {
    const P: &str = "response_format";
    let Some(f) = body.object(P)? else {
        return Ok(None);
    };
    let invalid = |e: crate::Error| ApiError::field(P, format!("`response_format` has an unusable JSON schema: {e}"));
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => compiler(ready, P)?.json_object().map(Some).map_err(invalid),
        Some("json_schema") => {
            let Some(spec) = f.get("json_schema").and_then(Value::as_object) else {
                return Err(ApiError::field(
                    P,
                    "`response_format` of type `json_schema` needs `json_schema`: {\"name\": ..., \"schema\": {...}}",
                ));
            };
            if !spec.get("name").is_some_and(Value::is_string) {
                return Err(ApiError::field(
                    P,
                    "`response_format.json_schema.name` must be a string",
                ));
            }
            if spec.get("strict").is_some_and(|s| !s.is_boolean() && !s.is_null()) {
                return Err(ApiError::field(
                    P,
                    "`response_format.json_schema.strict` must be true or false",
                ));
            }
            let c = compiler(ready, P)?;
            match spec.get("schema") {
                None | Some(Value::Null) => c.json_object(),
                Some(schema) => c.json_schema(schema),
            }
            .map(Some)
            .map_err(invalid)
        }
        other => Err(ApiError::field(
            P,
            format!(
                "unknown `response_format` type {} (expected text, json_object or json_schema)",
                other.map_or("(missing)".to_string(), |t| format!("`{t}`"))
            ),
        )),
    }
}

/// The call a `tool_choice` of `required` or a named function forces, in
/// the call format the model's tokenizer points to (its DeepSeek or Kimi
/// markers, else Qwen3's `<tool_call>` JSON); `None` when nothing is forced.
pub fn tool_call(ready: &Ready, tools: &Tools) -> ApiResult<Option<Constraint>> {
    let Some(forced) = tools.forced() else {
        return Ok(None);
    };
    let c = compiler(ready, "tool_choice")?;
    let tok = &ready.text.tokenizer;
    let format = if tok.token_to_id(DEEPSEEK.0).is_some() {
        Format::DeepSeek
    } else if tok.token_to_id(KIMI.0).is_some() {
        Format::Kimi
    } else {
        Format::Qwen
    };
    let grammar = call_grammar(c, format, &forced, tools.parallel());
    c.lark(&grammar).map(Some).map_err(|e| {
        ApiError::field(
            "tools",
            format!("a tool's `parameters` is not a usable JSON schema: {e}"),
        )
    })
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Format {
    Qwen,
    DeepSeek,
    Kimi,
}

/// A Lark grammar for one call (several with `parallel`) of one of `tools`.
fn call_grammar(c: &GrammarCompiler, format: Format, tools: &[(String, Value)], parallel: bool) -> String {
    let lit = |s: &str| c.literal(s);
    let json = |schema: &Value| GrammarCompiler::lark_json(schema);
    let mut rules = Vec::new();
    for (i, (name, params)) in tools.iter().enumerate() {
        let rule = match format {
            Format::Qwen => {
                let call = json!({
                    "type": "object",
                    "properties": {"name": {"const": name}, "arguments": params},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                });
                format!(
                    "{} {} {}",
                    lit(&format!("{}\n", QWEN.0)),
                    json(&call),
                    lit(&format!("\n{}", QWEN.1))
                )
            }
            Format::DeepSeek => format!(
                "{} {} {} {} {} {} {}",
                lit("<｜tool▁call▁begin｜>"),
                lit("function"),
                lit("<｜tool▁sep｜>"),
                lit(&format!("{name}\n```json\n")),
                json(params),
                lit("\n```"),
                lit("<｜tool▁call▁end｜>"),
            ),
            Format::Kimi => format!(
                "{} {} /[0-9]+/ {} {} {}",
                lit("<|tool_call_begin|>"),
                lit(&format!("functions.{name}:")),
                lit("<|tool_call_argument_begin|>"),
                json(params),
                lit("<|tool_call_end|>"),
            ),
        };
        rules.push(format!("call_{i}: {rule}"));
    }
    let calls = (0..tools.len())
        .map(|i| format!("call_{i}"))
        .collect::<Vec<_>>()
        .join(" | ");
    let more = if parallel { "*" } else { "" };
    let start = match format {
        Format::Qwen => format!("start: call ({} call){more}", lit("\n")),
        Format::DeepSeek => format!(
            "start: {} call{} {}",
            lit(DEEPSEEK.0),
            if parallel { "+" } else { "" },
            lit(DEEPSEEK.1)
        ),
        Format::Kimi => format!(
            "start: {} call{} {}",
            lit(KIMI.0),
            if parallel { "+" } else { "" },
            lit(KIMI.1)
        ),
    };
    format!("{start}\ncall: {calls}\n{}\n", rules.join("\n"))
}
