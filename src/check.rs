//! Checking a packed model directory the way `Model::open` does, but
//! collecting every problem instead of stopping at the first (`moeflux
//! inspect` reports them all). `Model::open` runs the same checks.

use crate::arch::{Entry, TensorKind};
use crate::backend::cpu::CpuBackend;
use crate::config::{FfnKind, ModelConfig};
use crate::error::{Error, Result};
use crate::experts::check_layer_file;
use crate::format::packed::{expert_file_name, Layout, WeightsFile, EXPERTS_DIR, LAYOUT_FILE, MANIFEST_FILE};
use crate::model::Net;
use crate::text::{GenerationDefaults, SamplingParams, Tokenizer};
use std::path::Path;

/// Whether `dir` is a checkpoint as downloaded (`config.json` and
/// safetensors files) rather than a packed model.
pub fn is_source_checkpoint(dir: &Path) -> bool {
    if dir.join(MANIFEST_FILE).exists() || !dir.join("config.json").is_file() {
        return false;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.filter_map(|e| e.ok()).any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name.ends_with(".safetensors") || name == "model.safetensors.index.json"
    })
}

/// An error naming the command that converts `dir` when it is a source
/// checkpoint; `Ok` otherwise.
pub fn not_a_source_checkpoint(dir: &Path) -> Result<()> {
    if dir.is_file() && dir.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        return Err(Error::Invalid(format!(
            "{} is a GGUF file: convert it once with `moeflux convert {} DIR` (Q8_0, Q4_0, Q4_1 and float \
             tensors are kept bit for bit; add --requantize 4 for K-quants), then pass DIR to --model",
            dir.display(),
            dir.display()
        )));
    }
    if is_source_checkpoint(dir) {
        Err(Error::SourceCheckpoint(dir.to_path_buf()))
    } else {
        Ok(())
    }
}

/// The expert table of every MoE layer of `cfg`: present in `layout`, with
/// the model's expert count and shapes.
pub fn moe_layouts(cfg: &ModelConfig, layout: &Layout) -> Vec<Error> {
    let where_ = format!("{EXPERTS_DIR}/{LAYOUT_FILE}");
    let mut found = Vec::new();
    if layout.num_layers != cfg.num_hidden_layers {
        found.push(Error::format(
            &where_,
            format!(
                "num_layers {} but config.json says num_hidden_layers {}",
                layout.num_layers, cfg.num_hidden_layers
            ),
        ));
    }
    if layout.num_experts != cfg.num_experts {
        found.push(Error::format(
            &where_,
            format!(
                "num_experts {} but config.json says {}",
                layout.num_experts, cfg.num_experts
            ),
        ));
    }
    for (i, l) in cfg.layers.iter().enumerate() {
        if l.ffn != FfnKind::Moe {
            continue;
        }
        match layout.layer(i) {
            None => found.push(Error::format(
                &where_,
                format!("layer {i} is an MoE layer but has no expert file"),
            )),
            Some(ll) => {
                if let Err(e) = ll.validate(i, cfg.hidden_size, cfg.moe_intermediate_size, layout.group_size) {
                    found.push(e);
                }
            }
        }
    }
    found
}

/// Every problem of the text files that `run` and `serve` read beside the
/// weights (`tokenizer.json`, `tokenizer_config.json`,
/// `generation_config.json`), with the functions they read them with.
pub fn text_problems(dir: &Path) -> Vec<Error> {
    let mut found = Vec::new();
    if let Err(e) = sampling_defaults(dir) {
        found.push(e);
    }
    if let Err(e) = Tokenizer::from_dir(dir) {
        // An error in generation_config.json is reported once.
        if !found.iter().any(|f| f.to_string() == e.to_string()) {
            found.push(e);
        }
    }
    found
}

/// The sampling parameters of `generation_config.json` (the defaults when
/// it is absent), checked as sampling checks them.
pub fn sampling_defaults(dir: &Path) -> Result<SamplingParams> {
    let path = dir.join("generation_config.json");
    let p = SamplingParams::from_defaults(&GenerationDefaults::from_dir(dir)?);
    p.validate().map_err(|e| Error::format(&path, e.to_string()))?;
    Ok(p)
}

/// Every problem of the packed model in `dir` that `Model::open`, or
/// `run` and `serve` reading its text files, would stop at; empty when it
/// opens.
pub fn problems(dir: &Path) -> Vec<Error> {
    if let Err(e) = not_a_source_checkpoint(dir) {
        return vec![e];
    }
    let mut found = model_problems(dir);
    found.extend(text_problems(dir));
    found
}

/// Every problem of the packed model in `dir` that `Model::open` would
/// stop at; empty when it opens.
pub fn model_problems(dir: &Path) -> Vec<Error> {
    if let Err(e) = not_a_source_checkpoint(dir) {
        return vec![e];
    }
    let mut found = Vec::new();
    let config = keep(&mut found, ModelConfig::from_dir(dir));
    let weights = keep(&mut found, WeightsFile::open(dir));
    let layout = keep(&mut found, Layout::read(dir));
    if let Some(layout) = &layout {
        for (key, ll) in &layout.layers {
            let Ok(i) = key.parse::<usize>() else { continue };
            let path = dir.join(EXPERTS_DIR).join(expert_file_name(i));
            if let Err(e) = check_layer_file(&path, layout.num_experts, ll) {
                found.push(e);
            }
        }
    }
    if let (Some(c), Some(l)) = (&config, &layout) {
        found.extend(moe_layouts(c, l));
    }
    if let (Some(c), Some(w)) = (&config, &weights) {
        let missing = tensors(c, w);
        if missing.is_empty() {
            if let Err(e) = Net::load(CpuBackend::new(), c, w) {
                found.push(e);
            }
        }
        found.extend(missing);
    }
    found
}

/// Every dense tensor of the model's table (`arch::table`) that
/// `model_weights.bin` lacks or holds in the wrong shape or form.
pub fn tensors(cfg: &ModelConfig, w: &WeightsFile) -> Vec<Error> {
    let mut found = Vec::new();
    for entry in crate::arch::table(cfg) {
        let Entry::Dense(t) = entry else { continue };
        let r = match (t.kind, t.shape.as_slice()) {
            (TensorKind::Matrix(_), &[rows, cols]) => w.matrix(&t.name, rows, cols).map(drop),
            (TensorKind::Conv1d, &[c, k]) => w.vector(&t.name, c * k).map(drop),
            (_, shape) => w.vector(&t.name, shape.iter().product()).map(drop),
        };
        if let Err(e) = r {
            found.push(e);
        }
    }
    found
}

/// The value, or `None` with the error added to `found`.
fn keep<T>(found: &mut Vec<Error>, r: Result<T>) -> Option<T> {
    r.map_err(|e| found.push(e)).ok()
}
