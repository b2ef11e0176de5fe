//! `agentdiff session end ID`: seals a session whose end never came (the agent was killed, or
//! its SessionEnd hook failed): the after-scan, attribution and seal `SessionEnd` would have made.
//!
//! Exit codes: 0 sealed; `NO_SUCH_RUN` for an unknown id or a run that is not a session;
//! `USAGE` for a session already ended, or one whose agent still runs (without `--force`);
//! `BUSY` when another agentdiff holds the project lock and `--wait` was not given.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::common::exit::{self, with_code};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The session (see `agentdiff session list`).
    #[arg(value_name = "ID")]
    id: String,
    /// End it even though its agent process still runs.
    #[arg(long)]
    force: bool,
    /// Policy file to use instead of ROOT/agentdiff.yaml.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Project root (default: discovered from the current directory, see docs/cli.md).
    #[arg(long)]
    root: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let root = crate::common::context::project_root(args.root.as_deref())?.path;
    let store = super::store(&root)?;
    let (capsule, metadata) = super::open(&store, &args.id)?;
    match super::state(&capsule, &metadata) {
        super::State::Ended => {
            return Err(with_code(
                exit::USAGE,
                anyhow::anyhow!("session {} has already ended: nothing was changed", args.id),
            ))
        }
        super::State::Open if !args.force => {
            return Err(with_code(
                exit::USAGE,
                anyhow::anyhow!(
                    "session {} is still open (its agent process runs); end the agent, or give \
                     --force to seal it now",
                    args.id
                ),
            ))
        }
        _ => {}
    }
    let result = crate::cli::hook::session::close(
        &root,
        args.policy.as_deref(),
        &store,
        &args.id,
        "closed",
        None,
    )?;
    outln!(
        "session {} sealed: {} change(s), status {:?}; `agentdiff session show {}` lists them",
        args.id,
        result.changes.len(),
        result.status,
        args.id
    );
    Ok(ExitCode::SUCCESS)
}
