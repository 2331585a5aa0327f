//! `moeflux pull REPO[:QUANT]`, `moeflux list`, and `--model ORG/NAME` on
//! the commands that open a model: the Hub's files into its cache, a
//! safetensors checkpoint converted into the packed layout.

use clap::Args;
use indicatif::HumanBytes;
use moeflux::format::convert::{convert, ConvertOptions};
use moeflux::format::packed::MANIFEST_FILE;
use moeflux::hub::{self, Event, Format, HubOptions, RepoRef};
use std::io::Write;
use std::path::{Path, PathBuf};

const ABOUT: &str = "\
REPO is a Hugging Face model id, ORG/NAME; after a colon, a GGUF
quantization (Q4_K_M, UD-Q4_K_XL, Q8_0), matched against the repo's file
names as llama-server -hf does. Without one, the safetensors checkpoint is
taken, else the repo's only GGUF quantization (Q4_K_M among several).

Only what the model needs is downloaded (config, tokenizer and template
files, the shards the index lists), into the cache huggingface_hub shares
(HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub): a model
it downloaded is not downloaded again. A broken download is resumed;
every file is checked against the Hub's size and sha256. A safetensors
checkpoint or a GGUF file is then converted into the packed layout
(MOEFLUX_MODELS, else ~/.cache/moeflux/models) and its weights removed
unless --keep-source; a GGUF keeps Q8_0, Q4_0, Q4_1 and float tensors
bit for bit, and other block formats (K-quants) need --bits 4 or 8 to be
requantized.
The last line on stdout is the path to give --model (ORG/NAME works too).

Environment: HF_TOKEN (else the file `huggingface-cli login` writes) for
gated and private models, HF_ENDPOINT for a mirror, HF_HUB_OFFLINE=1 to
use the cache alone.

Examples:
  moeflux pull Qwen/Qwen3-30B-A3B
  moeflux pull unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M
  moeflux run --model Qwen/Qwen3-30B-A3B -p \"Hello\"";

#[derive(Args)]
#[command(after_help = ABOUT)]
pub struct PullArgs {
    /// ORG/NAME or ORG/NAME:QUANT.
    #[arg(required_unless_present = "list", value_name = "REPO")]
    pub repo: Option<String>,
    /// A branch, tag or commit.
    #[arg(long, default_value = "main", value_name = "R")]
    pub revision: String,
    /// Keep the safetensors weights after converting them.
    #[arg(long)]
    pub keep_source: bool,
    /// Bits per weight of the conversion (as `convert --bits`).
    #[arg(long, value_name = "N")]
    pub bits: Option<u32>,
    /// List the models in the cache instead (as `moeflux list`).
    #[arg(long, conflicts_with = "repo")]
    pub list: bool,
}

#[derive(Args)]
pub struct ListArgs {
    /// Delete this model (ORG/NAME) from the cache, with its conversions.
    #[arg(long, value_name = "REPO")]
    pub remove: Option<String>,
}

/// How a pulled checkpoint is made ready.
#[derive(Clone, Copy)]
pub struct Prepare {
    /// Convert a safetensors checkpoint (else a packed conversion is
    /// used when there is one, the checkpoint itself otherwise).
    pub convert: bool,
    pub keep_source: bool,
    pub bits: Option<u32>,
}

pub fn run(a: PullArgs) -> anyhow::Result<()> {
    if a.list {
        return list(ListArgs { remove: None });
    }
    let spec = a.repo.as_deref().unwrap_or_default();
    let prep = Prepare {
        convert: true,
        keep_source: a.keep_source,
        bits: a.bits,
    };
    let cancel = super::interrupt::install_cancel()?;
    let path = fetch(spec, &a.revision, prep, Some(cancel))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", path.display())?;
    Ok(())
}

