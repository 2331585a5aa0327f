//! Server-sent events as the OpenAI API streams them: `data: {chunk}`
//! events, `data: [DONE]` at the end, and a comment line when nothing has
//! been said for a while (a long prefill), so that proxies and clients do
//! not time out.

use super::slots::{Event, Running};
use crate::error::Result;
use crate::generate::{Generation, TokenLogprob};
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::convert::Infallible;
use std::time::Duration;

/// Turns a generation's events into the chunks of one endpoint.
pub trait Chunks: Send + 'static {
    /// The chunks for a piece of text and its tokens' log-probabilities
    /// (none while text is held back).
    fn piece(&mut self, text: &str, logprobs: Vec<TokenLogprob>) -> Vec<Value>;
    /// The last chunks: the held-back text, `finish_reason`, usage; or an
    /// error object when the generation failed.
    fn done(&mut self, result: Result<Generation>) -> Vec<Value>;
}

struct Stream<C> {
    running: Running,
    chunks: C,
    first: Vec<Value>,
    keep_alive: Duration,
    ended: bool,
}

/// An SSE reply that sends `first` at once, then the job's chunks.
pub fn reply<C: Chunks>(first: Vec<Value>, running: Running, chunks: C, keep_alive: Duration) -> Response {
    let state = Stream {
        running,
        chunks,
        first,
        keep_alive,
        ended: false,
    };
    let body = futures_util::stream::unfold(state, |mut s| async move {
        if !s.first.is_empty() {
            let first = events(&std::mem::take(&mut s.first));
            return Some((Ok::<Bytes, Infallible>(first), s));
        }
        if s.ended {
            return None;
        }
        loop {
            let out = match tokio::time::timeout(s.keep_alive, s.running.events.recv()).await {
                Err(_) => Bytes::from_static(b": keep-alive\n\n"),
                Ok(Some(Event::Piece(text, logprobs))) => {
                    let chunks = s.chunks.piece(&text, logprobs);
                    if chunks.is_empty() {
                        continue;
                    }
                    events(&chunks)
                }
                Ok(Some(Event::Done(result))) => {
                    s.ended = true;
                    closing(&s.chunks.done(*result))
                }
                Ok(None) => {
                    s.ended = true;
                    let e = super::ApiError::unavailable("the server is shutting down");
                    closing(&[e.to_json()])
                }
            };
            return Some((Ok(out), s));
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

fn events(chunks: &[Value]) -> Bytes {
    let mut out = String::new();
    for c in chunks {
        out.push_str("data: ");
        out.push_str(&c.to_string());
        out.push_str("\n\n");
    }
    Bytes::from(out)
}

fn closing(chunks: &[Value]) -> Bytes {
    let mut out = events(chunks).to_vec();
    out.extend_from_slice(b"data: [DONE]\n\n");
    Bytes::from(out)
}
