//! `moeflux run`: generate from a prompt, streaming the text to stdout as
//! it is made, with a summary (throughput, expert traffic) on stderr.

use super::interrupt;
pub use super::model_args::ModelArgs;
use anyhow::Context;
use clap::Args;
use moeflux::backend::KvType;
use moeflux::generate::{CacheTraffic, Finish, GenerationStats, Generator, PhaseBreakdown, Request};
use moeflux::text::{
    model_eos_ids, ChatRequest, ChatTemplate, Rng, SamplingParams, TextStream, Tokenizer, TokenizerConfig,
};
use moeflux::Model;
use std::borrow::Cow;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

/// Tokens generated when neither `-n` nor `generation_config.json` says.
const DEFAULT_MAX_TOKENS: usize = 256;

impl ModelArgs {
    /// The model and its tokenizer.
    pub fn open(&self) -> anyhow::Result<(Model, Tokenizer)> {
        let model = self.open_model()?;
        let dir = &self.model;
        let tok = load_tokenizer(dir, "generating text needs the model's tokenizer")?;
        Ok((model, tok))
    }

    /// `--chat-template FILE|NAME`, else the model's own template.
    pub fn template(&self, file: Option<&Path>) -> anyhow::Result<ChatTemplate> {
        if let Some(path) = file {
            let builtin = path
                .to_str()
                .filter(|_| !path.exists())
                .and_then(super::llama::builtin_template);
            let text = match builtin {
                Some(t) => t.to_string(),
                None => std::fs::read_to_string(path).with_context(|| {
                    format!(
                        "reading {} (--chat-template takes a file or a built-in name: {})",
                        path.display(),
                        super::llama::BUILTIN_TEMPLATES
                    )
                })?,
            };
            let special = TokenizerConfig::from_dir(&self.model)?.special_tokens();
            return Ok(ChatTemplate::new(&text, path, special)?);
        }
        ChatTemplate::from_dir(&self.model)?.with_context(|| {
            format!(
                "{} has no chat template (chat_template.jinja or tokenizer_config.json's chat_template); pass --chat-template FILE",
                self.model.display()
            )
        })
    }
}

/// Sampling flags; unset ones come from the model's `generation_config.json`
/// (greedy when it does not ask for sampling).
#[derive(Args)]
pub struct SamplingArgs {
    /// 0 picks the most likely token (greedy).
    #[arg(long, visible_alias = "temp")]
    pub temperature: Option<f32>,
    /// Keep the K most likely tokens (0: all).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Keep the most likely tokens holding this probability mass (1: all).
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than this fraction of the most likely one.
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Penalty on tokens already in the prompt or output (1: off; transformers' repetition_penalty).
    #[arg(long)]
    pub repeat_penalty: Option<f32>,
    /// Subtracted once from the logit of every token already seen.
    #[arg(long)]
    pub presence_penalty: Option<f32>,
    /// Subtracted per occurrence of a token already seen.
    #[arg(long)]
    pub frequency_penalty: Option<f32>,
    /// Seed of the sampler (random when not given; the summary prints it).
    #[arg(short = 's', long)]
    pub seed: Option<u64>,
    /// Stop when the text produces this string (not printed). Repeatable.
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
}

impl SamplingArgs {
    /// The parameters for model `dir`: `generation_config.json`, then these
    /// flags. `max_tokens` is `-n` (0: no limit), else the config's
    /// `max_new_tokens`, else `default_max`.
    pub fn params(
        &self,
        dir: &Path,
        max_tokens: Option<usize>,
        default_max: Option<usize>,
    ) -> anyhow::Result<SamplingParams> {
        let mut p = moeflux::check::sampling_defaults(dir)?;
        let set = |dst: &mut f32, v: Option<f32>| {
            if let Some(v) = v {
                *dst = v;
            }
        };
        set(&mut p.temperature, self.temperature);
        set(&mut p.top_p, self.top_p);
        set(&mut p.min_p, self.min_p);
        set(&mut p.repetition_penalty, self.repeat_penalty);
        set(&mut p.presence_penalty, self.presence_penalty);
        set(&mut p.frequency_penalty, self.frequency_penalty);
        if let Some(k) = self.top_k {
            p.top_k = k;
        }
        p.seed = Some(self.seed.unwrap_or_else(Rng::entropy_seed));
        p.stop = self.stop.clone();
        p.max_tokens = match max_tokens {
            Some(0) => None,
            Some(n) => Some(n),
            None => p.max_tokens.or(default_max),
        };
        p.validate()?;
        Ok(p)
    }
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt text.
    #[arg(
        short = 'p',
        long,
        required_unless_present = "prompt_ids",
        conflicts_with = "prompt_ids"
    )]
    pub prompt: Option<String>,
    /// The prompt as comma-separated token ids (bypasses the tokenizer and
    /// the template; a model without tokenizer.json then prints ids, <id> each).
    #[arg(long, value_delimiter = ',', conflicts_with = "chat")]
    pub prompt_ids: Option<Vec<u32>>,
    /// Tokens to generate; 0: until an end-of-sequence token or the end of
    /// the context. Default: generation_config.json's max_new_tokens, else 256.
    #[arg(short = 'n', long = "max-tokens", value_name = "N")]
    pub max_tokens: Option<usize>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Apply the chat template to the prompt as a user message.
    #[arg(long)]
    pub chat: bool,
    /// A system message (with --chat).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// A Jinja chat template file instead of the model's own, or a
    /// built-in one by name: chatml (with --chat).
    #[arg(
        long,
        value_name = "FILE|NAME",
        requires = "chat",
        visible_alias = "chat-template-file"
    )]
    pub chat_template: Option<PathBuf>,
    /// Add a per-phase time breakdown to the summary.
    #[arg(long)]
    pub timing: bool,
    /// Print one JSON object {"prompt_tokens", "tokens", "text", "stats"} instead of streaming.
    #[arg(long)]
    pub json: bool,
}

