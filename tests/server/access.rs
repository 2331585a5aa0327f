//! Who may use the server: API keys (never empty, from a file, the scheme
//! in any case), web pages of other origins (refused unless allowed by
//! --cors-origin), and a warning for an open address without a key
//! (issue 49, items 4 and 8).

use super::client::{demo_model, Server};
use super::common;
use serde_json::json;
use std::process::Stdio;

#[test]
fn an_empty_api_key_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("key");
    std::fs::write(&empty, "\n").unwrap();
    let model = demo_model();
    let cases: [(&[&str], Option<&str>); 3] = [
        (&["--api-key", ""], None),
        (&[], Some("")),
        (&["--api-key-file", empty.to_str().unwrap()], None),
    ];
    for (flags, env) in cases {
        let mut cmd = common::moeflux();
        cmd.args(["serve", "--host", "127.0.0.1", "--port", "0", "--model"])
            .arg(&model)
            .args(flags)
            .env_remove("MOEFLUX_API_KEY")
            .stdout(Stdio::null());
        if let Some(v) = env {
            cmd.env("MOEFLUX_API_KEY", v);
        }
        let out = cmd.output().expect("run moeflux serve");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} {env:?}: {err}");
        assert!(err.contains("empty"), "{flags:?} {env:?}: {err}");
        assert!(!err.contains("listening"), "{err}");
    }
}

#[test]
fn a_key_file_and_the_bearer_scheme_in_any_case() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("key");
    std::fs::write(&file, "sesame\n").unwrap();
    let s = Server::start(&["--api-key-file", file.to_str().unwrap()]);
    for (auth, status) in [
        ("Bearer sesame", 200),
        ("bearer sesame", 200),
        ("BEARER sesame", 200),
        ("Bearer sesam", 401),
        ("Bearer sesame2", 401),
        ("Basic sesame", 401),
    ] {
        let r = s.request("GET", "/v1/models", &[("Authorization", auth)], "");
        assert_eq!(r.status, status, "{auth}: {}", r.body);
    }
}

#[test]
fn other_origins_are_refused_unless_allowed() {
    let s = Server::start(&[]);
    let own = format!("http://{}", s.addr);
    let body = json!({"prompt": "And", "max_tokens": 1}).to_string();
    // The chat page's own origin works, with no CORS header.
    let r = s.request("POST", "/v1/completions", &[("Origin", &own)], &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("access-control-allow-origin"), None);
    // Another site's page is refused, and told nothing a browser lets it read.
    let evil = [("Origin", "https://evil.example")];
    let r = s.request("POST", "/v1/completions", &evil, &body);
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "origin_not_allowed");
    assert_eq!(r.header("access-control-allow-origin"), None);
    let r = s.request("GET", "/v1/models", &evil, "");
    assert_eq!(r.status, 403);

    // --cors-origin lets one in, preflight included.
    let s = Server::start(&["--cors-origin", "https://app.example"]);
    let app = [("Origin", "https://app.example")];
    let r = s.request("POST", "/v1/completions", &app, &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("access-control-allow-origin"), Some("https://app.example"));
    let preflight = [
        ("Origin", "https://app.example"),
        ("Access-Control-Request-Method", "POST"),
        ("Access-Control-Request-Headers", "content-type"),
    ];
    let r = s.request("OPTIONS", "/v1/completions", &preflight, "");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("access-control-allow-origin"), Some("https://app.example"));
    let r = s.request("POST", "/v1/completions", &evil, &body);
    assert_eq!(r.status, 403);
}

#[test]
fn an_open_address_without_a_key_is_warned_about() {
    let s = Server::start_on(&demo_model(), &["--host", "0.0.0.0"], &[]);
    assert!(s.early.contains("warning: serving on 0.0.0.0:"), "{}", s.early);
    let (status, _) = s.stop();
    assert!(status.success());
    let s = Server::start(&[]);
    assert!(!s.early.contains("warning"), "{}", s.early);
}
