//! Stop conditions: stop strings (found across token boundaries, never
//! emitted), end-of-sequence ids and a token budget; `TextStream` ties them
//! to the streaming detokenizer.

use super::detok::Detokenizer;
use super::sampling::SamplingParams;
use super::tokenizer::Tokenizer;
use crate::error::Result;

/// Watches streamed text for stop strings. Text that could be the start of
/// a stop string is held back until it is decided.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

/// What a piece of text produced.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopOutput {
    /// Text that is safe to show now.
    pub text: String,
    /// The stop string that ended the stream, if one completed.
    pub stop: Option<String>,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Feed the next piece of text. Once a stop string has completed, the
    /// text before it is returned and everything after is ignored.
    pub fn push(&mut self, piece: &str) -> StopOutput {
        if self.stopped {
            return StopOutput::default();
        }
        self.held.push_str(piece);
        // The earliest stop string wins (the longest of those starting there).
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by(|a, b| a.0.cmp(&b.0).then(b.1.len().cmp(&a.1.len())));
        if let Some((at, stop)) = found {
            let stop = stop.clone();
            self.held.truncate(at);
            self.stopped = true;
            return StopOutput {
                text: std::mem::take(&mut self.held),
                stop: Some(stop),
            };
        }
        let keep = self.undecided_suffix();
        let text = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        StopOutput { text, stop: None }
    }

    /// The text held back, when the stream ends for another reason.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of `held` that is a proper prefix of a
    /// stop string.
    fn undecided_suffix(&self) -> usize {
        let held = self.held.as_str();
        let longest = self.stops.iter().map(|s| s.len()).max().unwrap_or(0);
        let start_min = held.len().saturating_sub(longest.saturating_sub(1));
        (start_min..held.len())
            .filter(|&i| held.is_char_boundary(i))
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&held[i..])))
            .map_or(0, |i| held.len() - i)
    }
}

/// Why generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token.
    Eos,
    /// A stop string (not emitted).
    Stop(String),
    /// `max_tokens` reached.
    Length,
}

impl FinishReason {
    /// The OpenAI API's name for it.
    pub fn as_openai(&self) -> &'static str {
        match self {
            FinishReason::Eos | FinishReason::Stop(_) => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// The result of one generated token.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Step {
    /// Text to show now (may be empty).
    pub text: String,
    /// `Some` when generation must stop after this token.
    pub finish: Option<FinishReason>,
}

/// Generated tokens in, displayable text and the stop decision out:
/// detokenisation, stop strings, EOS ids and `max_tokens` together.
#[derive(Debug, Clone)]
pub struct TextStream {
    /// `None`: no tokenizer; each token shows as `<id>`.
    detok: Option<Detokenizer>,
    stops: StopMatcher,
    eos_ids: Vec<u32>,
    max_tokens: Option<usize>,
    count: usize,
    finished: bool,
}

impl TextStream {
    /// Special tokens are left out of the text; EOS ids are the tokenizer's.
    pub fn new(tokenizer: &Tokenizer, params: &SamplingParams) -> TextStream {
        TextStream {
            detok: Some(Detokenizer::new(tokenizer.clone(), true)),
            ..TextStream::ids(tokenizer.eos_ids(), params)
        }
    }

    /// Without a tokenizer: each token is shown as `<id>` (a model made by
    /// `synth` has none); generation ends at `eos_ids`.
    pub fn ids(eos_ids: &[u32], params: &SamplingParams) -> TextStream {
        TextStream {
            eos_ids: eos_ids.to_vec(),
            detok: None,
            stops: StopMatcher::new(&params.stop),
            max_tokens: params.max_tokens,
            count: 0,
            finished: false,
        }
    }

    /// Add one generated token. An EOS token adds no text; after a step that
    /// returns `finish`, further tokens are ignored.
    pub fn push(&mut self, id: u32) -> Result<Step> {
        if self.finished {
            return Ok(Step::default());
        }
        self.count += 1;
        if self.eos_ids.contains(&id) {
            return self.end(FinishReason::Eos);
        }
        let piece = match &mut self.detok {
            Some(d) => d.push(id)?.unwrap_or_default(),
            None => format!("<{id}>"),
        };
        let out = self.stops.push(&piece);
        if let Some(stop) = out.stop {
            self.finished = true;
            return Ok(Step {
                text: out.text,
                finish: Some(FinishReason::Stop(stop)),
            });
        }
        if self.max_tokens.is_some_and(|m| self.count >= m) {
            let mut step = self.end(FinishReason::Length)?;
            step.text.insert_str(0, &out.text);
            return Ok(step);
        }
        Ok(Step {
            text: out.text,
            finish: None,
        })
    }

    /// Generated tokens so far (EOS included).
    pub fn count(&self) -> usize {
        self.count
    }

    /// End the stream: whatever text was held back, checked once more for
    /// stop strings.
    fn end(&mut self, reason: FinishReason) -> Result<Step> {
        self.finished = true;
        let tail = match &mut self.detok {
            Some(d) => d.finish()?,
            None => String::new(),
        };
        let out = self.stops.push(&tail);
        if let Some(stop) = out.stop {
            return Ok(Step {
                text: out.text,
                finish: Some(FinishReason::Stop(stop)),
            });
        }
        let mut text = out.text;
        text.push_str(&self.stops.finish());
        Ok(Step {
            text,
            finish: Some(reason),
        })
    }

    /// End a stream stopped from outside (client gone, context full): the
    /// held-back text.
    pub fn finish(&mut self) -> Result<String> {
        if self.finished {
            return Ok(String::new());
        }
        Ok(self.end(FinishReason::Length)?.text)
    }
}
