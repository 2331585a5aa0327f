//! `moeflux chat`: an interactive terminal chat. Each turn renders the whole
//! conversation with the chat template and evaluates only what the session
//! does not hold yet (the generator rewinds to the longest common prefix).

use super::interrupt;
use super::run::{for_terminal, write_summary, write_timing, ModelArgs, SamplingArgs};
use anyhow::{bail, Context};
use clap::Args;
use moeflux::chatsave;
use moeflux::generate::{Finish, Generation, Generator, Request, Segment, ThinkSplitter};
use moeflux::text::{ChatRequest, ChatTemplate, SamplingParams, Tokenizer};
use moeflux::{Model, Session};
use serde_json::{json, Value};
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Tokens per answer at most; 0: until an end-of-sequence token or the
    /// end of the context. Default: generation_config.json's max_new_tokens, else 0.
    #[arg(short = 'n', long = "max-tokens", value_name = "N")]
    pub max_tokens: Option<usize>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// A system message that starts the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// A Jinja chat template file instead of the model's own, or a
    /// built-in one by name: chatml.
    #[arg(long, value_name = "FILE|NAME", visible_alias = "chat-template-file")]
    pub chat_template: Option<PathBuf>,
    /// Do not show a reasoning model's thinking (<think>…</think>).
    #[arg(long)]
    pub hide_think: bool,
    /// Keep per-phase times for /stats.
    #[arg(long)]
    pub timing: bool,
}

const HELP: &str = "\
Type a message and press Enter. A line ending in \\ continues on the next
line; a block between lines of \"\"\" is sent as one message.
  /reset       start a new conversation
  /save FILE   save the conversation and the session state to FILE
  /load FILE   load a conversation saved with /save
  /stats       statistics of the last answer and of the session
  /exit        leave (or Ctrl-D); Ctrl-C stops an answer being written";

/// ANSI styling when stdout is a terminal (and NO_COLOR is unset).
struct Style {
    on: bool,
}

impl Style {
    fn paint(&self, code: &str, text: &str) -> String {
        if self.on {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
}

struct Chat<'m> {
    model: &'m Model,
    tok: Tokenizer,
    template: ChatTemplate,
    session: Session<'m>,
    params: SamplingParams,
    messages: Vec<Value>,
    /// The system message, kept across /reset.
    system: Option<Value>,
    /// The tokens the session holds (it cannot say itself after /load).
    held: Vec<u32>,
    last: Option<Generation>,
    turns: u64,
    hide_think: bool,
    timing: bool,
    style: Style,
}

pub fn run(a: ChatArgs) -> anyhow::Result<()> {
    interrupt::install()?;
    let (model, tok) = a.model.open()?;
    let template = a.model.template(a.chat_template.as_deref())?;
    let params = a.sampling.params(&a.model.model, a.max_tokens, None)?;
    model.set_timing(a.timing);
    let system = a.system.as_ref().map(|s| json!({"role": "system", "content": s}));
    let mut chat = Chat {
        session: model.session()?,
        model: &model,
        tok,
        template,
        params,
        messages: system.iter().cloned().collect(),
        system,
        held: Vec::new(),
        last: None,
        turns: 0,
        hide_think: a.hide_think,
        timing: a.timing,
        style: Style {
            on: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        },
    };
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "moeflux chat: {} on {}, context {} tokens. /help for commands.",
            model.name(),
            model.device_name(),
            model.n_ctx()
        );
    }
    let mut input = std::io::stdin().lock();
    while let Some(text) = read_message(&mut input, interactive, &chat.style)? {
        let line = text.trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('/') {
            if !chat.command(line)? {
                break;
            }
            continue;
        }
        if let Err(e) = chat.turn(text) {
            if super::is_broken_pipe(&e) {
                return Err(e);
            }
            chat.recover();
            eprintln!("error: {e:#}");
        }
    }
    Ok(())
}

