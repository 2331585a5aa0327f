//! A stand-in for the Hugging Face Hub on 127.0.0.1: the model-info route
//! (`/api/models/{repo}/revision/{rev}`, with LFS metadata), the resolve
//! route (LFS files redirected to `/cdn/{sha256}`, others served there),
//! `Range` requests, and faults on demand: a connection closed part-way,
//! a flipped byte, a gated repo. It counts the body bytes it sends per file.
#![allow(dead_code)]

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

pub const DEMO: &str = "test/demo-kjv";
pub const GGUF: &str = "test/tiny-GGUF";
pub const GATED: &str = "test/gated";
pub const DEMO_COMMIT: &str = "1111111111111111111111111111111111111111";
pub const GGUF_COMMIT: &str = "2222222222222222222222222222222222222222";

pub struct File {
    pub path: String,
    pub data: Vec<u8>,
    pub lfs: bool,
}

impl File {
    pub fn sha256(&self) -> String {
        hex(&Sha256::digest(&self.data))
    }
    /// The name of its blob: the sha256 (LFS) or a made-up git id.
    pub fn blob(&self) -> String {
        if self.lfs {
            self.sha256()
        } else {
            self.sha256()[..40].to_string()
        }
    }
}

pub struct Repo {
    pub id: String,
    pub commit: String,
    pub files: Vec<File>,
    pub gated: bool,
}

#[derive(Default)]
pub struct Faults {
    /// Close the connection after this many body bytes of this file, once.
    pub cut: Option<(String, u64)>,
    /// Flip a byte in the middle of this file, once.
    pub corrupt: Option<String>,
}

#[derive(Default)]
struct State {
    repos: Vec<Repo>,
    faults: Faults,
    /// Body bytes sent per file path.
    served: HashMap<String, u64>,
    requests: Vec<String>,
}

pub struct MockHub {
    pub url: String,
    state: Arc<Mutex<State>>,
}

