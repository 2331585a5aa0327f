//! `POST /v1/chat/completions`: messages rendered by the chat template,
//! the answer split into reasoning (`<think>…</think>`), content and tool
//! calls, as one JSON reply or as SSE chunks.

use super::api_error::{ApiError, ApiResult};
use super::logprobs::{self, Pending};
use super::openai::{self, Body};
use super::reqlog;
use super::slots::Running;
use super::sse::{self, Chunks};
use super::structured;
use super::tools::{self, Parser, ToolCall, ToolStream, Tools};
use super::{AppState, JobSpec, Ready, Shared};
use crate::error::Result;
use crate::generate::{Generation, Segment, ThinkSplitter, TokenLogprob};
use crate::text::ChatRequest;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

pub async fn handle(State(shared): State<AppState>, req: Request) -> Response {
    respond(&shared, req).await.unwrap_or_else(IntoResponse::into_response)
}

async fn respond(shared: &AppState, req: Request) -> ApiResult<Response> {
    let (parts, body) = req.into_parts();
    let log = reqlog::of(&parts);
    shared.ready()?;
    let body = shared.read_body(&parts.headers, body).await?;
    let p = shared.prepare(move |s| prepare(s, &body)).await?;
    let ready = shared.ready()?;
    log.set_prompt(p.ids.len(), &p.text);
    let mut running = shared.start_job(ready, "messages", p.ids, p.job, log)?;
    let reply = Reply {
        id: openai::response_id("chatcmpl"),
        model: shared.config.model_id.clone(),
        created: openai::unix_now(),
    };
    let tok = &ready.text.tokenizer;
    let opts = p.opts;
    if opts.stream {
        let first = vec![reply.chunk(json!({"role": "assistant", "content": ""}), None)];
        let chunks = ChatChunks {
            reply,
            split: ThinkSplitter::new(p.thinking),
            tools: ToolStream::new(p.parser),
            include_usage: opts.include_usage,
            called: 0,
            logprobs: opts.logprobs.map(|_| Pending::new(tok.clone())),
        };
        return Ok(sse::reply(first, running, chunks, shared.config.keep_alive));
    }
    let generation = wait(&mut running).await?;
    let mut whole = reply.whole(&generation, p.thinking, p.parser);
    if opts.logprobs.is_some() {
        whole["choices"][0]["logprobs"] = logprobs::chat(tok, &generation.logprobs);
    }
    Ok(Json(whole).into_response())
}

/// A chat request made ready to queue: everything that costs more than a
/// moment, done off the HTTP workers.
pub(super) struct Prepared {
    text: String,
    pub(super) ids: Vec<u32>,
    job: JobSpec,
    opts: openai::Options,
    parser: Option<Parser>,
    /// The prompt opens a thought (`<think>` after the assistant header).
    thinking: bool,
}

fn prepare(shared: &Shared, body: &[u8]) -> ApiResult<Prepared> {
    prepare_ready(shared.ready()?, body)
}

/// A chat request's body parsed, its messages rendered with the template
/// and tokenized, its grammar compiled: everything before the model runs.
pub(super) fn prepare_ready(ready: &Ready, body: &[u8]) -> ApiResult<Prepared> {
    let body = Body::parse(body)?;
    let opts = openai::options(&body, &ready.text.defaults)?;
    let tools = tools::parse(&body)?;
    let prompt = render(ready, &body, &tools)?;
    ready.check_prompt_bytes("messages", prompt.text.len())?;
    let constraint = match structured::tool_call(ready, &tools)? {
        Some(c) => Some(c),
        None => structured::response_format(ready, &body)?,
    };
    let (ids, ends) = ready.text.tokenizer.encode_with_ends(&prompt.text, false)?;
    // The checkpoint: the tokens that lie wholly inside the conversation
    // before the new assistant header.
    let checkpoint_at = prompt.history.as_deref().map(|h| {
        let same = h.bytes().zip(prompt.text.bytes()).take_while(|(a, b)| a == b).count();
        ends.iter().take_while(|&&end| end <= same).count()
    });
    let job = JobSpec {
        sampling: opts.sampling.clone(),
        checkpoint_at,
        constraint,
        logprobs: opts.logprobs,
    };
    Ok(Prepared {
        thinking: ThinkSplitter::prompt_opens_thought(&prompt.text),
        text: prompt.text,
        ids,
        job,
        opts,
        parser: tools.parser(),
    })
}

