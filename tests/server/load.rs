//! Many clients at once, and a full queue.

use super::client::{chat, Server};
use serde_json::json;
use std::io::Read;

#[test]
fn sixteen_concurrent_clients_all_get_their_answer() {
    let s = Server::start(&["--parallel", "4"]);
    let replies: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let s = &s;
                scope.spawn(move || {
                    let body = chat(&format!("Verse {i}"), json!({"max_tokens": 6, "stream": i % 2 == 0}));
                    s.post("/v1/chat/completions", &body)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &replies {
        assert_eq!(r.status, 200, "{}", r.body);
    }
    // Greedy answers to the same prompt agree whichever slot ran them.
    let a = s
        .post("/v1/chat/completions", &chat("Verse 1", json!({"max_tokens": 6})))
        .json();
    assert_eq!(
        a["choices"][0]["message"]["content"],
        replies[1].json()["choices"][0]["message"]["content"]
    );
    let m = s.get("/metrics").body;
    assert!(m.contains("moeflux_requests_total 17"), "{m}");
}

#[test]
fn a_full_queue_is_503() {
    let s = Server::start(&["--parallel", "1", "--queue", "1", "--keep-alive", "0.1"]);
    let long = json!({"prompt": "And", "max_tokens": 100000, "temperature": 0, "stream": true}).to_string();
    // One runs, one waits ...
    let mut running = s.send("POST", "/v1/completions", &[], &long);
    let mut buf = [0u8; 256];
    assert!(running.read(&mut buf).unwrap() > 0);
    let mut waiting = s.send("POST", "/v1/completions", &[], &long);
    // A stream with nothing to say yet sends SSE comments.
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains(": keep-alive") {
        let n = waiting.read(&mut buf).unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    // ... and the next is turned away.
    let r = s.post("/v1/completions", &json!({"prompt": "And", "max_tokens": 2}));
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "service_unavailable");
    drop(running);
    drop(waiting);
}
