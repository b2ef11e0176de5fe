use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    Err(crate::exit::with_code(
        crate::exit::INTERNAL,
        anyhow::anyhow!("`agentdiff promote` is not implemented in this build"),
    ))
}
