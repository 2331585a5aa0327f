//! `moeflux convert`: a Hugging Face or MLX checkpoint → the packed model
//! directory of SPEC.md §2.
//!
//! 1. [`source`] opens the checkpoint (config, shards, quantization block).
//! 2. [`plan`] (with [`layers`]) resolves every packed tensor to its source
//!    tensors and checks names, shapes and dtypes — before anything is
//!    written.
//! 3. [`dense`] and [`experts`] stream the tensors from the mapped shards
//!    into `DST.tmp-<pid>` ([`TempDir`]), encoding in parallel with
//!    bounded memory.
//! 4. [`verify`] re-reads the result with the engine's readers and
//!    compares it with the source; only then is the temp dir renamed to
//!    `DST`. On any error, or when the cancel flag is set, the temp dir is
//!    removed.

mod dense;
mod experts;
mod fp8;
mod gguf;
mod gguf_source;
mod layers;
mod matrix;
pub(crate) mod names;
mod plan;
pub mod source;
mod verify;

pub use source::Source;

use crate::error::{Error, Result};
use crate::format::outdir::{self, check_cancel, TempDir};
use crate::format::packed::{Layout, Manifest, EXPERTS_DIR, LAYOUT_FILE, MANIFEST_FILE, WEIGHTS_FILE};
use indicatif::ProgressBar;
use plan::{Item, Settings};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

/// Files copied unchanged from the source directory when present.
pub const COPIED_FILES: [&str; 10] = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
];

/// What `moeflux convert` was asked for.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    /// 2, 4, 8, or 16 (keep floats); `None`: the default, 4. Ignored for
    /// MLX-quantized sources, which are repacked as they are.
    pub bits: Option<u32>,
    pub group_size: usize,
    /// Bits of the routed experts only (default: `bits`).
    pub bits_experts: Option<u32>,
    /// GGUF sources: requantize the tensors whose block format the packed
    /// format cannot hold exactly to this many bits (4 or 8); `None`
    /// refuses them by name.
    pub requantize: Option<u32>,
    /// Replace an existing destination (a packed model directory only).
    pub force: bool,
    /// Advanced over the source bytes as they are converted (its length is
    /// set here); the caller chooses where, or whether, it is drawn.
    /// Hidden by default.
    pub progress: ProgressBar,
    /// Checked while writing: once set, the conversion stops with
    /// [`Error::Cancelled`] and removes what it wrote (e.g. set by Ctrl-C).
    pub cancel: Option<&'static AtomicBool>,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            bits: None,
            group_size: 64,
            bits_experts: None,
            requantize: None,
            force: false,
            progress: ProgressBar::hidden(),
            cancel: None,
        }
    }
}

/// What a conversion did.
#[derive(Debug, Clone)]
pub struct ConvertReport {
    /// Tensors in `model_weights.bin`.
    pub tensors: usize,
    pub dense_bytes: u64,
    pub expert_bytes: u64,
    pub expert_layers: usize,
    /// Experts re-read and checked against the source.
    pub verified_experts: usize,
    pub notes: Vec<String>,
    pub elapsed: Duration,
}

/// Progress over source bytes, and the cancel flag; cheap to share
/// between threads.
pub struct Progress {
    bar: ProgressBar,
    cancel: Option<&'static AtomicBool>,
}

impl Progress {
    fn new(total: u64, bar: &ProgressBar, cancel: Option<&'static AtomicBool>) -> Progress {
        bar.set_length(total);
        Progress {
            bar: bar.clone(),
            cancel,
        }
    }
    pub fn inc(&self, n: u64) {
        self.bar.inc(n);
    }
    /// `Err(Error::Cancelled)` once the cancel flag is set.
    pub fn check(&self) -> Result<()> {
        check_cancel(self.cancel)
    }
}

fn check_bits_arg(bits: u32, flag: &str) -> Result<()> {
    if matches!(bits, 2 | 4 | 8 | 16) {
        Ok(())
    } else {
        Err(Error::Invalid(format!("{flag} {bits}: use 2, 4, 8, or 16 (keep bf16)")))
    }
}

/// Convert the checkpoint in `src` into a packed model at `dst`.
pub fn convert(src: &Path, dst: &Path, opts: &ConvertOptions) -> Result<ConvertReport> {
    let t0 = Instant::now();
    if let Some(b) = opts.bits {
        check_bits_arg(b, "--bits")?;
    }
    if let Some(b) = opts.bits_experts {
        check_bits_arg(b, "--bits-experts")?;
    }
    if !matches!(opts.group_size, 32 | 64 | 128) {
        return Err(Error::Invalid(format!(
            "--group-size {}: use 32, 64 or 128",
            opts.group_size
        )));
    }
    let gguf = src.is_file() && src.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if let Some(b) = opts.requantize {
        if !matches!(b, 4 | 8) {
            return Err(Error::Invalid(format!("--requantize {b}: use 4 or 8")));
        }
    }
    if !gguf && !src.join("config.json").is_file() {
        return Err(Error::Invalid(format!(
            "{} is not a checkpoint directory: it has no config.json (give the folder that holds config.json and the *.safetensors files, or a .gguf file)",
            src.display()
        )));
    }
    check_destination(src, dst, opts.force)?;
    let source = match gguf {
        true => Source::open_gguf(src)?,
        false => Source::open(src)?,
    };
    let bits = opts.bits.unwrap_or(4);
    let as_option = |b: u32| (b != 16 && !gguf).then_some(b);
    let settings = Settings {
        dense_bits: as_option(bits),
        expert_bits: as_option(opts.bits_experts.unwrap_or(bits)),
        group_size: opts.group_size,
        requantize: opts.requantize,
    };
    let plan = plan::build(&source, settings)?;
    let mut notes = plan.notes.clone();
    if source.mlx.is_some() && (opts.bits.is_some() || opts.bits_experts.is_some()) {
        notes.push("the source is MLX-quantized: it is repacked as it is, --bits/--bits-experts do not apply".into());
    }
    if gguf && (opts.bits.is_some() || opts.bits_experts.is_some()) {
        notes.push("the source is GGUF: its tensors keep their own formats (--requantize N changes those that must change), --bits/--bits-experts do not apply".into());
    }
    if !gguf && opts.requantize.is_some() {
        notes.push("--requantize applies to GGUF sources only".into());
    }
    let tmp = TempDir::beside(dst, &mut notes)?;
    let (w, verified) = write_model(&source, &plan, tmp.path(), opts)?;
    check_cancel(opts.cancel)?;
    crate::format::checksums::write(tmp.path(), opts.cancel)?;
    tmp.install(dst, opts.force)?;
    Ok(ConvertReport {
        tensors: w.tensors,
        dense_bytes: w.dense_bytes,
        expert_bytes: w.expert_bytes,
        expert_layers: w.expert_layers,
        verified_experts: verified,
        notes,
        elapsed: t0.elapsed(),
    })
}