/// Read one message: a line, lines joined by a trailing `\`, or a `"""`
/// block. `None` at the end of input.
fn read_message(input: &mut impl BufRead, interactive: bool, style: &Style) -> anyhow::Result<Option<String>> {
    let prompt = |more: bool| -> anyhow::Result<()> {
        if interactive {
            let mut out = std::io::stdout().lock();
            write!(out, "{}", style.paint("1", if more { "… " } else { "> " }))?;
            out.flush()?;
        }
        Ok(())
    };
    let mut msg = String::new();
    let mut block = false;
    loop {
        prompt(!msg.is_empty() || block)?;
        let mut line = String::new();
        if input.read_line(&mut line).context("reading stdin")? == 0 {
            return Ok((!msg.is_empty()).then_some(msg));
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if block {
            if let Some(last) = line.trim_end().strip_suffix("\"\"\"") {
                msg.push_str(last);
                return Ok(Some(msg));
            }
            msg.push_str(line);
            msg.push('\n');
        } else if msg.is_empty() && line.trim_start().starts_with("\"\"\"") {
            let rest = &line.trim_start()[3..];
            if let Some(one) = rest.trim_end().strip_suffix("\"\"\"") {
                return Ok(Some(one.to_string()));
            }
            block = true;
            if !rest.is_empty() {
                msg.push_str(rest);
                msg.push('\n');
            }
        } else if let Some(head) = line.strip_suffix('\\') {
            msg.push_str(head);
            msg.push('\n');
        } else {
            msg.push_str(line);
            return Ok(Some(msg));
        }
    }
}

impl Chat<'_> {
    /// Run a `/command`; false to leave.
    fn command(&mut self, line: &str) -> anyhow::Result<bool> {
        let (cmd, arg) = match line.split_once(char::is_whitespace) {
            Some((c, a)) => (c, a.trim()),
            None => (line, ""),
        };
        let file = || -> anyhow::Result<&Path> {
            if arg.is_empty() {
                bail!("{cmd} needs a file name");
            }
            Ok(Path::new(arg))
        };
        let done = match cmd {
            "/exit" | "/quit" => return Ok(false),
            "/help" => {
                eprintln!("{HELP}");
                Ok(())
            }
            "/reset" => self.reset().map(|()| eprintln!("new conversation")),
            "/stats" => self.stats().map_err(Into::into),
            "/save" => file().and_then(|f| self.save(f)),
            "/load" => file().and_then(|f| self.load(f)),
            other => {
                eprintln!("unknown command {other}; /help lists them");
                Ok(())
            }
        };
        if let Err(e) = done {
            eprintln!("error: {e:#}");
        }
        Ok(true)
    }

    fn reset(&mut self) -> anyhow::Result<()> {
        self.session.clear()?;
        self.held.clear();
        self.messages = self.system.iter().cloned().collect();
        self.last = None;
        Ok(())
    }

    /// After a failed turn: drop its message and start the session afresh
    /// (the next turn evaluates the whole conversation).
    fn recover(&mut self) {
        if self.style.on {
            // Best effort: stdout may be gone.
            let _ = std::io::stdout().write_all(b"\x1b[0m");
        }
        if self.messages.last().is_some_and(|m| m["role"] == "user") {
            self.messages.pop();
        }
        self.held.clear();
        if let Err(e) = self.session.clear() {
            eprintln!("error: {e}");
        }
    }

    fn turn(&mut self, text: String) -> anyhow::Result<()> {
        self.messages.push(json!({"role": "user", "content": text}));
        let render = |add_generation_prompt| {
            self.template.render(&ChatRequest {
                messages: self.messages.clone(),
                add_generation_prompt,
                ..ChatRequest::default()
            })
        };
        let rendered = render(true)?;
        let ids = self.tok.encode(&rendered, false)?;
        // The next turn renders this answer without its thinking: it
        // diverges from this prompt where the assistant header starts.
        let history = self.tok.encode(&render(false)?, false)?;
        let header_at = history.iter().zip(&ids).take_while(|(a, b)| a == b).count();
        if ids.len() >= self.model.n_ctx() {
            bail!(
                "the conversation has {} tokens and the context holds {}: /reset to start over",
                ids.len(),
                self.model.n_ctx()
            );
        }
        let mut params = self.params.clone();
        params.seed = params.seed.map(|s| s.wrapping_add(self.turns));
        let req = Request {
            checkpoints: true,
            checkpoint_at: Some(header_at),
            timing: self.timing,
            held: Some(&self.held),
            cancel: Some(interrupt::stop_flag()),
            ..Request::new(&ids, params)
        };
        let mut shown = Shown {
            split: ThinkSplitter::new(ThinkSplitter::prompt_opens_thought(&rendered)),
            hide: self.hide_think,
            color: self.style.on,
            terminal: std::io::stdout().is_terminal(),
            in_thought: false,
            wrote: false,
            ends_newline: false,
        };
        interrupt::set_generating(true);
        let streamed = (|| -> anyhow::Result<Generation> {
            let mut g = Generator::start(&mut self.session, &self.tok, req)?;
            let mut out = std::io::stdout().lock();
            while let Some(piece) = g.next_piece()? {
                shown.write(&mut out, &piece)?;
            }
            shown.finish(&mut out)?;
            Ok(g.finish()?)
        })();
        interrupt::set_generating(false);
        let done = streamed?;
        self.held = done.session_tokens.clone();
        if done.finish == Finish::Cancelled && done.tokens.is_empty() {
            // Stopped before the answer began: as if never asked.
            self.messages.pop();
            eprintln!("(cancelled)");
            return Ok(());
        }
        self.turns += 1;
        self.messages
            .push(json!({"role": "assistant", "content": done.text.clone()}));
        let s = &done.stats;
        let mut line = format!(
            "[{} tokens, {:.1} tok/s | prompt {} new + {} reused, {:.1} tok/s | first token {:.2} s",
            s.generated_tokens,
            s.decode_tok_s,
            s.prompt_tokens - s.reused_tokens,
            s.reused_tokens,
            s.prefill_tok_s,
            s.time_to_first_token_s
        );
        match &done.finish {
            Finish::Eos => {}
            other => line.push_str(&format!(" | {}", other.name())),
        }
        line.push(']');
        let dim = std::io::stderr().is_terminal() && self.style.on;
        eprintln!("{}", Style { on: dim }.paint("2", &line));
        self.last = Some(done);
        Ok(())
    }

    fn stats(&self) -> std::io::Result<()> {
        let mut err = std::io::stderr().lock();
        writeln!(
            err,
            "session: {} of {} positions, {} turns, checkpoints at {:?}",
            self.session.pos(),
            self.model.n_ctx(),
            self.turns,
            self.session.checkpoints()
        )?;
        if let Some(last) = &self.last {
            writeln!(err, "last answer:")?;
            write_summary(&mut err, self.model, &last.stats, &last.finish, &self.params)?;
            if self.timing {
                write_timing(&mut err, &last.stats)?;
            }
        }
        Ok(())
    }

    fn save(&self, path: &Path) -> anyhow::Result<()> {
        let buf = chatsave::encode(&self.session, &self.messages, &self.held)?;
        chatsave::write_file(path, &buf)?;
        eprintln!(
            "saved {} messages, {} positions ({:.1} MB) to {}",
            self.messages.len(),
            self.session.pos(),
            buf.len() as f64 / 1e6,
            path.display()
        );
        Ok(())
    }

    /// Continue a saved conversation. A file that fails any check leaves
    /// the session and the conversation as they were.
    fn load(&mut self, path: &Path) -> anyhow::Result<()> {
        let buf = chatsave::read_file(self.model, path)?;
        let save = chatsave::load(&mut self.session, &buf, path)?;
        self.held = save.tokens;
        self.messages = save.messages;
        self.last = None;
        eprintln!(
            "loaded {} messages, {} positions from {}",
            self.messages.len(),
            self.session.pos(),
            path.display()
        );
        Ok(())
    }
}