/// The `messages` of a one-turn chat.
fn one_turn(system: Option<&str>, user: &str) -> Vec<serde_json::Value> {
    let mut m = Vec::new();
    if let Some(s) = system {
        m.push(serde_json::json!({"role": "system", "content": s}));
    }
    m.push(serde_json::json!({"role": "user", "content": user}));
    m
}

/// The model's tokenizer; `None` when it has no `tokenizer.json` and the
/// prompt is given as ids (the output is then ids too).
fn tokenizer(a: &RunArgs) -> anyhow::Result<Option<Tokenizer>> {
    let dir = &a.model.model;
    if a.prompt_ids.is_some() && !dir.join("tokenizer.json").exists() {
        eprintln!(
            "note: {} has no tokenizer.json: the output is token ids, <id> each",
            dir.display()
        );
        return Ok(None);
    }
    let tok = load_tokenizer(
        dir,
        "generating text needs the model's tokenizer (or give the prompt as --prompt-ids)",
    )?;
    Ok(Some(tok))
}

/// The tokenizer of `dir`; `hint` is added where `tokenizer.json` itself is
/// at fault (an error in another file it reads, such as
/// `generation_config.json`, names that file alone).
fn load_tokenizer(dir: &Path, hint: &str) -> anyhow::Result<Tokenizer> {
    Tokenizer::from_dir(dir).map_err(|e| match &e {
        moeflux::Error::Io { path, .. } | moeflux::Error::Format { path, .. } if path.ends_with("tokenizer.json") => {
            anyhow::Error::new(e).context(format!("{}: {hint}", dir.display()))
        }
        _ => e.into(),
    })
}

fn prompt_ids(a: &RunArgs, tok: Option<&Tokenizer>) -> anyhow::Result<Vec<u32>> {
    if let Some(ids) = &a.prompt_ids {
        return Ok(ids.clone());
    }
    let tok = tok.context("a text prompt needs the model's tokenizer")?;
    let text = a.prompt.as_deref().unwrap_or_default();
    if !a.chat {
        return Ok(tok.encode(text, true)?);
    }
    let template = a.model.template(a.chat_template.as_deref())?;
    let rendered = template.render(&ChatRequest {
        messages: one_turn(a.system.as_deref(), text),
        add_generation_prompt: true,
        ..ChatRequest::default()
    })?;
    // The rendered prompt holds its special tokens.
    Ok(tok.encode(&rendered, false)?)
}

