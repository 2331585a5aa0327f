use clap::Args;

#[derive(Args)]
pub struct SynthArgs {}

pub fn run(_a: SynthArgs) -> anyhow::Result<()> {
    anyhow::bail!("`synth` is not built yet")
}
