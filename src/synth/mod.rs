//! `moeflux synth`: a random-weight packed model (SPEC.md §2) of a real
//! model's shape, written directly — no source checkpoint. Used to run and
//! benchmark the engine at full scale (I/O, memory, speed) without
//! downloading hundreds of gigabytes.
//!
//! Values are chosen so that activations stay in range through every layer:
//! each matrix dequantizes to values uniform and centred on zero with
//! standard deviation `1/sqrt(cols)` (routers [`ROUTER_GAIN`]
//! times that, so routing spreads over the experts), norms are near 1.

mod fill;
pub mod presets;
mod random;
mod skew;
mod tensors;
pub mod tokenizer;
mod writer;

pub use presets::{preset, trim_layers, PRESETS};
pub use random::{token_ids, SplitMix64};
pub use skew::Routing;
pub use tensors::{QWEN_ROUTER_BITS, ROUTER_GAIN};

use crate::config::{FfnKind, ModelConfig};
use crate::error::{Error, Result};
use crate::format::outdir::{check_cancel, check_destination, TempDir};
use crate::format::packed::{
    expert_file_name, LayerLayout, Layout, Manifest, TensorEntry, ALIGN, EXPERTS_DIR, LAYOUT_FILE, MANIFEST_FILE,
    WEIGHTS_FILE,
};
use fill::CHUNK_ELEMS;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use tensors::{dense_tensors, expert_segments, Quant, Segment, TensorSpec};
use writer::{write_file, write_small, Piece};

/// What to write.
#[derive(Debug, Clone, Copy)]
pub struct SynthOptions {
    /// 2, 4 or 8: experts and dense matrices (Qwen routers stay at 8).
    pub bits: u32,
    pub group_size: usize,
    pub seed: u64,
    /// Keep only the first N layers.
    pub layers: Option<usize>,
    /// How the routers spread tokens over the experts.
    pub routing: Routing,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            bits: 4,
            group_size: 64,
            seed: 0,
            layers: None,
            routing: Routing::Uniform,
        }
    }
}

/// The model to write: its config and every tensor, placed.
pub struct Plan {
    pub name: String,
    /// The `config.json` written (layers trimmed).
    pub config_json: Value,
    pub config: ModelConfig,
    quant: Quant,
    /// Dense tensors with their offsets in `model_weights.bin`.
    tensors: Vec<(TensorSpec, u64)>,
    dense_bytes: u64,
    expert_layout: LayerLayout,
    moe_layers: Vec<usize>,
}

/// What a finished run wrote.
#[derive(Debug, Clone)]
pub struct Summary {
    pub dir: PathBuf,
    pub bytes: u64,
    pub files: usize,
    pub seconds: f64,
    /// Temporary directories of interrupted runs that were removed (or
    /// left alone because their process still runs).
    pub notes: Vec<String>,
}

