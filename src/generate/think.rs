//! Telling a reasoning model's thinking (`<think>…</think>`) from its
//! answer in streamed text, tags split across pieces included.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// A run of streamed text and whether it is thinking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Thinking(String),
    Answer(String),
}

/// Splits streamed text into thinking and answer; the tags themselves are
/// dropped. Text that could be the start of a tag is held back until the
/// next piece decides it.
#[derive(Debug, Clone, Default)]
pub struct ThinkSplitter {
    thinking: bool,
    held: String,
}

impl ThinkSplitter {
    /// `thinking`: the stream starts inside a thought (the prompt ended
    /// with an open `<think>`, as templates that force thinking do).
    pub fn new(thinking: bool) -> ThinkSplitter {
        ThinkSplitter {
            thinking,
            held: String::new(),
        }
    }

    /// Whether a rendered prompt leaves a `<think>` open at its end.
    pub fn prompt_opens_thought(prompt: &str) -> bool {
        match (prompt.rfind(OPEN), prompt.rfind(CLOSE)) {
            (Some(open), Some(close)) => open > close && prompt[open + OPEN.len()..].trim().is_empty(),
            (Some(open), None) => prompt[open + OPEN.len()..].trim().is_empty(),
            _ => false,
        }
    }

    /// Feed the next piece; returns the segments it completes.
    pub fn push(&mut self, piece: &str) -> Vec<Segment> {
        self.held.push_str(piece);
        let mut out = Vec::new();
        loop {
            let tag = if self.thinking { CLOSE } else { OPEN };
            match self.held.find(tag) {
                Some(at) => {
                    let before = self.held[..at].to_string();
                    self.held.drain(..at + tag.len());
                    self.emit(&mut out, before);
                    self.thinking = !self.thinking;
                }
                None => {
                    let keep = partial_tag_suffix(&self.held, tag);
                    let ready: String = self.held.drain(..self.held.len() - keep).collect();
                    self.emit(&mut out, ready);
                    return out;
                }
            }
        }
    }

    /// The text held back, at the end of the stream.
    pub fn finish(&mut self) -> Vec<Segment> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.held);
        self.emit(&mut out, rest);
        out
    }

    fn emit(&self, out: &mut Vec<Segment>, text: String) {
        if text.is_empty() {
            return;
        }
        out.push(if self.thinking {
            Segment::Thinking(text)
        } else {
            Segment::Answer(text)
        });
    }
}

/// Length of the longest suffix of `s` that is a proper prefix of `tag`.
fn partial_tag_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| n <= s.len() && s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(start: bool, pieces: &[&str]) -> Vec<Segment> {
        let mut s = ThinkSplitter::new(start);
        let mut out: Vec<Segment> = pieces.iter().flat_map(|p| s.push(p)).collect();
        out.extend(s.finish());
        // Merge neighbours of the same kind: piece boundaries are not meaningful.
        let mut merged: Vec<Segment> = Vec::new();
        for seg in out {
            match (merged.last_mut(), seg) {
                (Some(Segment::Thinking(a)), Segment::Thinking(b)) | (Some(Segment::Answer(a)), Segment::Answer(b)) => {
                    a.push_str(&b)
                }
                (_, seg) => merged.push(seg),
            }
        }
        merged
    }

    #[test]
    fn tags_split_across_pieces_are_found_and_dropped() {
        let want = vec![
            Segment::Answer("a".into()),
            Segment::Thinking("hmm <thin".into()),
            Segment::Answer("\n\nyes".into()),
        ];
        assert_eq!(split(false, &["a<think>hmm <thin", "</think>\n\nyes"]), want);
        assert_eq!(split(false, &["a<th", "ink>hmm <thin</", "thi", "nk>\n\nyes"]), want);
        let chars: Vec<String> = "a<think>hmm <thin</think>\n\nyes".chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(split(false, &pieces), want);
    }

    #[test]
    fn a_forced_thought_starts_inside_and_partial_tags_flush_at_the_end() {
        assert_eq!(
            split(true, &["plan</think>ok"]),
            vec![Segment::Thinking("plan".into()), Segment::Answer("ok".into())]
        );
        assert_eq!(split(false, &["x <thi"]), vec![Segment::Answer("x <thi".into())]);
        assert_eq!(
            split(false, &["é<think>ü", "ñ</th", "ink>日本"]),
            vec![
                Segment::Answer("é".into()),
                Segment::Thinking("üñ".into()),
                Segment::Answer("日本".into())
            ]
        );
        assert!(ThinkSplitter::prompt_opens_thought("<|im_start|>assistant\n<think>\n"));
        assert!(!ThinkSplitter::prompt_opens_thought("<think>\n\n</think>\n\n"));
        assert!(!ThinkSplitter::prompt_opens_thought("<|im_start|>assistant\n"));
        assert!(!ThinkSplitter::prompt_opens_thought("<think>a</think> then <think> x"));
    }
}
