//! `moeflux synth`: write a random-weight packed model of a real model's
//! shape (for running and benchmarking at full scale without a download).

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use moeflux::config::AttnKind;
use moeflux::synth::{preset, Plan, Routing, SynthOptions, PRESETS};
use std::path::PathBuf;

#[derive(Args)]
pub struct SynthArgs {
    /// Model shape: qwen3.6-35b-a3b, qwen3.5-397b-a17b, qwen3-30b-a3b or deepseek-v3.
    #[arg(long, required_unless_present = "config", conflicts_with = "config")]
    pub preset: Option<String>,
    /// Take the shape from this config.json instead of a preset.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Output directory (written as OUT.tmp-<pid>, renamed at the end;
    /// Ctrl-C or SIGTERM removes it, and the next run to OUT removes what
    /// a killed run left).
    #[arg(long)]
    pub out: PathBuf,
    /// Keep only the first N layers.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Bits of the quantized weights: 2, 4 or 8 (Qwen routers stay at 8).
    #[arg(long, default_value_t = 4)]
    pub bits: u32,
    /// Quantization group size: 32, 64 or 128.
    #[arg(long, default_value_t = 64)]
    pub group_size: usize,
    /// Seed of the random weights (same seed, same bytes).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Routing: uniform (random routers, every expert about equally
    /// likely) or skewed (a few experts per layer take most tokens, as in
    /// trained models).
    #[arg(long, default_value = "uniform", value_name = "uniform|skewed")]
    pub routing: Routing,
    /// Replace OUT if it is an existing packed model directory.
    #[arg(long)]
    pub force: bool,
}

const GB: f64 = 1e9;

pub fn run(a: SynthArgs) -> anyhow::Result<()> {
    let cancel = super::interrupt::install_cancel()?;
    let (name, config) = match (&a.preset, &a.config) {
        (Some(p), _) => (p.clone(), preset(p)?),
        (None, Some(path)) => {
            let v: serde_json::Value = moeflux::error::read_json(path)?;
            let name = path
                .parent()
                .and_then(|d| d.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "custom".into());
            (name, v)
        }
        (None, None) => anyhow::bail!("give --preset ({}) or --config FILE", PRESETS.join(", ")),
    };
    let opts = SynthOptions {
        bits: a.bits,
        group_size: a.group_size,
        seed: a.seed,
        layers: a.layers,
        routing: a.routing,
    };
    let plan = Plan::new(&format!("{name}-synth"), config, &opts).with_context(|| format!("planning `{name}`"))?;
    let cfg = &plan.config;
    let full = cfg.layers.iter().filter(|l| l.attn == AttnKind::Full).count();
    let linear = cfg.layers.iter().filter(|l| l.attn == AttnKind::Linear).count();
    let mla = cfg.layers.len() - full - linear;
    let kinds: Vec<String> = [(linear, "linear"), (full, "full attention"), (mla, "MLA")]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, k)| format!("{n} {k}"))
        .collect();
    eprintln!(
        "synth {name} ({}): {} layers ({}), {} MoE layers × {} experts × {} bytes, {}-bit, {} routing; {:.2} GB to write",
        cfg.model_type,
        cfg.num_hidden_layers,
        kinds.join(" + "),
        plan.moe_layers().len(),
        cfg.num_experts,
        plan.expert_size(),
        a.bits,
        a.routing.name(),
        plan.total_bytes() as f64 / GB,
    );
    let bar = ProgressBar::new(plan.total_bytes());
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{wide_bar}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .context("progress bar template")?
        .progress_chars("=> "),
    );
    let summary = plan.write(&a.out, a.force, &|n| bar.inc(n), Some(cancel));
    bar.finish_and_clear();
    let summary = summary?;
    for n in &summary.notes {
        eprintln!("note: {n}");
    }
    eprintln!(
        "wrote {}: {:.2} GB in {} files ({:.2} GB dense, {:.2} GB experts) in {:.1} s, {:.2} GB/s",
        summary.dir.display(),
        summary.bytes as f64 / GB,
        summary.files,
        plan.dense_bytes() as f64 / GB,
        plan.expert_bytes() as f64 / GB,
        summary.seconds,
        summary.bytes as f64 / GB / summary.seconds.max(1e-9),
    );
    Ok(())
}
