//! `agentdiff verify RUN`: check a capsule's integrity seal and its backup objects.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use agentdiff_engine::redact::escape_terminal;
use agentdiff_engine::store::Store;

use crate::exit;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 the capsule verifies; 67 it does not (each problem is \
named); 66 no such run. Verification is tamper evidence, not authenticity: a process that can \
rewrite the whole capsule can rewrite its manifest too."
)]
pub struct Args {
    /// The run id (see `agentdiff runs`).
    run: String,
    /// Project root (default: the nearest directory holding .agentdiff/ or agentdiff.yaml, else
    /// the nearest VCS root, else the current directory).
    #[arg(long)]
    root: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "summary")]
    format: super::inspect::Format,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let root = super::project_root(args.root.as_deref())?.path;
    let store = Store::open_existing(&root).map_err(|e| exit::with_code(exit::NO_SUCH_RUN, e))?;
    let capsule = store
        .open_run(&args.run)
        .map_err(|e| exit::with_code(exit::NO_SUCH_RUN, e))?;
    let report = capsule
        .verify(store.objects())
        .map_err(|e| exit::with_code(exit::INVALID_CAPSULE, e))?;
    match args.format {
        super::inspect::Format::Json => {
            outln!(
                "{}",
                serde_json::to_string_pretty(&report).context("serialising the report")?
            );
        }
        super::inspect::Format::Summary => {
            if report.ok {
                outln!(
                    "verified: run {} is sealed and every artifact and backup object matches its hash",
                    escape_terminal(report.run_id.as_str())
                );
            } else {
                outln!(
                    "NOT verified: run {} has {} problem(s):",
                    escape_terminal(report.run_id.as_str()),
                    report.problems.len()
                );
                for p in &report.problems {
                    outln!(
                        "  {}: {}",
                        escape_terminal(&p.subject),
                        escape_terminal(&p.problem)
                    );
                }
            }
        }
    }
    Ok(ExitCode::from(if report.ok {
        0
    } else {
        exit::INVALID_CAPSULE
    }))
}
