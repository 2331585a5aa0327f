//! Slots: `--parallel N` sessions of the one shared `Model`, fed from a
//! bounded queue and run together by one inference thread: every running
//! generation advances in the same forward pass (`generate::Batch`:
//! decodes one token each, prompts in chunks beside them). A request goes
//! to the idle slot whose session shares the longest prefix with its
//! prompt, so that a conversation's next turn evaluates only the new
//! tokens.

use super::metrics::Metrics;
use super::reqlog::RequestLog;
use crate::error::{Error, Result};
use crate::generate::{common_prefix, Batch, BatchEvent, Generation, Generator, Request, TokenLogprob};
use crate::text::{Constraint, SamplingParams, TextStream, Tokenizer};
use crate::{Model, Session};
use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};

/// One generation to run.
pub struct Job {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// Where the next turn of a chat probably diverges (a checkpoint there
    /// lets a recurrent model rewind to it).
    pub checkpoint_at: Option<usize>,
    /// The grammar the answer must follow (structured output).
    pub constraint: Option<Constraint>,
    /// `Request::logprobs`.
    pub logprobs: Option<usize>,
    /// Set when the client goes away or the server shuts down.
    pub cancel: Arc<AtomicBool>,
    /// Unbounded: the inference thread never waits on a slow client (the
    /// pieces of one answer are few and small).
    pub events: tokio::sync::mpsc::UnboundedSender<Event>,
    /// The request's log line: its slot and token counts.
    pub log: Arc<RequestLog>,
}

/// What a slot reports about its job.
pub enum Event {
    /// The next piece of generated text, and the log-probabilities of
    /// the tokens sampled since the last piece (when asked for).
    Piece(String, Vec<TokenLogprob>),
    /// The end: the whole generation, or why it failed.
    Done(Box<Result<Generation>>),
}

/// Why a job was not taken.
pub enum Refusal {
    Loading,
    QueueFull,
    ShuttingDown,
}

struct State {
    queue: VecDeque<Job>,
    /// Idle slots.
    idle: Vec<usize>,
    /// The tokens each slot's session holds.
    held: Vec<Vec<u32>>,
    /// The cancel flag of each slot's running job.
    running: Vec<Option<Arc<AtomicBool>>>,
    /// The inference thread's job channel (with the slot chosen); none
    /// until the model is loaded.
    slots: Option<mpsc::Sender<(usize, Job)>>,
    closed: bool,
}

/// The queue and the slots' bookkeeping.
pub struct Pool {
    state: Mutex<State>,
    queue_cap: usize,
}

impl Pool {
    pub fn new(queue_cap: usize) -> Pool {
        Pool {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                idle: Vec::new(),
                held: Vec::new(),
                running: Vec::new(),
                slots: None,
                closed: false,
            }),
            queue_cap,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A slot that panicked left consistent bookkeeping behind.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Start taking jobs for `n` slots, sent to the inference thread.
    pub fn open(&self, n: usize, slots: mpsc::Sender<(usize, Job)>) {
        let mut s = self.lock();
        s.idle = (0..n).rev().collect();
        s.held = vec![Vec::new(); n];
        s.running = vec![None; n];
        s.slots = Some(slots);
    }

    /// Stop taking jobs: queued ones are dropped (their clients hear that
    /// the server is shutting down), running ones cancelled.
    pub fn shut(&self) {
        let mut s = self.lock();
        s.closed = true;
        s.queue.clear();
        for flag in s.running.iter().flatten() {
            flag.store(true, Ordering::Relaxed);
        }
    }

    /// Drop the job sender so that the inference thread ends.
    pub fn close(&self) {
        let mut s = self.lock();
        s.closed = true;
        s.queue.clear();
        s.slots = None;
    }

    /// Queue a job; it starts at once when a slot is idle.
    pub fn submit(&self, job: Job) -> std::result::Result<(), Refusal> {
        let mut s = self.lock();
        if s.closed {
            return Err(Refusal::ShuttingDown);
        }
        if s.slots.is_none() {
            return Err(Refusal::Loading);
        }
        if s.idle.is_empty() && s.queue.len() >= self.queue_cap {
            return Err(Refusal::QueueFull);
        }
        s.queue.push_back(job);
        dispatch(&mut s);
        Ok(())
    }

    /// Jobs running and waiting.
    pub fn load(&self) -> (usize, usize) {
        let s = self.lock();
        (s.running.iter().flatten().count(), s.queue.len())
    }

    fn release(&self, slot: usize, held: Vec<u32>) {
        let mut s = self.lock();
        s.held[slot] = held;
        s.running[slot] = None;
        s.idle.push(slot);
        dispatch(&mut s);
    }
}

