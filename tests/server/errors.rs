//! Bad requests get the right 4xx in the OpenAI error shape, never a 500.

use super::client::{chat, Server};
use serde_json::{json, Value};

fn error(s: &Server, path: &str, body: &str) -> (u16, Value) {
    let r = s.request("POST", path, &[], body);
    let v = r.json();
    assert!(
        v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{}",
        r.body
    );
    assert!(v["error"]["type"].is_string(), "{}", r.body);
    (r.status, v["error"].clone())
}

#[test]
fn bad_json_fields_and_unsupported_features_are_400_naming_the_field() {
    let s = Server::start(&["--ctx", "64"]);
    let chat_path = "/v1/chat/completions";
    let (status, e) = error(&s, chat_path, "{not json");
    assert_eq!((status, e["type"].as_str()), (400, Some("invalid_request_error")));
    let (status, _) = error(&s, chat_path, "[1, 2]");
    assert_eq!(status, 400);

    let cases: Vec<(Value, &str)> = vec![
        (json!({"temperature": 0}), "messages"),
        (json!({"messages": []}), "messages"),
        (json!({"messages": "hi"}), "messages"),
        (
            json!({"messages": [{"role": "wizard", "content": "hi"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "user", "content": 3}]}),
            "messages[0].content",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            "messages[0].content[0].type",
        ),
        (chat("hi", json!({"temperature": -1})), "temperature"),
        (chat("hi", json!({"temperature": "hot"})), "temperature"),
        (chat("hi", json!({"top_p": 0})), "top_p"),
        (chat("hi", json!({"top_k": -5})), "top_k"),
        (chat("hi", json!({"min_p": 2})), "min_p"),
        (chat("hi", json!({"presence_penalty": 5})), "presence_penalty"),
        (chat("hi", json!({"repetition_penalty": 0})), "repetition_penalty"),
        (chat("hi", json!({"max_tokens": 0})), "max_tokens"),
        (
            chat("hi", json!({"max_completion_tokens": "many"})),
            "max_completion_tokens",
        ),
        (chat("hi", json!({"stop": 3})), "stop"),
        (chat("hi", json!({"n": 2})), "n"),
        (chat("hi", json!({"logprobs": "yes"})), "logprobs"),
        (chat("hi", json!({"top_logprobs": 3})), "top_logprobs"),
        (
            chat("hi", json!({"logprobs": true, "top_logprobs": 21})),
            "top_logprobs",
        ),
        (chat("hi", json!({"logit_bias": {"five": 10}})), "logit_bias"),
        (chat("hi", json!({"logit_bias": {"5": 1000}})), "logit_bias"),
        (
            chat("hi", json!({"response_format": {"type": "xml"}})),
            "response_format",
        ),
        (
            chat(
                "hi",
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wizard"}}}}),
            ),
            "response_format",
        ),
        (
            chat(
                "hi",
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}}),
            ),
            "response_format",
        ),
        (
            chat(
                "hi",
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}}),
            ),
            "response_format",
        ),
        (chat("hi", json!({"tool_choice": "required"})), "tool_choice"),
        (chat("hi", json!({"stream": "yes"})), "stream"),
        (
            chat("hi", json!({"chat_template_kwargs": {"messages": []}})),
            "chat_template_kwargs",
        ),
        (chat("hi", json!({"tools": [{"type": "function"}]})), "tools[0]"),
        (chat("hi", json!({"tool_choice": "sometimes"})), "tool_choice"),
        (
            chat(&"And the LORD spake unto Moses, saying, ".repeat(20), json!({})),
            "messages",
        ),
    ];
    for (body, param) in cases {
        let (status, e) = error(&s, chat_path, &body.to_string());
        assert_eq!(status, 400, "{body}: {e}");
        assert_eq!(e["param"], param, "{body}: {e}");
    }
    let (_, e) = error(
        &s,
        chat_path,
        &chat(&"And it came to pass ".repeat(30), json!({})).to_string(),
    );
    assert_eq!(e["code"], "context_length_exceeded");

    let completions = "/v1/completions";
    for (body, param) in [
        (json!({"max_tokens": 3}), "prompt"),
        (json!({"prompt": {"text": "x"}}), "prompt"),
        (json!({"prompt": ["a", "b"]}), "prompt"),
        (json!({"prompt": [1, 99999999]}), "prompt"),
        (json!({"prompt": "x", "echo": true}), "echo"),
        (json!({"prompt": "x", "best_of": 3}), "best_of"),
    ] {
        let (status, e) = error(&s, completions, &body.to_string());
        assert_eq!((status, e["param"].as_str()), (400, Some(param)), "{body}: {e}");
    }
    let (status, e) = error(&s, "/detokenize", &json!({"tokens": [1, 99999999]}).to_string());
    assert_eq!((status, e["param"].as_str()), (400, Some("tokens")));
    let (status, _) = error(&s, "/tokenize", "{}");
    assert_eq!(status, 400);

    let r = s.get("/v1/nothing");
    assert_eq!(r.status, 404);
    assert!(r.json()["error"]["message"].is_string());
    // Still serving after all that.
    assert_eq!(s.get("/health").status, 200);
}
