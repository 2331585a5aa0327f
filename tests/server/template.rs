//! The chat template's side: `--chat-template`, `chat_template_kwargs`,
//! tools rendered for the model, and reasoning split from the answer.

use super::client::{chat, Server};
use serde_json::{json, Value};

/// ChatML that lists the tools in a system turn and, with
/// `enable_thinking`, opens a thought after the assistant header.
const TEMPLATE: &str = "{%- if tools %}{{- '<|im_start|>system\\nTools:' }}{%- for t in tools %}{{- ' ' + t.function.name }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}\
{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking %}{{- '<think>\\n' }}{%- endif %}{%- endif %}";

fn server() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("template.jinja");
    std::fs::write(&path, TEMPLATE).unwrap();
    let s = Server::start(&["--chat-template", path.to_str().unwrap()]);
    (dir, s)
}

fn rendered(s: &Server, body: Value) -> String {
    let ids = s.post("/tokenize", &body).json()["tokens"].clone();
    s.post("/detokenize", &json!({"tokens": ids})).json()["content"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn tools_reach_the_template_unless_tool_choice_is_none() {
    let (_dir, s) = server();
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "get_time"}}
    ]);
    let messages = json!([{"role": "user", "content": "hi"}]);
    let text = rendered(&s, json!({"messages": messages, "tools": tools}));
    assert!(
        text.starts_with("<|im_start|>system\nTools: get_weather get_time<|im_end|>"),
        "{text}"
    );
    let text = rendered(&s, json!({"messages": messages, "tools": tools, "tool_choice": "none"}));
    assert!(!text.contains("Tools:"), "{text}");
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    let text = rendered(&s, json!({"messages": messages, "tools": tools, "tool_choice": named}));
    assert!(text.contains("Tools: get_time<|im_end|>"), "{text}");
    // A chat with tools answers like any other when the model calls none.
    let r = s.post(
        "/v1/chat/completions",
        &chat("hi", json!({"tools": tools, "max_tokens": 4})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["finish_reason"], "length");
}

#[test]
fn thinking_goes_to_reasoning_content_not_content() {
    let (_dir, s) = server();
    let think = json!({"chat_template_kwargs": {"enable_thinking": true}, "max_tokens": 6});
    let text = rendered(&s, chat("hi", think.clone()));
    assert!(text.ends_with("<|im_start|>assistant\n<think>\n"), "{text}");

    // The demo model never closes its thought: everything is reasoning.
    let r = s
        .post("/v1/chat/completions", &chat("Who made the heaven?", think.clone()))
        .json();
    let m = &r["choices"][0]["message"];
    let reasoning = m["reasoning_content"].as_str().unwrap();
    assert!(!reasoning.is_empty(), "{r}");
    assert_eq!(m["reasoning"], reasoning);
    assert_eq!(m["content"], "");

    let mut stream = think;
    stream["stream"] = true.into();
    let r = s.post("/v1/chat/completions", &chat("Who made the heaven?", stream));
    let mut streamed = String::new();
    for c in r.chunks() {
        let delta = &c["choices"][0]["delta"];
        assert!(delta["content"].as_str().unwrap_or("").is_empty(), "{c}");
        streamed.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
    }
    assert_eq!(streamed, reasoning);

    // Without the open thought the same answer is content.
    let r = s
        .post(
            "/v1/chat/completions",
            &chat("Who made the heaven?", json!({"max_tokens": 6})),
        )
        .json();
    assert!(!r["choices"][0]["message"]["content"].as_str().unwrap().is_empty());
    assert!(r["choices"][0]["message"].get("reasoning_content").is_none());
}

#[test]
fn a_template_whose_output_runs_away_is_an_error_and_the_server_stays_up() {
    let dir = tempfile::tempdir().unwrap();
    let doubling = dir.path().join("doubling.jinja");
    std::fs::write(
        &doubling,
        "{%- set ns = namespace(s='ab') %}{%- for i in range(64) %}{{ ns.s }}{%- set ns.s = ns.s ~ ns.s %}{%- endfor %}",
    )
    .unwrap();
    let s = Server::start(&["--chat-template", doubling.to_str().unwrap()]);
    let r = s.post("/v1/chat/completions", &chat("hi", json!({})));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("output is over"),
        "{}",
        r.body
    );
    assert_eq!(s.get("/health").status, 200);
}
