//! `logprobs` / `top_logprobs`: one entry per generated token, whole and
//! streamed, in chat's and text completions' shapes.

use super::client::{chat, Server};
use serde_json::{json, Value};

fn stream_logprobs(r: &super::client::Reply, key: &str) -> Vec<Value> {
    let mut all = Vec::new();
    for v in r.chunks() {
        if let Some(list) = v["choices"][0]["logprobs"][key].as_array() {
            all.extend(list.iter().cloned());
        }
    }
    all
}

#[test]
fn chat_logprobs_cover_every_token_whole_and_streamed() {
    let s = Server::start(&[]);
    let body = chat(
        "hi",
        json!({"logprobs": true, "top_logprobs": 3, "max_tokens": 10, "repetition_penalty": 1}),
    );
    let r = s.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap(),
        "{v}"
    );
    let mut text = String::new();
    for e in content {
        let lp = e["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0, "{e}");
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{e}");
        assert!(
            top.windows(2)
                .all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64()),
            "{e}"
        );
        // Greedy, no penalty: the chosen token is the most likely one.
        assert_eq!(e["token"], top[0]["token"], "{e}");
        text.push_str(e["token"].as_str().unwrap());
    }
    let answer = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.starts_with(answer), "{text:?} vs {answer:?}");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = s.post("/v1/chat/completions", &streamed);
    // The same tokens; the values as close as a prefix reused from the
    // first request's session leaves them.
    let got = stream_logprobs(&r, "content");
    assert_eq!(got.len(), content.len(), "{}", r.body);
    for (a, b) in got.iter().zip(content) {
        assert_eq!(a["token"], b["token"]);
        assert!((a["logprob"].as_f64().unwrap() - b["logprob"].as_f64().unwrap()).abs() < 1e-3);
    }
    // Without the field: null, as OpenAI sends it.
    let r = s.post("/v1/chat/completions", &chat("hi", json!({})));
    assert_eq!(r.json()["choices"][0]["logprobs"], Value::Null);
}

#[test]
fn completion_logprobs_have_tokens_offsets_and_alternatives() {
    let s = Server::start(&[]);
    let body = json!({"prompt": "In the beginning", "max_tokens": 8, "temperature": 0, "logprobs": 2, "repetition_penalty": 1});
    let r = s.post("/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let lp = &v["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.len(), 8, "{v}");
    assert_eq!(tokens.concat(), v["choices"][0]["text"].as_str().unwrap(), "{v}");
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert_eq!(offsets[0], 0);
    assert_eq!(offsets[1], tokens[0].len() as u64, "{v}");
    assert!(
        lp["top_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t.as_object().unwrap().len() <= 2),
        "{v}"
    );
    assert!(lp["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l.as_f64().unwrap() <= 0.0));
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = s.post("/v1/completions", &streamed);
    let got: Vec<Value> = stream_logprobs(&r, "tokens");
    assert_eq!(got.len(), 8, "{}", r.body);
    assert_eq!(
        stream_logprobs(&r, "text_offset"),
        lp["text_offset"].as_array().unwrap().clone()
    );
}
