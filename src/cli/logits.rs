use clap::Args;

#[derive(Args)]
pub struct LogitsArgs {}

pub fn run(_a: LogitsArgs) -> anyhow::Result<()> {
    anyhow::bail!("`logits` is not built yet")
}
