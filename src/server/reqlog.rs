//! One `tracing` line per request, written when its reply has been sent
//! (or dropped by a client that went away): method, route, status, tokens
//! in (and of those, reused from the slot) and out, time, slot. The
//! prompt and answer texts only with `--log-text`.

use super::AppState;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

const NONE: usize = usize::MAX;
/// Longest request path written (a client chooses it).
const PATH_CHARS: usize = 80;

/// What a request's handler and slot tell its log line.
#[derive(Debug)]
pub struct RequestLog {
    slot: AtomicUsize,
    prompt_tokens: AtomicUsize,
    reused_tokens: AtomicUsize,
    generated_tokens: AtomicUsize,
    /// `Some` with `--log-text`: the prompt, then the answer.
    text: Option<Mutex<(String, String)>>,
}

impl RequestLog {
    fn new(with_text: bool) -> RequestLog {
        RequestLog {
            slot: AtomicUsize::new(NONE),
            prompt_tokens: AtomicUsize::new(NONE),
            reused_tokens: AtomicUsize::new(NONE),
            generated_tokens: AtomicUsize::new(NONE),
            text: with_text.then(|| Mutex::new(Default::default())),
        }
    }

    pub fn set_slot(&self, slot: usize) {
        self.slot.store(slot, Ordering::Relaxed);
    }

    /// The prompt's tokens, as soon as they are known.
    pub fn set_prompt(&self, tokens: usize, text: &str) {
        self.prompt_tokens.store(tokens, Ordering::Relaxed);
        if let Some(t) = &self.text {
            t.lock().unwrap_or_else(|e| e.into_inner()).0 = text.to_string();
        }
    }

    /// The generation's end.
    pub fn set_generated(&self, reused: usize, generated: usize, answer: &str) {
        self.reused_tokens.store(reused, Ordering::Relaxed);
        self.generated_tokens.store(generated, Ordering::Relaxed);
        if let Some(t) = &self.text {
            t.lock().unwrap_or_else(|e| e.into_inner()).1 = answer.to_string();
        }
    }
}

/// The log of a request (the middleware's; a fresh one that nobody
/// writes if it is missing).
pub fn of(parts: &axum::http::request::Parts) -> Arc<RequestLog> {
    parts
        .extensions
        .get::<Arc<RequestLog>>()
        .cloned()
        .unwrap_or_else(|| Arc::new(RequestLog::new(false)))
}

fn field(v: &AtomicUsize) -> String {
    match v.load(Ordering::Relaxed) {
        NONE => "-".into(),
        n => n.to_string(),
    }
}

/// The outermost layer: hands the handlers a [`RequestLog`] and writes
/// the line once the reply's body is done with.
pub async fn log_requests(State(shared): State<AppState>, mut req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().to_string();
    let path: String = req.uri().path().chars().take(PATH_CHARS).collect();
    let log = Arc::new(RequestLog::new(shared.config.log_text));
    req.extensions_mut().insert(log.clone());
    let res = next.run(req).await;
    let line = Line {
        method,
        path,
        status: res.status().as_u16(),
        start,
        log,
    };
    let (parts, body) = res.into_parts();
    Response::from_parts(parts, Body::new(Logged { body, line: Some(line) }))
}

struct Line {
    method: String,
    path: String,
    status: u16,
    start: Instant,
    log: Arc<RequestLog>,
}

impl Line {
    fn write(self) {
        let l = &self.log;
        let ms = format!("{:.1}", self.start.elapsed().as_secs_f64() * 1e3);
        let (method, route, status) = (&self.method, &self.path, self.status);
        let (tokens_in, reused) = (field(&l.prompt_tokens), field(&l.reused_tokens));
        let (tokens_out, slot) = (field(&l.generated_tokens), field(&l.slot));
        match &l.text {
            None => tracing::info!(%method, ?route, status, %tokens_in, %reused, %tokens_out, %ms, %slot, "request"),
            Some(t) => {
                let (prompt, answer) = t.lock().unwrap_or_else(|e| e.into_inner()).clone();
                tracing::info!(%method, ?route, status, %tokens_in, %reused, %tokens_out, %ms, %slot, ?prompt, ?answer, "request")
            }
        }
    }
}

/// A reply body that writes its request's line when dropped.
struct Logged {
    body: Body,
    line: Option<Line>,
}

impl HttpBody for Logged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        if let Some(line) = self.line.take() {
            line.write();
        }
    }
}
