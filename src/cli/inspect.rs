//! `moeflux inspect DIR`: describe a source checkpoint or a packed model.

use clap::Args;
use indicatif::HumanBytes;
use moeflux::backend::{KvType, KvTypes};
use moeflux::config::{AttnKind, FfnKind, ModelConfig};
use moeflux::format::checksums::{self, Verified, ALGORITHM, CHECKSUMS_FILE};
use moeflux::format::convert::Source;
use moeflux::format::packed::{
    expert_file_name, LayerLayout, Layout, Manifest, EXPERTS_DIR, MANIFEST_FILE, WEIGHTS_FILE,
};
use moeflux::model::kv_bytes_per_token;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

const ABOUT: &str = "\
DIR is either a checkpoint as downloaded (config.json + *.safetensors, from
Hugging Face or mlx_lm.convert) or a packed model made by `moeflux convert`.
Only headers and JSON files are read, so this is quick even for large models.

With --verify, every file of a packed model is read and checked against the
checksums convert and synth recorded (checksums.json); the first file, and
expert, that does not match is named.

Examples:
  moeflux inspect ~/models/Qwen3-30B-A3B
  moeflux inspect ~/packed/qwen3-30b
  moeflux inspect --verify ~/packed/qwen3-30b";

#[derive(Args)]
#[command(after_help = ABOUT)]
pub struct InspectArgs {
    /// A source checkpoint directory or a packed model directory.
    pub dir: PathBuf,
    /// Read every file of a packed model and check it against the
    /// checksums recorded when it was written.
    #[arg(long)]
    pub verify: bool,
}

pub fn run(a: InspectArgs) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if a.dir.join(MANIFEST_FILE).is_file() {
        packed(&mut out, &a.dir, a.verify)
    } else if a.dir.join("config.json").is_file() {
        source(&mut out, &a.dir)
    } else {
        anyhow::bail!(
            "{} has neither {MANIFEST_FILE} (a packed model) nor config.json (a checkpoint)",
            a.dir.display()
        )
    }
}

fn row(out: &mut impl Write, label: &str, text: impl std::fmt::Display) -> std::io::Result<()> {
    writeln!(out, "  {label:<13} {text}")
}

/// Architecture, layer kinds, experts: what the config says.
fn describe_config(out: &mut impl Write, c: &ModelConfig) -> std::io::Result<()> {
    row(
        out,
        "architecture",
        format!(
            "{}: hidden {}, vocab {}, {} layers, {} attention heads{}",
            c.model_type,
            c.hidden_size,
            c.vocab_size,
            c.num_hidden_layers,
            c.num_attention_heads,
            if c.mla.is_some() {
                String::new()
            } else {
                format!(" ({} KV)", c.num_key_value_heads)
            }
        ),
    )?;
    let count = |f: &dyn Fn(&moeflux::config::LayerSpec) -> bool| c.layers.iter().filter(|l| f(l)).count();
    let mut kinds = Vec::new();
    for (kind, name) in [
        (AttnKind::Linear, "linear attention"),
        (AttnKind::Full, "full attention"),
        (AttnKind::Mla, "MLA"),
    ] {
        let n = count(&|l| l.attn == kind);
        if n > 0 {
            kinds.push(format!("{n} {name}"));
        }
    }
    let moe = count(&|l| l.ffn == FfnKind::Moe);
    let dense = count(&|l| l.ffn == FfnKind::Dense);
    row(
        out,
        "layers",
        format!("{}; {moe} MoE, {dense} dense FFN", kinds.join(", ")),
    )?;
    let mut experts = format!(
        "{} per MoE layer, K = {} active, width {}",
        c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size
    );
    if c.shared_expert_intermediate_size > 0 {
        experts += &format!(", shared expert width {}", c.shared_expert_intermediate_size);
    }
    row(out, "experts", experts)?;
    kv_rows(out, c)
}

