use clap::Args;

#[derive(Args)]
pub struct InspectArgs {}

pub fn run(_a: InspectArgs) -> anyhow::Result<()> {
    anyhow::bail!("`inspect` is not built yet")
}
