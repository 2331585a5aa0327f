//! Generation: a prompt's token ids in, text pieces out as they are made,
//! and the run's statistics at the end — the loop that `moeflux run`,
//! `moeflux chat` and the HTTP server share.
//!
//! ```text
//! let mut g = Generator::start(&mut session, &tokenizer, Request::new(&prompt, params))?;
//! while let Some(piece) = g.next_piece()? { print!("{piece}"); }
//! let out = g.finish()?;           // tokens, text, why it stopped, stats
//! ```
//!
//! The prompt is evaluated only past what the session already holds: the
//! session is cut back to the longest common prefix of its tokens and the
//! prompt (a chat that renders the whole conversation each turn evaluates
//! only the new turn). Generation ends at an end-of-sequence token, a stop
//! string, the token budget, the end of the context, a complete grammar
//! (a request's [`Constraint`] lets only the tokens it allows be sampled),
//! or when the caller's cancel flag is set; the text held back until then (an incomplete
//! character, a possible stop string) comes out as the last piece.

mod batch;
mod logprobs;
mod rewind;
mod stats;
mod think;

use rewind::check_and_rewind;
pub(crate) use rewind::common_prefix;
use stats::Mark;
pub use stats::{CacheTraffic, ExpertTraffic, GenerationStats, PhaseBreakdown};

pub use batch::{Batch, BatchEvent};
pub use logprobs::TokenLogprob;
pub use think::{Segment, ThinkSplitter};

use crate::error::{Error, Result};
use crate::session::Session;
use crate::text::{Constraint, FinishReason, Sampler, SamplingParams, TextStream, Tokenizer};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// One generation: the prompt and how to continue it.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// Token ids of the whole prompt (a chat renders the whole conversation).
    pub prompt: &'a [u32],
    /// Sampling, stop strings and the token budget (`max_tokens`).
    pub sampling: SamplingParams,
    /// On a model with recurrent layers, store session checkpoints at
    /// `checkpoint_at` and at the end of the answer, so that the next
    /// request sharing a prefix rewinds without re-evaluating from 0.
    pub checkpoints: bool,
    /// A prompt position worth a checkpoint (with `checkpoints`): where the
    /// next request is likely to diverge, e.g. the start of the assistant
    /// header, since chat templates drop the thinking of earlier turns.
    pub checkpoint_at: Option<usize>,
    /// Record per-phase times in the stats (turn them on first with
    /// `Model::set_timing(true)`).
    pub timing: bool,
    /// The tokens the session holds, for a session that cannot say itself
    /// (after `Session::load_state`). Ignored when the session knows them or
    /// when the length differs from `Session::pos`.
    pub held: Option<&'a [u32]>,
    /// Checked between prompt chunks and before every token: when set,
    /// generation ends with [`Finish::Cancelled`].
    pub cancel: Option<&'a AtomicBool>,
    /// A grammar the answer must follow (structured output, forced tool
    /// calls): its mask applies to the logits before sampling.
    pub constraint: Option<Constraint>,
    /// Record each generated token's log-probability and this many most
    /// likely alternatives ([`TokenLogprob`]).
    pub logprobs: Option<usize>,
}

