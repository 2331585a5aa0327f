//! `moeflux serve`: an OpenAI-compatible HTTP API over one model.
//!
//! ```text
//! let server = Server::start(config)?;        // listening; /health says 503 "loading"
//! let model = Model::open(dir, &opts)?;
//! server.run(&model, text, |addr| eprintln!("listening on http://{addr}"))?;  // until SIGINT/SIGTERM
//! ```
//!
//! The HTTP side runs on a small tokio runtime; inference never does: one
//! inference thread owns `parallel` slots (`Session`s of the shared
//! `Model`), takes jobs from a bounded queue and runs every slot's
//! generation in the same forward passes ([`slots`]). A handler reads the
//! body under its bounds ([`body`]), has it parsed, the prompt rendered and
//! tokenized on the blocking pool (a few requests at a time, never on the
//! HTTP workers, so that `/health` stays quick under large prompts), queues
//! a job, and turns the slot's text pieces into a JSON reply or an SSE
//! stream. A client that goes away drops its reply, which sets the job's
//! cancel flag: the slot stops within a token. Connections, their timeouts
//! and shutdown are [`http`]'s; keys and origins [`access`]'s; the log line
//! of each request [`reqlog`]'s.

mod access;
mod api_error;
mod body;
mod chat;
mod completions;
mod http;
mod logprobs;
mod metrics;
mod openai;
mod page;
mod reqlog;
mod slots;
mod sse;
mod structured;
mod tokenize;
mod tools;

/// The request parsing of the handlers, without sockets or a model, for
/// the fuzz tests (`tests/fuzz.rs`).
#[doc(hidden)]
pub mod fuzzing {
    use super::{chat, completions, Ready, Text};
    use std::sync::OnceLock;

    /// What a handler does with a body before the model runs.
    pub struct RequestParser {
        ready: Ready,
    }

    /// A refused request: its status and message.
    pub type Refused = (u16, String);

    impl RequestParser {
        /// Parse requests for a model of `text` and a context of `n_ctx`.
        pub fn new(text: Text, n_ctx: usize) -> RequestParser {
            let max_prompt_bytes = super::max_prompt_bytes(&text.tokenizer, n_ctx);
            RequestParser {
                ready: Ready {
                    text,
                    n_ctx,
                    max_prompt_bytes,
                    grammars: OnceLock::new(),
                },
            }
        }

        /// A `/v1/chat/completions` body: the prompt's token ids.
        pub fn chat(&self, body: &[u8]) -> Result<Vec<u32>, Refused> {
            chat::prepare_ready(&self.ready, body)
                .map(|p| p.ids)
                .map_err(|e| (e.status.as_u16(), e.message))
        }

        /// A `/v1/completions` body: the prompt's token ids.
        pub fn completion(&self, body: &[u8]) -> Result<Vec<u32>, Refused> {
            completions::prepare(&self.ready, body)
                .map(|(_, ids, _, _)| ids)
                .map_err(|e| (e.status.as_u16(), e.message))
        }
    }
}

pub use api_error::ApiError;
pub use http::Timeouts;

use crate::error::{Error, Result};
use crate::text::{ChatTemplate, Constraint, GrammarCompiler, SamplingParams, Tokenizer};
use crate::Model;
use api_error::ApiResult;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics::{Gauges, Metrics};
use reqlog::RequestLog;
use serde_json::json;
use slots::{Job, Pool, Refusal, Running};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::{watch, Semaphore};

/// Requests parsed, rendered and tokenized at once (each on a thread of
/// the blocking pool); more wait their turn. Bounds the memory large
/// prompts take, and the CPU they take from the forward passes.
const PREPARING_AT_ONCE: usize = 2;
/// A prompt's text may be at most this many times the longest token's
/// bytes per token of context (normalizers can shorten text a little).
const PROMPT_BYTES_MARGIN: usize = 2;

