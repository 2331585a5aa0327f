//! `org/name[:SELECTOR]`: a Hub repo id and the quantization asked for.

use crate::{Error, Result};

/// A model on the Hub as the user names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoRef {
    /// `org/name`.
    pub repo: String,
    /// A GGUF quantization (`Q4_K_M`, `UD-Q4_K_XL`), matched against file names.
    pub selector: Option<String>,
}

impl RepoRef {
    /// Parse `org/name` or `org/name:SELECTOR`.
    pub fn parse(s: &str) -> Result<RepoRef> {
        let (repo, selector) = match s.split_once(':') {
            Some((r, q)) => (r, Some(q)),
            None => (s, None),
        };
        if !is_repo_id(repo) {
            return Err(Error::Invalid(format!(
                "`{s}` is not a Hub model id: expected ORG/NAME or ORG/NAME:QUANT (letters, digits, `-`, `_`, `.`)"
            )));
        }
        let selector = match selector {
            Some(q) if q.is_empty() || q.contains('/') => {
                return Err(Error::Invalid(format!(
                    "`{s}`: the quantization after `:` is empty or holds `/`"
                )))
            }
            q => q.map(str::to_string),
        };
        Ok(RepoRef {
            repo: repo.to_string(),
            selector,
        })
    }

    /// Whether `s` reads as a repo id rather than a path: `org/name`
    /// (one `/`, neither part empty, `.` or `..`, no leading `~`), with an
    /// optional `:SELECTOR`. The caller checks first that no such path exists.
    pub fn looks_like(s: &str) -> bool {
        RepoRef::parse(s).is_ok()
    }

    /// The directory name `huggingface_hub` gives the repo: `models--org--name`.
    pub fn folder(&self) -> String {
        repo_folder(&self.repo)
    }
}

impl std::fmt::Display for RepoRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.selector {
            Some(q) => write!(f, "{}:{q}", self.repo),
            None => f.write_str(&self.repo),
        }
    }
}

/// `models--org--name` for `org/name`.
pub fn repo_folder(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

fn is_repo_id(s: &str) -> bool {
    let Some((org, name)) = s.split_once('/') else {
        return false;
    };
    let part = |p: &str| {
        !p.is_empty()
            && p != "."
            && p != ".."
            && !p.starts_with(['-', '.', '~'])
            && p.len() <= 96
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    part(org) && part(name)
}

#[cfg(test)]
mod tests {
    use super::RepoRef;

    #[test]
    fn repo_ids_and_selectors() {
        let r = RepoRef::parse("unsloth/Qwen3-30B-A3B-GGUF:UD-Q4_K_XL").unwrap();
        assert_eq!(r.repo, "unsloth/Qwen3-30B-A3B-GGUF");
        assert_eq!(r.selector.as_deref(), Some("UD-Q4_K_XL"));
        assert_eq!(r.folder(), "models--unsloth--Qwen3-30B-A3B-GGUF");
        assert_eq!(r.to_string(), "unsloth/Qwen3-30B-A3B-GGUF:UD-Q4_K_XL");
        for path in ["model", "./a/b", "/abs/x", "a/b/c", "~/m", "../x", "a/", "a/b:"] {
            assert!(!RepoRef::looks_like(path), "{path}");
        }
        assert!(RepoRef::looks_like("Qwen/Qwen3-30B-A3B"));
    }
}
