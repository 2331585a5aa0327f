//! Several generations advanced together: each step evaluates every
//! running generation's next tokens in one `Model::eval_batch` (continuous
//! batching). Decoding generations take one token each; prompts take what
//! is left of the step's token budget, in chunks (chunked prefill; at most
//! `MIXED_PROMPT_TOKENS` while others decode), so that a long prompt does
//! not stall the streams already decoding; the prompt that starts a
//! step's share rotates, so that every prompt advances.
//!
//! ```text
//! let mut batch = Batch::new(512);
//! batch.add(id, Generator::begin(&mut session, stream, request)?);
//! while !batch.is_empty() {
//!     for event in batch.step(&model, |id| cancelled(id)) { … }   // pieces, and each generation's end
//! }
//! ```

use super::{Generation, Generator, Need, TokenLogprob};
use crate::engine::Model;
use crate::error::{Error, Result};
use crate::session::{BatchItem, Session};

/// The most prompt tokens a step evaluates while other generations
/// decode in it: each of their tokens waits for the whole step.
pub const MIXED_PROMPT_TOKENS: usize = 512;

/// What happened to one generation in a step.
pub enum BatchEvent<'a, 'm> {
    /// The next piece of its text, and the log-probabilities of the tokens
    /// sampled for it (when its request asked for them).
    Piece {
        id: u64,
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    /// It ended (or failed): the result, and its session back.
    Done {
        id: u64,
        result: Box<Result<Generation>>,
        session: &'a mut Session<'m>,
    },
}

/// Generations run together (see the module docs).
pub struct Batch<'a, 'm> {
    running: Vec<(u64, Generator<'a, 'm>)>,
    /// Most tokens evaluated per step (decodes count one each).
    budget: usize,
    /// Which prompt goes first in the next step's prefill share.
    turn: usize,
}

impl<'a, 'm> Batch<'a, 'm> {
    /// An empty batch evaluating at most `budget` tokens per step (at
    /// least one per running generation).
    pub fn new(budget: usize) -> Batch<'a, 'm> {
        Batch {
            running: Vec::new(),
            budget: budget.max(1),
            turn: 0,
        }
    }

    /// Add a generation made by [`Generator::begin`] (nothing evaluated
    /// yet), under the caller's `id`.
    pub fn add(&mut self, id: u64, g: Generator<'a, 'm>) {
        self.running.push((id, g));
    }

    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Generations running.
    pub fn len(&self) -> usize {
        self.running.len()
    }

    /// One step: generations for which `cancelled(id)` holds end first;
    /// then every other one's next tokens are evaluated in one forward pass
    /// and the ready ones sample a token. Returns the pieces made and the
    /// generations that ended, with their sessions. A failed pass ends
    /// every generation in it with the error (their sessions may be
    /// part-updated: clear them before reuse).
    pub fn step(&mut self, model: &Model, cancelled: impl Fn(u64) -> bool) -> Vec<BatchEvent<'a, 'm>> {
        let mut events = Vec::new();
        let mut ended = Vec::new();
        // What each generation needs: tokens to evaluate (decodes first),
        // or nothing more.
        let mut work: Vec<(usize, Vec<u32>)> = Vec::new();
        let mut prefill = Vec::new();
        // Ready to sample without evaluating anything.
        let mut sample_now: Vec<usize> = Vec::new();
        for (i, (id, g)) in self.running.iter_mut().enumerate() {
            let need = match cancelled(*id) {
                true => g.cancel().map(Need::Ended),
                // Its share is decided below, once the decodes are counted.
                false if g.is_prefilling() => {
                    prefill.push(i);
                    continue;
                }
                false => g.needs(1),
            };
            match need {
                Ok(Need::Eval(t)) => work.push((i, t)),
                Ok(Need::Sample) => sample_now.push(i),
                Ok(Need::Ended(tail)) => {
                    push_piece(&mut events, *id, tail, g);
                    ended.push((i, None));
                }
                Err(e) => ended.push((i, Some(e))),
            }
        }
        // The prompts' share of the budget, from this step's first prompt
        // on; while others decode, at most `MIXED_PROMPT_TOKENS`.
        let budget = match work.is_empty() {
            true => self.budget,
            false => self.budget.min(MIXED_PROMPT_TOKENS + work.len()),
        };
        let mut left = budget.saturating_sub(work.len());
        if !prefill.is_empty() {
            let first = self.turn % prefill.len();
            self.turn = self.turn.wrapping_add(1);
            for k in 0..prefill.len() {
                let i = prefill[(first + k) % prefill.len()];
                if left == 0 {
                    break;
                }
                match self.running[i].1.needs(left) {
                    Ok(Need::Eval(t)) => {
                        left -= t.len();
                        work.push((i, t));
                    }
                    Ok(_) => {}
                    Err(e) => ended.push((i, Some(e))),
                }
            }
        }
        if !work.is_empty() {
            match self.eval(model, &work) {
                Ok(logits) => {
                    for ((i, t), l) in work.iter().zip(logits) {
                        match self.running[*i].1.evaluated(t, l) {
                            Ok(true) => sample_now.push(*i),
                            Ok(false) => {}
                            Err(e) => ended.push((*i, Some(e))),
                        }
                    }
                }
                Err(e) => {
                    // Every generation of the pass hears the error, of the
                    // same kind: a request's fault stays one, and the
                    // model's (a file it cannot read) stays the server's.
                    let msg = format!("batched step: {e}");
                    let client = matches!(
                        e,
                        Error::Invalid(_) | Error::TokenOutOfRange { .. } | Error::ContextFull { .. }
                    );
                    for (i, _) in &work {
                        let e = match client {
                            true => Error::Invalid(msg.clone()),
                            false => Error::Server(msg.clone()),
                        };
                        ended.push((*i, Some(e)));
                    }
                }
            }
        }
        for i in sample_now {
            let (id, g) = &mut self.running[i];
            match g.sample() {
                Ok(piece) => {
                    push_piece(&mut events, *id, piece, g);
                    if g.is_finished() {
                        ended.push((i, None));
                    }
                }
                Err(e) => ended.push((i, Some(e))),
            }
        }
        // Remove the ended ones, highest index first.
        ended.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        ended.dedup_by_key(|(i, _)| *i);
        for (i, err) in ended {
            let (id, g) = self.running.remove(i);
            let (result, session) = g.finish_with_session();
            let result = match err {
                Some(e) => Err(e),
                None => result,
            };
            events.push(BatchEvent::Done {
                id,
                result: Box::new(result),
                session,
            });
        }
        events
    }

    /// One forward pass over the generations `work` names, with their tokens.
    fn eval(&mut self, model: &Model, work: &[(usize, Vec<u32>)]) -> Result<Vec<Vec<f32>>> {
        // Each generation's session, in `work`'s order (indices distinct).
        let mut sessions: Vec<Option<&mut Session<'m>>> =
            self.running.iter_mut().map(|(_, g)| Some(g.session())).collect();
        let mut items = Vec::with_capacity(work.len());
        for (i, t) in work {
            if let Some(session) = sessions[*i].take() {
                items.push(BatchItem {
                    session,
                    tokens: t,
                    all: false,
                });
            }
        }
        model.eval_batch(&mut items)
    }
}

fn push_piece(events: &mut Vec<BatchEvent<'_, '_>>, id: u64, piece: Option<String>, g: &mut Generator<'_, '_>) {
    // Log-probabilities wait for the piece their tokens make.
    if let Some(text) = piece {
        let logprobs = g.take_logprobs();
        events.push(BatchEvent::Piece { id, text, logprobs });
    }
}
