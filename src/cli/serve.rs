//! `moeflux serve`: the OpenAI-compatible HTTP server (`moeflux::server`).

use super::model_args::ModelArgs;
use anyhow::Context;
use clap::Args;
use moeflux::server::{Config, Server, Text, Timeouts};
use moeflux::text::Tokenizer;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1", env = "MOEFLUX_ARG_HOST")]
    pub host: String,
    /// Port to listen on (0: any free one; the ready line names it).
    #[arg(long, default_value_t = 8080, env = "MOEFLUX_ARG_PORT")]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health
    /// and / (a key given here shows in `ps`: prefer --api-key-file or the
    /// environment variable).
    #[arg(long, value_name = "KEY", env = "MOEFLUX_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Read the API key from the first line of FILE.
    #[arg(long, value_name = "FILE", conflicts_with = "api_key")]
    pub api_key_file: Option<PathBuf>,
    /// Let web pages of ORIGIN (`https://app.example:8443`) call the
    /// server and read its replies; repeat for several, `*` for any. By
    /// default only the server's own chat page may.
    #[arg(long, value_name = "ORIGIN")]
    pub cors_origin: Vec<String>,
    /// Largest request body, in bytes (more: 413).
    #[arg(long, default_value_t = 8 << 20, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    pub max_body: u64,
    /// Seconds a connection may take to send a request's headers, from
    /// its start or from its last reply (slow and idle connections are
    /// closed after it).
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub header_timeout: f64,
    /// Seconds a request may take to send its body (more: 408).
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub body_timeout: f64,
    /// Seconds a reply may wait for a client that does not read it; then
    /// the connection is closed (and its generation stopped).
    #[arg(long, default_value_t = 60.0, value_name = "SECONDS")]
    pub idle_timeout: f64,
    /// Seconds requests in flight get to end after SIGINT / SIGTERM; then
    /// every connection is closed (a second signal exits at once).
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub shutdown_timeout: f64,
    /// Write each request's prompt and answer in its log line (off: only
    /// the method, route, status, token counts, time and slot).
    #[arg(long)]
    pub log_text: bool,
    /// Generations that run at once, each in its own slot (session); all
    /// of them advance together, one forward pass per step (continuous
    /// batching: the weights and each expert are read once per step).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u16).range(1..),
          env = "MOEFLUX_ARG_N_PARALLEL")]
    pub parallel: u16,
    /// Requests that may wait for a free slot; more are refused with 503.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub queue: usize,
    /// The model's name in the API (default: the model directory's name).
    #[arg(long, value_name = "NAME", env = "MOEFLUX_ARG_ALIAS")]
    pub alias: Option<String>,
    /// A Jinja chat template file instead of the model's own, or a
    /// built-in one by name: chatml.
    #[arg(
        long,
        value_name = "FILE|NAME",
        visible_alias = "chat-template-file",
        env = "MOEFLUX_ARG_CHAT_TEMPLATE"
    )]
    pub chat_template: Option<PathBuf>,
    /// Seconds of silence after which a stream sends an SSE comment.
    #[arg(long, default_value_t = 5.0, value_name = "SECONDS")]
    pub keep_alive: f64,
}

pub fn run(mut a: ServeArgs) -> anyhow::Result<()> {
    // Each slot holds a context of -c tokens: the memory plan holds them all.
    a.model.sequences = a.parallel.into();
    let dir = &a.model.model;
    let model_id = a.alias.clone().unwrap_or_else(|| {
        let name = dir
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        name.unwrap_or_else(|| "moeflux".into())
    });
    let timeouts = Timeouts {
        header: seconds("--header-timeout", a.header_timeout)?,
        body: seconds("--body-timeout", a.body_timeout)?,
        idle: seconds("--idle-timeout", a.idle_timeout)?,
        shutdown: seconds("--shutdown-timeout", a.shutdown_timeout)?,
    };
    let config = Config {
        api_key: api_key(&a)?,
        parallel: a.parallel.into(),
        queue: a.queue,
        keep_alive: seconds("--keep-alive", a.keep_alive)?,
        max_body: usize::try_from(a.max_body)?,
        timeouts,
        cors_origins: a.cors_origin.clone(),
        log_text: a.log_text,
        ..Config::new(a.host.clone(), a.port, model_id)
    };
    init_logging();
    let server = Server::start(config)?;
    let addr = server.local_addr();
    if !addr.ip().is_loopback() && a.api_key.is_none() && a.api_key_file.is_none() {
        eprintln!(
            "warning: serving on {addr} without an API key: anyone who can reach this address can use the model (give --api-key-file FILE, or --host 127.0.0.1)"
        );
    }
    eprintln!(
        "loading {} (http://{} answers 503 until ready)",
        dir.display(),
        server.local_addr()
    );
    let model = a.model.open_model()?;
    let tokenizer = Tokenizer::from_dir(dir)
        .with_context(|| format!("{}: serving text needs the model's tokenizer", dir.display()))?;
    let template = match &a.chat_template {
        Some(file) => Some(a.model.template(Some(file))?),
        None => moeflux::text::ChatTemplate::from_dir(dir)?,
    };
    if template.is_none() {
        eprintln!(
            "note: {} has no chat template: /v1/chat/completions answers 400 (give --chat-template FILE)",
            dir.display()
        );
    }
    let defaults = moeflux::check::sampling_defaults(dir)?;
    let text = Text {
        tokenizer,
        template,
        defaults,
    };
    server.run(&model, text, |addr| {
        eprintln!(
            "listening on http://{addr} ({} on {}, {} slot{})",
            model.name(),
            model.device_name(),
            a.parallel,
            if a.parallel == 1 { "" } else { "s" }
        )
    })?;
    eprintln!("stopped");
    Ok(())
}

/// A positive, finite number of seconds (at most a day).
fn seconds(flag: &str, s: f64) -> anyhow::Result<Duration> {
    if !(s.is_finite() && s > 0.0 && s <= 86_400.0) {
        anyhow::bail!("{flag} {s}: give a number of seconds from more than 0 to 86400");
    }
    Ok(Duration::from_secs_f64(s))
}

/// The key of --api-key, MOEFLUX_API_KEY or --api-key-file; an empty one
/// is refused (it would start a server that turns everyone away).
fn api_key(a: &ServeArgs) -> anyhow::Result<Option<String>> {
    let key = match &a.api_key_file {
        Some(file) => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading the API key from {}", file.display()))?;
            let line = text.lines().next().unwrap_or("").trim().to_string();
            if line.is_empty() {
                anyhow::bail!("{}: the API key file is empty", file.display());
            }
            Some(line)
        }
        None => a.api_key.clone(),
    };
    let env_empty = std::env::var_os("MOEFLUX_API_KEY").is_some_and(|v| v.is_empty());
    if key.as_deref().is_some_and(|k| k.trim().is_empty()) || (key.is_none() && env_empty) {
        anyhow::bail!(
            "the API key is empty (--api-key or MOEFLUX_API_KEY): give a key, or unset it to serve without one"
        );
    }
    Ok(key)
}

/// Log lines (one per request) on stderr.
fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_max_level(tracing::Level::INFO)
        .try_init();
}