/// The KV cache of one position in each type (`--cache-type-k/-v`), over
/// all attention layers and for one, and at the model's whole context.
fn kv_rows(out: &mut impl Write, c: &ModelConfig) -> std::io::Result<()> {
    let layers = c.layers.iter().filter(|l| l.attn != AttnKind::Linear).count();
    if layers == 0 {
        return row(out, "KV cache", "none: no attention layer");
    }
    let per_type: Vec<String> = KvType::ALL
        .iter()
        .map(|&t| {
            let b = kv_bytes_per_token(c, KvTypes::both(t));
            let usable = match t {
                KvType::Q8_0 if c.mla.is_none() && !c.head_dim.is_multiple_of(32) => {
                    " (heads not blocks of 32: refused)"
                }
                KvType::Q8_0 if c.mla.as_ref().is_some_and(|m| !m.qk_rope_head_dim.is_multiple_of(32)) => {
                    " (heads not blocks of 32: refused)"
                }
                _ => "",
            };
            format!(
                "{t} {b} B ({} B a layer, {} at {} tokens){usable}",
                b / layers,
                HumanBytes((b * c.max_position_embeddings) as u64),
                c.max_position_embeddings
            )
        })
        .collect();
    row(
        out,
        "KV cache",
        format!("per token, {layers} attention layers: {}", per_type.join("; ")),
    )
}

/// Describe a packed model, then list every problem that would keep it
/// from opening (an error when there is one).
fn packed(out: &mut impl Write, dir: &Path, verify: bool) -> anyhow::Result<()> {
    let mut problems = moeflux::check::problems(dir);
    if let Err(e) = describe_packed(out, dir) {
        // A description that fails for a reason not among the problems.
        if problems.is_empty() || super::is_broken_pipe(&e) {
            return Err(e);
        }
    }
    if verify {
        match checksums::verify(dir) {
            Ok(Verified::NoChecksums) => row(
                out,
                "checksums",
                format!(
                    "none: the model has no {CHECKSUMS_FILE} (packed before moeflux recorded them); nothing verified"
                ),
            )?,
            Ok(Verified::Ok { files, experts }) => row(
                out,
                "checksums",
                format!("verified: {files} files, {experts} experts ({ALGORITHM})"),
            )?,
            Err(e) => problems.push(e),
        }
    }
    out.flush()?;
    if problems.is_empty() {
        return Ok(());
    }
    for p in &problems {
        eprintln!("problem: {p}");
    }
    anyhow::bail!(
        "{}: {} problem{} found; `moeflux run` would refuse this model",
        dir.display(),
        problems.len(),
        if problems.len() == 1 { "" } else { "s" }
    )
}

