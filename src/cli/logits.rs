//! `moeflux logits`: evaluate tokens from position 0 and print logits.
//! The debugging and oracle interface; its output format is stable.

use super::model_args::ModelArgs;
use clap::Args;
use std::io::Write;

#[derive(Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Comma-separated token ids, evaluated from position 0.
    #[arg(long, value_delimiter = ',', required = true)]
    pub tokens: Vec<u32>,
    /// Print every position, not only the last.
    #[arg(long)]
    pub all_positions: bool,
    /// Print `{"positions":[{"pos":0,"logits":[...]}, ...]}` instead of the top 10.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: LogitsArgs) -> anyhow::Result<()> {
    let model = a.model.open_model()?;
    let mut s = model.session()?;
    let n = a.tokens.len();
    let vocab = model.n_vocab();
    let (first, logits) = if a.all_positions {
        (0, s.eval_all(&a.tokens, 0)?)
    } else {
        (n - 1, s.eval_prompt(&a.tokens, 0)?)
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if a.json {
        write!(out, "{{\"positions\":[")?;
        for (i, row) in logits.chunks_exact(vocab).enumerate() {
            if i > 0 {
                write!(out, ",")?;
            }
            write!(out, "{{\"pos\":{},\"logits\":", first + i)?;
            serde_json::to_writer(&mut out, row)?;
            write!(out, "}}")?;
        }
        writeln!(out, "]}}")?;
    } else {
        for (i, row) in logits.chunks_exact(vocab).enumerate() {
            let pos = first + i;
            let mut idx: Vec<usize> = (0..vocab).collect();
            idx.sort_by(|&x, &y| row[y].total_cmp(&row[x]));
            writeln!(out, "pos {pos} (token {}):", a.tokens[pos])?;
            for &t in idx.iter().take(10) {
                writeln!(out, "  {t:>8}  {:>12.6}", row[t])?;
            }
        }
    }
    out.flush()?;
    Ok(())
}
