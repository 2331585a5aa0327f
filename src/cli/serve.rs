//! `moeflux serve`: the OpenAI-compatible HTTP server (`moeflux::server`).

use super::model_args::ModelArgs;
use anyhow::Context;
use clap::Args;
use moeflux::server::{Config, Server, Text};
use moeflux::text::{GenerationDefaults, SamplingParams, Tokenizer};
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
    /// Require `Authorization: Bearer KEY` on every endpoint but /health and /.
    #[arg(long, value_name = "KEY", env = "MOEFLUX_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Generations that run at once, each in its own slot (session); all
    /// of them advance together, one forward pass per step (continuous
    /// batching: the weights and each expert are read once per step).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u16).range(1..),
          env = "MOEFLUX_ARG_N_PARALLEL")]
    pub parallel: u16,
    /// Requests that may wait for a free slot; more are refused with 503.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub queue: usize,
    /// Context per request, prompt and answer (default: the model's).
    #[arg(
        short = 'c',
        long,
        visible_alias = "ctx-size",
        value_name = "N",
        env = "MOEFLUX_ARG_CTX_SIZE"
    )]
    pub ctx: Option<usize>,
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

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let dir = &a.model.model;
    let model_id = a.alias.clone().unwrap_or_else(|| {
        let name = dir
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        name.unwrap_or_else(|| "moeflux".into())
    });
    if !(a.keep_alive.is_finite() && a.keep_alive > 0.0) {
        anyhow::bail!("--keep-alive must be a positive number of seconds");
    }
    let config = Config {
        host: a.host.clone(),
        port: a.port,
        api_key: a.api_key.clone(),
        parallel: a.parallel.into(),
        queue: a.queue,
        ctx: a.ctx,
        model_id,
        keep_alive: Duration::from_secs_f64(a.keep_alive),
    };
    let server = Server::start(config)?;
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
    let defaults = SamplingParams::from_defaults(&GenerationDefaults::from_dir(dir)?);
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