impl Plan {
    /// Plan the model `name` of shape `config_json` (a `config.json`).
    pub fn new(name: &str, mut config_json: Value, opts: &SynthOptions) -> Result<Plan> {
        if !crate::format::quant::check_bits(opts.bits) {
            return Err(Error::Invalid(format!(
                "--bits {}: synth writes 2, 4 or 8-bit models",
                opts.bits
            )));
        }
        if ![32, 64, 128].contains(&opts.group_size) {
            return Err(Error::Invalid(format!(
                "--group-size {}: use 32, 64 or 128",
                opts.group_size
            )));
        }
        if let Some(n) = opts.layers {
            trim_layers(&mut config_json, n)?;
        }
        let config = ModelConfig::from_json(&config_json)?;
        for (field, v) in [
            ("hidden_size", config.hidden_size),
            ("moe_intermediate_size", config.moe_intermediate_size),
        ] {
            if v % opts.group_size != 0 {
                return Err(Error::config(
                    field,
                    format!(
                        "{v} is not a multiple of the group size {}: experts cannot be quantized",
                        opts.group_size
                    ),
                ));
            }
        }
        let block = (opts.routing == Routing::Skewed && !config.moe.router_bias).then_some(());
        if block.is_some() && config.hidden_size < 2 * skew::BLOCK {
            return Err(Error::config(
                "hidden_size",
                format!(
                    "{}: skewed routing needs at least {} (its routers read the last {} dimensions)",
                    config.hidden_size,
                    2 * skew::BLOCK,
                    skew::BLOCK
                ),
            ));
        }
        let quant = Quant {
            bits: opts.bits,
            group_size: opts.group_size,
            seed: opts.seed,
            routing: opts.routing,
            block: block.map(|()| config.hidden_size - skew::BLOCK),
        };
        let mut off = 0u64;
        let mut tensors = Vec::new();
        for t in dense_tensors(&config, quant) {
            off = off.div_ceil(ALIGN) * ALIGN;
            let size = t.nbytes() as u64;
            tensors.push((t, off));
            off += size;
        }
        let moe_layers = (0..config.num_hidden_layers)
            .filter(|&i| config.layers[i].ffn == FfnKind::Moe)
            .collect();
        let expert_layout = LayerLayout::quantized(
            config.hidden_size,
            config.moe_intermediate_size,
            opts.bits,
            opts.group_size,
        );
        Ok(Plan {
            name: name.to_string(),
            config_json,
            config,
            quant,
            tensors,
            dense_bytes: off,
            expert_layout,
            moe_layers,
        })
    }

    pub fn dense_bytes(&self) -> u64 {
        self.dense_bytes
    }
    pub fn expert_size(&self) -> usize {
        self.expert_layout.expert_size
    }
    /// Layers with an expert file.
    pub fn moe_layers(&self) -> &[usize] {
        &self.moe_layers
    }
    pub fn expert_bytes(&self) -> u64 {
        (self.moe_layers.len() * self.config.num_experts * self.expert_size()) as u64
    }
    /// Bytes of `model_weights.bin` and the expert files.
    pub fn total_bytes(&self) -> u64 {
        self.dense_bytes + self.expert_bytes()
    }

    /// Write the model to `out` (through a temporary sibling directory,
    /// renamed at the end). An existing `out` is replaced if it is empty,
    /// or with `force` if it is a packed model. Once `cancel` is set, the
    /// write stops with [`Error::Cancelled`] and removes what it wrote.
    pub fn write(
        &self,
        out: &Path,
        force: bool,
        progress: &dyn Fn(u64),
        cancel: Option<&AtomicBool>,
    ) -> Result<Summary> {
        let t0 = std::time::Instant::now();
        check_destination(out, force)?;
        let mut notes = Vec::new();
        let tmp = TempDir::beside(out, &mut notes)?;
        let (bytes, files) = self.write_into(tmp.path(), progress, cancel)?;
        check_cancel(cancel)?;
        crate::format::checksums::write(tmp.path(), cancel)?;
        tmp.install(out, force)?;
        Ok(Summary {
            dir: out.to_path_buf(),
            bytes,
            files,
            seconds: t0.elapsed().as_secs_f64(),
            notes,
        })
    }

    fn write_into(&self, dir: &Path, progress: &dyn Fn(u64), cancel: Option<&AtomicBool>) -> Result<(u64, usize)> {
        let edir = dir.join(EXPERTS_DIR);
        std::fs::create_dir_all(&edir).map_err(|e| Error::io(&edir, e))?;
        write_small(&dir.join("config.json"), &to_json(&self.config_json)?)?;
        let mut bytes = write_file(&dir.join(WEIGHTS_FILE), &self.dense_pieces(), progress, cancel)?;
        write_small(&dir.join(MANIFEST_FILE), &to_json(&self.manifest())?)?;
        let mut layers = BTreeMap::new();
        for &layer in &self.moe_layers {
            let pieces: Vec<Piece> = (0..self.config.num_experts)
                .map(|e| Piece::Data(expert_segments(&self.expert_layout, layer, e, &self.quant)))
                .collect();
            bytes += write_file(&edir.join(expert_file_name(layer)), &pieces, progress, cancel)?;
            layers.insert(layer.to_string(), self.expert_layout.clone());
        }
        let layout = Layout {
            num_layers: self.config.num_hidden_layers,
            num_experts: self.config.num_experts,
            group_size: self.quant.group_size,
            layers,
        };
        write_small(&edir.join(LAYOUT_FILE), &to_json(&layout)?)?;
        let files = self.write_text_files(dir)?;
        // With checksums.json, written after.
        Ok((bytes, 5 + files + self.moe_layers.len()))
    }

