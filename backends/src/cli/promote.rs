//! `agentdiff promote RUN`: apply a private-workspace run's changes to the host tree, one path at
//! a time, only where the host still holds the captured before-state.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use agentdiff_engine::promote::{self, PromoteError, Scope, Selection};
use agentdiff_store::Store;

use crate::common::exit;

#[derive(Debug, clap::Args)]
#[command(
    group(clap::ArgGroup::new("scope").required(true).args(["safe_only", "all"])),
    after_help = "Promote writes a path only when the host still holds exactly what the run \
captured before it started; otherwise it reports a conflict and preserves the host state. \
--safe-only promotes allow-classified changes, --all adds review-classified ones; deny-classified \
changes are promoted only when named with --path and --force.\n\nExit codes: 0 done (or nothing to \
do); 68 at least one conflict or failure preserved a host path; 67 the capsule does not verify; \
66 no such run; 64 bad arguments."
)]
pub struct Args {
    /// The run id (see `agentdiff runs`).
    run: String,
    /// Promote only changes the policy allowed.
    #[arg(long)]
    safe_only: bool,
    /// Promote allowed and review-classified changes.
    #[arg(long)]
    all: bool,
    /// Only these recorded paths (or directories above them); repeatable.
    #[arg(long = "path", value_name = "P")]
    paths: Vec<String>,
    /// With --path: also promote deny-classified changes under the named paths.
    #[arg(long)]
    force: bool,
    /// Check every path and show a diff preview; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Wait for another agentdiff running in this project instead of exiting 75.
    #[arg(long)]
    wait: bool,
    /// With --dry-run: show content diffs of sensitive files (denied changes, `.env*`, keys)
    /// instead of their sizes and hashes.
    #[arg(long)]
    show_secrets: bool,
    /// Project root (default: the nearest directory holding .agentdiff/ or agentdiff.yaml, else
    /// the nearest VCS root, else the current directory).
    #[arg(long)]
    root: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "summary")]
    format: super::inspect::Format,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let root = crate::common::context::project_root(args.root.as_deref())?.path;
    let store = Store::open_existing(&root).map_err(|e| exit::with_code(exit::NO_SUCH_RUN, e))?;
    // A preview writes nothing and may run beside a run; a real promote may not.
    let _lock = match args.dry_run {
        true => None,
        false => Some(crate::common::context::lock_store(&store, args.wait)?),
    };
    let capsule = store
        .open_run(&args.run)
        .map_err(|e| exit::with_code(exit::NO_SUCH_RUN, e))?;
    let selection = Selection {
        scope: if args.all {
            Scope::All
        } else {
            Scope::SafeOnly
        },
        paths: args.paths.clone(),
        force: args.force,
    };
    let mut plan = promote::plan(&capsule, store.objects(), &root, &selection).map_err(|e| {
        let code = match &e {
            PromoteError::NotSealed { .. }
            | PromoteError::Verification { .. }
            | PromoteError::Malformed { .. }
            | PromoteError::UnsafePath { .. }
            | PromoteError::Store(_) => exit::INVALID_CAPSULE,
            PromoteError::InvalidPathArgument { .. }
            | PromoteError::UnknownPath { .. }
            | PromoteError::ForceWithoutPath
            | PromoteError::NotPrivate { .. }
            | PromoteError::RootMismatch { .. } => exit::USAGE,
            _ => exit::INTERNAL,
        };
        exit::with_code(code, e)
    })?;
    // A write that could not finish preserved what it could not change: the conflict code, as
    // for rollback.
    plan.show_secrets = args.show_secrets;
    let report = promote::execute(&capsule, &plan, args.dry_run)
        .context("promote stopped")
        .map_err(|e| exit::with_code(exit::CONFLICT, e))?;
    match args.format {
        super::inspect::Format::Json => outln!(
            "{}",
            serde_json::to_string_pretty(&report).context("serialising the report")?
        ),
        super::inspect::Format::Summary => out!("{}", promote::render_summary(&report)),
    }
    Ok(ExitCode::from(if report.has_conflicts() {
        exit::CONFLICT
    } else {
        0
    }))
}
