//! The text files of a synthetic model: a byte-level BPE `tokenizer.json`
//! with exactly `vocab_size` ids, `tokenizer_config.json`,
//! `generation_config.json` and a ChatML `chat_template.jinja`, so that a
//! synthetic model can be prompted with text and served like a real one.
//!
//! Ids: `0..256` are the 256 bytes (id = byte value), then the merges
//! learned from [`WORDS`] (so that English text takes fewer tokens than
//! bytes), then filler tokens (pronounceable made-up words that no text
//! encodes to, but that decode like any other), and the last three ids are
//! the ChatML special tokens `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`.
//! Nothing is random: the files depend on `vocab_size` and
//! `max_position_embeddings` only.

use crate::error::{Error, Result};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

/// The special tokens, in id order at the end of the vocabulary.
pub const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// The chat template written as `chat_template.jinja`.
pub const CHAT_TEMPLATE: &str = include_str!("chat_template.jinja");
/// Merges learned at most (the rest of a large vocabulary is filler).
const MAX_MERGES: usize = 8192;

/// Common English words, most frequent first: what the merges are learned from.
const WORDS: &str = "the of and to a in is it you that he was for on are with as I his they be at one have this \
from or had by not word but what some we can out other were all there when up use your how said an each she \
which do their time if will way about many then them write would like so these her long make thing see him two \
has look more day could go come did number sound no most people my over know water than call first who may down \
side been now find any new work part take get place made live where after back little only round man year came \
show every good me give our under name very through just form sentence great think say help low line differ turn \
cause much mean before move right boy old too same tell does set three want air well also play small end put home \
read hand port large spell add even land here must big high such follow act why ask men change went light kind \
off need house picture try us again animal point mother world near build self earth father head stand own page \
should country found answer school grow study still learn plant cover food sun four between state keep eye never \
last let thought city tree cross farm hard start might story saw far sea draw left late run while press close \
night real life few north open seem together next white children begin got walk example ease paper group always \
music those both mark often letter until mile river car feet care second book carry took science eat room friend \
began idea fish mountain stop once base hear horse cut sure watch color face wood main enough plain girl usual \
young ready above ever red list though feel talk bird soon body dog family direct pose leave song measure door \
product black short numeral class wind question happen complete ship area half rock order fire south problem \
piece told knew pass since top whole king space heard best hour better true during hundred five remember step \
early hold west ground interest reach fast verb sing listen six table travel less morning ten simple several \
vowel toward war lay against pattern slow center love person money serve appear road map rain rule govern pull \
cold notice voice unit power town fine certain fly fall lead cry dark machine note wait plan figure star box noun \
field rest correct able pound done beauty drive stood contain front teach week final gave green quick develop \
ocean warm free minute strong special mind behind clear tail produce fact street inch multiply nothing course \
stay wheel full force blue object decide surface deep moon island foot system busy test record boat common gold \
possible plane instead dry wonder laugh thousand ago ran check game shape equate hot miss brought heat snow tire \
bring yes distant fill east paint language among user assistant tool function call model answer question data \
code file error value number string list return result model token server request response";

/// GPT-2's map from bytes to the printable characters byte-level BPE
/// writes them as: printable Latin-1 bytes stand for themselves, the
/// others (controls, space, ...) for `U+0100` onwards, in byte order.
fn byte_chars() -> [char; 256] {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        out[b as usize] = if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or('\u{FFFD}');
            next += 1;
            c
        };
    }
    out
}

/// A word as byte-level symbols.
fn symbols(word: &str, chars: &[char; 256]) -> Vec<String> {
    word.bytes().map(|b| chars[b as usize].to_string()).collect()
}

/// Learn up to `max` BPE merges from `words` (symbols, weight): each step
/// merges the most frequent adjacent pair (ties: the smallest pair).
fn learn_merges(mut words: Vec<(Vec<String>, u64)>, max: usize) -> Vec<(String, String)> {
    let mut merges = Vec::new();
    while merges.len() < max {
        let mut counts: HashMap<(&str, &str), u64> = HashMap::new();
        for (w, n) in &words {
            for p in w.windows(2) {
                *counts.entry((&p[0], &p[1])).or_default() += n;
            }
        }
        let best = counts
            .into_iter()
            .max_by(|(a, na), (b, nb)| na.cmp(nb).then(b.cmp(a)))
            .map(|((a, b), _)| (a.to_string(), b.to_string()));
        let Some((a, b)) = best else { break };
        let joined = format!("{a}{b}");
        for (w, _) in words.iter_mut() {
            let mut i = 0;
            while i + 1 < w.len() {
                if w[i] == a && w[i + 1] == b {
                    w[i] = joined.clone();
                    w.remove(i + 1);
                }
                i += 1;
            }
        }
        merges.push((a, b));
    }
    merges
}

/// The training words with their weights: word `r` (0-based rank) weighs
/// `1000/(r+1) + 1` as `word` and as ` Word`, and five times that as
/// ` word` (after a space, as most words of a text come).
fn training_words(chars: &[char; 256]) -> Vec<(Vec<String>, u64)> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (r, w) in WORDS.split_whitespace().enumerate() {
        let weight = 1000 / (r as u64 + 1) + 1;
        let mut cap = w.to_string();
        if let Some(f) = cap.get_mut(0..1) {
            f.make_ascii_uppercase();
        }
        for (text, n) in [
            (format!(" {w}"), 5 * weight),
            (w.to_string(), weight),
            (format!(" {cap}"), weight),
        ] {
            if seen.insert(text.clone()) {
                out.push((symbols(&text, chars), n));
            }
        }
    }
    out
}