pub fn run(a: RunArgs) -> anyhow::Result<()> {
    interrupt::install()?;
    let model = a.model.open_model()?;
    let tok = tokenizer(&a)?;
    let prompt = prompt_ids(&a, tok.as_ref())?;
    let params = a
        .sampling
        .params(&a.model.model, a.max_tokens, Some(DEFAULT_MAX_TOKENS))?;
    model.set_timing(a.timing);
    let mut session = model.session()?;
    let req = Request {
        timing: a.timing,
        cancel: Some(interrupt::stop_flag()),
        ..Request::new(&prompt, params.clone())
    };
    interrupt::set_generating(true);
    let mut g = match &tok {
        Some(tok) => Generator::start(&mut session, tok, req)?,
        None => {
            let eos = model_eos_ids(&a.model.model)?.unwrap_or_default();
            Generator::start_with_stream(&mut session, TextStream::ids(&eos, &params), req)?
        }
    };
    let mut out = std::io::stdout().lock();
    let terminal = out.is_terminal();
    // Whether the reader of stdout went away (`| head`): then stop.
    let mut gone = false;
    while let Some(piece) = g.next_piece()? {
        if a.json {
            continue;
        }
        let piece = if terminal {
            for_terminal(&piece)
        } else {
            Cow::Borrowed(piece.as_str())
        };
        match out.write_all(piece.as_bytes()).and_then(|()| out.flush()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                gone = true;
                break;
            }
            r => r.context("writing to stdout")?,
        }
    }
    let done = g.finish()?;
    interrupt::set_generating(false);
    if a.json {
        let mut stats = serde_json::to_value(&done.stats)?;
        stats["finish"] = done.finish.name().into();
        if let Finish::Stop(s) = &done.finish {
            stats["stop"] = s.as_str().into();
        }
        stats["seed"] = params.seed.into();
        let j = serde_json::json!({"prompt_tokens": prompt, "tokens": done.tokens, "text": done.text, "stats": stats});
        writeln!(out, "{j}")?;
        out.flush()?;
    } else {
        if !gone && !done.text.is_empty() && !done.text.ends_with('\n') {
            // A reader that leaves now misses only the newline.
            writeln!(out).and_then(|()| out.flush()).ok();
        }
        let mut err = std::io::stderr().lock();
        write_summary(&mut err, &model, &done.stats, &done.finish, &params)?;
        if a.timing {
            write_timing(&mut err, &done.stats)?;
        }
    }
    if done.finish == Finish::Cancelled && !gone {
        std::process::exit(130);
    }
    Ok(())
}

/// Model text made safe for a terminal: control characters other than
/// newline, tab and carriage return are shown as their Unicode control
/// pictures (an ESC written by a model must not drive the terminal).
pub fn for_terminal(s: &str) -> Cow<'_, str> {
    let harmless = |c: char| !c.is_control() || matches!(c, '\n' | '\t' | '\r');
    if s.chars().all(harmless) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .map(|c| match c {
                c if harmless(c) => c,
                '\u{7f}' => '\u{2421}',
                c if (c as u32) < 0x20 => char::from_u32(0x2400 + c as u32).unwrap_or('\u{fffd}'),
                _ => '\u{fffd}',
            })
            .collect(),
    )
}

fn why(finish: &Finish) -> String {
    match finish {
        Finish::Eos => "end of sequence".into(),
        Finish::Stop(s) => format!("stop string {s:?}"),
        Finish::Length => "token limit".into(),
        Finish::ContextFull => "context full".into(),
        Finish::Cancelled => "cancelled".into(),
        Finish::Complete => "grammar complete".into(),
    }
}

fn mb(bytes: f64) -> String {
    format!("{:.2} MB", bytes / 1e6)
}

/// The end-of-run summary: tokens, prefill / decode throughput, time to
/// first token, expert traffic.
pub fn write_summary(
    w: &mut impl Write,
    model: &Model,
    s: &GenerationStats,
    finish: &Finish,
    params: &SamplingParams,
) -> std::io::Result<()> {
    let t = params.temperature;
    let sampling = match params.seed {
        _ if t == 0.0 => "greedy".to_string(),
        Some(seed) => format!("temperature {t}, seed {seed}"),
        None => format!("temperature {t}"),
    };
    writeln!(
        w,
        "prompt {} tokens ({} reused) | generated {} tokens ({}) | {sampling} | {} on {}{}",
        s.prompt_tokens,
        s.reused_tokens,
        s.generated_tokens,
        why(finish),
        model.name(),
        model.device_name(),
        kernel_note(model)
    )?;
    writeln!(
        w,
        "prefill {:.1} tok/s ({} tokens, {:.3} s) | decode {:.1} tok/s ({} tokens, {:.3} s) | first token {:.3} s",
        s.prefill_tok_s,
        s.prompt_tokens - s.reused_tokens,
        s.prefill_s,
        s.decode_tok_s,
        s.generated_tokens.saturating_sub(1),
        s.decode_s,
        s.time_to_first_token_s
    )?;
    let d = &s.decode_experts;
    let steps = s.generated_tokens.saturating_sub(1).max(1) as f64;
    write!(
        w,
        "experts: decode {:.1} reads/token, {}/token streamed ({} total, {:.3} s reading) | prefill {} reads, {}",
        d.experts_read as f64 / steps,
        mb(s.decode_bytes_per_token),
        mb(d.bytes_read as f64),
        d.read_s,
        s.prefill_experts.experts_read,
        mb(s.prefill_experts.bytes_read as f64),
    )?;
    match (&d.cache, &s.prefill_experts.cache) {
        _ if model.expert_cache().is_some_and(|c| c.resident) => {
            writeln!(w, "\ncache: every expert is resident on the device (nothing streams)")
        }
        (Some(dc), Some(pc)) => {
            let pct = |c: &CacheTraffic| c.hit_rate().map_or("n/a".to_string(), |r| format!("{:.1}%", 100.0 * r));
            writeln!(
                w,
                "\ncache: decode hit rate {} ({} hits, {} misses, {} prefetched, {} prefetch hits), {}/token copied, {:.3} s stalled | prefill hit rate {}",
                pct(dc),
                dc.hits,
                dc.misses,
                dc.prefetched,
                dc.prefetch_hits,
                mb(dc.bytes_copied as f64 / steps),
                dc.stall_s,
                pct(pc)
            )
        }
        _ => writeln!(w, " | hit rate n/a ({} keeps no expert cache)", model.device_name()),
    }
}