/// What the files say, as far as they can be read. The architecture is the
/// one of `config.json` (as `run` reads it), else the manifest's copy.
fn describe_packed(out: &mut impl Write, dir: &Path) -> anyhow::Result<()> {
    let manifest: Manifest = moeflux::error::read_json(&dir.join(MANIFEST_FILE))?;
    writeln!(out, "{}: packed moeflux model `{}`", dir.display(), manifest.model)?;
    let cfg = ModelConfig::from_dir(dir).or_else(|_| ModelConfig::from_json(&manifest.config))?;
    describe_config(out, &cfg)?;
    let layout = Layout::read(dir)?;
    let mut dense: BTreeMap<String, usize> = BTreeMap::new();
    for (name, t) in &manifest.tensors {
        let key = match (t.bits, t.dtype.as_str()) {
            (Some(b), _) => format!("{b}-bit"),
            (None, _) if name.ends_with(".scales") || name.ends_with(".biases") => continue,
            (None, d) => d.to_string(),
        };
        *dense.entry(key).or_default() += 1;
    }
    let mut widths: BTreeMap<u32, usize> = BTreeMap::new();
    let mut sizes: BTreeMap<usize, usize> = BTreeMap::new();
    let mut expert_bytes = 0u64;
    for l in layout.layers.values() {
        *widths.entry(l.bits).or_default() += 1;
        *sizes.entry(l.expert_size).or_default() += 1;
        expert_bytes += (l.expert_size * layout.num_experts) as u64;
    }
    let list = |m: &BTreeMap<String, usize>| {
        m.iter()
            .map(|(k, n)| format!("{k} ×{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let width_list: Vec<String> = widths
        .iter()
        .map(|(b, n)| format!("{} in {n} layers", bits_name(*b)))
        .collect();
    row(
        out,
        "bits",
        format!(
            "experts {} (group {}); dense tensors {}",
            width_list.join(", "),
            layout.group_size,
            list(&dense)
        ),
    )?;
    let dense_size = std::fs::metadata(dir.join(WEIGHTS_FILE)).map(|m| m.len()).unwrap_or(0);
    row(
        out,
        "dense part",
        format!(
            "{} in {WEIGHTS_FILE} ({} tensors)",
            HumanBytes(dense_size),
            manifest.num_tensors
        ),
    )?;
    let missing: Vec<String> = layout
        .layers
        .keys()
        .filter_map(|k| k.parse::<usize>().ok())
        .map(expert_file_name)
        .filter(|f| !dir.join(EXPERTS_DIR).join(f).is_file())
        .collect();
    row(
        out,
        "experts",
        format!(
            "{} in {} layer files{}",
            HumanBytes(expert_bytes),
            layout.layers.len(),
            if missing.is_empty() {
                String::new()
            } else {
                format!(" (missing: {})", missing.join(", "))
            }
        ),
    )?;
    let sizes: Vec<String> = sizes
        .keys()
        .map(|s| format!("{s} bytes ({})", HumanBytes(*s as u64)))
        .collect();
    row(out, "expert_size", sizes.join(", "))?;
    Ok(())
}

fn bits_name(b: u32) -> String {
    match b {
        16 => "BF16/F16".into(),
        32 => "F32".into(),
        b => format!("{b}-bit"),
    }
}

fn source(out: &mut impl Write, dir: &Path) -> anyhow::Result<()> {
    let src = Source::open(dir)?;
    let cfg = &src.config;
    let shards = src.shard_paths().count();
    writeln!(
        out,
        "{}: source checkpoint, {} tensors in {shards} safetensors file{}",
        dir.display(),
        src.names().count(),
        if shards == 1 { "" } else { "s" }
    )?;
    describe_config(out, cfg)?;
    let mut dtypes: BTreeMap<String, usize> = BTreeMap::new();
    for n in src.names() {
        if let Some(t) = src.get(n) {
            *dtypes.entry(t.dtype.name().to_string()).or_default() += 1;
        }
    }
    let dt: Vec<String> = dtypes.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
    let weights = match &src.mlx {
        Some(q) => {
            let mut o: BTreeMap<String, usize> = BTreeMap::new();
            for v in q.overrides.values() {
                let k = v.map_or("unquantized".to_string(), |(b, g)| format!("{b}-bit group {g}"));
                *o.entry(k).or_default() += 1;
            }
            let o: Vec<String> = o.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
            format!(
                "MLX affine {}-bit, group {}{} (repacked as is by convert)",
                q.bits,
                q.group_size,
                if o.is_empty() {
                    String::new()
                } else {
                    format!("; per-tensor overrides: {}", o.join(", "))
                }
            )
        }
        None if dtypes.contains_key("F8_E4M3") => {
            format!("fp8 e4m3 with {}×{} block scales", src.fp8_block[0], src.fp8_block[1])
        }
        None => "unquantized".to_string(),
    };
    row(out, "bits", format!("{weights}; tensors {}", dt.join(", ")))?;
    let (dense, experts) = src.sizes();
    row(out, "dense part", HumanBytes(dense))?;
    row(out, "experts", HumanBytes(experts))?;
    let per_layer = cfg.num_moe_layers() * cfg.num_experts;
    if per_layer > 0 && experts > 0 {
        let each = experts / per_layer as u64;
        let mut text = format!("{each} bytes ({}) in the source", HumanBytes(each));
        if src.mlx.is_none() {
            let (h, i) = (cfg.hidden_size, cfg.moe_intermediate_size);
            if h % 64 == 0 && i % 64 == 0 {
                let packed = LayerLayout::quantized(h, i, 4, 64).expert_size;
                text += &format!(
                    "; {packed} bytes ({}) after convert at 4 bits",
                    HumanBytes(packed as u64)
                );
            }
        }
        row(out, "expert_size", text)?;
    }
    let mut skipped: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, why) in &src.skipped {
        *skipped.entry(why).or_default() += 1;
    }
    for (why, n) in skipped {
        row(out, "skipped", format!("{n} tensors: {why}"))?;
    }
    Ok(())
}
