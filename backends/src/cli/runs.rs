//! `agentdiff runs`: list stored runs.

use std::path::PathBuf;
use std::process::ExitCode;

use agentdiff_engine::redact::escape_terminal;
use agentdiff_engine::store::Store;

use crate::exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Project root (default: the current directory).
    #[arg(long, default_value = ".")]
    root: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value = "summary")]
    format: super::inspect::Format,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let store =
        Store::open_existing(&args.root).map_err(|e| exit::with_code(exit::NO_SUCH_RUN, e))?;
    let runs = store
        .list_runs()
        .map_err(|e| exit::with_code(exit::INTERNAL, e))?;
    match args.format {
        super::inspect::Format::Json => println!("{}", serde_json::to_string_pretty(&runs)?),
        super::inspect::Format::Summary => {
            if runs.is_empty() {
                println!("no runs recorded");
            }
            for r in &runs {
                println!(
                    "{}  {}  {}",
                    escape_terminal(r.id.as_str()),
                    r.status.as_deref().unwrap_or("-"),
                    if r.sealed { "sealed" } else { "NOT sealed" }
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
