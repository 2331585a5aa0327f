//! `moeflux::hub` against a mock Hub on 127.0.0.1 (`hub/mock.rs`): a whole
//! pull, resumed and corrupted downloads, the Hub's refusals, offline use
//! and a cache `huggingface_hub` wrote. No test reaches the internet.

#[path = "hub/mock.rs"]
mod mock;

use mock::{Faults, MockHub, DEMO, DEMO_COMMIT, GATED, GGUF};
use moeflux::hub::{self, Event, Format, HubOptions, RepoRef};
use std::path::Path;

fn options(hub: &MockHub, root: &Path) -> HubOptions {
    let mut o = HubOptions::new(&hub.url, root);
    o.retries = 0;
    o
}

fn pull(o: &HubOptions, model: &str) -> moeflux::Result<hub::Pulled> {
    hub::pull(o, &RepoRef::parse(model).unwrap(), "main", &mut |_| {})
}

const WEIGHTS: &str = "model.safetensors";

#[test]
fn a_pull_fills_the_huggingface_hub_cache() {
    let hub = MockHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let o = options(&hub, tmp.path());
    let mut started = None;
    let mut bytes = 0;
    let p = hub::pull(&o, &RepoRef::parse(DEMO).unwrap(), "main", &mut |e| match e {
        Event::Start { total, present, .. } => started = Some((total, present)),
        Event::Bytes(n) => bytes += n,
        _ => {}
    })
    .unwrap();
    assert_eq!(p.format, Format::Safetensors);
    assert_eq!(p.commit, DEMO_COMMIT);
    assert_eq!(p.weights, [WEIGHTS]);
    let repo = tmp.path().join("hub/models--test--demo-kjv");
    assert_eq!(p.path, repo.join("snapshots").join(DEMO_COMMIT));
    assert_eq!(std::fs::read_to_string(repo.join("refs/main")).unwrap(), DEMO_COMMIT);
    let (data, _, blob) = hub.file(DEMO, WEIGHTS);
    let link = p.path.join(WEIGHTS);
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        Path::new("../../blobs").join(&blob),
        "a relative link into blobs/, as huggingface_hub makes"
    );
    assert_eq!(std::fs::read(&link).unwrap(), data);
    assert!(p.path.join("tokenizer.json").is_file() && p.path.join("chat_template.jinja").is_file());
    assert!(!p.path.join("README.md").exists(), "only what the model needs");
    let (total, present) = started.unwrap();
    assert_eq!((bytes, present), (total, 0));
    assert_eq!(p.downloaded, total);
    // Again: nothing is downloaded.
    hub.clear_counts();
    let again = pull(&o, DEMO).unwrap();
    assert_eq!((again.downloaded, hub.served(WEIGHTS)), (0, 0));
}

#[test]
fn a_broken_download_resumes_where_it_stopped() {
    let hub = MockHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let o = options(&hub, tmp.path());
    let (data, _, blob) = hub.file(DEMO, WEIGHTS);
    let half = data.len() as u64 / 2;
    hub.set_faults(Faults {
        cut: Some((WEIGHTS.into(), half)),
        ..Faults::default()
    });
    let e = pull(&o, DEMO).unwrap_err().to_string();
    assert!(e.contains(WEIGHTS), "{e}");
    let blobs = tmp.path().join("hub/models--test--demo-kjv/blobs");
    assert!(!blobs.join(&blob).exists(), "no half file under the final name");
    let part = std::fs::metadata(blobs.join(format!("{blob}.incomplete")))
        .unwrap()
        .len();
    assert_eq!(part, half);
    let p = pull(&o, DEMO).unwrap();
    assert_eq!(std::fs::read(p.path.join(WEIGHTS)).unwrap(), data);
    // Every byte once: the second request asked for the rest only.
    assert_eq!(hub.served(WEIGHTS), data.len() as u64);
    assert_eq!(p.downloaded, data.len() as u64 - half);
    assert!(!blobs.join(format!("{blob}.incomplete")).exists());
}

#[test]
fn a_broken_connection_is_resumed_within_one_pull() {
    let hub = MockHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let mut o = options(&hub, tmp.path());
    o.retries = 2;
    let (data, _, _) = hub.file(DEMO, WEIGHTS);
    hub.set_faults(Faults {
        cut: Some((WEIGHTS.into(), 1_000_000)),
        ..Faults::default()
    });
    let mut retries = 0;
    let p = hub::pull(&o, &RepoRef::parse(DEMO).unwrap(), "main", &mut |e| {
        if let Event::Retry { .. } = e {
            retries += 1
        }
    })
    .unwrap();
    assert_eq!(retries, 1);
    assert_eq!(std::fs::read(p.path.join(WEIGHTS)).unwrap(), data);
    assert_eq!(hub.served(WEIGHTS), data.len() as u64);
}