struct Written {
    tensors: usize,
    dense_bytes: u64,
    expert_bytes: u64,
    expert_layers: usize,
}

/// Write the whole packed model into `out` (a fresh directory) and verify
/// it; returns what was written and the number of experts verified.
fn write_model(source: &Source, plan: &plan::Plan, out: &Path, opts: &ConvertOptions) -> Result<(Written, usize)> {
    let w = write_files(source, plan, out, opts)?;
    check_cancel(opts.cancel)?;
    let verified = verify::verify(out, plan)?;
    Ok((w, verified))
}

fn write_files(source: &Source, plan: &plan::Plan, out: &Path, opts: &ConvertOptions) -> Result<Written> {
    let cfg = &source.config;
    std::fs::create_dir_all(out.join(EXPERTS_DIR)).map_err(|e| Error::io(out, e))?;
    for f in COPIED_FILES {
        let from = source.dir.join(f);
        if from.is_file() {
            std::fs::copy(&from, out.join(f)).map_err(|e| Error::io(&from, e))?;
        }
    }
    if source.gguf.is_some() {
        write_json(&out.join("config.json"), &source.config_json)?;
        for (name, text) in &source.texts {
            let p = out.join(name);
            std::fs::write(&p, text).map_err(|e| Error::io(&p, e))?;
        }
    }
    let progress = Progress::new(plan.source_bytes, &opts.progress, opts.cancel);
    let mut dense = dense::DenseWriter::create(&out.join(WEIGHTS_FILE))?;
    let mut layers = BTreeMap::new();
    let mut expert_bytes = 0;
    for item in &plan.items {
        progress.check()?;
        match item {
            Item::Matrix(m) => dense.matrix(m, source, &progress)?,
            Item::Vector(v) => dense.vector(v, &progress)?,
            Item::Experts(l) => {
                expert_bytes += experts::write_layer(out, l, source, &progress)?;
                layers.insert(l.layer.to_string(), l.layout.clone());
            }
        }
        release(source, item);
    }
    let dense_bytes = dense.finish()?;
    progress.bar.finish_and_clear();
    let model = source
        .dir
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| cfg.model_type.clone());
    let manifest = Manifest {
        model,
        num_tensors: dense.tensors.len(),
        tensors: dense.tensors.clone(),
        config: source.config_json.clone(),
    };
    write_json(&out.join(MANIFEST_FILE), &manifest)?;
    let expert_layers = layers.len();
    let layout = Layout {
        num_layers: cfg.num_hidden_layers,
        num_experts: cfg.num_experts,
        group_size: plan.expert_group_size,
        layers,
    };
    write_json(&out.join(EXPERTS_DIR).join(LAYOUT_FILE), &layout)?;
    Ok(Written {
        tensors: manifest.num_tensors,
        dense_bytes,
        expert_bytes,
        expert_layers,
    })
}

/// Let go of the source pages an item has been converted from.
fn release(source: &Source, item: &Item) {
    let mut slices: Vec<&[u8]> = match item {
        Item::Matrix(m) => m.src.source_slices(),
        Item::Vector(v) => vec![v.src.data],
        Item::Experts(l) => l.experts.iter().flatten().flat_map(|m| m.source_slices()).collect(),
    };
    slices.sort_by_key(|s| (s.as_ptr() as usize, s.len()));
    slices.dedup_by_key(|s| (s.as_ptr() as usize, s.len()));
    for s in slices {
        source.release(s);
    }
}

fn write_json<T: serde::Serialize>(path: &Path, v: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(v).map_err(|e| Error::Json {
        path: path.to_path_buf(),
        err: e,
    })?;
    std::fs::write(path, text).map_err(|e| Error::io(path, e))
}

/// Refuse a destination that exists and is not a packed model (or exists
/// at all without `--force`; see [`outdir::check_destination`]), or that
/// is, or contains, the source. Changes nothing on disk.
fn check_destination(src: &Path, dst: &Path, force: bool) -> Result<()> {
    let src_c = src.canonicalize().map_err(|e| Error::io(src, e))?;
    if dst.exists() {
        let dst_c = dst.canonicalize().map_err(|e| Error::io(dst, e))?;
        if src_c.starts_with(&dst_c) {
            return Err(Error::Invalid(format!(
                "destination {} is (or contains) the source; --force would delete it",
                dst.display()
            )));
        }
    }
    outdir::check_destination(dst, force)
}