/// How to serve.
#[derive(Debug, Clone)]
pub struct Config {
    pub host: String,
    /// 0: any free port (the ready line says which).
    pub port: u16,
    /// Requests must carry `Authorization: Bearer KEY` (all but `/health`
    /// and the chat page).
    pub api_key: Option<String>,
    /// Slots: generations that run at once.
    pub parallel: usize,
    /// Requests that may wait for a slot; one more is refused with 503.
    pub queue: usize,
    /// Context per request (prompt + answer); `None`: the model's.
    pub ctx: Option<usize>,
    /// The model's name in the API (`/v1/models`, `model` of replies).
    pub model_id: String,
    /// How often an SSE stream with nothing to say sends a comment.
    pub keep_alive: Duration,
    /// Bytes a request body may hold (more: 413).
    pub max_body: usize,
    pub timeouts: Timeouts,
    /// Origins of web pages, besides the server's own, that may call it
    /// (`*`: any).
    pub cors_origins: Vec<String>,
    /// Write each request's prompt and answer in its log line.
    pub log_text: bool,
}

impl Config {
    /// The settings of a server on `host:port` with the defaults of
    /// `moeflux serve`.
    pub fn new(host: impl Into<String>, port: u16, model_id: impl Into<String>) -> Config {
        Config {
            host: host.into(),
            port,
            api_key: None,
            parallel: 1,
            queue: 64,
            ctx: None,
            model_id: model_id.into(),
            keep_alive: Duration::from_secs(5),
            max_body: 8 << 20,
            timeouts: Timeouts::default(),
            cors_origins: Vec::new(),
            log_text: false,
        }
    }

    fn check(&self) -> Result<()> {
        if self.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
            return Err(Error::Invalid(
                "the API key is empty: give a key, or none to serve without one".into(),
            ));
        }
        if self.max_body == 0 {
            return Err(Error::Invalid("the request body limit must be at least 1 byte".into()));
        }
        Ok(())
    }
}

/// The text side of the model: tokenizer, chat template and sampling
/// defaults (from `generation_config.json`, SPEC.md §7).
pub struct Text {
    pub tokenizer: Tokenizer,
    /// `None`: `/v1/chat/completions` answers 400 (the model has none).
    pub template: Option<ChatTemplate>,
    pub defaults: SamplingParams,
}

/// What the handlers need once the model is loaded.
struct Ready {
    text: Text,
    n_ctx: usize,
    /// More bytes of prompt text than the context could hold as tokens
    /// (`None`: the tokenizer's tokens could not be read as bytes).
    max_prompt_bytes: Option<usize>,
    /// Structured output's grammar compiler, built by the first request
    /// that needs one (or why it cannot be).
    grammars: OnceLock<std::result::Result<GrammarCompiler, String>>,
}

struct Shared {
    config: Config,
    ready: OnceLock<Ready>,
    pool: Pool,
    metrics: Metrics,
    created: u64,
    stopping: AtomicBool,
    shutdown: watch::Sender<bool>,
    preparing: Arc<Semaphore>,
}

type AppState = Arc<Shared>;

impl Shared {
    fn ready(&self) -> ApiResult<&Ready> {
        self.ready
            .get()
            .ok_or_else(|| ApiError::unavailable("the model is loading; try again shortly"))
    }

    /// Stop taking requests, cancel running generations, end the server.
    fn begin_shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.pool.shut();
        self.shutdown.send_replace(true);
    }

    /// A JSON endpoint's body, read under `--max-body` and `--body-timeout`.
    async fn read_body(&self, headers: &HeaderMap, body: axum::body::Body) -> ApiResult<Bytes> {
        let limits = body::BodyLimits {
            bytes: self.config.max_body,
            timeout: self.config.timeouts.body,
        };
        body::read_json(headers, body, limits).await
    }

    /// Run `f` (parsing, rendering, tokenizing, compiling a grammar) on
    /// the blocking pool, at most [`PREPARING_AT_ONCE`] at a time.
    async fn prepare<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Shared) -> ApiResult<T> + Send + 'static,
    ) -> ApiResult<T> {
        let permit = self
            .preparing
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ApiError::unavailable("the server is shutting down"))?;
        let shared = self.clone();
        let work = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            f(&shared)
        });
        work.await
            .map_err(|e| ApiError::internal(format!("preparing the request failed: {e}")))?
    }

    fn submit(&self, job: Job) -> ApiResult<()> {
        self.pool.submit(job).map_err(|r| match r {
            Refusal::Loading => ApiError::unavailable("the model is loading; try again shortly"),
            Refusal::QueueFull => ApiError::unavailable(format!(
                "the server is busy: {} requests are waiting already (--queue); try again later",
                self.config.queue
            )),
            Refusal::ShuttingDown => ApiError::unavailable("the server is shutting down"),
        })
    }
}