    /// `synth.json`: how the model was made (its routing above all, which
    /// `bench` names), for people and tools; the engine does not read it.
    fn note(&self) -> Value {
        serde_json::json!({
            "made_by": "moeflux synth",
            "model": self.name,
            "routing": self.quant.routing.name(),
            "seed": self.quant.seed,
            "bits": self.quant.bits,
            "group_size": self.quant.group_size,
        })
    }

    /// The tokenizer, its config, the generation config and the chat
    /// template (`tokenizer` module), and the note; returns the number of
    /// files.
    fn write_text_files(&self, dir: &Path) -> Result<usize> {
        let vocab = self.config.vocab_size;
        let text = [
            ("tokenizer.json", tokenizer::tokenizer_json(vocab)?.into_bytes()),
            (
                "tokenizer_config.json",
                to_json(&tokenizer::tokenizer_config(vocab, self.config.max_position_embeddings))?,
            ),
            ("generation_config.json", to_json(&tokenizer::generation_config(vocab))?),
            ("chat_template.jinja", tokenizer::CHAT_TEMPLATE.as_bytes().to_vec()),
            (NOTE_FILE, to_json(&self.note())?),
        ];
        for (name, bytes) in &text {
            write_small(&dir.join(name), bytes)?;
        }
        Ok(text.len())
    }

    /// `model_weights.bin` as pieces: each tensor at its aligned offset,
    /// split into chunks that are generated independently.
    fn dense_pieces(&self) -> Vec<Piece> {
        let mut pieces = Vec::new();
        let mut pos = 0u64;
        for (t, off) in &self.tensors {
            if *off > pos {
                pieces.push(Piece::Zeros((off - pos) as usize));
            }
            let n = t.elems();
            for (c, start) in (0..n).step_by(CHUNK_ELEMS).enumerate() {
                pieces.push(Piece::Data(vec![Segment {
                    fill: t.fill,
                    key: t.key,
                    chunk: c as u64,
                    n: CHUNK_ELEMS.min(n - start),
                    mask: t.mask,
                }]));
            }
            pos = off + t.nbytes() as u64;
        }
        pieces
    }

    fn manifest(&self) -> Manifest {
        let tensors: BTreeMap<String, TensorEntry> = self
            .tensors
            .iter()
            .map(|(t, off)| {
                let entry = TensorEntry {
                    offset: *off,
                    size: t.nbytes() as u64,
                    shape: t.shape.clone(),
                    dtype: t.dtype.name().to_string(),
                    bits: t.bits,
                    group_size: t.group_size,
                };
                (t.name.clone(), entry)
            })
            .collect();
        Manifest {
            model: self.name.clone(),
            num_tensors: tensors.len(),
            tensors,
            config: self.config_json.clone(),
        }
    }
}

/// The note beside a synthetic model ([`Plan::write`]).
pub const NOTE_FILE: &str = "synth.json";

/// The routing of the model in `dir` when `synth` made it (from its
/// `synth.json`); `None` for any other model, or a note that does not say.
pub fn synth_routing(dir: &Path) -> Option<Routing> {
    let note: Value = serde_json::from_slice(&std::fs::read(dir.join(NOTE_FILE)).ok()?).ok()?;
    note.get("routing")?.as_str()?.parse().ok()
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_json::to_vec_pretty(v).map_err(|e| Error::Invalid(format!("serializing JSON: {e}")))
}
