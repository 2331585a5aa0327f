//! `POST /tokenize` and `POST /detokenize` (the shapes of llama.cpp's and
//! vLLM's servers).

use super::api_error::{ApiError, ApiResult};
use super::chat;
use super::openai::Body;
use super::tools;
use super::{AppState, Shared};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

/// `{"content"|"prompt": TEXT, "add_special": bool}` or `{"messages": [...]}`
/// (rendered by the chat template) → `{"tokens", "count", "max_model_len"}`.
pub async fn tokenize(State(shared): State<AppState>, req: Request) -> Response {
    let reply = async {
        let (parts, body) = req.into_parts();
        shared.ready()?;
        let body = shared.read_body(&parts.headers, body).await?;
        shared.prepare(move |s| tokens(s, &body)).await
    };
    match reply.await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

fn tokens(shared: &Shared, body: &[u8]) -> ApiResult<Value> {
    let ready = shared.ready()?;
    let body = Body::parse(body)?;
    let tok = &ready.text.tokenizer;
    let tokens = if body.get("messages").is_some() {
        let tools = tools::parse(&body)?;
        tok.encode(&chat::render(ready, &body, &tools)?.text, false)?
    } else {
        let text = match (body.str("content")?, body.str("prompt")?) {
            (Some(t), _) | (None, Some(t)) => t,
            (None, None) => {
                return Err(ApiError::field(
                    "content",
                    "give the text as `content` (or `prompt`), or `messages`",
                ))
            }
        };
        let special = body.bool("add_special")?.or(body.bool("add_special_tokens")?);
        tok.encode(text, special.unwrap_or(true))?
    };
    Ok(json!({"tokens": tokens, "count": tokens.len(), "max_model_len": ready.n_ctx}))
}

/// `{"tokens": [ids]}` → `{"content": TEXT, "prompt": TEXT}` (special tokens kept).
pub async fn detokenize(State(shared): State<AppState>, req: Request) -> Response {
    let reply = async {
        let (parts, body) = req.into_parts();
        shared.ready()?;
        let body = shared.read_body(&parts.headers, body).await?;
        shared.prepare(move |s| text(s, &body)).await
    };
    match reply.await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

fn text(shared: &Shared, body: &[u8]) -> ApiResult<Value> {
    let ready = shared.ready()?;
    let body = Body::parse(body)?;
    let bad = || ApiError::field("tokens", "`tokens` must be a list of token ids");
    let list = body.get("tokens").and_then(Value::as_array).ok_or_else(bad)?;
    let ids = list
        .iter()
        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(bad))
        .collect::<ApiResult<Vec<u32>>>()?;
    let text = ready.text.tokenizer.decode(&ids, false).map_err(|e| ApiError {
        param: Some("tokens".into()),
        ..ApiError::from(e)
    })?;
    Ok(json!({"content": text, "prompt": text}))
}