impl Shared {
    /// Queue a generation of `prompt` (`param` names the field it came
    /// from), under `constraint` if any. The token budget is capped by what
    /// the context has left.
    fn start_job(
        &self,
        ready: &Ready,
        param: &str,
        prompt: Vec<u32>,
        job: JobSpec,
        log: Arc<RequestLog>,
    ) -> ApiResult<Running> {
        let JobSpec {
            mut sampling,
            checkpoint_at,
            constraint,
            logprobs,
        } = job;
        let n = prompt.len();
        if n == 0 {
            return Err(ApiError::field(param, "the prompt has no tokens"));
        }
        if n >= ready.n_ctx {
            return Err(ApiError {
                code: Some("context_length_exceeded"),
                ..ApiError::field(
                    param,
                    format!(
                        "this model's maximum context length is {} tokens, but the prompt has {n} tokens (with room for at least one more to generate); shorten it",
                        ready.n_ctx
                    ),
                )
            });
        }
        let room = ready.n_ctx - n;
        sampling.max_tokens = Some(sampling.max_tokens.map_or(room, |m| m.min(room)));
        let cancel = Arc::new(AtomicBool::new(false));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.submit(Job {
            prompt,
            sampling,
            checkpoint_at,
            constraint,
            logprobs,
            cancel: cancel.clone(),
            events: tx,
            log,
        })?;
        Ok(Running::new(rx, cancel))
    }
}

impl Ready {
    /// Refuse, before it is tokenized, a prompt text longer than any
    /// prompt that fits the context.
    fn check_prompt_bytes(&self, param: &str, bytes: usize) -> ApiResult<()> {
        match self.max_prompt_bytes {
            Some(max) if bytes > max => Err(ApiError {
                code: Some("context_length_exceeded"),
                ..ApiError::field(
                    param,
                    format!(
                        "the prompt is {bytes} bytes long, more than this model's maximum context length of {} tokens can hold (at most {max} bytes); shorten it",
                        self.n_ctx
                    ),
                )
            }),
            _ => Ok(()),
        }
    }
}

/// The most bytes of text a prompt of `n_ctx` tokens can be.
fn max_prompt_bytes(tokenizer: &Tokenizer, n_ctx: usize) -> Option<usize> {
    let longest = tokenizer.token_bytes().ok()?.iter().map(Vec::len).max()?;
    Some(n_ctx.saturating_mul(longest.max(1)).saturating_mul(PROMPT_BYTES_MARGIN))
}

/// How to generate, besides the prompt.
struct JobSpec {
    sampling: SamplingParams,
    checkpoint_at: Option<usize>,
    constraint: Option<Constraint>,
    logprobs: Option<usize>,
}

/// A server listening and answering; generation starts with [`Server::run`].
pub struct Server {
    runtime: tokio::runtime::Runtime,
    task: tokio::task::JoinHandle<()>,
    shared: AppState,
    addr: SocketAddr,
}

