//! A running `moeflux serve` and a minimal HTTP/1.1 client for it.

use super::common;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

/// The demo model, converted once per test run (`common::packed_with`).
pub fn demo_model() -> PathBuf {
    common::packed_with("demo_kjv", &[])
}

/// A server process, stopped (SIGTERM) when dropped.
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    /// stderr before the ready line.
    pub early: String,
    /// stderr after the ready line, read on a thread.
    log: std::sync::Mutex<std::sync::mpsc::Receiver<String>>,
}

impl Server {
    /// Start `moeflux serve` on the demo model with extra flags; returns
    /// once it says it is listening.
    pub fn start(flags: &[&str]) -> Server {
        Server::start_on(&demo_model(), &["--host", "127.0.0.1"], flags)
    }

    /// Start `moeflux serve` on `model`, listening as `host` says (port 0).
    pub fn start_on(model: &std::path::Path, host: &[&str], flags: &[&str]) -> Server {
        let mut child = common::moeflux()
            .arg("serve")
            .args(host)
            .args(["--port", "0", "--alias", "demo", "--model"])
            .arg(model)
            .args(flags)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start moeflux serve");
        let mut err = BufReader::new(child.stderr.take().expect("stderr"));
        let mut seen = String::new();
        let addr = loop {
            let mut line = String::new();
            if err.read_line(&mut line).expect("read stderr") == 0 {
                panic!("moeflux serve exited before it was ready:\n{seen}");
            }
            seen.push_str(&line);
            if let Some(rest) = line.strip_prefix("listening on http://") {
                let addr = rest.split_whitespace().next().expect("address");
                break addr.parse().expect("socket address");
            }
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in err.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Server {
            child,
            addr,
            early: seen,
            log: std::sync::Mutex::new(rx),
        }
    }

    /// Send raw bytes on a new connection and read the reply to its end.
    pub fn raw(&self, bytes: &[u8]) -> Reply {
        let mut s = TcpStream::connect(self.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
        s.write_all(bytes).expect("send request");
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).expect("read reply");
        Reply::parse(&raw)
    }

    /// Send `sig` to the server.
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
    }

    /// The exit status, if the server ends within `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let t = std::time::Instant::now();
        while t.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn get(&self, path: &str) -> Reply {
        self.request("GET", path, &[], "")
    }

    pub fn post(&self, path: &str, body: &Value) -> Reply {
        self.request("POST", path, &[], &body.to_string())
    }

    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        let mut s = self.send(method, path, headers, body);
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).expect("read reply");
        Reply::parse(&raw)
    }

    /// Send a request and return the connection, the reply unread.
    pub fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> TcpStream {
        let mut s = TcpStream::connect(self.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(body);
        s.write_all(req.as_bytes()).expect("send request");
        s
    }

    /// Send SIGTERM and wait for the exit status; the rest of stderr.
    pub fn stop(mut self) -> (std::process::ExitStatus, Vec<String>) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let status = self.child.wait().expect("wait for the server");
        let log = self.log.lock().expect("log").try_iter().collect();
        (status, log)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A reply read to its end.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    fn parse(raw: &[u8]) -> Reply {
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("end of headers");
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let mut lines = head.lines();
        let status = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|c| c.parse().ok())
            .expect("status line");
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let mut body = raw[split + 4..].to_vec();
        if headers.iter().any(|(k, v)| k == "transfer-encoding" && v == "chunked") {
            body = dechunk(&body);
        }
        Reply {
            status,
            headers,
            body: String::from_utf8(body).expect("UTF-8 body"),
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn events(&self) -> Vec<String> {
        self.body
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }

    /// The JSON chunks of an SSE body that ends with `data: [DONE]`
    /// (asserted), in order.
    pub fn chunks(&self) -> Vec<Value> {
        let events = self.events();
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{}", self.body);
        events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("chunk not JSON ({err}): {e}")))
            .collect()
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(std::str::from_utf8(&b[..eol]).expect("chunk size").trim(), 16)
            .expect("hex chunk size");
        if size == 0 {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
    out
}

/// A one-message chat request.
pub fn chat(user: &str, extra: Value) -> Value {
    let mut v = serde_json::json!({
        "model": "demo",
        "messages": [{"role": "user", "content": user}],
        "temperature": 0,
        "max_tokens": 12,
    });
    if let (Some(m), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        for (k, x) in e {
            m.insert(k.clone(), x.clone());
        }
    }
    v
}