/// The model a `--model` value names: itself when it is a path that
/// exists or does not read as ORG/NAME, else pulled (saying so) and
/// made ready.
pub fn resolve_model(arg: &Path, prep: Prepare) -> anyhow::Result<PathBuf> {
    let Some(spec) = arg.to_str() else {
        return Ok(arg.to_path_buf());
    };
    if arg.exists() || !RepoRef::looks_like(spec) {
        return Ok(arg.to_path_buf());
    }
    eprintln!("{spec} is not a local path: getting it from the Hugging Face Hub");
    fetch(spec, "main", prep, None)
}

/// Pull `spec` at `revision`; the path to open.
fn fetch(
    spec: &str,
    revision: &str,
    prep: Prepare,
    cancel: Option<&'static std::sync::atomic::AtomicBool>,
) -> anyhow::Result<PathBuf> {
    let model = RepoRef::parse(spec)?;
    let opts = HubOptions::from_env();
    if let Some(sel) = &model.selector {
        // A GGUF quantization converted at this commit needs nothing more.
        if let Some(packed) = hub::commit(&opts, &model.repo, revision)
            .ok()
            .and_then(|c| converted_gguf(&opts, &model.repo, &c, sel))
        {
            eprintln!("{model}: converted already, {}", packed.display());
            return Ok(packed);
        }
    }
    if model.selector.is_none() {
        // A conversion of this commit needs nothing more.
        let commit = hub::commit(&opts, &model.repo, revision);
        if let Ok(c) = &commit {
            let packed = hub::packed_path(&opts, &model.repo, c);
            if packed.join(MANIFEST_FILE).is_file() {
                eprintln!("{model}: converted already, {}", packed.display());
                return Ok(packed);
            }
        }
        commit?;
    }
    let pulled = pull_with_bar(&opts, &model, revision)?;
    if pulled.downloaded > 0 {
        eprintln!(
            "{model}: {} downloaded into {}",
            HumanBytes(pulled.downloaded),
            pulled.snapshot.display()
        );
    }
    match pulled.format {
        Format::Gguf if !prep.convert => Ok(pulled.path),
        Format::Gguf => convert_pulled(&opts, &pulled, prep, cancel),
        Format::Safetensors if !prep.convert => Ok(pulled.path),
        Format::Safetensors => convert_pulled(&opts, &pulled, prep, cancel),
    }
}

/// The one conversion of `repo` at `commit` of a GGUF file whose name
/// holds `selector` (`<commit>-<file stem>`, as `convert_pulled` names it).
fn converted_gguf(opts: &HubOptions, repo: &str, commit: &str, selector: &str) -> Option<PathBuf> {
    let dir = hub::packed_path(opts, repo, commit);
    let prefix = format!("{commit}-");
    let sel = selector.to_ascii_lowercase();
    let found: Vec<PathBuf> = std::fs::read_dir(dir.parent()?)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().to_ascii_lowercase();
            name.starts_with(&prefix) && name.contains(&sel)
        })
        .map(|e| e.path())
        .filter(|p| p.join(MANIFEST_FILE).is_file())
        .collect();
    match found.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// Convert a pulled checkpoint into its packed directory; its weights are
