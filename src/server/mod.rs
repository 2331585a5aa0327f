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
//! generation in the same forward passes ([`slots`]). A handler renders and
//! tokenizes the prompt, queues a job, and turns the slot's text pieces
//! into a JSON reply or an SSE stream. A client that goes away drops its
//! reply, which sets the job's cancel flag: the slot stops within a token.

mod api_error;
mod chat;
mod completions;
mod logprobs;
mod metrics;
mod openai;
mod page;
mod slots;
mod sse;
mod structured;
mod tokenize;
mod tools;

pub use api_error::ApiError;

use crate::error::{Error, Result};
use crate::text::{ChatTemplate, Constraint, GrammarCompiler, SamplingParams, Tokenizer};
use crate::Model;
use api_error::ApiResult;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics::{Gauges, Metrics};
use serde_json::json;
use slots::{Job, Pool, Refusal, Running};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::watch;

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
    fn start_job(&self, ready: &Ready, param: &str, prompt: Vec<u32>, job: JobSpec) -> ApiResult<Running> {
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
        })?;
        Ok(Running::new(rx, cancel))
    }
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
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    shared: AppState,
    addr: SocketAddr,
}

impl Server {
    /// Bind and start answering (`/health` says 503 until [`Server::run`]).
    /// SIGINT and SIGTERM shut the server down.
    pub fn start(config: Config) -> Result<Server> {
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
        });
        let app = router(shared.clone());
        let mut stop = shared.shutdown.subscribe();
        let task = runtime.spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await
        });
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
        let config = &self.shared.config;
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
        let shared = &*self.shared;
        std::thread::scope(|scope| {
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
                grammars: OnceLock::new(),
            });
            on_ready(self.addr);
            let served = self.runtime.block_on(self.task);
            shared.pool.close();
            match served {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(Error::Server(format!("serving: {e}"))),
                Err(e) => Err(Error::Server(format!("serving: {e}"))),
            }
        })
    }
}

/// Shut down on the first SIGINT or SIGTERM.
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
}

fn router(shared: AppState) -> Router {
    let guarded = Router::new()
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/completions", post(completions::handle))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route_layer(axum::middleware::from_fn_with_state(shared.clone(), authorize));
    Router::new()
        .merge(guarded)
        .route("/health", get(health))
        .route("/", get(page::index))
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .layer(tower_http::cors::CorsLayer::permissive())
        .with_state(shared)
}

/// With `--api-key`: the request must carry `Authorization: Bearer KEY`.
async fn authorize(State(shared): State<AppState>, headers: HeaderMap, req: Request, next: Next) -> Response {
    if let Some(key) = &shared.config.api_key {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if given != Some(key.as_str()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
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