/// Wait for a job's end.
pub async fn wait(running: &mut Running) -> ApiResult<Generation> {
    match running.finish().await {
        Some(result) => Ok(result?),
        None => Err(ApiError::unavailable("the server is shutting down")),
    }
}

/// The prompt, and the conversation without the new assistant header (for
/// the checkpoint where the next turn diverges).
pub struct Prompt {
    pub text: String,
    pub history: Option<String>,
}

/// Render the request's messages with the chat template.
pub fn render(ready: &Ready, body: &Body, tools: &Tools) -> ApiResult<Prompt> {
    let template = ready.text.template.as_ref().ok_or_else(|| {
        ApiError::bad_request(
            "this model has no chat template; use /v1/completions, or restart the server with --chat-template FILE",
        )
    })?;
    let messages = messages(body)?;
    let extra = match body.object("chat_template_kwargs")? {
        Some(m) => m.clone(),
        None => Map::new(),
    };
    let add_generation_prompt = body.bool("add_generation_prompt")?.unwrap_or(true);
    let req = ChatRequest {
        messages,
        tools: tools.for_template(),
        add_generation_prompt,
        extra,
    };
    let in_template = |e: crate::Error| match e {
        crate::Error::Invalid(msg) if msg.contains("chat template variable") => {
            ApiError::field("chat_template_kwargs", msg)
        }
        e => ApiError {
            param: Some("messages".into()),
            ..ApiError::from(e)
        },
    };
    let text = template.render(&req).map_err(in_template)?;
    let history = if add_generation_prompt {
        let without = ChatRequest {
            add_generation_prompt: false,
            ..req
        };
        template.render(&without).ok()
    } else {
        None
    };
    Ok(Prompt { text, history })
}

/// `messages` as the template takes them: roles checked, content parts
/// joined into a string, tool-call arguments given as JSON text parsed.
pub fn messages(body: &Body) -> ApiResult<Vec<Value>> {
    let Some(list) = body.get("messages") else {
        return Err(ApiError::field("messages", "`messages` is required"));
    };
    let Some(list) = list.as_array().filter(|l| !l.is_empty()) else {
        return Err(ApiError::field("messages", "`messages` must be a non-empty list"));
    };
    list.iter().enumerate().map(|(i, m)| message(i, m)).collect()
}

fn message(i: usize, m: &Value) -> ApiResult<Value> {
    let at = |field: &str| format!("messages[{i}].{field}");
    let Some(fields) = m.as_object() else {
        return Err(ApiError::field(
            &format!("messages[{i}]"),
            "each message must be an object",
        ));
    };
    let role = match fields.get("role").and_then(Value::as_str) {
        Some("developer") => "system",
        Some(r @ ("system" | "user" | "assistant" | "tool")) => r,
        Some(other) => {
            return Err(ApiError::field(
                &at("role"),
                format!("unknown role `{other}` (expected system, developer, user, assistant or tool)"),
            ))
        }
        None => return Err(ApiError::field(&at("role"), "each message needs a string `role`")),
    };
    let mut out = Map::new();
    out.insert("role".into(), role.into());
    let content = match fields.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => text_parts(&at("content"), parts)?,
        Some(_) => {
            return Err(ApiError::field(
                &at("content"),
                "`content` must be a string or a list of text parts",
            ))
        }
    };
    out.insert("content".into(), content.into());
    for key in ["name", "tool_call_id", "reasoning_content", "reasoning"] {
        match fields.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => {
                out.insert(key.into(), s.clone().into());
            }
            Some(_) => return Err(ApiError::field(&at(key), format!("`{key}` must be a string"))),
        }
    }
    if let Some(calls) = fields.get("tool_calls").filter(|v| !v.is_null()) {
        out.insert(
            "tool_calls".into(),
            tools::calls_for_template(&at("tool_calls"), calls)?,
        );
    }
    Ok(Value::Object(out))
}

fn text_parts(param: &str, parts: &[Value]) -> ApiResult<String> {
    let mut texts = Vec::new();
    for (j, part) in parts.iter().enumerate() {
        let kind = part.get("type").and_then(Value::as_str);
        match (kind, part.get("text").and_then(Value::as_str)) {
            (Some("text"), Some(t)) => texts.push(t),
            (Some("text"), None) => {
                return Err(ApiError::field(
                    &format!("{param}[{j}].text"),
                    "a text part needs a string `text`",
                ))
            }
            (other, _) => {
                return Err(ApiError {
                    code: Some("unsupported_content"),
                    ..ApiError::field(
                        &format!("{param}[{j}].type"),
                        format!(
                            "content parts of type `{}` are not supported: this server takes text only",
                            other.unwrap_or("?")
                        ),
                    )
                })
            }
        }
    }
    Ok(texts.join("\n"))
}