impl MockHub {
    /// The demo model (`tests/fixtures/demo_kjv`, a safetensors checkpoint),
    /// a repo of two tiny GGUF quantizations, and a gated repo.
    pub fn start() -> MockHub {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/demo_kjv");
        let mut demo = Vec::new();
        for name in [
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
            "model.safetensors",
        ] {
            demo.push(File {
                path: name.into(),
                data: std::fs::read(dir.join(name)).unwrap(),
                lfs: name.ends_with(".safetensors"),
            });
        }
        demo.push(File {
            path: "README.md".into(),
            data: b"# demo\n".to_vec(),
            lfs: false,
        });
        // Q8_0 is a real model (tests/fixtures/gguf_models): pull converts it.
        let real_gguf = || File {
            path: "tiny-Q8_0.gguf".into(),
            data: std::fs::read(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf_models/qwen3_moe_q8_0/model.gguf"),
            )
            .unwrap(),
            lfs: true,
        };
        let gguf = |q: &str, n: usize| File {
            path: format!("tiny-{q}.gguf"),
            data: (0..n).map(|i| (i * 31 % 251) as u8).collect(),
            lfs: true,
        };
        let repos = vec![
            Repo {
                id: DEMO.into(),
                commit: DEMO_COMMIT.into(),
                files: demo,
                gated: false,
            },
            Repo {
                id: GGUF.into(),
                commit: GGUF_COMMIT.into(),
                files: vec![gguf("Q4_K_M", 300_000), real_gguf()],
                gated: false,
            },
            Repo {
                id: GATED.into(),
                commit: "3".repeat(40),
                files: Vec::new(),
                gated: true,
            },
        ];
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State {
            repos,
            ..State::default()
        }));
        let s = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let s = s.clone();
                std::thread::spawn(move || serve(conn, &s));
            }
        });
        MockHub { url, state }
    }

    pub fn set_faults(&self, f: Faults) {
        self.state.lock().unwrap().faults = f;
    }
    /// Body bytes sent of `path` so far.
    /// Bytes of file `path` of repo `id`.
    pub fn file_len(&self, id: &str, path: &str) -> u64 {
        let s = self.state.lock().unwrap();
        let repo = s.repos.iter().find(|r| r.id == id).unwrap();
        repo.files.iter().find(|f| f.path == path).unwrap().data.len() as u64
    }
    pub fn served(&self, path: &str) -> u64 {
        self.state.lock().unwrap().served.get(path).copied().unwrap_or(0)
    }
    pub fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().requests.clone()
    }
    pub fn clear_counts(&self) {
        let mut s = self.state.lock().unwrap();
        s.served.clear();
        s.requests.clear();
    }
    /// A copy of file `path` of `repo`: (data, sha256, blob).
    pub fn file(&self, repo: &str, path: &str) -> (Vec<u8>, String, String) {
        let s = self.state.lock().unwrap();
        let f = s
            .repos
            .iter()
            .find(|r| r.id == repo)
            .and_then(|r| r.files.iter().find(|f| f.path == path))
            .unwrap();
        (f.data.clone(), f.sha256(), f.blob())
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn respond(w: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) {
    let mut h = format!(
        "HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        h += &format!("{k}: {v}\r\n");
    }
    h += "\r\n";
    let _ = w.write_all(h.as_bytes());
    let _ = w.write_all(body);
}

fn serve(mut conn: TcpStream, state: &Mutex<State>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let target = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut range_from = 0u64;
    let mut auth = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or((&h, ""));
        let v = v.trim();
        match k.to_ascii_lowercase().as_str() {
            "range" => {
                range_from = v
                    .strip_prefix("bytes=")
                    .and_then(|r| r.strip_suffix('-'))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0)
            }
            "authorization" => auth = Some(v.to_string()),
            _ => {}
        }
    }
    let _ = auth;
    let mut s = state.lock().unwrap();
    s.requests.push(target.clone());
    let path = target.split('?').next().unwrap_or("").to_string();
    let not_found = |w: &mut TcpStream, code: &str| {
        respond(
            w,
            if code == "RepoNotFound" {
                "401 Unauthorized"
            } else {
                "404 Not Found"
            },
            &[("X-Error-Code", code.into())],
            b"{\"error\":\"not found\"}",
        )
    };
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let Some((repo, rev)) = rest.split_once("/revision/") else {
            return not_found(&mut conn, "RepoNotFound");
        };
        let Some(r) = s.repos.iter().find(|r| r.id == repo) else {
            return not_found(&mut conn, "RepoNotFound");
        };
        if r.gated {
            return respond(
                &mut conn,
                "403 Forbidden",
                &[("X-Error-Code", "GatedRepo".into())],
                b"{}",
            );
        }
        if rev != "main" && rev != r.commit {
            return not_found(&mut conn, "RevisionNotFound");
        }
        let siblings: Vec<_> = r
            .files
            .iter()
            .map(|f| {
                let mut j = serde_json::json!({"rfilename": f.path, "size": f.data.len(), "blobId": f.blob()[..40]});
                if f.lfs {
                    j["lfs"] = serde_json::json!({"sha256": f.sha256(), "size": f.data.len(), "pointerSize": 134});
                }
                j
            })
            .collect();
        let body = serde_json::json!({"id": r.id, "sha": r.commit, "siblings": siblings}).to_string();
        return respond(&mut conn, "200 OK", &[], body.as_bytes());
    }
    if let Some(sha) = path.strip_prefix("/cdn/") {
        let found = s
            .repos
            .iter()
            .flat_map(|r| &r.files)
            .find(|f| f.blob() == sha)
            .map(|f| (f.path.clone(), f.data.clone()));
        let Some((file, mut data)) = found else {
            return not_found(&mut conn, "EntryNotFound");
        };
        if s.faults.corrupt.as_deref() == Some(file.as_str()) {
            s.faults.corrupt = None;
            let mid = data.len() / 2;
            data[mid] ^= 0x40;
        }
        let from = (range_from as usize).min(data.len());
        let cut = match &s.faults.cut {
            Some((f, n)) if *f == file => Some(*n as usize),
            _ => None,
        };
        if cut.is_some() {
            s.faults.cut = None;
        }
        let body = &data[from..];
        let send = cut.map_or(body.len(), |c| c.saturating_sub(from).min(body.len()));
        *s.served.entry(file).or_default() += send as u64;
        drop(s);
        let (status, mut headers) = if from > 0 {
            (
                "206 Partial Content",
                vec![(
                    "Content-Range",
                    format!("bytes {from}-{}/{}", data.len() - 1, data.len()),
                )],
            )
        } else {
            ("200 OK", Vec::new())
        };
        headers.push(("Content-Length", body.len().to_string()));
        let mut h = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
        for (k, v) in headers {
            h += &format!("{k}: {v}\r\n");
        }
        h += "\r\n";
        let _ = conn.write_all(h.as_bytes());
        for chunk in body[..send].chunks(64 << 10) {
            if conn.write_all(chunk).is_err() {
                return;
            }
        }
        let _ = conn.flush();
        let _ = conn.shutdown(std::net::Shutdown::Both);
        return;
    }
    // /{org}/{name}/resolve/{rev}/{file}
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    if let [org, name, "resolve", rev, file] = parts[..] {
        let repo = format!("{org}/{name}");
        let Some(r) = s.repos.iter().find(|r| r.id == repo) else {
            return not_found(&mut conn, "RepoNotFound");
        };
        if rev != r.commit && rev != "main" {
            return not_found(&mut conn, "RevisionNotFound");
        }
        let Some(f) = r.files.iter().find(|f| f.path == file) else {
            return not_found(&mut conn, "EntryNotFound");
        };
        let to = format!("/cdn/{}", f.blob());
        return respond(&mut conn, "302 Found", &[("Location", to)], b"");
    }
    not_found(&mut conn, "EntryNotFound")
}