impl<'a> Request<'a> {
    /// A request with no checkpoints, timing, held tokens or cancel flag.
    pub fn new(prompt: &'a [u32], sampling: SamplingParams) -> Request<'a> {
        Request {
            prompt,
            sampling,
            checkpoints: false,
            checkpoint_at: None,
            timing: false,
            held: None,
            cancel: None,
            constraint: None,
            logprobs: None,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-sequence token (kept in `tokens`, adds no text).
    Eos,
    /// A stop string (not in the text).
    Stop(String),
    /// `max_tokens` reached.
    Length,
    /// The next token would not fit in the model's context.
    ContextFull,
    /// The cancel flag was set.
    Cancelled,
    /// The request's grammar was complete: nothing more may follow.
    Complete,
}

impl Finish {
    /// A short name: `eos`, `stop`, `length`, `context_full`, `cancelled`,
    /// `complete`.
    pub fn name(&self) -> &'static str {
        match self {
            Finish::Eos => "eos",
            Finish::Stop(_) => "stop",
            Finish::Length => "length",
            Finish::ContextFull => "context_full",
            Finish::Cancelled => "cancelled",
            Finish::Complete => "complete",
        }
    }

    /// The OpenAI API's `finish_reason`.
    pub fn as_openai(&self) -> &'static str {
        match self {
            Finish::Eos | Finish::Stop(_) | Finish::Cancelled | Finish::Complete => "stop",
            Finish::Length | Finish::ContextFull => "length",
        }
    }
}

impl From<FinishReason> for Finish {
    fn from(r: FinishReason) -> Finish {
        match r {
            FinishReason::Eos => Finish::Eos,
            FinishReason::Stop(s) => Finish::Stop(s),
            FinishReason::Length => Finish::Length,
        }
    }
}

/// The result of a finished generation.
#[derive(Debug, Clone)]
pub struct Generation {
    /// The generated token ids (an end-of-sequence token included).
    pub tokens: Vec<u32>,
    /// The text, as the pieces streamed it.
    pub text: String,
    pub finish: Finish,
    pub stats: GenerationStats,
    /// The tokens the session holds now: the prompt and the generated
    /// tokens that were evaluated (all but the last one sampled). Pass it
    /// as `Request::held` after reloading a saved state.
    pub session_tokens: Vec<u32>,
    /// Per generated token, when the request asked for them.
    pub logprobs: Vec<TokenLogprob>,
}

/// A generation [`Generator::begin`] refused: why, and the session back.
pub type Refused<'a, 'm> = (Error, &'a mut Session<'m>);

/// What a generation needs next ([`Generator::needs`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// These tokens evaluated on its session, then `evaluated`.
    Eval(Vec<u32>),
    /// A token sampled from the logits it holds (`sample`).
    Sample,
    /// Nothing: it has ended (the text held back, when it ended now).
    Ended(Option<String>),
}

/// A generation in progress over a session (see the module docs).
pub struct Generator<'a, 'm> {
    session: &'a mut Session<'m>,
    sampler: Sampler,
    constraint: Option<Constraint>,
    /// `Request::logprobs`, the entries so far, and how many
    /// [`Generator::take_logprobs`] has handed out.
    top_logprobs: Option<usize>,
    logprobs: Vec<TokenLogprob>,
    logprobs_taken: usize,
    stream: TextStream,
    cancel: Option<&'a AtomicBool>,
    checkpoints: bool,
    timing: bool,
    /// Prompt and generated tokens: the history the penalties count (the
    /// presence and frequency penalties only past `prompt_len`).
    history: Vec<u32>,
    prompt_len: usize,
    /// What the session holds.
    held: Vec<u32>,
    text: String,
    /// Logits of the last evaluated token `[vocab]`.
    logits: Vec<f32>,
    /// The last sampled token, not yet evaluated.
    pending: Option<u32>,
    /// Prompt tokens not yet evaluated, and the position to store a
    /// checkpoint at on the way (`Request::checkpoint_at`).
    todo: Vec<u32>,
    mid: Option<usize>,
    finish: Option<Finish>,
    start: Mark,
    prefill_end: Mark,
    first_token: Option<Mark>,
    stats: GenerationStats,
}

impl<'a, 'm> Generator<'a, 'm> {
    /// Check the request, rewind the session to the longest prefix it shares
    /// with the prompt, and evaluate the rest of the prompt.
    pub fn start(session: &'a mut Session<'m>, tokenizer: &Tokenizer, req: Request<'a>) -> Result<Generator<'a, 'm>> {
        let stream = TextStream::new(tokenizer, &req.sampling);
        Generator::start_with_stream(session, stream, req)
    }

