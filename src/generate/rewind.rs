//! Where a request's prompt starts on its session: the checks of a
//! request against the session's model, and the rewind to the longest
//! prefix the session already holds.

use super::{mark, Request};
use crate::error::{Error, Result};
use crate::generate::stats::Mark;
use crate::session::Session;
use crate::text::Sampler;

/// Check a request against the session's model, and rewind the session to
/// the longest prefix it shares with the prompt: the sampler, the mark
/// the stats start from, the prompt tokens kept and how many of those
/// were evaluated again.
pub(super) fn check_and_rewind(session: &mut Session<'_>, req: &Request<'_>) -> Result<(Sampler, Mark, usize, usize)> {
    let model = session.model();
    let prompt = req.prompt;
    if prompt.is_empty() {
        return Err(Error::Invalid("the prompt has no tokens".into()));
    }
    if prompt.len() > model.n_ctx() {
        return Err(Error::Invalid(format!(
            "the prompt has {} tokens, more than the model's context of {}",
            prompt.len(),
            model.n_ctx()
        )));
    }
    let sampler = Sampler::new(req.sampling.clone(), model.n_vocab())?;
    let start = mark(session);
    let (keep, replayed) = rewind(session, prompt, req.held)?;
    Ok((sampler, start, keep, replayed))
}

/// Cut the session back to the longest prefix of `prompt` it holds, leaving
/// at least the last prompt token to evaluate (its logits start the
/// generation). Returns the number of prompt tokens kept, and how many of
/// those the session evaluated again to get there (a recurrent model
/// replays from its nearest checkpoint). A session whose tokens are
/// unknown, or that cannot rewind that far, is cleared.
fn rewind(session: &mut Session<'_>, prompt: &[u32], held: Option<&[u32]>) -> Result<(usize, usize)> {
    let known = session.tokens().or(held.filter(|h| h.len() == session.pos()));
    let keep = match known {
        Some(k) => common_prefix(k, prompt).min(prompt.len() - 1),
        None => 0,
    };
    if keep == 0 {
        if session.pos() > 0 || session.tokens().is_none() {
            session.clear()?;
        }
        return Ok((0, 0));
    }
    let replayed = if keep < session.pos() && session.model().has_recurrent_layers() {
        let base = session.checkpoints().into_iter().filter(|&c| c <= keep).max();
        keep - base.unwrap_or(0)
    } else {
        0
    };
    match session.truncate(keep) {
        Ok(()) => Ok((keep, replayed)),
        Err(Error::NoCheckpoint { .. }) => {
            session.clear()?;
            Ok((0, 0))
        }
        Err(e) => Err(e),
    }
}

pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_counts_equal_leading_ids() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
    }
}
