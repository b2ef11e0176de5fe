//! `agentdiff runs prune`: remove old runs, then every object no remaining run references, under
//! the project lock; `--dry-run` lists what would go.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use agentdiff_host::redact::escape_terminal;
use agentdiff_store::seal::{SealAuthority, StateDir};
use agentdiff_store::{PruneRunsReport, PruneSelection, Store, StoreError};

use crate::common::exit;

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("selection").required(true).args(["keep", "older_than"])))]
pub struct Args {
    /// Project root (default: discovered from the current directory, see docs/cli.md).
    #[arg(long)]
    root: Option<PathBuf>,
    /// Keep the newest N authenticated runs (by sealed creation time) and remove the older ones.
    #[arg(long, value_name = "N")]
    keep: Option<usize>,
    /// Remove the authenticated runs created longer ago than D (`90s`, `12h`, `7d`, `2weeks`).
    #[arg(long, value_name = "D", value_parser = super::run::parse_duration)]
    older_than: Option<Duration>,
    /// List what would be removed and the bytes it would free; remove nothing.
    #[arg(long)]
    dry_run: bool,
    /// Wait for another agentdiff in this project to finish instead of failing (exit 75).
    #[arg(long)]
    wait: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "summary")]
    format: super::inspect::Format,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let selection = match (args.keep, args.older_than) {
        (Some(n), _) => PruneSelection::Keep(n),
        (None, Some(age)) => PruneSelection::OlderThan(age),
        (None, None) => {
            return Err(exit::with_code(
                exit::USAGE,
                anyhow::anyhow!("give --keep N or --older-than D"),
            ))
        }
    };
    let root = crate::common::context::project_root(args.root.as_deref())?;
    let store = match Store::open_existing(&root.path) {
        Ok(store) => store,
        Err(StoreError::NoStore { .. }) => {
            errln!(
                "no runs recorded under {}; nothing to prune",
                escape_terminal(&root.path.display().to_string())
            );
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(exit::with_code(exit::INVALID_CAPSULE, e)),
    };
    // A removed run is recorded in this user's ledger, so `verify --all` knows it went on purpose.
    let state = StateDir::from_env().map_err(|e| exit::with_code(exit::INTERNAL, e))?;
    let authority = (!args.dry_run)
        .then(|| SealAuthority::open(&state, &root.path))
        .transpose()
        .map_err(|e| exit::with_code(exit::INTERNAL, e))?;
    // Only runs whose seal authenticates here are removed; the others are evidence and stay.
    let (ctx, _) = crate::common::context::verify_context(&root.path);
    let lock = crate::common::context::lock_store(&store, args.wait)?;
    let report = store
        .prune_runs(&lock, selection, args.dry_run, &ctx, authority.as_ref())
        .map_err(|e| exit::with_code(exit::INTERNAL, e))?;
    match args.format {
        super::inspect::Format::Json => outln!(
            "{}",
            serde_json::to_string_pretty(&report).context("serialising the report")?
        ),
        super::inspect::Format::Summary => render(&report),
    }
    Ok(ExitCode::SUCCESS)
}

fn render(r: &PruneRunsReport) {
    let verb = if r.dry_run { "would remove" } else { "removed" };
    for run in &r.runs_removed {
        outln!(
            "{verb} run {}  {}  {} bytes",
            escape_terminal(&run.id),
            escape_terminal(run.created_at.as_deref().unwrap_or("-")),
            run.bytes
        );
    }
    for id in &r.unsealed_kept {
        outln!(
            "left run {} in place, not counted as a kept run: it has no seal (see agentdiff \
             inspect {0}, agentdiff cleanup {0})",
            escape_terminal(id)
        );
    }
    for run in &r.unverified_kept {
        outln!(
            "left run {} in place, not counted as a kept run: its seal does not authenticate \
             here ({}) — see agentdiff verify {0}; remove its directory by hand if you mean to",
            escape_terminal(&run.id),
            escape_terminal(run.problem.as_deref().unwrap_or("not authenticated"))
        );
    }
    outln!(
        "{} {} run(s) and {} object(s), {} bytes ({} of objects); {} authenticated run(s) and {} \
         object(s) kept",
        if r.dry_run { "would free:" } else { "freed:" },
        r.runs_removed.len(),
        r.objects_removed,
        r.bytes_freed,
        r.object_bytes_freed,
        r.runs_kept,
        r.objects_kept
    );
    if let Some(why) = &r.sweep_skipped {
        outln!("objects not swept: {}", escape_terminal(why));
    }
}