#[test]
fn a_corrupted_byte_is_caught_by_the_sha256() {
    let hub = MockHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let o = options(&hub, tmp.path());
    hub.set_faults(Faults {
        corrupt: Some(WEIGHTS.into()),
        ..Faults::default()
    });
    let e = pull(&o, DEMO).unwrap_err().to_string();
    assert!(e.contains("sha256") && e.contains("corrupted"), "{e}");
    let (data, _, blob) = hub.file(DEMO, WEIGHTS);
    let blobs = tmp.path().join("hub/models--test--demo-kjv/blobs");
    assert!(!blobs.join(&blob).exists() && !blobs.join(format!("{blob}.incomplete")).exists());
    let p = pull(&o, DEMO).unwrap();
    assert_eq!(std::fs::read(p.path.join(WEIGHTS)).unwrap(), data);
}

#[test]
fn refusals_say_what_to_do() {
    let hub = MockHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let o = options(&hub, tmp.path());
    let e = pull(&o, GATED).unwrap_err().to_string();
    assert!(e.contains("access denied (HTTP 403)"), "{e}");
    assert!(
        e.contains(&format!("{}/{GATED}", hub.url)) && e.contains("HF_TOKEN"),
        "{e}"
    );
    let e = pull(&o, "test/nothing-here").unwrap_err().to_string();
    assert!(
        e.contains("test/nothing-here") && e.contains("not found on the Hub"),
        "{e}"
    );
    let e = hub::pull(&o, &RepoRef::parse(DEMO).unwrap(), "v9", &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("revision v9: not found on the Hub"), "{e}");
    let e = pull(&o, &format!("{GGUF}:Q2_K")).unwrap_err().to_string();
    assert!(
        e.contains("no GGUF file matching `Q2_K`") && e.contains("tiny-Q8_0"),
        "{e}"
    );
}

#[test]
fn offline_uses_the_cache_or_says_it_cannot() {
    let hub = MockHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let mut o = options(&hub, tmp.path());
    o.offline = true;
    let e = pull(&o, DEMO).unwrap_err().to_string();
    assert!(e.contains("HF_HUB_OFFLINE") && e.contains("not in the cache"), "{e}");
    assert!(hub.requests().is_empty());
    o.offline = false;
    let online = pull(&o, DEMO).unwrap();
    hub.clear_counts();
    o.offline = true;
    let p = pull(&o, DEMO).unwrap();
    assert_eq!((p.path, p.commit), (online.path, online.commit));
    assert!(hub.requests().is_empty(), "{:?}", hub.requests());
}

#[test]
fn a_gguf_quantization_is_chosen_by_name() {
    let hub = MockHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let o = options(&hub, tmp.path());
    let p = pull(&o, &format!("{GGUF}:q8_0")).unwrap();
    assert_eq!(p.format, Format::Gguf);
    assert!(p.path.ends_with("tiny-Q8_0.gguf"), "{}", p.path.display());
    assert_eq!(hub.served("tiny-Q4_K_M.gguf"), 0);
    // Without a selector, several quantizations: Q4_K_M, as llama.cpp.
    let p = pull(&o, GGUF).unwrap();
    assert!(p.path.ends_with("tiny-Q4_K_M.gguf"));
    let listed = hub::list(&o).unwrap();
    let g = listed.iter().find(|m| m.repo == GGUF).unwrap();
    let want = 300_000 + hub.file_len(GGUF, "tiny-Q8_0.gguf");
    assert!(g.gguf && !g.safetensors && g.bytes == want, "{g:?}");
    assert!(hub::remove(&o, GGUF).unwrap() >= want);
    assert!(hub::list(&o).unwrap().iter().all(|m| m.repo != GGUF));
}

/// A cache as `huggingface_hub` writes it: blobs by sha, relative links,
/// `refs/main`.
#[test]
fn a_cache_written_by_python_is_reused() {
    let hub = MockHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let o = options(&hub, tmp.path());
    let repo = tmp.path().join("hub/models--test--demo-kjv");
    let snap = repo.join("snapshots").join(DEMO_COMMIT);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), DEMO_COMMIT).unwrap();
    for f in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        WEIGHTS,
    ] {
        let (data, _, blob) = hub.file(DEMO, f);
        std::fs::write(repo.join("blobs").join(&blob), data).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{blob}"), snap.join(f)).unwrap();
    }
    let p = pull(&o, DEMO).unwrap();
    assert_eq!(p.downloaded, 0);
    assert!(
        hub.requests().iter().all(|r| r.starts_with("/api/")),
        "{:?}",
        hub.requests()
    );
}