/// Writes an answer as it streams: thinking dimmed (or hidden), the
/// answer plain; without colours the thinking keeps its tags.
struct Shown {
    split: ThinkSplitter,
    hide: bool,
    color: bool,
    /// Control characters are shown as pictures (stdout is a terminal).
    terminal: bool,
    /// Whether the last text written was thinking.
    in_thought: bool,
    wrote: bool,
    ends_newline: bool,
}

impl Shown {
    fn write(&mut self, out: &mut impl Write, piece: &str) -> std::io::Result<()> {
        for seg in self.split.push(piece) {
            self.segment(out, seg)?;
        }
        out.flush()
    }

    fn segment(&mut self, out: &mut impl Write, seg: Segment) -> std::io::Result<()> {
        let (thought, text) = match seg {
            Segment::Thinking(t) => (true, t),
            Segment::Answer(t) => (false, t),
        };
        if thought && self.hide {
            return Ok(());
        }
        if thought != self.in_thought {
            let mark = match (thought, self.color) {
                (true, true) => "\x1b[2m",
                (false, true) => "\x1b[22m",
                (true, false) => "<think>",
                (false, false) => "</think>",
            };
            out.write_all(mark.as_bytes())?;
            self.in_thought = thought;
        }
        // The answer after a hidden thought starts with the blank lines
        // that followed the tag.
        let text = if self.hide && !self.wrote {
            text.trim_start()
        } else {
            &text
        };
        if !text.is_empty() {
            let shown = if self.terminal { for_terminal(text) } else { text.into() };
            out.write_all(shown.as_bytes())?;
            self.wrote = true;
            self.ends_newline = text.ends_with('\n');
        }
        Ok(())
    }

    /// Flush held-back text, close the styling, end the line.
    fn finish(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        for seg in self.split.finish() {
            self.segment(out, seg)?;
        }
        if self.in_thought && self.color {
            out.write_all(b"\x1b[22m")?;
        }
        if !self.ends_newline {
            out.write_all(b"\n")?;
        }
        out.flush()
    }
}