/// What every chunk and reply of one request shares.
struct Reply {
    id: String,
    model: String,
    created: u64,
}

impl Reply {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        })
    }

    /// The non-streamed reply.
    fn whole(&self, g: &Generation, thinking: bool, parser: Option<Parser>) -> Value {
        let mut split = ThinkSplitter::new(thinking);
        let mut segments = split.push(&g.text);
        segments.extend(split.finish());
        let (mut reasoning, mut answer) = (String::new(), String::new());
        for s in segments {
            match s {
                Segment::Thinking(t) => reasoning.push_str(&t),
                Segment::Answer(t) => answer.push_str(&t),
            }
        }
        let (content, calls) = match parser {
            Some(p) => tools::extract(p, &answer),
            None => (answer, Vec::new()),
        };
        let mut message = json!({"role": "assistant", "content": content});
        if !reasoning.is_empty() {
            message["reasoning_content"] = reasoning.clone().into();
            message["reasoning"] = reasoning.into();
        }
        let mut finish = g.finish.as_openai();
        if !calls.is_empty() {
            if message["content"] == "" {
                message["content"] = Value::Null;
            }
            message["tool_calls"] = calls.iter().enumerate().map(|(i, c)| c.to_json(i, false)).collect();
            finish = "tool_calls";
        }
        json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
            "usage": openai::usage(&g.stats),
            "timings": openai::timings(&g.stats),
        })
    }
}

struct ChatChunks {
    reply: Reply,
    split: ThinkSplitter,
    tools: ToolStream,
    include_usage: bool,
    /// Tool calls sent so far.
    called: usize,
    logprobs: Option<Pending>,
}

impl ChatChunks {
    /// One chunk per run of reasoning, content or tool calls.
    fn deltas(&mut self, segments: Vec<Segment>, end: bool) -> Vec<Value> {
        let mut out = Vec::new();
        for s in segments {
            match s {
                Segment::Thinking(t) => {
                    out.push(self.reply.chunk(json!({"reasoning_content": t, "reasoning": t}), None))
                }
                Segment::Answer(t) => {
                    let (text, calls) = self.tools.push(&t);
                    self.content(&mut out, text, calls);
                }
            }
        }
        if end {
            let (text, calls) = self.tools.finish();
            self.content(&mut out, text, calls);
        }
        out
    }

    fn content(&mut self, out: &mut Vec<Value>, text: String, calls: Vec<ToolCall>) {
        if !text.is_empty() {
            out.push(self.reply.chunk(json!({"content": text}), None));
        }
        for call in calls {
            let delta = json!({"tool_calls": [call.to_json(self.called, true)]});
            out.push(self.reply.chunk(delta, None));
            self.called += 1;
        }
    }
}

impl Chunks for ChatChunks {
    fn piece(&mut self, text: &str, lps: Vec<TokenLogprob>) -> Vec<Value> {
        let segments = self.split.push(text);
        let mut out = self.deltas(segments, false);
        if let Some(p) = &mut self.logprobs {
            p.push(lps);
            if !out.is_empty() {
                p.attach(&mut out, None);
            }
        }
        out
    }

    fn done(&mut self, result: Result<Generation>) -> Vec<Value> {
        let g = match result {
            Ok(g) => g,
            Err(e) => return vec![ApiError::from(e).to_json()],
        };
        let segments = self.split.finish();
        let mut out = self.deltas(segments, true);
        let finish = if self.called > 0 {
            "tool_calls"
        } else {
            g.finish.as_openai()
        };
        let mut last = self.reply.chunk(json!({}), Some(finish));
        last["timings"] = openai::timings(&g.stats);
        out.push(last);
        if let Some(p) = &mut self.logprobs {
            p.rest(&g.logprobs);
            p.attach(&mut out, None);
        }
        if self.include_usage {
            let mut usage = self.reply.chunk(json!({}), None);
            usage["choices"] = json!([]);
            usage["usage"] = openai::usage(&g.stats);
            out.push(usage);
        }
        out
    }
}
