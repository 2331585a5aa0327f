//! Which files of a repo a model needs: the safetensors checkpoint (its
//! config, tokenizer and template files, and the shards its index lists),
//! or one GGUF quantization, picked by name as `llama-server -hf` does.

use crate::{Error, Result};
use std::collections::BTreeMap;

/// The format of a pulled model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Safetensors,
    Gguf,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Safetensors => "safetensors",
            Format::Gguf => "GGUF",
        }
    }
}

/// What to download: `first` before the rest can be chosen (the index of
/// a sharded checkpoint), then `files`.
#[derive(Debug, PartialEq, Eq)]
pub enum Choice {
    /// Small files (config, tokenizer, templates, the index) and, when
    /// there is no index, the weight files.
    Safetensors {
        meta: Vec<String>,
        index: Option<String>,
        weights: Vec<String>,
    },
    Gguf {
        files: Vec<String>,
    },
}

pub const INDEX: &str = "model.safetensors.index.json";

/// Files at the top of a checkpoint that go with the weights.
fn is_meta(path: &str) -> bool {
    !path.contains('/')
        && (path.ends_with(".json")
            || path.ends_with(".jinja")
            || path.ends_with(".tiktoken")
            || matches!(path, "merges.txt" | "tokenizer.model"))
}

/// The choice for `paths` (a repo's files) and the quantization asked for.
pub fn choose(repo: &str, paths: &[&str], selector: Option<&str>) -> Result<Choice> {
    let groups = gguf_groups(paths);
    let safetensors: Vec<&str> = paths
        .iter()
        .copied()
        .filter(|p| !p.contains('/') && p.ends_with(".safetensors"))
        .collect();
    if selector.is_none() && !safetensors.is_empty() {
        let index = paths.contains(&INDEX).then(|| INDEX.to_string());
        let weights = if index.is_some() {
            Vec::new()
        } else if safetensors.contains(&"model.safetensors") {
            vec!["model.safetensors".to_string()]
        } else {
            safetensors.iter().map(|s| s.to_string()).collect()
        };
        let meta = paths.iter().filter(|p| is_meta(p)).map(|p| p.to_string()).collect();
        return Ok(Choice::Safetensors { meta, index, weights });
    }
    if groups.is_empty() {
        let what = if selector.is_some() {
            "GGUF"
        } else {
            "safetensors or GGUF"
        };
        return Err(Error::Invalid(format!("{repo} has no {what} weights")));
    }
    let names = || {
        let labels: Vec<String> = groups
            .values()
            .map(|f| format!("`{}`", f.first().map_or("", |x| label(x))))
            .collect();
        labels.join(", ")
    };
    let key = match selector {
        Some(q) => {
            let q = q.to_ascii_lowercase();
            let mut hits: Vec<&String> = groups.keys().filter(|k| matches(k, &q)).collect();
            hits.sort_by_key(|k| (base(k).len(), k.to_string()));
            let Some(k) = hits.first() else {
                return Err(Error::Invalid(format!(
                    "{repo} has no GGUF file matching `{}`; it has {}",
                    selector.unwrap_or_default(),
                    names()
                )));
            };
            (*k).clone()
        }
        None if groups.len() == 1 => groups.keys().next().cloned().unwrap_or_default(),
        None => match groups.keys().find(|k| matches(k, "q4_k_m")) {
            Some(k) => k.clone(),
            None => {
                return Err(Error::Invalid(format!(
                    "{repo} has several GGUF quantizations: {}; name one as {repo}:QUANT",
                    names()
                )))
            }
        },
    };
    let files = groups.get(&key).cloned().unwrap_or_default();
    check_parts(repo, &files)?;
    Ok(Choice::Gguf { files })
}

