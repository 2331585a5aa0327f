//! Streaming: the SSE event sequence, cancellation when the client goes
//! away, and a stream cut short by SIGTERM.

use super::client::{chat, Server};
use serde_json::{json, Value};
use std::io::Read;
use std::time::{Duration, Instant};

#[test]
fn chat_stream_is_the_openai_event_sequence() {
    let s = Server::start(&[]);
    let body = chat(
        "Who made the heaven?",
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let r = s.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.header("content-type").unwrap().starts_with("text/event-stream"));
    let chunks = r.chunks();
    assert!(chunks.len() >= 4, "{chunks:?}");
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(
            (&c["id"], &c["created"], &c["model"]),
            (&chunks[0]["id"], &chunks[0]["created"], &chunks[0]["model"])
        );
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (usage, rest) = chunks.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    let (last, middle) = rest.split_last().unwrap();
    assert!(["stop", "length"].contains(&last["choices"][0]["finish_reason"].as_str().unwrap()));
    assert!(last["timings"]["predicted_per_second"].is_number());
    let mut text = String::new();
    for c in middle {
        assert_eq!(c["choices"][0]["finish_reason"], Value::Null);
        text.push_str(c["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
    }
    assert!(middle[1..]
        .iter()
        .all(|c| c["choices"][0]["delta"].get("role").is_none()));

    // The same text as the whole reply; the same usage.
    let whole = s
        .post("/v1/chat/completions", &chat("Who made the heaven?", json!({})))
        .json();
    assert_eq!(whole["choices"][0]["message"]["content"], text.as_str());
    assert_eq!(usage["usage"]["completion_tokens"], whole["usage"]["completion_tokens"]);
    assert_eq!(usage["usage"]["prompt_tokens"], whole["usage"]["prompt_tokens"]);

    // Without include_usage there is no usage chunk.
    let r = s.post(
        "/v1/chat/completions",
        &chat("hi", json!({"stream": true, "max_tokens": 3})),
    );
    let chunks = r.chunks();
    let last = &chunks[chunks.len() - 1];
    assert!(last["choices"][0]["finish_reason"].is_string());
    assert!(last.get("usage").is_none());
}

#[test]
fn completion_stream_ends_with_finish_reason_and_done() {
    let s = Server::start(&[]);
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "And it came to pass", "max_tokens": 6, "temperature": 0, "stream": true}),
    );
    let chunks = r.chunks();
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");
    let whole = s.post(
        "/v1/completions",
        &json!({"prompt": "And it came to pass", "max_tokens": 6, "temperature": 0}),
    );
    assert_eq!(whole.json()["choices"][0]["text"], text.as_str());
}

/// Read from a streaming reply until `n` data events have arrived.
fn read_events(conn: &mut std::net::TcpStream, n: usize) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while String::from_utf8_lossy(&seen).matches("data: ").count() < n {
        let got = conn.read(&mut buf).expect("read stream");
        assert!(got > 0, "stream ended early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..got]);
    }
}

fn generated_total(s: &Server) -> u64 {
    let m = s.get("/metrics").body;
    let line = m
        .lines()
        .find(|l| l.starts_with("moeflux_generated_tokens_total "))
        .unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_client_that_goes_away_cancels_its_generation_and_frees_the_slot() {
    let s = Server::start(&["--parallel", "1"]);
    let long = json!({"prompt": "And", "max_tokens": 100000, "temperature": 0, "stream": true});
    let mut conn = s.send("POST", "/v1/completions", &[], &long.to_string());
    read_events(&mut conn, 3);
    drop(conn);
    // The one slot is free again long before 1000 tokens could be made.
    let t = Instant::now();
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "And", "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(t.elapsed() < Duration::from_secs(20));
    let generated = generated_total(&s);
    assert!(generated < 1000, "the abandoned generation ran on: {generated} tokens");

    // A non-streamed request whose client leaves is cancelled too.
    let conn = s.send(
        "POST",
        "/v1/completions",
        &[],
        &json!({"prompt": "And", "max_tokens": 100000, "temperature": 0}).to_string(),
    );
    std::thread::sleep(Duration::from_millis(100));
    conn.shutdown(std::net::Shutdown::Both).unwrap();
    drop(conn);
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "And", "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(r.status, 200);
    assert!(generated_total(&s) < generated + 1000);
}

#[test]
fn sigterm_ends_streams_with_a_finish_reason_and_exits_cleanly() {
    let s = Server::start(&[]);
    let long = json!({"prompt": "And", "max_tokens": 100000, "temperature": 0, "stream": true});
    let mut conn = s.send("POST", "/v1/completions", &[], &long.to_string());
    read_events(&mut conn, 2);
    let (status, log) = s.stop();
    let mut rest = String::new();
    conn.read_to_string(&mut rest).expect("read the end of the stream");
    assert!(rest.contains("\"finish_reason\":\"stop\""), "{rest}");
    assert!(rest.contains("data: [DONE]"), "{rest}");
    assert!(status.success(), "{status:?} {log:?}");
    assert!(!log.iter().any(|l| l.contains("panic")), "{log:?}");
}
