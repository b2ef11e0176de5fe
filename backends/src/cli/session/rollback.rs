//! `agentdiff session rollback ID (--safe-only | --all) [--dry-run] [--wait] [--format F]`: the
//! run rollback (`agentdiff rollback`) on the session's capsule, with the same conflict rules
//! and exit codes; only an ended (sealed) session can be rolled back.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::common::exit::{self, with_code};

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("scope").required(true).args(["safe_only", "all"])))]
pub struct Args {
    /// The session (see `agentdiff session list`).
    #[arg(value_name = "ID")]
    id: String,
    /// Undo only the changes the policy classified `review` or `deny`.
    #[arg(long)]
    safe_only: bool,
    /// Undo every recorded change.
    #[arg(long)]
    all: bool,
    /// Check every path and show what would happen; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Wait for another agentdiff running in this project instead of exiting 75.
    #[arg(long)]
    wait: bool,
    #[arg(long, value_enum, default_value_t = crate::cli::rollback::Format::Summary)]
    format: crate::cli::rollback::Format,
    /// Project root (default: discovered from the current directory, see docs/cli.md).
    #[arg(long)]
    root: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let root = crate::common::context::project_root(args.root.as_deref())?.path;
    let store = super::store(&root)?;
    let (capsule, metadata) = super::open(&store, &args.id)?;
    if super::state(&capsule, &metadata) != super::State::Ended {
        return Err(with_code(
            exit::INVALID_CAPSULE,
            anyhow::anyhow!(
                "session {} has not ended (its capsule is not sealed); `agentdiff session end {}` \
                 seals it first",
                args.id,
                args.id
            ),
        ));
    }
    crate::cli::rollback::run(crate::cli::rollback::Args::of(
        args.id,
        args.all,
        args.dry_run,
        args.wait,
        args.format,
        Some(root),
    ))
}
