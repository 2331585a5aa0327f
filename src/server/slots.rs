//! Slots: `--parallel N` inference threads, each owning a `Session` of the
//! one shared `Model`, fed from a bounded queue. A request goes to the
//! idle slot whose session shares the longest prefix with its prompt, so
//! that a conversation's next turn evaluates only the new tokens.

use super::metrics::Metrics;
use crate::error::{Error, Result};
use crate::generate::{Generation, Generator, Request, TokenLogprob};
use crate::text::{Constraint, SamplingParams, Tokenizer};
use crate::Model;
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
    pub events: tokio::sync::mpsc::Sender<Event>,
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
    /// One sender per slot thread; empty until the model is loaded.
    slots: Vec<mpsc::Sender<Job>>,
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
                slots: Vec::new(),
                closed: false,
            }),
            queue_cap,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A slot that panicked left consistent bookkeeping behind.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Start taking jobs, one sender per slot thread.
    pub fn open(&self, slots: Vec<mpsc::Sender<Job>>) {
        let mut s = self.lock();
        let n = slots.len();
        s.idle = (0..n).rev().collect();
        s.held = vec![Vec::new(); n];
        s.running = vec![None; n];
        s.slots = slots;
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

    /// Drop the slot senders so that the slot threads end.
    pub fn close(&self) {
        let mut s = self.lock();
        s.closed = true;
        s.queue.clear();
        s.slots.clear();
    }

    /// Queue a job; it starts at once when a slot is idle.
    pub fn submit(&self, job: Job) -> std::result::Result<(), Refusal> {
        let mut s = self.lock();
        if s.closed {
            return Err(Refusal::ShuttingDown);
        }
        if s.slots.is_empty() {
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
        if let Err(mpsc::SendError(job)) = s.slots[slot].send(job) {
            // The slot thread is gone (the server is closing): the job's
            // client hears that its channel closed.
            s.running[slot] = None;
            drop(job);
        }
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A slot thread: run jobs until the pool closes.
pub fn work(pool: &Pool, slot: usize, model: &Model, tok: &Tokenizer, metrics: &Metrics, jobs: mpsc::Receiver<Job>) {
    let mut session = model.session();
    while let Ok(mut job) = jobs.recv() {
        let result = match &mut session {
            Ok(session) => run(session, tok, &mut job),
            Err(e) => Err(Error::Server(format!("slot {slot} has no session: {e}"))),
        };
        if let Ok(g) = &result {
            metrics.record(&g.stats);
        }
        let held = match &mut session {
            Ok(s) => {
                if result.is_err() {
                    // Whatever the error left, start the next job afresh.
                    let _ = s.clear();
                }
                s.tokens().map(<[u32]>::to_vec).unwrap_or_default()
            }
            Err(_) => Vec::new(),
        };
        // The client may be gone; nothing more to tell then.
        let _ = job.events.blocking_send(Event::Done(Box::new(result)));
        pool.release(slot, held);
    }
}

fn run(session: &mut crate::Session<'_>, tok: &Tokenizer, job: &mut Job) -> Result<Generation> {
    let req = Request {
        checkpoints: true,
        constraint: job.constraint.take(),
        logprobs: job.logprobs,
        checkpoint_at: job.checkpoint_at,
        cancel: Some(&job.cancel),
        ..Request::new(&job.prompt, job.sampling.clone())
    };
    let mut g = Generator::start(session, tok, req)?;
    while let Some(piece) = g.next_piece()? {
        let lps = g.take_logprobs();
        if job.events.blocking_send(Event::Piece(piece, lps)).is_err() {
            job.cancel.store(true, Ordering::Relaxed);
        }
    }
    g.finish()
}

/// A job handed to a slot, from the handler's side: its events, and its
/// cancel flag, set when this is dropped (the reply finished, or the
/// client went away and the server dropped the reply).
pub struct Running {
    pub events: tokio::sync::mpsc::Receiver<Event>,
    cancel: Arc<AtomicBool>,
}

impl Running {
    pub fn new(events: tokio::sync::mpsc::Receiver<Event>, cancel: Arc<AtomicBool>) -> Running {
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
