//! `moeflux convert SRC DST`: a Hugging Face or MLX checkpoint → a packed
//! model directory.

use clap::Args;
use indicatif::{HumanBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};
use moeflux::format::convert::{convert, ConvertOptions};
use std::io::IsTerminal;
use std::path::PathBuf;

const ABOUT: &str = "\
SRC is a model directory as downloaded from Hugging Face (config.json +
model.safetensors, or sharded model-*.safetensors with their index; bf16,
f16, f32 or fp8 with block scales) or as made by mlx_lm.convert (2/4/8-bit
MLX weights, repacked losslessly), or a GGUF file (the first part of a
split one). Supported model_type: qwen3_moe, qwen3_5_moe, qwen3_next,
deepseek_v3 (kimi_k2), deepseek_v2, glm4_moe, minimax_m2, mixtral,
qwen2_moe. Vision towers and MTP heads are left out.

A GGUF keeps its tensors' formats where the packed format holds them bit
for bit (F32, F16, BF16, Q8_0, Q4_0, Q4_1); a tensor in another block
format (Q4_K, Q6_K, ...) is refused by name unless --requantize N turns
such tensors into N-bit affine weights (a note says so). GGUF conversion
covers the qwen3moe, qwen2moe, glm4moe, minimax-m2 and llama (Mixtral)
architectures.

DST receives model_weights.bin + model_weights.json (everything but the
routed experts), packed_experts/ (one file per MoE layer) and the config
and tokenizer files. It is written as DST.tmp-<pid> and renamed only after
a verification pass has re-read a sample of experts and compared them with
the source: a failed or interrupted run (Ctrl-C, SIGTERM) leaves nothing
behind, and the next run to DST removes what a killed one left. An
existing DST is replaced only with --force, and only if it is a packed
model directory.

Examples:
  moeflux convert ~/models/Qwen3-30B-A3B ~/packed/qwen3-30b          (4-bit)
  moeflux convert ~/models/Qwen3-30B-A3B ~/packed/qwen3-30b-q8 --bits 8
  moeflux convert ~/models/DeepSeek-V3 ~/packed/dsv3 --bits-experts 2
  moeflux convert Qwen3-30B-A3B-Q8_0.gguf ~/packed/qwen3-30b-q8
  moeflux convert Qwen3-30B-A3B-Q4_K_M.gguf ~/packed/qwen3-30b --requantize 4
  moeflux inspect ~/packed/qwen3-30b";

#[derive(Args)]
#[command(after_help = ABOUT)]
pub struct ConvertArgs {
    /// Source checkpoint directory (config.json + *.safetensors), or a
    /// .gguf file.
    pub src: PathBuf,
    /// Output directory for the packed model.
    pub dst: PathBuf,
    /// Bits per weight for unquantized sources: 4 (default), 8, 2, or 16
    /// to keep bf16. Qwen routers stay at 8 bits, DeepSeek's router and
    /// matrices whose input size is not a multiple of the group size stay
    /// unquantized. MLX-quantized sources keep their own bits.
    #[arg(long, value_name = "N")]
    pub bits: Option<u32>,
    /// Quantization group size: 32, 64 or 128.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub group_size: usize,
    /// Bits for the routed experts only (2, 4, 8 or 16); the rest uses --bits.
    #[arg(long, value_name = "N")]
    pub bits_experts: Option<u32>,
    /// GGUF sources: requantize tensors whose block format the packed
    /// format cannot hold exactly (Q4_K, Q6_K, Q5_0, ...) to N bits (4 or 8).
    #[arg(long, value_name = "N")]
    pub requantize: Option<u32>,
    /// Replace DST if it is an existing packed model directory.
    #[arg(long)]
    pub force: bool,
}

/// A bar over the source bytes on stderr when it is a terminal, else none.
pub(crate) fn progress_bar() -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta} {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

pub fn run(a: ConvertArgs) -> anyhow::Result<()> {
    let cancel = super::interrupt::install_cancel()?;
    let opts = ConvertOptions {
        bits: a.bits,
        group_size: a.group_size,
        bits_experts: a.bits_experts,
        requantize: a.requantize,
        force: a.force,
        progress: progress_bar(),
        cancel: Some(cancel),
    };
    eprintln!("converting {} → {}", a.src.display(), a.dst.display());
    let r = convert(&a.src, &a.dst, &opts)?;
    for n in &r.notes {
        eprintln!("note: {n}");
    }
    eprintln!(
        "done: {} tensors, dense {}, experts {} in {} layer files, {} experts verified, {:.1}s → {}",
        r.tensors,
        HumanBytes(r.dense_bytes),
        HumanBytes(r.expert_bytes),
        r.expert_layers,
        r.verified_experts,
        r.elapsed.as_secs_f64(),
        a.dst.display()
    );
    Ok(())
}
