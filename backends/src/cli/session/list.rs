//! `agentdiff session list [--format summary|json]`: one line per session, oldest first, with
//! its calls, linked runs and denied calls (the rows the dashboard lists).

use std::path::PathBuf;
use std::process::ExitCode;

use agentdiff_host::redact::escape_terminal;
use agentdiff_store::StoreError;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Project root (default: discovered from the current directory, see docs/cli.md).
    #[arg(long)]
    root: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "summary")]
    format: crate::cli::inspect::Format,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let root = crate::common::context::project_root(args.root.as_deref())?.path;
    let invalid = |e| crate::common::exit::with_code(crate::common::exit::INVALID_CAPSULE, e);
    let rows = match agentdiff_store::Store::open_existing(&root) {
        Ok(store) => {
            agentdiff_report::session::list(&store, &super::agent_runs).map_err(invalid)?
        }
        Err(StoreError::NoStore { .. }) => Vec::new(),
        Err(e) => return Err(invalid(e)),
    };
    match args.format {
        crate::cli::inspect::Format::Json => outln!("{}", serde_json::to_string_pretty(&rows)?),
        crate::cli::inspect::Format::Summary => {
            if rows.is_empty() {
                errln!(
                    "no sessions recorded under {}",
                    escape_terminal(&root.display().to_string())
                );
            }
            for r in &rows {
                let outcome = match (r.status, r.changes) {
                    (Some(status), Some(n)) => format!("  {status:?} {n} change(s)").to_lowercase(),
                    _ => String::new(),
                };
                outln!(
                    "{}  {:<11}  {}  {} {}  {} call(s), {} linked run(s), {} denied{}",
                    r.id,
                    r.state.as_str(),
                    escape_terminal(&r.created_at),
                    escape_terminal(&r.agent),
                    escape_terminal(&r.agent_session_id),
                    r.calls,
                    r.linked_runs,
                    r.denied_calls,
                    outcome
                );
                if let Some(p) = &r.problem {
                    outln!("    problem: {}", escape_terminal(p));
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