    /// [`Generator::start`] with the tokens turned into text by `stream`
    /// (e.g. [`TextStream::ids`] for a model without a tokenizer).
    pub fn start_with_stream(
        session: &'a mut Session<'m>,
        stream: TextStream,
        req: Request<'a>,
    ) -> Result<Generator<'a, 'm>> {
        let cancel = req.cancel;
        let mut g = Generator::prepare(session, stream, req, cancel).map_err(|(e, _)| e)?;
        // The prompt chunk by chunk, checking the cancel flag between chunks.
        while let Need::Eval(chunk) = g.needs(g.session.chunk_size())? {
            if g.cancelled() {
                g.cancel()?;
                break;
            }
            let pos = g.session.pos();
            let logits = g.session.eval_prompt(&chunk, pos)?;
            g.evaluated(&chunk, logits)?;
        }
        Ok(g)
    }

    /// Check the request and rewind the session as [`Generator::start`]
    /// does, but evaluate nothing: the caller feeds the generation (see
    /// [`Generator::needs`]), e.g. one `Model::eval_batch` step for
    /// several generations at once ([`Batch`]). The request is not kept,
    /// so it cannot carry a cancel flag: the caller cancels
    /// ([`Generator::cancel`], or `Batch::step`'s `cancelled`).
    /// On error the session comes back with it (unchanged, or cleared
    /// if rewinding it failed).
    pub fn begin(
        session: &'a mut Session<'m>,
        stream: TextStream,
        req: Request<'_>,
    ) -> std::result::Result<Generator<'a, 'm>, Refused<'a, 'm>> {
        if req.cancel.is_some() {
            let e = Error::Invalid(
                "Generator::begin keeps no cancel flag: cancel through the caller (Generator::cancel)".into(),
            );
            return Err((e, session));
        }
        Generator::prepare(session, stream, req, None)
    }

    fn prepare(
        session: &'a mut Session<'m>,
        stream: TextStream,
        req: Request<'_>,
        cancel: Option<&'a AtomicBool>,
    ) -> std::result::Result<Generator<'a, 'm>, Refused<'a, 'm>> {
        let (sampler, start, keep, replayed) = match check_and_rewind(session, &req) {
            Ok(v) => v,
            Err(e) => return Err((e, session)),
        };
        let model = session.model();
        let prompt = req.prompt;
        let checkpoints = req.checkpoints && model.has_recurrent_layers();
        // Evaluate up to the checkpoint position, store it, then the rest.
        let mid = req
            .checkpoint_at
            .filter(|&c| checkpoints && c > keep && c < prompt.len());
        Ok(Generator {
            sampler,
            constraint: req.constraint,
            top_logprobs: req.logprobs,
            logprobs: Vec::new(),
            logprobs_taken: 0,
            stream,
            cancel,
            checkpoints,
            timing: req.timing,
            history: prompt.to_vec(),
            prompt_len: prompt.len(),
            held: prompt[..keep].to_vec(),
            text: String::new(),
            logits: Vec::new(),
            pending: None,
            todo: prompt[keep..].to_vec(),
            mid,
            finish: None,
            start,
            prefill_end: start,
            first_token: None,
            stats: GenerationStats {
                prompt_tokens: prompt.len(),
                reused_tokens: keep - replayed,
                ..GenerationStats::default()
            },
            session,
        })
    }

    /// What the generation needs next: tokens evaluated on its session
    /// (at most `max` of the prompt, up to a checkpoint position; or the
    /// token sampled last), then [`Generator::evaluated`]; or a sample
    /// ([`Generator::sample`]); or nothing more — it has ended, with the
    /// text held back until now when it ends here (the context is full).
    pub fn needs(&mut self, max: usize) -> Result<Need> {
        if self.finish.is_some() {
            return Ok(Need::Ended(None));
        }
        if !self.todo.is_empty() {
            let pos = self.session.pos();
            let mut n = self.todo.len().min(max.max(1));
            if let Some(mid) = self.mid.filter(|&m| m > pos) {
                n = n.min(mid - pos);
            }
            return Ok(Need::Eval(self.todo[..n].to_vec()));
        }
        match self.pending {
            Some(_) if self.session.pos() >= self.session.model().n_ctx() => {
                Ok(Need::Ended(self.end(Finish::ContextFull)?))
            }
            Some(t) => Ok(Need::Eval(vec![t])),
            None => Ok(Need::Sample),
        }
    }

