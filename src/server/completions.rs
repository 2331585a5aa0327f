//! `POST /v1/completions`: a raw prompt (text or token ids) continued, as
//! one JSON reply or as SSE chunks.

use super::api_error::{ApiError, ApiResult};
use super::chat::wait;
use super::logprobs::{self, Pending};
use super::openai::{self, Body};
use super::reqlog;
use super::sse::{self, Chunks};
use super::structured;
use super::{AppState, JobSpec, Ready};
use crate::error::Result;
use crate::generate::{Generation, TokenLogprob};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

pub async fn handle(State(shared): State<AppState>, req: Request) -> Response {
    respond(&shared, req).await.unwrap_or_else(IntoResponse::into_response)
}

async fn respond(shared: &AppState, req: Request) -> ApiResult<Response> {
    let (parts, body) = req.into_parts();
    let log = reqlog::of(&parts);
    shared.ready()?;
    let body = shared.read_body(&parts.headers, body).await?;
    let (opts, ids, job, text) = shared.prepare(move |s| prepare(s.ready()?, &body)).await?;
    let ready = shared.ready()?;
    log.set_prompt(ids.len(), &text);
    let mut running = shared.start_job(ready, "prompt", ids, job, log)?;
    let reply = Reply {
        id: openai::response_id("cmpl"),
        model: shared.config.model_id.clone(),
        created: openai::unix_now(),
    };
    if opts.stream {
        let chunks = CompletionChunks {
            reply,
            include_usage: opts.include_usage,
            logprobs: opts.logprobs.map(|_| Pending::new(ready.text.tokenizer.clone())),
            offset: 0,
        };
        return Ok(sse::reply(Vec::new(), running, chunks, shared.config.keep_alive));
    }
    let g = wait(&mut running).await?;
    let mut out = reply.chunk(&g.text, Some(g.finish.as_openai()));
    if opts.logprobs.is_some() {
        out["choices"][0]["logprobs"] = logprobs::completion(&ready.text.tokenizer, &g.logprobs, 0);
    }
    out["usage"] = openai::usage(&g.stats);
    out["timings"] = openai::timings(&g.stats);
    Ok(Json(out).into_response())
}

/// A completion request's body made ready to queue: its options, prompt
/// ids, job and prompt text (everything before the model runs).
pub(super) fn prepare(ready: &Ready, body: &[u8]) -> ApiResult<(openai::Options, Vec<u32>, JobSpec, String)> {
    let body = Body::parse(body)?;
    let opts = openai::options(&body, &ready.text.defaults)?;
    let (ids, text) = prompt(ready, &body)?;
    let job = JobSpec {
        sampling: opts.sampling.clone(),
        checkpoint_at: None,
        constraint: structured::response_format(ready, &body)?,
        logprobs: opts.logprobs,
    };
    Ok((opts, ids, job, text))
}

/// `prompt`: a string or token ids, or a list holding one of them; with
/// its text (empty for token ids).
fn prompt(ready: &Ready, body: &Body) -> ApiResult<(Vec<u32>, String)> {
    let tok = &ready.text.tokenizer;
    let bad = || ApiError::field("prompt", "`prompt` must be a string or a list of token ids");
    let ids = |list: &[Value]| -> ApiResult<Vec<u32>> {
        list.iter()
            .map(|v| {
                let id = v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(bad)?;
                if id as usize >= tok.vocab_size() {
                    return Err(ApiError::field(
                        "prompt",
                        format!("token id {id} is outside the vocabulary (size {})", tok.vocab_size()),
                    ));
                }
                Ok(id)
            })
            .collect()
    };
    let text = |s: &str| -> ApiResult<(Vec<u32>, String)> {
        ready.check_prompt_bytes("prompt", s.len())?;
        Ok((tok.encode(s, true)?, s.to_string()))
    };
    match body.get("prompt") {
        None => Err(ApiError::field("prompt", "`prompt` is required")),
        Some(Value::String(s)) => text(s),
        Some(Value::Array(list)) => match list.as_slice() {
            [Value::String(s)] => text(s),
            [Value::Array(inner)] => Ok((ids(inner)?, String::new())),
            l if l.iter().all(Value::is_number) => Ok((ids(l)?, String::new())),
            _ => Err(ApiError::field(
                "prompt",
                "`prompt` must be one prompt: this server makes one choice per request; send several requests instead",
            )),
        },
        Some(_) => Err(bad()),
    }
}

struct Reply {
    id: String,
    model: String,
    created: u64,
}

impl Reply {
    fn chunk(&self, text: &str, finish: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}],
        })
    }
}

struct CompletionChunks {
    reply: Reply,
    include_usage: bool,
    logprobs: Option<Pending>,
    /// Bytes of text sent so far.
    offset: usize,
}

impl Chunks for CompletionChunks {
    fn piece(&mut self, text: &str, lps: Vec<TokenLogprob>) -> Vec<Value> {
        let mut out = vec![self.reply.chunk(text, None)];
        if let Some(p) = &mut self.logprobs {
            p.push(lps);
            p.attach(&mut out, Some(self.offset));
        }
        self.offset += text.len();
        out
    }

    fn done(&mut self, result: Result<Generation>) -> Vec<Value> {
        let g = match result {
            Ok(g) => g,
            Err(e) => return vec![ApiError::from(e).to_json()],
        };
        let mut last = self.reply.chunk("", Some(g.finish.as_openai()));
        last["timings"] = openai::timings(&g.stats);
        let mut out = vec![last];
        if let Some(p) = &mut self.logprobs {
            p.rest(&g.logprobs);
            p.attach(&mut out, Some(self.offset));
        }
        if self.include_usage {
            let mut usage = self.reply.chunk("", None);
            usage["choices"] = json!([]);
            usage["usage"] = openai::usage(&g.stats);
            out.push(usage);
        }
        out
    }
}