/// removed after unless kept.
fn convert_pulled(
    opts: &HubOptions,
    pulled: &hub::Pulled,
    prep: Prepare,
    cancel: Option<&'static std::sync::atomic::AtomicBool>,
) -> anyhow::Result<PathBuf> {
    let mut dst = hub::packed_path(opts, &pulled.repo, &pulled.commit);
    // A GGUF repo holds several quantizations: each converts apart.
    let gguf = pulled.format == Format::Gguf;
    if gguf {
        let stem = pulled.path.file_stem().map(|s| s.to_string_lossy().into_owned());
        dst.set_file_name(format!("{}-{}", pulled.commit, stem.unwrap_or_default()));
        if dst.join(MANIFEST_FILE).is_file() {
            eprintln!("{}: converted already, {}", pulled.repo, dst.display());
            return Ok(dst);
        }
    }
    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent)?;
    }
    eprintln!("converting {} → {}", pulled.repo, dst.display());
    let copts = ConvertOptions {
        bits: prep.bits.filter(|_| !gguf),
        // GGUF: --bits asks for block formats the packed format cannot
        // hold exactly to be requantized (else they are refused by name).
        requantize: prep.bits.filter(|_| gguf),
        progress: super::convert::progress_bar(),
        cancel,
        ..ConvertOptions::default()
    };
    let src = if gguf { &pulled.path } else { &pulled.snapshot };
    let r = convert(src, &dst, &copts)?;
    copts.progress.finish_and_clear();
    for n in &r.notes {
        eprintln!("note: {n}");
    }
    eprintln!(
        "converted: dense {}, experts {} in {} layer files",
        HumanBytes(r.dense_bytes),
        HumanBytes(r.expert_bytes),
        r.expert_layers
    );
    if !prep.keep_source {
        let freed = hub::remove_weights(opts, &pulled.repo, &pulled.commit, &pulled.weights)?;
        if freed > 0 {
            eprintln!(
                "removed the downloaded weights ({}; --keep-source keeps them)",
                HumanBytes(freed)
            );
        }
    }
    Ok(dst)
}

/// `hub::pull` with one bar for the whole download.
fn pull_with_bar(opts: &HubOptions, model: &RepoRef, revision: &str) -> anyhow::Result<hub::Pulled> {
    let bar = super::convert::progress_bar();
    let quiet = bar.is_hidden();
    let r = hub::pull(opts, model, revision, &mut |e| match e {
        Event::Start { files, total, present } => {
            bar.set_length(total);
            bar.set_position(present);
            if total > present {
                let msg = format!(
                    "{model}: {files} files, {} to download ({} here already)",
                    HumanBytes(total - present),
                    HumanBytes(present)
                );
                if quiet {
                    eprintln!("{msg}");
                } else {
                    bar.println(msg);
                }
            }
        }
        Event::File { name, .. } => bar.set_message(name.to_string()),
        Event::Bytes(n) => bar.inc(n),
        Event::Rewind(n) => bar.set_position(bar.position().saturating_sub(n)),
        Event::Retry { file, error } => {
            let msg = format!("{file}: {error}; resuming");
            if quiet {
                eprintln!("{msg}");
            } else {
                bar.println(msg);
            }
        }
        Event::Done => bar.finish_and_clear(),
    });
    bar.finish_and_clear();
    Ok(r?)
}

/// `moeflux list`: the cache's models, or `--remove` one.
pub fn list(a: ListArgs) -> anyhow::Result<()> {
    let opts = HubOptions::from_env();
    if let Some(repo) = &a.remove {
        let freed = hub::remove(&opts, repo)?;
        eprintln!("removed {repo} ({} freed)", HumanBytes(freed));
        return Ok(());
    }
    let models = hub::list(&opts)?;
    let mut out = std::io::stdout().lock();
    if models.is_empty() {
        eprintln!(
            "no models in {} (get one with `moeflux pull ORG/NAME`)",
            opts.cache_dir.display()
        );
        return Ok(());
    }
    writeln!(out, "{:<48} {:>10} {:<16} converted", "model", "size", "format")?;
    for m in &models {
        let mut formats = Vec::new();
        if m.safetensors {
            formats.push("safetensors");
        }
        if m.gguf {
            formats.push("GGUF");
        }
        if !m.packed.is_empty() {
            formats.push("packed");
        }
        let converted = match m.packed.as_slice() {
            [] if m.safetensors => "no".to_string(),
            [] => "-".to_string(),
            p => format!("yes, {} ({})", HumanBytes(m.packed_bytes), p[p.len() - 1].display()),
        };
        writeln!(
            out,
            "{:<48} {:>10} {:<16} {converted}",
            m.repo,
            HumanBytes(m.bytes + m.packed_bytes).to_string(),
            formats.join("+")
        )?;
    }
    Ok(())
}
