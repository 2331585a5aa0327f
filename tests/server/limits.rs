//! What a request may hold is bounded before the server works on it: the
//! body (413), its type (415), the prompt's bytes, `stop`, `tools`; and
//! large prompts are tokenized off the HTTP workers, so that `/health`
//! keeps answering (issue 49).

use super::client::{chat, Server};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn error(r: &super::client::Reply) -> Value {
    assert_eq!(r.header("content-type"), Some("application/json"), "{r:?}");
    let e = r.json()["error"].clone();
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{r:?}");
    e
}

#[test]
fn bodies_are_bounded_must_be_json_and_methods_are_checked() {
    let s = Server::start(&["--max-body", "4096"]);
    // Too large by its declared length: refused before it is read.
    let r = s.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n");
    assert_eq!(r.status, 413, "{r:?}");
    assert_eq!(error(&r)["code"], "request_too_large");
    // Too large as it arrives (no length given).
    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(5000));
    let chunked = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{big}\r\n0\r\n\r\n",
        big.len()
    );
    let r = s.raw(chunked.as_bytes());
    assert_eq!(r.status, 413, "{r:?}");
    assert_eq!(error(&r)["type"], "invalid_request_error");

    // A JSON body sent as text/plain (what a web page may send without a
    // preflight) is refused.
    let body = json!({"prompt": "And", "max_tokens": 2}).to_string();
    let plain = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let r = s.raw(plain.as_bytes());
    assert_eq!(r.status, 415, "{r:?}");
    assert_eq!(error(&r)["code"], "unsupported_media_type");

    // A wrong method is a JSON 405.
    let r = s.get("/v1/chat/completions");
    assert_eq!(r.status, 405, "{r:?}");
    assert_eq!(error(&r)["code"], "method_not_allowed");
    let r = s.request("POST", "/health", &[], "{}");
    assert_eq!(r.status, 405, "{r:?}");
    error(&r);

    // Within the bounds, all is well.
    let r = s.post("/v1/completions", &json!({"prompt": "And", "max_tokens": 2}));
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn stop_tools_and_prompt_bytes_are_bounded_with_a_400_naming_the_limit() {
    let s = Server::start(&["--ctx", "64"]);
    let path = "/v1/chat/completions";
    let check = |body: Value, param: &str, words: &str| {
        let r = s.post(path, &body);
        assert_eq!(r.status, 400, "{}", r.body);
        let e = error(&r);
        assert_eq!(e["param"], param, "{e}");
        assert!(e["message"].as_str().unwrap().contains(words), "{e}");
    };
    check(
        chat("hi", json!({"stop": ["a", "b", "c", "d", "e"]})),
        "stop",
        "at most 4",
    );
    check(chat("hi", json!({"stop": ["x".repeat(2000)]})), "stop", "at most 1024");
    let tool = |i: usize, description: &str| json!({"type": "function", "function": {"name": format!("f{i}"), "description": description, "parameters": {"type": "object"}}});
    let many: Vec<Value> = (0..129).map(|i| tool(i, "")).collect();
    check(chat("hi", json!({"tools": many})), "tools", "at most 128");
    let large: Vec<Value> = (0..10).map(|i| tool(i, &"x".repeat(30_000))).collect();
    check(chat("hi", json!({"tools": large})), "tools", "bytes");
    // A prompt longer than any prompt of 64 tokens could be is refused
    // by its bytes, before it is tokenized.
    let r = s.post(path, &chat(&"And God said ".repeat(20_000), json!({})));
    let e = error(&r);
    assert_eq!((r.status, &e["code"]), (400, &json!("context_length_exceeded")), "{e}");
    assert!(e["message"].as_str().unwrap().contains("bytes long"), "{e}");
    let r = s.post("/v1/completions", &json!({"prompt": "And God said ".repeat(20_000)}));
    assert_eq!(error(&r)["code"], "context_length_exceeded");

    // Four stop strings and a few tools are fine.
    let r = s.post(
        path,
        &chat(
            "hi",
            json!({"stop": ["a", "b", "c", "d"], "tools": [tool(0, "")], "max_tokens": 2}),
        ),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn health_answers_quickly_while_large_prompts_are_tokenized() {
    let s = Server::start(&[]);
    let text = "And the LORD spake unto Moses, saying, ".repeat(25_000);
    let body = json!({"content": text}).to_string();
    let worst = std::thread::scope(|scope| {
        let load: Vec<_> = (0..4)
            .map(|_| {
                let (s, body) = (&s, &body);
                scope.spawn(move || {
                    for _ in 0..2 {
                        let r = s.request("POST", "/tokenize", &[], body);
                        assert_eq!(r.status, 200, "{}", &r.body[..r.body.len().min(300)]);
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let mut worst = Duration::ZERO;
        for _ in 0..20 {
            let t = Instant::now();
            assert_eq!(s.get("/health").status, 200);
            worst = worst.max(t.elapsed());
            std::thread::sleep(Duration::from_millis(50));
        }
        for h in load {
            h.join().unwrap();
        }
        worst
    });
    assert!(worst < Duration::from_millis(500), "/health took {worst:?}");
}
