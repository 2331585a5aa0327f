//! Structured output: `response_format` and forced tool calls make even
//! the demo model, which knows only Bible text, answer in well-formed JSON
//! that follows the schema.

use super::client::{chat, Server};
use serde_json::{json, Value};

/// A verse reference: an enum, a bounded integer, a short string.
fn verse_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "book": {"type": "string", "enum": ["Genesis", "Exodus", "Psalms"]},
            "chapter": {"type": "integer", "minimum": 1, "maximum": 150},
            "text": {"type": "string", "maxLength": 40},
            "holy": {"type": "boolean"}
        },
        "required": ["book", "chapter", "text", "holy"],
        "additionalProperties": false
    })
}

/// `v` follows `verse_schema`.
fn check_verse(v: &Value) {
    let o = v.as_object().unwrap_or_else(|| panic!("not an object: {v}"));
    assert_eq!(o.len(), 4, "{v}");
    assert!(
        ["Genesis", "Exodus", "Psalms"].contains(&o["book"].as_str().unwrap()),
        "{v}"
    );
    let chapter = o["chapter"].as_i64().unwrap_or_else(|| panic!("chapter: {v}"));
    assert!((1..=150).contains(&chapter), "{v}");
    assert!(o["text"].as_str().unwrap().chars().count() <= 40, "{v}");
    assert!(o["holy"].is_boolean(), "{v}");
}

fn format(schema: Value) -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "verse", "schema": schema, "strict": true}})
}

fn content(r: &super::client::Reply) -> Value {
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"));
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn json_schema_answers_parse_and_follow_the_schema() {
    let s = Server::start(&[]);
    for (temperature, seed) in [(0.0, 1), (1.0, 7), (1.0, 8)] {
        let body = chat(
            "Where is it written?",
            json!({"response_format": format(verse_schema()), "max_tokens": 120, "temperature": temperature, "seed": seed}),
        );
        let r = s.post("/v1/chat/completions", &body);
        check_verse(&content(&r));
        assert_eq!(r.json()["choices"][0]["finish_reason"], "stop", "{}", r.body);
    }
    // Streamed: the deltas join into the same kind of answer.
    let body = chat(
        "Where is it written?",
        json!({"response_format": format(verse_schema()), "max_tokens": 120, "stream": true}),
    );
    let r = s.post("/v1/chat/completions", &body);
    let mut text = String::new();
    for v in r.chunks() {
        text.push_str(v["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
    }
    check_verse(&serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")));
    // Text completions take it too.
    let body = json!({"prompt": "In the beginning", "max_tokens": 120, "temperature": 0, "response_format": format(verse_schema())});
    let r = s.post("/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let text = r.json()["choices"][0]["text"].as_str().unwrap().to_string();
    check_verse(&serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")));
}

#[test]
fn json_object_answers_are_a_json_object() {
    let s = Server::start(&[]);
    // Without the constraint the demo model writes scripture, not JSON.
    let plain = s.post("/v1/chat/completions", &chat("hi", json!({"max_tokens": 8})));
    let text = plain.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(serde_json::from_str::<Value>(&text).is_err(), "{text}");
    let schema = json!({
        "type": "object",
        "properties": {"a": {"type": "string", "maxLength": 12}, "n": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
        "required": ["a", "n"],
        "additionalProperties": false
    });
    let r = s.post(
        "/v1/chat/completions",
        &chat("hi", json!({"response_format": format(schema), "max_tokens": 80})),
    );
    assert!(content(&r)["n"].is_array(), "{}", r.body);
    let body = chat(
        "hi",
        json!({"response_format": {"type": "json_object"}, "max_tokens": 200}),
    );
    let r = s.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    if v["choices"][0]["finish_reason"] == "stop" {
        let parsed: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
        assert!(parsed.is_object(), "{text}");
    } else {
        // Out of tokens inside a long string: still the start of an object.
        assert!(text.starts_with('{'), "{text}");
    }
}

#[test]
fn tool_choice_required_forces_a_parsed_call() {
    let s = Server::start(&[]);
    let tools = json!([
        {"type": "function", "function": {"name": "get_verse", "parameters": {
            "type": "object",
            "properties": {"book": {"type": "string", "enum": ["Genesis", "John"]}, "chapter": {"type": "integer", "minimum": 1, "maximum": 50}},
            "required": ["book", "chapter"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "amen", "parameters": {"type": "object", "properties": {}, "additionalProperties": false}}}
    ]);
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_verse"}}),
    ] {
        let body = chat(
            "Read me a verse",
            json!({"tools": tools, "tool_choice": choice, "max_tokens": 80, "parallel_tool_calls": false}),
        );
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        let choice0 = &v["choices"][0];
        assert_eq!(choice0["finish_reason"], "tool_calls", "{v}");
        let calls = choice0["message"]["tool_calls"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"));
        assert_eq!(calls.len(), 1, "{v}");
        let f = &calls[0]["function"];
        let args: Value = serde_json::from_str(f["arguments"].as_str().unwrap()).unwrap();
        match f["name"].as_str().unwrap() {
            "get_verse" => {
                assert!(["Genesis", "John"].contains(&args["book"].as_str().unwrap()), "{v}");
                assert!((1..=50).contains(&args["chapter"].as_i64().unwrap()), "{v}");
            }
            "amen" => assert_eq!(args, json!({}), "{v}"),
            other => panic!("unknown tool {other}: {v}"),
        }
    }
}
