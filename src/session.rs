//! `Session`: one sequence's state over a shared `Model` (SPEC.md §3):
//! explicit contiguous positions, chunked prompt evaluation, snapshots in
//! the MFLX format, checkpoints, and truncation that is correct for
//! recurrent layers.

use crate::engine::{EngineCheckpoint, EngineState, EngineStep, Model};
use crate::error::{Error, Result};

pub use crate::engine::DEFAULT_CHUNK;
pub const DEFAULT_MAX_CHECKPOINTS: usize = 4;

struct Checkpoint {
    pos: usize,
    saved: Saved,
    /// Order of storing, for eviction.
    stamp: u64,
}

/// What a checkpoint keeps.
enum Saved {
    /// A whole MFLX snapshot (a loaded conversation).
    Snapshot(Vec<u8>),
    /// The recurrent layers' state, copied on the device: the attention
    /// caches below the checkpoint's position are never written again while
    /// it exists (checkpoints above the position a session is cut back to
    /// are dropped), so they need no copy.
    Recurrent(EngineCheckpoint),
}

pub struct Session<'m> {
    model: &'m Model,
    state: EngineState,
    pos: usize,
    /// The tokens of positions `[0, pos)` when known (not after `load_state`).
    tokens: Option<Vec<u32>>,
    checkpoints: Vec<Checkpoint>,
    max_checkpoints: usize,
    clock: u64,
    chunk: usize,
    broken: bool,
}

impl Model {
    /// A new, empty session over this model.
    pub fn session(&self) -> Result<Session<'_>> {
        Ok(Session {
            model: self,
            state: self.new_state(self.n_ctx())?,
            pos: 0,
            tokens: Some(Vec::new()),
            checkpoints: Vec::new(),
            max_checkpoints: DEFAULT_MAX_CHECKPOINTS,
            clock: 0,
            chunk: self.prefill_chunk(),
            broken: false,
        })
    }
}

/// One session's part of [`Model::eval_batch`]: the tokens that continue
/// it (at its current position), and whether every token's logits are
/// wanted or only the last one's.
pub struct BatchItem<'a, 'm> {
    pub session: &'a mut Session<'m>,
    pub tokens: &'a [u32],
    pub all: bool,
}

impl Model {
    /// Evaluate several sessions' next tokens in one forward pass: the
    /// dense products and the MoE layers run once over all the tokens, so
    /// the weights (and each expert routed to) are read once for all the
    /// sessions; attention and recurrent layers run per session on its own
    /// state. Returns each item's logits, as `eval_prompt` (`[vocab]`) or,
    /// with `all`, `eval_all` (`[n, vocab]`) would; the results equal
    /// evaluating each session alone, within rounding (SPEC.md §3).
    ///
    /// The tokens are not cut into chunks: the caller sizes the step. Every
    /// item is checked first (its session's model, position and context,
    /// its token ids); if the pass then fails, sessions of a model with
    /// recurrent layers are marked broken, as `eval_prompt` does.
    pub fn eval_batch(&self, items: &mut [BatchItem<'_, '_>]) -> Result<Vec<Vec<f32>>> {
        for it in items.iter() {
            if !std::ptr::eq(it.session.model, self) {
                return Err(Error::Invalid("a session of another model in the batch".into()));
            }
            it.session.check(it.tokens, it.session.pos)?;
        }
        let mut steps: Vec<EngineStep<'_>> = items
            .iter_mut()
            .map(|it| EngineStep {
                pos0: it.session.pos,
                state: &mut it.session.state,
                tokens: it.tokens,
                all: it.all,
            })
            .collect();
        let out = self.forward_batch(&mut steps);
        drop(steps);
        match out {
            Ok(out) => {
                for it in items.iter_mut() {
                    it.session.advance(it.tokens);
                }
                Ok(out)
            }
            Err(e) => {
                if self.has_recurrent_layers() {
                    for it in items.iter_mut() {
                        it.session.broken = true;
                    }
                }
                Err(e)
            }
        }
    }
}

impl<'m> Session<'m> {
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// Number of positions held (0 when empty).
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// The tokens held, when the session knows them.
    pub fn tokens(&self) -> Option<&[u32]> {
        self.tokens.as_deref()
    }

    /// Tokens per chunk of `eval_prompt` (at least 1; a new session takes
    /// [`Model::prefill_chunk`]).
    pub fn set_chunk_size(&mut self, n: usize) {
        self.chunk = n.max(1);
    }

    pub fn chunk_size(&self) -> usize {
        self.chunk
    }

