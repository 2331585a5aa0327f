//! The text files synth writes beside the weights: a tokenizer of the
//! model's vocabulary size and a chat template, read by the engine's text
//! layer.

use super::{tiny_qwen3, with, write};
use moeflux::synth::SynthOptions;
use serde_json::json;

#[test]
fn synthetic_models_have_a_tokenizer_and_a_chat_template() {
    use moeflux::text::{ChatRequest, ChatTemplate, Tokenizer};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    write(
        with(tiny_qwen3(), json!({"vocab_size": 2048})),
        &dir,
        &SynthOptions::default(),
    );
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.vocab_size(), 2048);
    let (eot, start, end) = (2045, 2046, 2047);
    assert_eq!(
        [
            tok.token_to_id("<|endoftext|>"),
            tok.token_to_id("<|im_start|>"),
            tok.token_to_id("<|im_end|>")
        ],
        [Some(eot), Some(start), Some(end)]
    );
    assert_eq!(tok.eos_ids(), &[end, eot]);
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    // Text round-trips, and English takes fewer tokens than bytes.
    let text =
        "The people of the world could not find the water, so they took a long walk to the river. Ünïcödé ✓ 42\n";
    let ids = tok.encode(text, true).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    assert!(
        ids.len() * 2 < text.len(),
        "{} tokens for {} bytes",
        ids.len(),
        text.len()
    );
    // The chat template renders every turn, and its special tokens encode as one id each.
    let template = ChatTemplate::from_dir(&dir).unwrap().expect("a chat template");
    let call = json!({"type": "function", "function": {"name": "clock", "arguments": {"zone": "UTC"}}});
    let req = ChatRequest {
        messages: vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "What time is it?"}),
            json!({"role": "assistant", "content": "", "tool_calls": [call]}),
            json!({"role": "tool", "content": "12:00"}),
            json!({"role": "assistant", "content": "Noon."}),
            json!({"role": "user", "content": "Thanks"}),
        ],
        add_generation_prompt: true,
        ..ChatRequest::default()
    };
    let prompt = template.render(&req).unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat time is it?<|im_end|>\n\
         <|im_start|>assistant\n<tool_call>\n{\"name\": \"clock\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call><|im_end|>\n\
         <|im_start|>user\n<tool_response>\n12:00\n</tool_response><|im_end|>\n\
         <|im_start|>assistant\nNoon.<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = tok.encode(&prompt, false).unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == start).count(), 7);
    assert_eq!(ids.iter().filter(|&&i| i == end).count(), 6);
    assert_eq!(tok.decode(&ids, false).unwrap(), prompt);
    let tools = vec![json!({"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}}})];
    let with_tools = template
        .render(&ChatRequest {
            tools: Some(tools),
            ..req
        })
        .unwrap();
    assert!(
        with_tools.starts_with("<|im_start|>system\nBe brief.\n\n# Tools\n"),
        "{with_tools}"
    );
    assert!(
        with_tools.contains("\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"clock\""),
        "{with_tools}"
    );
    // Every id decodes (one by one and all together), and the grammar layer reads every token's bytes.
    let all: Vec<u32> = (0..2048).collect();
    for &id in &all {
        tok.decode(&[id], false).unwrap();
    }
    tok.decode(&all, false).unwrap();
    assert_eq!(tok.token_bytes().unwrap().len(), 2048);
}

#[test]
fn the_tokenizer_of_a_full_vocabulary_is_quick_and_deterministic() {
    use moeflux::synth::tokenizer::tokenizer_json;
    let t = std::time::Instant::now();
    let a = tokenizer_json(248_320).unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(a, tokenizer_json(248_320).unwrap());
    let tok = tokenizers::Tokenizer::from_bytes(a.as_bytes()).unwrap();
    assert_eq!(tok.get_vocab_size(true), 248_320);
    let all: Vec<u32> = (0..248_320).collect();
    tok.decode(&all, false).unwrap();
    assert!(secs < 10.0, "{secs:.1} s to build a 248k tokenizer");
    eprintln!("248k tokenizer: {secs:.2} s, {} MB", a.len() / 1_000_000);
}