/// Filler token `i`: a made-up word of two or more consonant-vowel
/// syllables (the digits of `i + 90` in base 90), after a space three
/// times in four.
fn filler(i: usize) -> String {
    const C: &[u8] = b"bcdfghjklmnprstvwz";
    const V: &[u8] = b"aeiou";
    let mut s = String::from(if i % 4 == 3 { "" } else { "\u{120}" }); // 'Ġ', a space
    let mut n = i + 90;
    while n > 0 {
        let d = n % 90;
        s.push(char::from(C[d / 5]));
        s.push(char::from(V[d % 5]));
        n /= 90;
    }
    s
}

/// The BPE vocabulary (bytes, merges, fillers) of `vocab_size − 3` ids.
fn vocabulary(vocab_size: usize) -> Result<(Vocab, Vec<(String, String)>)> {
    let regular = vocab_size.checked_sub(256 + SPECIAL_TOKENS.len()).ok_or_else(|| {
        Error::config(
            "vocab_size",
            format!("{vocab_size} is too small for a byte-level tokenizer (at least 259)"),
        )
    })?;
    let chars = byte_chars();
    let merges = learn_merges(training_words(&chars), regular.min(MAX_MERGES));
    let mut tokens: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
    tokens.extend(merges.iter().map(|(a, b)| format!("{a}{b}")));
    let mut seen: HashSet<String> = tokens.iter().cloned().collect();
    let mut i = 0;
    while tokens.len() < vocab_size - SPECIAL_TOKENS.len() {
        let f = filler(i);
        i += 1;
        if seen.insert(f.clone()) {
            tokens.push(f);
        }
    }
    let vocab = tokens.into_iter().enumerate().map(|(id, t)| (t, id as u32)).collect();
    Ok((vocab, merges))
}

/// `tokenizer.json` for a vocabulary of `vocab_size` ids.
pub fn tokenizer_json(vocab_size: usize) -> Result<String> {
    let bad = |e: tokenizers::Error| Error::Invalid(format!("building the synthetic tokenizer: {e}"));
    let (vocab, merges) = vocabulary(vocab_size)?;
    let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().map_err(bad)?;
    let mut tok = tokenizers::Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(ByteLevelDecoder::default()));
    tok.add_special_tokens(SPECIAL_TOKENS.iter().map(|t| AddedToken::from(*t, true)))
        .map_err(bad)?;
    tok.to_string(false).map_err(bad)
}

/// The id of special token `name` in a vocabulary of `vocab_size`.
pub fn special_id(vocab_size: usize, name: &str) -> Option<u32> {
    let i = SPECIAL_TOKENS.iter().position(|t| *t == name)?;
    Some((vocab_size - SPECIAL_TOKENS.len() + i) as u32)
}

/// `tokenizer_config.json`, as a Qwen model's (Qwen2Tokenizer fields).
pub fn tokenizer_config(vocab_size: usize, max_len: usize) -> Value {
    let decoder: BTreeMap<String, Value> = SPECIAL_TOKENS
        .iter()
        .map(|t| {
            let id = special_id(vocab_size, t).unwrap_or_default();
            let entry = json!({"content": t, "lstrip": false, "normalized": false, "rstrip": false,
                               "single_word": false, "special": true});
            (id.to_string(), entry)
        })
        .collect();
    json!({
        "add_bos_token": false,
        "add_prefix_space": false,
        "added_tokens_decoder": decoder,
        "bos_token": null,
        "clean_up_tokenization_spaces": false,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": max_len,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": false,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": null
    })
}

/// `generation_config.json`: generation ends at `<|im_end|>` or
/// `<|endoftext|>`; no sampling fields, so decoding is greedy by default.
pub fn generation_config(vocab_size: usize) -> Value {
    let id = |t| special_id(vocab_size, t);
    json!({
        "bos_token_id": id("<|endoftext|>"),
        "eos_token_id": [id("<|im_end|>"), id("<|endoftext|>")],
        "pad_token_id": id("<|endoftext|>")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_map_to_distinct_chars() {
        let c = byte_chars();
        assert_eq!(c.iter().collect::<HashSet<_>>().len(), 256);
        assert_eq!((c[b' ' as usize], c[b'\n' as usize], c[b'a' as usize]), ('Ġ', 'Ċ', 'a'));
    }

    #[test]
    fn merges_follow_frequency() {
        let w = |s: &str, n| (s.chars().map(String::from).collect(), n);
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        // ab: 5, bc: 3; then ab·c: 2, b·c: 1; then b·c; then nothing (cd ties with dc: the smaller first).
        let m = learn_merges(vec![w("ab", 3), w("abc", 2), w("bc", 1)], 10);
        assert_eq!(m, [pair("a", "b"), pair("ab", "c"), pair("b", "c")]);
        let m = learn_merges(vec![w("dc", 1), w("cd", 1)], 1);
        assert_eq!(m, [pair("c", "d")]);
    }

    #[test]
    fn fillers_are_distinct_words() {
        let f: Vec<String> = (0..20_000).map(filler).collect();
        assert_eq!(f.iter().collect::<HashSet<_>>().len(), f.len());
        assert_eq!(filler(0), "\u{120}babe");
    }
}