impl Server {
    /// Bind and start answering (`/health` says 503 until [`Server::run`]).
    /// SIGINT and SIGTERM shut the server down; a second one ends the
    /// process at once.
    pub fn start(config: Config) -> Result<Server> {
        config.check()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("moeflux-http")
            .enable_all()
            .build()
            .map_err(|e| Error::Server(format!("cannot start the HTTP runtime: {e}")))?;
        let where_ = format!("{}:{}", config.host, config.port);
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(&where_))
            .map_err(|e| Error::Server(format!("cannot listen on {where_}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::Server(format!("cannot listen on {where_}: {e}")))?;
        let shared = Arc::new(Shared {
            pool: Pool::new(config.queue),
            config,
            ready: OnceLock::new(),
            metrics: Metrics::default(),
            created: openai::unix_now(),
            stopping: AtomicBool::new(false),
            shutdown: watch::channel(false).0,
            preparing: Arc::new(Semaphore::new(PREPARING_AT_ONCE)),
        });
        let app = router(shared.clone());
        let stop = shared.shutdown.subscribe();
        let timeouts = shared.config.timeouts;
        let task = runtime.spawn(http::serve(listener, app, timeouts, stop));
        runtime.spawn(on_signals(shared.clone()));
        Ok(Server {
            runtime,
            task,
            shared,
            addr,
        })
    }

    /// The address bound (the actual port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serve `model` until SIGINT or SIGTERM: start the slots, call
    /// `on_ready`, and return once in-flight requests have ended.
    pub fn run(self, model: &Model, text: Text, on_ready: impl FnOnce(SocketAddr)) -> Result<()> {
        let Server {
            runtime,
            task,
            shared,
            addr,
        } = self;
        let config = &shared.config;
        let n_ctx = match config.ctx {
            Some(n) if n > model.n_ctx() => {
                return Err(Error::Invalid(format!(
                    "--ctx {n} is more than the model's context of {}",
                    model.n_ctx()
                )))
            }
            Some(0) => return Err(Error::Invalid("--ctx must be at least 1".into())),
            Some(n) => n,
            None => model.n_ctx(),
        };
        let parallel = config.parallel.max(1);
        let max_prompt_bytes = max_prompt_bytes(&text.tokenizer, n_ctx);
        let shared = &*shared;
        let served = std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel();
            let tok = text.tokenizer.clone();
            std::thread::Builder::new()
                .name("moeflux-infer".into())
                .spawn_scoped(scope, move || {
                    slots::work(&shared.pool, parallel, model, &tok, &shared.metrics, rx)
                })
                .map_err(|e| Error::Server(format!("cannot start the inference thread: {e}")))?;
            shared.pool.open(parallel, tx);
            // Set once: `run` consumes the server.
            let _ = shared.ready.set(Ready {
                text,
                n_ctx,
                max_prompt_bytes,
                grammars: OnceLock::new(),
            });
            on_ready(addr);
            let served = runtime.block_on(task);
            shared.pool.close();
            served.map_err(|e| Error::Server(format!("serving: {e}")))
        });
        // A request still being prepared on the blocking pool is not waited for.
        runtime.shutdown_timeout(Duration::from_millis(100));
        served
    }
}

/// Shut down on the first SIGINT or SIGTERM; exit at once on the second.
async fn on_signals(shared: AppState) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) else {
        return;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    shared.begin_shutdown();
    let code = tokio::select! {
        _ = int.recv() => 130,
        _ = term.recv() => 143,
    };
    tracing::warn!("a second signal: exiting without waiting for requests in flight");
    std::process::exit(code);
}

fn router(shared: AppState) -> Router {
    use axum::middleware::from_fn_with_state;
    let guarded = Router::new()
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/completions", post(completions::handle))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route_layer(from_fn_with_state(shared.clone(), access::authorize));
    let mut app = Router::new()
        .merge(guarded)
        .route("/health", get(health))
        .route("/", get(page::index))
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|method: Method| async move { ApiError::method_not_allowed(method.as_str()) })
        .layer(from_fn_with_state(shared.clone(), access::check_origin));
    if let Some(cors) = access::cors(&shared.config.cors_origins) {
        app = app.layer(cors);
    }
    app.layer(from_fn_with_state(shared.clone(), reqlog::log_requests))
        .with_state(shared)
}

async fn health(State(shared): State<AppState>) -> Response {
    if shared.stopping.load(Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "the server is shutting down"})),
        )
            .into_response();
    }
    match shared.ready.get() {
        Some(_) => Json(json!({"status": "ok"})).into_response(),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "the model is loading"})),
        )
            .into_response(),
    }
}

async fn models(State(shared): State<AppState>) -> Response {
    let n_ctx = shared.ready.get().map(|r| r.n_ctx);
    Json(json!({
        "object": "list",
        "data": [{
            "id": shared.config.model_id,
            "object": "model",
            "created": shared.created,
            "owned_by": "moeflux",
            "max_model_len": n_ctx,
        }],
    }))
    .into_response()
}

async fn metrics(State(shared): State<AppState>) -> Response {
    let (running, queued) = shared.pool.load();
    let gauges = Gauges {
        running,
        queued,
        slots: shared.config.parallel.max(1),
    };
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        shared.metrics.render(&gauges),
    )
        .into_response()
}
