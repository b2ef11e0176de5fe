//! `agentdiff runs`: list stored runs with their start time, backend, status, verified seal
//! state, change counts and task.

use std::path::PathBuf;
use std::process::ExitCode;

use agentdiff_host::redact::escape_terminal;
use agentdiff_report::listing::{self, RunRow, SealState};
use agentdiff_store::{Store, StoreError, Verdict};

use crate::common::exit;

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    action: Option<Action>,
    /// Project root (default: discovered from the current directory, see docs/cli.md).
    #[arg(long)]
    root: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "summary")]
    format: super::inspect::Format,
}

#[derive(Debug, clap::Subcommand)]
enum Action {
    /// Remove old runs, then every object no remaining run references (bytes freed reported).
    Prune(super::runs_prune::Args),
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(Action::Prune(prune)) = args.action {
        return super::runs_prune::run(prune);
    }
    let root = crate::common::context::project_root(args.root.as_deref())?;
    let store = match Store::open_existing(&root.path) {
        Ok(store) => Some(store),
        // No store yet: no runs, which is not an error.
        Err(StoreError::NoStore { .. }) => None,
        Err(e) => return Err(exit::with_code(exit::INVALID_CAPSULE, e)),
    };
    // The same key and ledger as `agentdiff verify`, so "verified" means authenticated here.
    let (ctx, _) = crate::common::context::verify_context(&root.path);
    let rows: Vec<RunRow> = match &store {
        Some(store) => {
            listing::list(store, &ctx).map_err(|e| exit::with_code(exit::INTERNAL, e))?
        }
        None => Vec::new(),
    };
    match args.format {
        super::inspect::Format::Json => outln!("{}", serde_json::to_string_pretty(&rows)?),
        super::inspect::Format::Summary => {
            if rows.is_empty() {
                errln!(
                    "no runs recorded under {}",
                    escape_terminal(&root.path.display().to_string())
                );
            }
            for r in &rows {
                outln!("{}", render(r));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn render(r: &RunRow) -> String {
    let changes = match &r.changes {
        Some(c) => format!(
            "{} changes ({} expected, {} review, {} protected)",
            c.total, c.expected, c.review, c.protected
        ),
        None => "changes unknown".to_string(),
    };
    let seal = match (r.seal, r.verdict) {
        (SealState::Verified, Some(Verdict::Authenticated)) => "seal verified".to_string(),
        (SealState::Verified, _) => {
            "seal intact, NOT authenticated here (agentdiff verify RUN)".into()
        }
        (SealState::Broken, _) => "SEAL BROKEN (agentdiff verify RUN)".to_string(),
        (SealState::Unsealed, _) => format!(
            "NOT sealed (interrupted; see agentdiff inspect {0}, agentdiff cleanup {0})",
            escape_terminal(&r.id)
        ),
    };
    let mut line = format!(
        "{}  {}  {}  {}  {}  {}",
        escape_terminal(&r.id),
        escape_terminal(r.started_at.as_deref().unwrap_or("-")),
        escape_terminal(r.backend.as_deref().unwrap_or("-")),
        r.state.word(),
        seal,
        changes,
    );
    if let Some(refused) = r.egress_denied.filter(|n| *n > 0) {
        line.push_str(&format!("  {refused} connection(s) refused"));
    }
    if let Some(task) = &r.task {
        line.push_str(&format!("  task: {}", escape_terminal(task)));
    }
    if let Some(p) = &r.problem {
        line.push_str(&format!("\n    problem: {}", escape_terminal(p)));
    }
    line
}