/// The shard files an index's `weight_map` names, in order, once each.
pub fn index_shards(text: &str) -> Result<Vec<String>> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| Error::Hub(format!("{INDEX}: invalid JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| Error::Hub(format!("{INDEX}: no `weight_map` object")))?;
    let mut out: Vec<String> = map.values().filter_map(|f| f.as_str()).map(str::to_string).collect();
    out.sort();
    out.dedup();
    if out.iter().any(|f| f.contains('/') || !f.ends_with(".safetensors")) {
        return Err(Error::Hub(format!(
            "{INDEX}: a shard that is not a plain .safetensors name"
        )));
    }
    Ok(out)
}

/// GGUF files by quantization: the lowercase path without `.gguf` and
/// without a split suffix (`-00001-of-00003`) → its files, in order.
/// Projector files (`mmproj`) are left out.
fn gguf_groups(paths: &[&str]) -> BTreeMap<String, Vec<String>> {
    let mut g: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in paths {
        let lower = p.to_ascii_lowercase();
        let Some(stem) = lower.strip_suffix(".gguf") else {
            continue;
        };
        if base(stem).contains("mmproj") {
            continue;
        }
        let key = split_part(stem).map_or(stem, |(s, _, _)| s);
        g.entry(key.to_string()).or_default().push(p.to_string());
    }
    for files in g.values_mut() {
        files.sort();
    }
    g
}

/// `stem-00001-of-00003` → (`stem`, 1, 3).
fn split_part(stem: &str) -> Option<(&str, u32, u32)> {
    let (head, total) = stem.rsplit_once("-of-")?;
    let (s, part) = head.rsplit_once('-')?;
    let digits = |x: &str| x.len() == 5 && x.bytes().all(|b| b.is_ascii_digit());
    if !(digits(part) && digits(total)) {
        return None;
    }
    Some((s, part.parse().ok()?, total.parse().ok()?))
}

/// Every part of a split GGUF is there.
fn check_parts(repo: &str, files: &[String]) -> Result<()> {
    let Some(first) = files.first() else {
        return Ok(());
    };
    let lower = first.to_ascii_lowercase();
    let stem = lower.strip_suffix(".gguf").unwrap_or(&lower);
    if let Some((_, _, total)) = split_part(stem) {
        if files.len() != total as usize {
            return Err(Error::Hub(format!(
                "{repo}: `{first}` is one of {total} parts, but the repo has {} of them",
                files.len()
            )));
        }
    }
    Ok(())
}

/// A GGUF file's name without `.gguf` and without a split suffix.
fn label(path: &str) -> &str {
    let name = base(path);
    let stem = &name[..name.len().saturating_sub(".gguf".len())];
    split_part(stem).map_or(stem, |(s, _, _)| s)
}

/// The file name of a `/`-separated path.
fn base(k: &str) -> &str {
    k.rsplit('/').next().unwrap_or(k)
}

/// Whether quantization key `k` (lowercase) is the one named `q`
/// (lowercase): its name ends in `q` after `-`, `.` or `_`, or it sits
/// in a folder named `q`.
fn matches(k: &str, q: &str) -> bool {
    let name = base(k);
    let ends = name == q || name.strip_suffix(q).is_some_and(|head| head.ends_with(['-', '.', '_']));
    ends || k.split('/').rev().skip(1).any(|d| d == q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selector_picks_one_quantization_whole() {
        let paths = [
            "README.md",
            "Qwen3-30B-A3B-Q4_K_M.gguf",
            "Qwen3-30B-A3B-UD-Q4_K_M.gguf",
            "Qwen3-30B-A3B-Q8_0.gguf",
            "UD-Q4_K_XL/Qwen3-30B-A3B-UD-Q4_K_XL-00002-of-00002.gguf",
            "UD-Q4_K_XL/Qwen3-30B-A3B-UD-Q4_K_XL-00001-of-00002.gguf",
            "mmproj-F16.gguf",
        ];
        let pick = |q: Option<&str>| match choose("r/x", &paths, q).unwrap() {
            Choice::Gguf { files } => files,
            c => panic!("{c:?}"),
        };
        assert_eq!(pick(Some("q4_k_m")), ["Qwen3-30B-A3B-Q4_K_M.gguf"]);
        assert_eq!(pick(Some("UD-Q4_K_M")), ["Qwen3-30B-A3B-UD-Q4_K_M.gguf"]);
        assert_eq!(pick(None), ["Qwen3-30B-A3B-Q4_K_M.gguf"]);
        assert_eq!(
            pick(Some("UD-Q4_K_XL")),
            [
                "UD-Q4_K_XL/Qwen3-30B-A3B-UD-Q4_K_XL-00001-of-00002.gguf",
                "UD-Q4_K_XL/Qwen3-30B-A3B-UD-Q4_K_XL-00002-of-00002.gguf"
            ]
        );
        let e = choose("r/x", &paths, Some("Q4_K")).unwrap_err().to_string();
        assert!(e.contains("no GGUF file matching `Q4_K`") && e.contains("Q8_0"), "{e}");
        let e = choose("r/x", &paths[3..5], Some("UD-Q4_K_XL")).unwrap_err().to_string();
        assert!(e.contains("one of 2 parts"), "{e}");
    }

    #[test]
    fn safetensors_come_with_their_small_files() {
        let paths = [
            "config.json",
            "model.safetensors.index.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "tokenizer.json",
            "chat_template.jinja",
            "README.md",
            "original/consolidated.safetensors",
            "x-Q4_K_M.gguf",
        ];
        let Choice::Safetensors { meta, index, weights } = choose("r/x", &paths, None).unwrap() else {
            panic!()
        };
        assert_eq!(meta, ["config.json", INDEX, "tokenizer.json", "chat_template.jinja"]);
        assert_eq!(index.as_deref(), Some(INDEX));
        assert!(weights.is_empty());
        let shards =
            index_shards(r#"{"weight_map": {"a": "m-2.safetensors", "b": "m-1.safetensors", "c": "m-1.safetensors"}}"#);
        assert_eq!(shards.unwrap(), ["m-1.safetensors", "m-2.safetensors"]);
        assert!(index_shards(r#"{"weight_map": {"a": "../x.safetensors"}}"#).is_err());
    }
}