    fn check(&self, tokens: &[u32], start_pos: usize) -> Result<()> {
        if self.broken {
            return Err(Error::SessionBroken);
        }
        if tokens.is_empty() {
            return Err(Error::Invalid("no tokens to evaluate".into()));
        }
        if start_pos != self.pos {
            return Err(Error::Position {
                expected: self.pos,
                got: start_pos,
            });
        }
        let limit = self.model.n_ctx();
        if start_pos + tokens.len() > limit {
            return Err(Error::ContextFull {
                pos: start_pos + tokens.len(),
                limit,
            });
        }
        let vocab = self.model.n_vocab();
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::TokenOutOfRange { token: t, vocab });
        }
        Ok(())
    }

    /// Evaluate one chunk; on failure of a model with recurrent layers
    /// the session is marked broken (its recurrent state is part-updated).
    fn run(&mut self, tokens: &[u32], all: bool) -> Result<Vec<f32>> {
        match self.model.forward(&mut self.state, tokens, self.pos, all) {
            Ok(out) => {
                self.advance(tokens);
                Ok(out)
            }
            Err(e) => {
                if self.model.has_recurrent_layers() {
                    self.broken = true;
                }
                Err(e)
            }
        }
    }

    /// `tokens` were evaluated at the current position.
    fn advance(&mut self, tokens: &[u32]) {
        self.pos += tokens.len();
        if let Some(t) = &mut self.tokens {
            t.extend_from_slice(tokens);
        }
    }

    /// Evaluate a prompt from `start_pos` in chunks; logits of the last token.
    pub fn eval_prompt(&mut self, tokens: &[u32], start_pos: usize) -> Result<Vec<f32>> {
        self.check(tokens, start_pos)?;
        let mut last = Vec::new();
        for c in tokens.chunks(self.chunk) {
            last = self.run(c, false)?;
        }
        Ok(last)
    }

    /// Evaluate a prompt and return the logits of every position `[n, vocab]`.
    pub fn eval_all(&mut self, tokens: &[u32], start_pos: usize) -> Result<Vec<f32>> {
        self.check(tokens, start_pos)?;
        let mut out = Vec::with_capacity(tokens.len() * self.model.n_vocab());
        for c in tokens.chunks(self.chunk) {
            out.extend(self.run(c, true)?);
        }
        Ok(out)
    }

    pub fn eval_token(&mut self, token: u32, pos: usize) -> Result<Vec<f32>> {
        self.eval_prompt(&[token], pos)
    }

    /// Everything back to empty, checkpoints dropped. The caches stay
    /// allocated (a second set of them, even for a moment, may not fit
    /// the memory plan).
    pub fn clear(&mut self) -> Result<()> {
        if let Err(e) = self.model.reset_state(&mut self.state) {
            // Some recurrent states may be zero, others not.
            self.broken = true;
            return Err(e);
        }
        self.pos = 0;
        self.tokens = Some(Vec::new());
        self.checkpoints.clear();
        self.broken = false;
        Ok(())
    }

    /// Bytes `save_state` writes now.
    pub fn state_size(&self) -> usize {
        self.model.state_size(self.pos)
    }

    /// Append the MFLX snapshot of the current state to `buf`.
    pub fn save_state(&self, buf: &mut Vec<u8>) -> Result<()> {
        if self.broken {
            return Err(Error::SessionBroken);
        }
        self.model.save_state(&self.state, self.pos, buf)
    }

    /// Replace the state with a snapshot. The whole buffer is validated
    /// first: on error the session is exactly as before. Checkpoints are
    /// dropped (they belong to the replaced sequence).
    pub fn load_state(&mut self, buf: &[u8]) -> Result<()> {
        let (state, len) = self.model.load_state(buf, self.model.n_ctx())?;
        self.state = state;
        self.pos = len;
        self.tokens = None;
        self.checkpoints.clear();
        self.broken = false;
        Ok(())
    }

    /// Replace the state with a snapshot of the sequence `tokens` (a saved
    /// conversation). Everything is checked before anything changes: the
    /// token ids against the vocabulary, the snapshot as in
    /// [`Session::load_state`], and that it holds exactly `tokens.len()`
    /// positions. The session then knows its tokens; on a model with
    /// recurrent layers the snapshot is also kept as the checkpoint at its
    /// position, so that the sequence can be rewound to it.
    pub fn load_conversation(&mut self, buf: &[u8], tokens: &[u32]) -> Result<()> {
        let vocab = self.model.n_vocab();
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::TokenOutOfRange { token: t, vocab });
        }
        let (state, len) = self.model.load_state(buf, self.model.n_ctx())?;
        if len != tokens.len() {
            return Err(Error::Invalid(format!(
                "the snapshot holds {len} positions but {} tokens came with it",
                tokens.len()
            )));
        }
        self.state = state;
        self.pos = len;
        self.tokens = Some(tokens.to_vec());
        self.checkpoints.clear();
        self.broken = false;
        if self.model.has_recurrent_layers() {
            self.clock += 1;
            self.checkpoints.push(Checkpoint {
                pos: len,
                saved: Saved::Snapshot(buf.to_vec()),
                stamp: self.clock,
            });
        }
        Ok(())
    }

    pub fn set_max_checkpoints(&mut self, n: usize) {
        self.max_checkpoints = n.max(1);
        while self.checkpoints.len() > self.max_checkpoints {
            if !self.evict_one(None) {
                break;
            }
        }
    }

    /// Positions with a checkpoint, ascending.
    pub fn checkpoints(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.checkpoints.iter().map(|c| c.pos).collect();
        v.sort_unstable();
        v
    }

    /// Evict the least recently stored checkpoint other than position 0 and
    /// `keep`; false when none can go.
    fn evict_one(&mut self, keep: Option<usize>) -> bool {
        let victim = self
            .checkpoints
            .iter()
            .enumerate()
            .filter(|(_, c)| c.pos != 0 && Some(c.pos) != keep)
            .min_by_key(|(_, c)| c.stamp)
            .map(|(i, _)| i);
        match victim {
            Some(i) => {
                self.checkpoints.remove(i);
                true
            }
            None => false,
        }
    }

    /// Store a snapshot of the current state under `pos` (which must be the
    /// current position).
    pub fn checkpoint(&mut self, pos: usize) -> Result<()> {
        if pos != self.pos {
            return Err(Error::Position {
                expected: self.pos,
                got: pos,
            });
        }
        if self.broken {
            return Err(Error::SessionBroken);
        }
        let saved = Saved::Recurrent(self.model.save_recurrent(&self.state)?);
        self.clock += 1;
        let stamp = self.clock;
        match self.checkpoints.iter_mut().find(|c| c.pos == pos) {
            Some(c) => {
                c.saved = saved;
                c.stamp = stamp;
            }
            None => self.checkpoints.push(Checkpoint { pos, saved, stamp }),
        }
        while self.checkpoints.len() > self.max_checkpoints {
            if !self.evict_one(Some(pos)) {
                break;
            }
        }
        Ok(())
    }

    /// Load the checkpoint at exactly `pos` and drop every checkpoint above it.
    pub fn restore(&mut self, pos: usize) -> Result<()> {
        let i = self
            .checkpoints
            .iter()
            .position(|c| c.pos == pos)
            .ok_or(Error::CheckpointMissing(pos))?;
        let len = match &self.checkpoints[i].saved {
            Saved::Snapshot(buf) => {
                let (state, len) = self.model.load_state(buf, self.model.n_ctx())?;
                self.state = state;
                len
            }
            Saved::Recurrent(c) => {
                self.model.load_recurrent(&mut self.state, c)?;
                pos
            }
        };
        self.pos = len;
        if let Some(t) = &mut self.tokens {
            t.truncate(len);
        }
        self.checkpoints.retain(|c| c.pos <= pos);
        self.broken = false;
        Ok(())
    }

    pub fn forget(&mut self, pos: usize) -> Result<()> {
        let n = self.checkpoints.len();
        self.checkpoints.retain(|c| c.pos != pos);
        if self.checkpoints.len() == n {
            return Err(Error::CheckpointMissing(pos));
        }
        Ok(())
    }

    /// Keep positions `[0, p0)`. Attention caches are cut by length; a
    /// model with recurrent layers restores the nearest checkpoint at or
    /// below `p0` (or the empty state) and re-evaluates the gap from the
    /// remembered tokens, or fails with `NoCheckpoint`.
    pub fn truncate(&mut self, p0: usize) -> Result<()> {
        if p0 > self.pos {
            return Err(Error::Invalid(format!(
                "cannot truncate to {p0}: the session holds {} positions",
                self.pos
            )));
        }
        self.checkpoints.retain(|c| c.pos <= p0);
        if !self.model.has_recurrent_layers() && !self.broken {
            self.pos = p0;
            if let Some(t) = &mut self.tokens {
                t.truncate(p0);
            }
            return Ok(());
        }
        if p0 == self.pos && !self.broken {
            return Ok(());
        }
        let base = self.checkpoints.iter().map(|c| c.pos).max();
        let gap: Vec<u32> = match (&self.tokens, base) {
            (Some(t), b) => t[b.unwrap_or(0)..p0].to_vec(),
            (None, Some(b)) if b == p0 => Vec::new(),
            (None, _) => return Err(Error::NoCheckpoint { pos: p0 }),
        };
        match base {
            Some(b) => self.restore(b)?,
            None => {
                let tokens = self.tokens.take();
                self.clear()?;
                self.tokens = tokens.map(|mut t| {
                    t.clear();
                    t
                });
            }
        }
        if !gap.is_empty() {
            let start = self.pos;
            self.eval_prompt(&gap, start)?;
        }
        Ok(())
    }
}
