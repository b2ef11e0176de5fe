//! `agentdiff rollback RUN (--safe-only | --all) [--path P]… [--dry-run] [--format summary|json]`
//!
//! Exit codes: 0 when every selected path is in its pre-run state (or is reported as not
//! restorable automatically), `CONFLICT` when any path was preserved because of a conflict or a
//! failure (also for a dry run that predicts one), `INVALID_CAPSULE` for an unsealed, tampered
//! or unreadable capsule, `NO_SUCH_RUN` for an invalid or unknown run id, `USAGE` for a missing
//! or doubled scope flag or a `--path` that names no recorded change, `INVALID_CONFIG` when the
//! run's policy disabled rollback.

use std::path::PathBuf;
use std::process::ExitCode;

use agentdiff_engine::rollback::{
    self, render_summary, ExecuteOptions, RollbackError, Scope, Selection,
};
use agentdiff_store::{Store, StoreError};
use anyhow::Context;

use crate::common::exit::{self, with_code};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One line per path and a final line.
    Summary,
    /// The full report (the same document as rollback-result.json).
    Json,
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("scope").required(true).args(["safe_only", "all"])))]
pub struct Args {
    /// The run to roll back (see `agentdiff runs`).
    #[arg(value_name = "RUN")]
    run: String,
    /// Undo only the changes the run's policy classified `review` or `deny`.
    #[arg(long)]
    safe_only: bool,
    /// Undo every recorded change.
    #[arg(long)]
    all: bool,
    /// Only this recorded path, or the recorded paths below this directory (repeatable).
    #[arg(long = "path", value_name = "P")]
    paths: Vec<String>,
    /// Check every path and show what would happen (with a diff of text files); write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Wait for another agentdiff running in this project instead of exiting 75.
    #[arg(long)]
    wait: bool,
    /// With --dry-run: show content diffs of sensitive files (denied changes, `.env*`, keys)
    /// instead of their sizes and hashes.
    #[arg(long)]
    show_secrets: bool,
    #[arg(long, value_enum, default_value_t = Format::Summary)]
    format: Format,
    /// Project root (default: the nearest directory holding .agentdiff/ or agentdiff.yaml, else
    /// the nearest VCS root, else the current directory).
    #[arg(long, value_name = "R")]
    root: Option<PathBuf>,
}

impl Args {
    /// A rollback of `run` limited to `paths` (none: the whole capsule), as `session rollback`
    /// asks for it.
    pub(crate) fn of(
        run: String,
        all: bool,
        paths: Vec<String>,
        dry_run: bool,
        wait: bool,
        format: Format,
        root: Option<PathBuf>,
    ) -> Args {
        Args {
            run,
            safe_only: !all,
            all,
            paths,
            dry_run,
            wait,
            show_secrets: false,
            format,
            root,
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let root = crate::common::context::project_root(args.root.as_deref())?.path;
    let store = Store::open_existing(&root).map_err(store_error)?;
    // A preview writes nothing and may run beside a run; a real rollback may not.
    let _lock = match args.dry_run {
        true => None,
        false => Some(crate::common::context::lock_store(&store, args.wait)?),
    };
    let capsule = store.open_run(&args.run).map_err(store_error)?;
    let selection = Selection {
        scope: if args.all {
            Scope::All
        } else {
            Scope::SafeOnly
        },
        paths: args.paths.clone(),
    };
    let mut plan =
        rollback::plan(&capsule, store.objects(), &root, &selection).map_err(rollback_error)?;
    plan.show_secrets = args.show_secrets;
    let opts = ExecuteOptions {
        dry_run: args.dry_run,
        fault: test_fault(),
    };
    let report = rollback::execute(&capsule, &plan, &opts).map_err(rollback_error)?;
    match args.format {
        Format::Summary => out!("{}", render_summary(&report)),
        Format::Json => outln!(
            "{}",
            serde_json::to_string_pretty(&report).context("cannot serialize the report")?
        ),
    }
    Ok(if report.has_conflicts() {
        ExitCode::from(exit::CONFLICT)
    } else {
        ExitCode::SUCCESS
    })
}

fn store_error(e: StoreError) -> anyhow::Error {
    let code = match e {
        StoreError::NoStore { .. }
        | StoreError::InvalidRunId { .. }
        | StoreError::RunNotFound { .. } => exit::NO_SUCH_RUN,
        StoreError::UnsafeStoreDir { .. } | StoreError::NotRegularFile { .. } => {
            exit::INVALID_CAPSULE
        }
        _ => exit::INTERNAL,
    };
    with_code(code, e)
}

fn rollback_error(e: RollbackError) -> anyhow::Error {
    let code = match &e {
        RollbackError::NotSealed { .. }
        | RollbackError::Verification { .. }
        | RollbackError::Malformed { .. }
        | RollbackError::UnsafePath { .. } => exit::INVALID_CAPSULE,
        // Writing the recovery record failed (a read-only or full store): the rollback could
        // not finish, which is not a verification failure.
        RollbackError::Store(StoreError::Io { .. }) => exit::CONFLICT,
        RollbackError::Store(_) => exit::INVALID_CAPSULE,
        RollbackError::Disabled { .. } => exit::INVALID_CONFIG,
        RollbackError::UnknownPath { .. }
        | RollbackError::InvalidPathArgument { .. }
        | RollbackError::RootMismatch { .. }
        | RollbackError::PrivateWorkspace { .. } => exit::USAGE,
        RollbackError::CrossesSymlink { .. } => exit::CONFLICT,
        RollbackError::Io { .. } | RollbackError::FaultInjected { .. } => exit::INTERNAL,
    };
    with_code(code, e)
}

/// Debug builds only: `AGENTDIFF_TEST_ROLLBACK_FAULT_AFTER=N` aborts the process after N write
/// steps, so tests can prove crash safety with a real crash. Release builds do not contain it.
#[cfg(debug_assertions)]
fn test_fault() -> Option<rollback::Fault> {
    let n = std::env::var("AGENTDIFF_TEST_ROLLBACK_FAULT_AFTER").ok()?;
    Some(rollback::Fault {
        after_ops: n.trim().parse().ok()?,
        action: rollback::FaultAction::Abort,
    })
}

#[cfg(not(debug_assertions))]
fn test_fault() -> Option<rollback::Fault> {
    None
}
