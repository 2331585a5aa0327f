//! Every endpoint's happy path.

use super::client::{chat, Server};
use serde_json::json;

#[test]
fn health_models_metrics_tokenize_and_the_page() {
    let s = Server::start(&[]);
    let h = s.get("/health");
    assert_eq!((h.status, h.json()), (200, json!({"status": "ok"})));

    let m = s.get("/v1/models").json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "demo");
    assert_eq!(m["data"][0]["object"], "model");

    let t = s.post("/tokenize", &json!({"content": "And God said"}));
    assert_eq!(t.status, 200);
    let tokens = t.json()["tokens"].clone();
    assert!(!tokens.as_array().unwrap().is_empty());
    assert_eq!(t.json()["count"], tokens.as_array().unwrap().len());
    let d = s.post("/detokenize", &json!({"tokens": tokens}));
    assert_eq!(d.json()["content"], "And God said");

    // Messages are rendered with the chat template (ChatML here).
    let t = s.post("/tokenize", &json!({"messages": [{"role": "user", "content": "hi"}]}));
    let d = s.post("/detokenize", &json!({"tokens": t.json()["tokens"]}));
    assert_eq!(
        d.json()["content"],
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );

    let page = s.get("/");
    assert_eq!(page.status, 200);
    assert!(page.header("content-type").unwrap().starts_with("text/html"));
    assert!(page.body.contains("/v1/chat/completions"));

    s.post(
        "/v1/completions",
        &json!({"prompt": "And", "max_tokens": 3, "temperature": 0}),
    );
    let metrics = s.get("/metrics");
    assert_eq!(metrics.status, 200);
    for name in [
        "moeflux_prompt_tokens_total 1",
        "moeflux_generated_tokens_total 3",
        "moeflux_prefill_tokens_per_second",
        "moeflux_decode_tokens_per_second",
        "moeflux_requests_running 0",
        "moeflux_requests_queued 0",
        "moeflux_expert_cache_hit_ratio",
        "moeflux_expert_bytes_per_token",
    ] {
        assert!(metrics.body.contains(name), "{name} missing from\n{}", metrics.body);
    }
}

#[test]
fn chat_completion_reply_usage_and_cached_tokens_on_the_next_turn() {
    let s = Server::start(&[]);
    let first = s.post("/v1/chat/completions", &chat("Who made the heaven?", json!({})));
    assert_eq!(first.status, 200, "{}", first.body);
    let r = first.json();
    assert_eq!(r["object"], "chat.completion");
    assert_eq!(r["model"], "demo");
    assert!(r["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choice = &r["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    let answer = choice["message"]["content"].as_str().unwrap().to_string();
    assert!(!answer.is_empty());
    assert!(["stop", "length"].contains(&choice["finish_reason"].as_str().unwrap()));
    let u = &r["usage"];
    let prompt_tokens = u["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 5);
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        prompt_tokens + u["completion_tokens"].as_u64().unwrap()
    );
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 0);

    // Greedy is deterministic.
    let again = s.post("/v1/chat/completions", &chat("Who made the heaven?", json!({})));
    assert_eq!(again.json()["choices"][0]["message"]["content"], answer.as_str());

    // The next turn shares the first turn's prompt: only the rest is evaluated.
    let next = json!({
        "messages": [
            {"role": "user", "content": "Who made the heaven?"},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": [{"type": "text", "text": "And the earth?"}]},
        ],
        "temperature": 0,
        "max_tokens": 4,
    });
    let r = s.post("/v1/chat/completions", &next).json();
    let cached = r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(
        cached >= prompt_tokens,
        "cached {cached} < first prompt {prompt_tokens}: {r}"
    );
    assert!(cached < r["usage"]["prompt_tokens"].as_u64().unwrap());
}

#[test]
fn text_completions_take_text_or_token_ids_and_honour_stop_and_seed() {
    let s = Server::start(&[]);
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "And it came to pass", "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = r.json();
    assert_eq!(r["object"], "text_completion");
    let text = r["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(r["usage"]["completion_tokens"], 8);
    assert_eq!(r["choices"][0]["finish_reason"], "length");

    let ids = s.post("/tokenize", &json!({"prompt": "And it came to pass"})).json()["tokens"].clone();
    let by_ids = s.post(
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(by_ids.json()["choices"][0]["text"], text.as_str());

    // A stop string ends the text before it.
    let word = text.split_whitespace().nth(2).unwrap();
    let stopped = s.post(
        "/v1/completions",
        &json!({"prompt": "And it came to pass", "max_tokens": 8, "temperature": 0, "stop": [word]}),
    );
    let stopped = stopped.json();
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
    assert!(text.starts_with(stopped["choices"][0]["text"].as_str().unwrap()));
    assert!(!stopped["choices"][0]["text"].as_str().unwrap().contains(word));

    // A logit bias of -100 keeps the first greedy token out.
    let first = s.post(
        "/v1/completions",
        &json!({"prompt": "And it came to pass", "max_tokens": 1, "temperature": 0}),
    );
    let first_text = first.json()["choices"][0]["text"].as_str().unwrap().to_string();
    let first_id = s.post("/tokenize", &json!({"content": first_text})).json()["tokens"][0].clone();
    let bias = json!({ first_id.to_string(): -100 });
    let biased = s.post(
        "/v1/completions",
        &json!({"prompt": "And it came to pass", "max_tokens": 1, "temperature": 0, "logit_bias": bias}),
    );
    assert_ne!(biased.json()["choices"][0]["text"], first_text.as_str());

    // Sampling with a seed repeats itself.
    let sampled = json!({"prompt": "And", "max_tokens": 10, "temperature": 1.0, "top_p": 0.9, "seed": 7});
    let a = s.post("/v1/completions", &sampled).json();
    let b = s.post("/v1/completions", &sampled).json();
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
}

#[test]
fn an_api_key_guards_everything_but_health_and_the_page() {
    let s = Server::start(&["--api-key", "sesame"]);
    assert_eq!(s.get("/health").status, 200);
    assert_eq!(s.get("/").status, 200);
    for (path, body) in [("/v1/models", ""), ("/metrics", "")] {
        let r = s.request("GET", path, &[], body);
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    }
    let body = chat("hi", json!({"max_tokens": 2})).to_string();
    let wrong = s.request(
        "POST",
        "/v1/chat/completions",
        &[("Authorization", "Bearer nope")],
        &body,
    );
    assert_eq!(wrong.status, 401);
    assert_eq!(wrong.json()["error"]["type"], "authentication_error");
    let right = s.request(
        "POST",
        "/v1/chat/completions",
        &[("Authorization", "Bearer sesame")],
        &body,
    );
    assert_eq!(right.status, 200, "{}", right.body);
}
