//! `agentdiff runs`: list stored runs with their start time, backend, status, verified seal
//! state, change counts and task.

use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;

use agentdiff_engine::redact::escape_terminal;
use agentdiff_engine::store::seal::VerifyContext;
use agentdiff_engine::store::{Artifact, Capsule, Store, StoreError, Verdict};
use agentdiff_engine::transaction::RunResult;

use crate::exit;

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

/// One listed run. Every field comes from what the capsule holds; the seal is checked as
/// `agentdiff verify` checks it, never inferred from integrity.json being present.
#[derive(Debug, Serialize)]
struct Row {
    id: String,
    started_at: Option<String>,
    backend: Option<String>,
    /// result.json's status, or `interrupted` when the run never wrote its result.
    status: String,
    /// Whether the seal is intact (`verified`), present but not matching (`broken`), or absent.
    seal: Seal,
    /// `agentdiff verify`'s verdict: `verified` above is `authenticated` only when the seal's
    /// MAC checks under this user's key.
    verdict: Option<Verdict>,
    /// The first problem of a broken seal or an unreadable entry.
    problem: Option<String>,
    changes: Option<Counts>,
    task: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Seal {
    Verified,
    Broken,
    Unsealed,
}

#[derive(Debug, Serialize)]
struct Counts {
    total: usize,
    expected: u64,
    review: u64,
    protected: u64,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(Action::Prune(prune)) = args.action {
        return super::runs_prune::run(prune);
    }
    let root = super::project_root(args.root.as_deref())?;
    let store = match Store::open_existing(&root.path) {
        Ok(store) => Some(store),
        // No store yet: no runs, which is not an error.
        Err(StoreError::NoStore { .. }) => None,
        Err(e) => return Err(exit::with_code(exit::INVALID_CAPSULE, e)),
    };
    let listings = match &store {
        Some(store) => store
            .list_runs()
            .map_err(|e| exit::with_code(exit::INTERNAL, e))?,
        None => Vec::new(),
    };
    // The same key and ledger as `agentdiff verify`, so "verified" means authenticated here.
    let (ctx, _) = super::verify::context(&root.path);
    let rows: Vec<Row> = match &store {
        Some(store) => listings.iter().map(|l| row(store, &ctx, l)).collect(),
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

fn row(store: &Store, ctx: &VerifyContext, listing: &agentdiff_engine::store::RunListing) -> Row {
    let mut row = Row {
        id: listing.id.to_string(),
        started_at: listing.created_at.clone(),
        backend: None,
        status: "interrupted".into(),
        seal: Seal::Unsealed,
        verdict: None,
        problem: listing.problem.clone(),
        changes: None,
        task: None,
    };
    let capsule = match store.open_run(listing.id.as_str()) {
        Ok(c) => c,
        Err(e) => {
            row.problem = Some(e.to_string());
            return row;
        }
    };
    if let Ok(meta) = capsule.metadata() {
        row.backend = Some(meta.backend);
        row.task = meta.task;
        row.started_at = Some(meta.created_at);
    }
    if let Some(result) = read_result(&capsule) {
        row.status = result.status.as_str().to_string();
        if let Some(rt) = &result.runtime {
            row.backend = Some(rt.backend.clone());
        }
        row.changes = Some(Counts {
            total: result.changes.len(),
            expected: result.summary.expected,
            review: result.summary.unexpected,
            protected: result.summary.protected,
        });
    }
    let report = capsule.verify_with(store.objects(), ctx);
    row.verdict = report.as_ref().ok().map(|r| r.verdict);
    match report {
        Ok(report) if report.ok => row.seal = Seal::Verified,
        Ok(report) if report.sealed => {
            row.seal = Seal::Broken;
            row.problem = report
                .problems
                .first()
                .map(|p| format!("{}: {}", p.subject, p.problem));
        }
        Ok(_) => row.seal = Seal::Unsealed,
        Err(e) => {
            row.seal = Seal::Broken;
            row.problem = Some(e.to_string());
        }
    }
    row
}

fn read_result(capsule: &Capsule) -> Option<RunResult> {
    if std::fs::symlink_metadata(capsule.dir().join(Artifact::Result.file_name())).is_err() {
        return None;
    }
    capsule.result().ok()
}

fn render(r: &Row) -> String {
    let changes = match &r.changes {
        Some(c) => format!(
            "{} changes ({} expected, {} review, {} protected)",
            c.total, c.expected, c.review, c.protected
        ),
        None => "changes unknown".to_string(),
    };
    let seal = match (r.seal, r.verdict) {
        (Seal::Verified, Some(Verdict::Authenticated)) => "seal verified".to_string(),
        (Seal::Verified, _) => "seal intact, NOT authenticated here (agentdiff verify RUN)".into(),
        (Seal::Broken, _) => "SEAL BROKEN (agentdiff verify RUN)".to_string(),
        (Seal::Unsealed, _) => format!(
            "NOT sealed (interrupted; see agentdiff inspect {0}, agentdiff cleanup {0})",
            escape_terminal(&r.id)
        ),
    };
    let mut line = format!(
        "{}  {}  {}  {}  {}  {}",
        escape_terminal(&r.id),
        escape_terminal(r.started_at.as_deref().unwrap_or("-")),
        escape_terminal(r.backend.as_deref().unwrap_or("-")),
        escape_terminal(&r.status),
        seal,
        changes,
    );
    if let Some(task) = &r.task {
        line.push_str(&format!("  task: {}", escape_terminal(task)));
    }
    if let Some(p) = &r.problem {
        line.push_str(&format!("\n    problem: {}", escape_terminal(p)));
    }
    line
}
