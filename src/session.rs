//! `Session`: one sequence's state over a shared `Model`, with explicit,
//! contiguous positions.

use crate::engine::{EngineState, Model};
use crate::error::{Error, Result};

/// Positions the caches are first sized for; they grow on demand.
const INITIAL_CAPACITY: usize = 256;

pub struct Session<'m> {
    model: &'m Model,
    state: EngineState,
    /// The tokens evaluated so far, one per position.
    tokens: Vec<u32>,
}

impl Model {
    pub fn session(&self) -> Result<Session<'_>> {
        Ok(Session {
            model: self,
            state: self.new_state(INITIAL_CAPACITY)?,
            tokens: Vec::new(),
        })
    }
}

impl<'m> Session<'m> {
    /// Number of positions held.
    pub fn pos(&self) -> usize {
        self.tokens.len()
    }

    fn check(&self, tokens: &[u32], start_pos: usize) -> Result<()> {
        if start_pos != self.pos() {
            return Err(Error::Position {
                expected: self.pos(),
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

    /// Evaluate a prompt from `start_pos`; logits of the last token.
    pub fn eval_prompt(&mut self, tokens: &[u32], start_pos: usize) -> Result<Vec<f32>> {
        self.check(tokens, start_pos)?;
        let out = self.model.forward(&mut self.state, tokens, start_pos, false)?;
        self.tokens.extend_from_slice(tokens);
        Ok(out)
    }

    /// Evaluate a prompt and return the logits of every position `[n, vocab]`.
    pub fn eval_all(&mut self, tokens: &[u32], start_pos: usize) -> Result<Vec<f32>> {
        self.check(tokens, start_pos)?;
        let out = self.model.forward(&mut self.state, tokens, start_pos, true)?;
        self.tokens.extend_from_slice(tokens);
        Ok(out)
    }

    pub fn eval_token(&mut self, token: u32, pos: usize) -> Result<Vec<f32>> {
        self.eval_prompt(&[token], pos)
    }

    /// Everything back to empty.
    pub fn clear(&mut self) -> Result<()> {
        self.state = self.model.new_state(INITIAL_CAPACITY)?;
        self.tokens.clear();
        Ok(())
    }
}