    /// The session has evaluated `tokens` (the start of what
    /// [`Generator::needs`] asked for), and `logits` `[vocab]` are those of
    /// the last one. True when the generation is ready to sample.
    pub fn evaluated(&mut self, tokens: &[u32], logits: Vec<f32>) -> Result<bool> {
        self.held.extend_from_slice(tokens);
        self.logits = logits;
        if self.todo.is_empty() {
            self.pending = None;
            return Ok(true);
        }
        self.todo.drain(..tokens.len().min(self.todo.len()));
        let pos = self.session.pos();
        if self.todo.is_empty() {
            self.end_prefill()?;
            return Ok(true);
        }
        if self.mid == Some(pos) {
            self.session.checkpoint(pos)?;
        }
        Ok(false)
    }

    /// End the generation as cancelled; the text held back until now.
    pub fn cancel(&mut self) -> Result<Option<String>> {
        if self.finish.is_some() {
            return Ok(None);
        }
        if !self.todo.is_empty() {
            self.todo.clear();
            self.finish = Some(Finish::Cancelled);
            self.end_prefill()?;
            return Ok(None);
        }
        self.end(Finish::Cancelled)
    }

    /// Whether the generation has ended.
    pub fn is_finished(&self) -> bool {
        self.finish.is_some()
    }

    /// Whether prompt tokens remain to be evaluated.
    pub fn is_prefilling(&self) -> bool {
        self.finish.is_none() && !self.todo.is_empty()
    }

