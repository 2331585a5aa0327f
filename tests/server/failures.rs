//! Failures get the right class of error before anything is streamed: a
//! schema that cannot be followed is the client's (400), a model that
//! cannot read its files the server's (500); every request leaves one log
//! line (issue 49, items 6, 7 and 9).

use super::client::{chat, demo_model, Server};
use serde_json::json;

#[test]
fn a_self_referential_schema_is_a_400_naming_response_format_before_any_token() {
    let s = Server::start(&[]);
    let format = json!({"type": "json_schema", "json_schema": {"name": "loop", "schema": {"$ref": "#"}}});
    for stream in [false, true] {
        let body = chat("hi", json!({"response_format": format, "stream": stream}));
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "stream {stream}: {}", r.body);
        let e = r.json()["error"].clone();
        assert_eq!(e["param"], "response_format", "{e}");
        assert!(e["message"].as_str().unwrap().len() < 600, "{e}");
    }
    assert_eq!(s.get("/health").status, 200);
}

#[test]
fn a_model_that_cannot_read_its_experts_is_a_500() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    copy_dir(&demo_model(), &model);
    let s = Server::start_on(&model, &["--host", "127.0.0.1"], &["--device", "cpu", "--io", "pread"]);
    // The expert files shrink under the running server.
    for e in std::fs::read_dir(model.join("packed_experts")).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("layer_") {
            let f = std::fs::OpenOptions::new().write(true).open(e.path()).unwrap();
            f.set_len(0).unwrap();
        }
    }
    for stream in [false, true] {
        let body = json!({"prompt": "And", "max_tokens": 2, "stream": stream});
        let r = s.post("/v1/completions", &body);
        let e = match stream {
            false => {
                assert_eq!(r.status, 500, "{}", r.body);
                r.json()["error"].clone()
            }
            true => {
                let events = r.events();
                let last: serde_json::Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
                last["error"].clone()
            }
        };
        assert_eq!(e["type"], "server_error", "{e}");
    }
}

/// Regression: a model file truncated under the server (default mmap
/// reads on the CPU) ended it with SIGBUS, no log line. Now each request
/// is a 500 naming the file, and the server stays up.
#[test]
fn model_files_truncated_under_the_server_are_an_error_naming_them() {
    for (file, io) in [("model_weights.bin", "mmap"), ("packed_experts/layer_01.bin", "mmap")] {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model");
        copy_dir(&demo_model(), &model);
        let s = Server::start_on(&model, &["--host", "127.0.0.1"], &["--device", "cpu", "--io", io]);
        let body = json!({"prompt": "And", "max_tokens": 2});
        assert_eq!(s.post("/v1/completions", &body).status, 200);
        let path = model.join(file);
        assert!(path.is_file(), "{}", path.display());
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        for _ in 0..2 {
            let r = s.post("/v1/completions", &body);
            assert_eq!(r.status, 500, "{file}: {}", r.body);
            let msg = r.json()["error"]["message"].as_str().unwrap_or_default().to_string();
            assert!(msg.contains(file) && msg.contains("changed"), "{msg}");
            assert_eq!(s.get("/health").status, 200);
        }
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let dst = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}

#[test]
fn every_request_writes_one_log_line_and_its_text_only_when_asked() {
    let s = Server::start(&[]);
    let r = s.post(
        "/v1/chat/completions",
        &chat("Who made the heaven?", json!({"max_tokens": 3})),
    );
    assert_eq!(r.status, 200);
    s.get("/nothing");
    let (_, log) = s.stop();
    let line = log
        .iter()
        .find(|l| l.contains("route=\"/v1/chat/completions\""))
        .unwrap_or_else(|| panic!("{log:?}"));
    for field in ["method=POST", "status=200", "tokens_out=3", "slot=0", "ms="] {
        assert!(line.contains(field), "{field}: {line}");
    }
    assert!(line.contains("tokens_in="), "{line}");
    assert!(!line.contains("heaven"), "{line}");
    assert!(
        log.iter()
            .any(|l| l.contains("route=\"/nothing\"") && l.contains("status=404")),
        "{log:?}"
    );

    let s = Server::start(&["--log-text"]);
    s.post(
        "/v1/chat/completions",
        &chat("Who made the heaven?", json!({"max_tokens": 3})),
    );
    let (_, log) = s.stop();
    assert!(
        log.iter().any(|l| l.contains("prompt=") && l.contains("heaven")),
        "{log:?}"
    );
}
