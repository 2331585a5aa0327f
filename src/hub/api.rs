//! The Hub's HTTP routes: `/api/models/{repo}/revision/{rev}` for the
//! commit and the file list (sizes, LFS sha256), `/{repo}/resolve/{commit}/{file}`
//! for a file (redirects followed; `Range` to resume).

use super::options::HubOptions;
use crate::{Error, Result};
use serde::Deserialize;
use std::io::Read;

/// A file of a repo as the Hub describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteFile {
    /// Path in the repo (`config.json`, `UD-Q4_K_XL/x-00001-of-00002.gguf`).
    pub path: String,
    pub size: u64,
    /// The blob's name in the cache: the LFS sha256, else the git blob id.
    pub blob: String,
    /// The content's sha256, for LFS files.
    pub sha256: Option<String>,
}

/// A revision of a repo: its commit and its files.
#[derive(Clone, Debug)]
pub struct RepoInfo {
    pub commit: String,
    pub files: Vec<RemoteFile>,
}

#[derive(Deserialize)]
struct InfoJson {
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Sibling {
    rfilename: String,
    size: Option<u64>,
    blob_id: Option<String>,
    lfs: Option<Lfs>,
}

#[derive(Deserialize)]
struct Lfs {
    sha256: String,
    size: u64,
}

/// A response whose body is being read, and where it starts in the file.
pub struct Download {
    pub reader: Box<dyn Read + Send>,
    /// The byte of the file the body starts at: the offset asked for
    /// (206), or 0 when the server sent the whole file (200).
    pub start: u64,
}

pub struct Client {
    agent: ureq::Agent,
    opts: HubOptions,
}

impl Client {
    pub fn new(opts: &HubOptions) -> Client {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(10)
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
            .proxy(if opts.system_proxy {
                ureq::Proxy::try_from_env()
            } else {
                None
            })
            .user_agent(concat!("moeflux/", env!("CARGO_PKG_VERSION")))
            .timeout_connect(Some(opts.timeout))
            .timeout_recv_response(Some(opts.timeout))
            .timeout_per_read(Some(opts.timeout))
            .build();
        Client {
            agent: config.into(),
            opts: opts.clone(),
        }
    }

    fn get(&self, url: &str, range_from: u64) -> Result<ureq::http::Response<ureq::Body>> {
        let mut req = self.agent.get(url);
        if let Some(t) = &self.opts.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        if range_from > 0 {
            req = req.header("Range", format!("bytes={range_from}-"));
        }
        req.call().map_err(|e| Error::Hub(format!("{url}: {e}")))
    }

    /// The commit `revision` of `repo` names, and its files.
    pub fn info(&self, repo: &str, revision: &str) -> Result<RepoInfo> {
        let url = format!(
            "{}/api/models/{repo}/revision/{}?blobs=true",
            self.opts.endpoint,
            encode(revision, false)
        );
        let mut resp = self.get(&url, 0)?;
        if !resp.status().is_success() {
            return Err(self.status_error(repo, &format!("{repo} at revision {revision}"), &resp));
        }
        let text = resp
            .body_mut()
            .with_config()
            .limit(256 << 20)
            .read_to_string()
            .map_err(|e| Error::Hub(format!("{url}: {e}")))?;
        let info: InfoJson =
            serde_json::from_str(&text).map_err(|e| Error::Hub(format!("{url}: unexpected model info: {e}")))?;
        let commit = info
            .sha
            .filter(|s| is_commit(s))
            .ok_or_else(|| Error::Hub(format!("{url}: the model info names no commit")))?;
        let files = info
            .siblings
            .into_iter()
            .filter(|s| safe_path(&s.rfilename))
            .map(|s| {
                let (size, sha256) = match s.lfs {
                    Some(l) => (l.size, Some(l.sha256.to_ascii_lowercase())),
                    None => (s.size.unwrap_or(0), None),
                };
                let blob = sha256.clone().or(s.blob_id).unwrap_or_default();
                RemoteFile {
                    path: s.rfilename,
                    size,
                    blob,
                    sha256,
                }
            })
            .filter(|f| !f.blob.is_empty())
            .collect();
        Ok(RepoInfo { commit, files })
    }

    /// `file` of `repo` at `commit`, from byte `from` on where the server
    /// can (it may send the whole file instead: see [`Download::start`]).
    pub fn download(&self, repo: &str, commit: &str, file: &str, from: u64) -> Result<Download> {
        let url = format!("{}/{repo}/resolve/{commit}/{}", self.opts.endpoint, encode(file, true));
        let resp = self.get(&url, from)?;
        let start = match resp.status().as_u16() {
            206 => from,
            200 => 0,
            416 => from,
            _ => return Err(self.status_error(repo, &format!("{repo}: {file}"), &resp)),
        };
        if resp.status().as_u16() == 416 {
            // Nothing past `from`: the caller finds the file complete or not.
            return Ok(Download {
                reader: Box::new(std::io::empty()),
                start,
            });
        }
        Ok(Download {
            reader: Box::new(resp.into_body().into_reader()),
            start,
        })
    }

    /// The error for a refused request, by the Hub's `X-Error-Code` and
    /// then by the status.
    fn status_error(&self, repo: &str, what: &str, resp: &ureq::http::Response<ureq::Body>) -> Error {
        let status = resp.status().as_u16();
        let code = resp
            .headers()
            .get("x-error-code")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let denied = || Error::HubDenied {
            repo: repo.to_string(),
            status,
            url: self.opts.repo_url(repo),
        };
        match (code, status) {
            ("GatedRepo", _) => denied(),
            ("RepoNotFound", _) if self.opts.token.is_none() => Error::HubNotFound(format!(
                "{repo} (if it is private, give a token: HF_TOKEN or `huggingface-cli login`)"
            )),
            ("RepoNotFound" | "RevisionNotFound" | "EntryNotFound", _) | (_, 404) => {
                Error::HubNotFound(what.to_string())
            }
            (_, 401 | 403) => denied(),
            _ => Error::Hub(format!("{what}: HTTP {status} from {}", self.opts.endpoint)),
        }
    }
}

/// A 40-hex-digit commit id.
pub fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A repo path that stays inside the snapshot directory.
pub fn safe_path(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && !p.contains('\\')
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Percent-encode `s` for a URL path; `/` kept where `keep_slash`.
fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            b'/' if keep_slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}