    /// The session the generation runs on.
    pub fn session(&mut self) -> &mut Session<'m> {
        self.session
    }

    fn end_prefill(&mut self) -> Result<()> {
        self.prefill_end = mark(self.session);
        let secs = span(&self.start, &self.prefill_end);
        self.stats.prefill_s = secs;
        self.stats.prefill_tok_s = rate(self.stats.prompt_tokens - self.stats.reused_tokens, secs);
        self.stats.prefill_experts = ExpertTraffic::between(&self.start, &self.prefill_end);
        if self.finish.is_some() {
            self.close()?;
        }
        Ok(())
    }

    fn cancelled(&self) -> bool {
        self.cancel.is_some_and(|c| c.load(Ordering::Relaxed))
    }

    /// The next piece of text (never empty), or `None` once generation has
    /// ended. Each call evaluates and samples as many tokens as it takes to
    /// produce text.
    pub fn next_piece(&mut self) -> Result<Option<String>> {
        loop {
            if self.finish.is_none() && self.cancelled() {
                return self.cancel();
            }
            match self.needs(usize::MAX)? {
                Need::Ended(tail) => return Ok(tail),
                Need::Eval(tokens) => {
                    let pos = self.session.pos();
                    let logits = self.session.eval_prompt(&tokens, pos)?;
                    if !self.evaluated(&tokens, logits)? {
                        continue;
                    }
                }
                Need::Sample => {}
            }
            let piece = self.sample()?;
            if piece.is_some() || self.finish.is_some() {
                return Ok(piece);
            }
        }
    }

    /// Sample the next token from the logits of the last evaluated one;
    /// the text it completes, if any. The generation may end here
    /// ([`Generator::is_finished`]); otherwise the token is to be
    /// evaluated next.
    pub fn sample(&mut self) -> Result<Option<String>> {
        if self.finish.is_some() {
            return Ok(None);
        }
        if self.pending.is_some() || !self.todo.is_empty() || self.logits.is_empty() {
            return Err(Error::Invalid(
                "sample: the generation's last tokens are not evaluated yet".into(),
            ));
        }
        let raw = self.top_logprobs.map(|_| self.logits.clone());
        if let Some(c) = &mut self.constraint {
            c.mask(&mut self.logits)?;
        }
        let tok = self
            .sampler
            .sample_after(&mut self.logits, &self.history, self.prompt_len);
        if let (Some(raw), Some(top)) = (raw, self.top_logprobs) {
            self.logprobs.push(TokenLogprob::of(&raw, tok, top));
        }
        let complete = match &mut self.constraint {
            Some(c) => {
                c.accept(tok)?;
                c.is_complete()
            }
            None => false,
        };
        self.history.push(tok);
        if self.first_token.is_none() {
            self.first_token = Some(mark(self.session));
        }
        let step = self.stream.push(tok)?;
        self.text.push_str(&step.text);
        if let Some(reason) = step.finish {
            self.finish = Some(reason.into());
            self.close()?;
            return Ok(non_empty(step.text));
        }
        if complete {
            let tail = self.end(Finish::Complete)?;
            return Ok(non_empty(step.text + tail.as_deref().unwrap_or("")));
        }
        self.pending = Some(tok);
        self.logits.clear();
        Ok(non_empty(step.text))
    }

    /// The log-probabilities of the tokens generated since the last call
    /// (empty unless the request asked for them).
    pub fn take_logprobs(&mut self) -> Vec<TokenLogprob> {
        let new = self.logprobs[self.logprobs_taken..].to_vec();
        self.logprobs_taken = self.logprobs.len();
        new
    }

    /// Tokens generated so far.
    pub fn tokens(&self) -> &[u32] {
        &self.history[self.prompt_len..]
    }

    /// End from outside (context, cancel): the held-back text.
    fn end(&mut self, why: Finish) -> Result<Option<String>> {
        let tail = self.stream.finish()?;
        self.text.push_str(&tail);
        self.finish = Some(why);
        self.close()?;
        Ok(non_empty(tail))
    }

    /// Fill in the decode stats and store the closing checkpoint.
    fn close(&mut self) -> Result<()> {
        let end = mark(self.session);
        let generated = self.history.len() - self.prompt_len;
        self.stats.generated_tokens = generated;
        if let Some(first) = &self.first_token {
            self.stats.time_to_first_token_s = span(&self.start, first);
            self.stats.decode_s = span(first, &end);
            self.stats.decode_tok_s = rate(generated - 1, self.stats.decode_s);
            self.stats.decode_experts = ExpertTraffic::between(first, &end);
            self.stats.decode_bytes_per_token = if generated > 1 {
                self.stats.decode_experts.bytes_read as f64 / (generated - 1) as f64
            } else {
                0.0
            };
        }
        if self.timing {
            let first = self.first_token.unwrap_or(end);
            self.stats.prefill_phases = Some(PhaseBreakdown::between(
                &self.start.phases,
                &self.prefill_end.phases,
                self.stats.prefill_experts.wait_s(),
            ));
            self.stats.decode_phases = Some(PhaseBreakdown::between(
                &first.phases,
                &end.phases,
                self.stats.decode_experts.wait_s(),
            ));
        }
        if self.checkpoints && self.session.pos() > 0 {
            self.session.checkpoint(self.session.pos())?;
        }
        Ok(())
    }

    /// The result; a generation stopped before it ended counts as cancelled.
    pub fn finish(self) -> Result<Generation> {
        self.finish_with_session().0
    }

    /// [`Generator::finish`], and the session back (a scheduler that runs
    /// several generations hands it to the next one).
    pub fn finish_with_session(mut self) -> (Result<Generation>, &'a mut Session<'m>) {
        if self.finish.is_none() {
            if let Err(e) = self.cancel() {
                return (Err(e), self.session);
            }
        }
        let finish = self.finish.take().unwrap_or(Finish::Cancelled);
        let g = Generation {
            tokens: self.history.split_off(self.prompt_len),
            text: self.text,
            finish,
            stats: self.stats,
            session_tokens: self.held,
            logprobs: self.logprobs,
        };
        (Ok(g), self.session)
    }
}

fn mark(session: &Session<'_>) -> Mark {
    let model = session.model();
    Mark {
        at: Instant::now(),
        experts: model.expert_store().stats(),
        cache: model.expert_cache_stats(),
        phases: model.phase_times(),
    }
}

fn span(a: &Mark, b: &Mark) -> f64 {
    b.at.duration_since(a.at).as_secs_f64()
}

fn rate(n: usize, secs: f64) -> f64 {
    if n == 0 || secs <= 0.0 {
        0.0
    } else {
        n as f64 / secs
    }
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}