/// `, kernel K` on the CPU, with what the fast path does when it runs;
/// on CUDA, whether prefill runs on tensor cores; then the KV caches'
/// types where they round (f16 by default).
pub fn kernel_note(model: &Model) -> String {
    let kv = model.kv_types();
    let kv_note = match (kv.k, kv.v) {
        (KvType::F32, KvType::F32) => String::new(),
        (k, v) if k == v => format!(", KV cache {k} (-ctk/-ctv f32 or --exact for f32)"),
        (k, v) => format!(", KV cache {k}/{v} (-ctk/-ctv f32 or --exact for f32)"),
    };
    kernel_only(model) + &kv_note
}

fn kernel_only(model: &Model) -> String {
    match model.cuda_tensor_cores() {
        Some(true) => return ", prefill products on tensor cores (split f16, f32 sums; --exact for f32)".into(),
        Some(false) => return String::new(),
        None => {}
    }
    match model.cpu_kernel() {
        Some(k) if !k.is_exact() => format!(
            ", kernel {} (16-bit activations in quantized products; --exact for f32)",
            k.name()
        ),
        Some(k) => format!(", kernel {}", k.name()),
        None => String::new(),
    }
}

/// The `--timing` table: seconds per phase, prefill and decode.
pub fn write_timing(w: &mut impl Write, s: &GenerationStats) -> std::io::Result<()> {
    let (Some(p), Some(d)) = (&s.prefill_phases, &s.decode_phases) else {
        return Ok(());
    };
    let steps = s.generated_tokens.saturating_sub(1).max(1) as f64;
    type Column = fn(&PhaseBreakdown) -> f64;
    let rows: [(&str, Column); 6] = [
        ("attention", |x| x.attention),
        ("routing", |x| x.routing),
        ("expert I/O wait", |x| x.expert_io_wait),
        ("expert compute", |x| x.expert_compute),
        ("dense FFN", |x| x.dense_ffn),
        ("lm head", |x| x.lm_head),
    ];
    writeln!(
        w,
        "{:<18} {:>10} {:>10} {:>14} {:>9}",
        "phase", "prefill s", "decode s", "decode ms/tok", "decode %"
    )?;
    let pct = |x: f64| if s.decode_s > 0.0 { 100.0 * x / s.decode_s } else { 0.0 };
    let mut row = |name: &str, pv: f64, dv: f64| {
        writeln!(
            w,
            "{name:<18} {pv:>10.4} {dv:>10.4} {:>14.3} {:>9.1}",
            1e3 * dv / steps,
            pct(dv)
        )
    };
    for (name, f) in rows {
        row(name, f(p), f(d))?;
    }
    let other_p = (s.prefill_s - p.total()).max(0.0);
    let other_d = (s.decode_s - d.total()).max(0.0);
    row("other", other_p, other_d)?;
    row("total", s.prefill_s, s.decode_s)
}

#[cfg(test)]
mod tests {
    #[test]
    fn control_characters_are_shown_not_sent_to_the_terminal() {
        assert_eq!(super::for_terminal("a\tb\nc"), "a\tb\nc");
        assert_eq!(
            super::for_terminal("\x1b[2J\x07\u{7f}\u{9b}é"),
            "\u{241b}[2J\u{2407}\u{2421}\u{fffd}é"
        );
    }
}
