use clap::Args;

#[derive(Args)]
pub struct ConvertArgs {}

pub fn run(_a: ConvertArgs) -> anyhow::Result<()> {
    anyhow::bail!("`convert` is not built yet")
}