/// Hand queued jobs to idle slots, each to the slot holding the longest
/// prefix of its prompt.
fn dispatch(s: &mut State) {
    while !s.idle.is_empty() {
        let Some(job) = s.queue.pop_front() else { return };
        let best = (0..s.idle.len())
            .max_by_key(|&i| (common_prefix(&s.held[s.idle[i]], &job.prompt), i))
            .unwrap_or(0);
        let slot = s.idle.swap_remove(best);
        s.running[slot] = Some(job.cancel.clone());
        job.log.set_slot(slot);
        let sent = match &s.slots {
            Some(tx) => tx.send((slot, job)).is_ok(),
            None => false,
        };
        if !sent {
            // The inference thread is gone (the server is closing): the
            // job's client hears that its channel closed.
            s.running[slot] = None;
        }
    }
}

/// The inference thread: `n` sessions, run together by a `Batch` until
/// the pool closes. Blocks for a job while nothing runs; between steps it
/// takes every job that has arrived.
pub fn work(
    pool: &Pool,
    n: usize,
    model: &Model,
    tok: &Tokenizer,
    metrics: &Metrics,
    jobs: mpsc::Receiver<(usize, Job)>,
) {
    let mut sessions: Vec<Result<Session>> = (0..n).map(|_| model.session()).collect();
    // Each slot's session while it is idle (taken by its running job).
    let mut idle: Vec<Option<&mut Session>> = sessions.iter_mut().map(|s| s.as_mut().ok()).collect();
    let mut running: HashMap<u64, Job> = HashMap::new();
    let mut batch = Batch::new(model.prefill_chunk());
    loop {
        let first = match batch.is_empty() {
            true => match jobs.recv() {
                Ok(j) => Some(j),
                Err(_) => return,
            },
            false => None,
        };
        for (slot, mut job) in first.into_iter().chain(std::iter::from_fn(|| jobs.try_recv().ok())) {
            let Some(session) = idle.get_mut(slot).and_then(Option::take) else {
                let e = Error::Server(format!("slot {slot} has no session"));
                pool.release(slot, Vec::new());
                let _ = job.events.send(Event::Done(Box::new(Err(e))));
                continue;
            };
            let req = Request {
                checkpoints: true,
                constraint: job.constraint.take(),
                logprobs: job.logprobs,
                checkpoint_at: job.checkpoint_at,
                ..Request::new(&job.prompt, job.sampling.clone())
            };
            match Generator::begin(session, TextStream::new(tok, &job.sampling), req) {
                Ok(g) => {
                    batch.add(slot as u64, g);
                    running.insert(slot as u64, job);
                }
                Err((e, session)) => {
                    pool.release(slot, held(session, true));
                    idle[slot] = Some(session);
                    let _ = job.events.send(Event::Done(Box::new(Err(e))));
                }
            }
        }
        let cancelled = |id: u64| running.get(&id).is_some_and(|j| j.cancel.load(Ordering::Relaxed));
        for event in batch.step(model, cancelled) {
            match event {
                BatchEvent::Piece { id, text, logprobs } => {
                    if let Some(job) = running.get(&id) {
                        if job.events.send(Event::Piece(text, logprobs)).is_err() {
                            // The client is gone: stop at the next step.
                            job.cancel.store(true, Ordering::Relaxed);
                        }
                    }
                }
                BatchEvent::Done { id, result, session } => {
                    if let Ok(g) = &*result {
                        metrics.record(&g.stats);
                    }
                    // The slot is free before the client hears the end (a
                    // client that then asks /metrics sees it idle).
                    let slot = id as usize;
                    pool.release(slot, held(session, result.is_err()));
                    idle[slot] = Some(session);
                    if let Some(job) = running.remove(&id) {
                        if let Ok(g) = &*result {
                            let s = &g.stats;
                            job.log.set_generated(s.reused_tokens, s.generated_tokens, &g.text);
                        }
                        // The client may be gone; nothing more to tell then.
                        let _ = job.events.send(Event::Done(result));
                    }
                }
            }
        }
    }
}

/// The tokens a slot's session holds after a job; after an error it is
/// cleared first (the next job starts afresh, whatever the error left).
fn held(session: &mut Session<'_>, failed: bool) -> Vec<u32> {
    if failed {
        let _ = session.clear();
    }
    session.tokens().map(<[u32]>::to_vec).unwrap_or_default()
}

/// A job handed to a slot, from the handler's side: its events, and its
/// cancel flag, set when this is dropped (the reply finished, or the
/// client went away and the server dropped the reply).
pub struct Running {
    pub events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    cancel: Arc<AtomicBool>,
}

impl Running {
    pub fn new(events: tokio::sync::mpsc::UnboundedReceiver<Event>, cancel: Arc<AtomicBool>) -> Running {
        Running { events, cancel }
    }

    /// Wait for the end, dropping the pieces (the generation holds the text).
    /// `None` when the job was dropped unrun (the server is shutting down).
    pub async fn finish(&mut self) -> Option<Result<Generation>> {
        while let Some(event) = self.events.recv().await {
            if let Event::Done(result) = event {
                return Some(*result);
            }
        }
        None
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}
