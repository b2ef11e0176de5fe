//! `agentdiff session list [--format summary|json]`: one line per session, oldest first.

use std::path::PathBuf;
use std::process::ExitCode;

use agentdiff_host::redact::escape_terminal;
use agentdiff_store::schema::{Metadata, RunResult};
use agentdiff_store::{Artifact, StoreError};

use super::State;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Project root (default: discovered from the current directory, see docs/cli.md).
    #[arg(long)]
    root: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "summary")]
    format: crate::cli::inspect::Format,
}

/// One session as listed.
#[derive(Debug, serde::Serialize)]
struct Row {
    id: String,
    agent: String,
    agent_session_id: String,
    state: State,
    created_at: String,
    /// `status` of the sealed result (ended sessions only).
    status: Option<agentdiff_store::schema::Status>,
    changes: Option<usize>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let root = crate::common::context::project_root(args.root.as_deref())?.path;
    let store = match agentdiff_store::Store::open_existing(&root) {
        Ok(store) => Some(store),
        Err(StoreError::NoStore { .. }) => None,
        Err(e) => {
            return Err(crate::common::exit::with_code(
                crate::common::exit::INVALID_CAPSULE,
                e,
            ))
        }
    };
    let mut rows = Vec::new();
    for id in store
        .as_ref()
        .map(|s| s.run_ids())
        .transpose()?
        .unwrap_or_default()
    {
        let Some(store) = &store else { break };
        let Ok(capsule) = store.open_run(id.as_str()) else {
            continue;
        };
        let Ok(metadata) = capsule.read_artifact::<Metadata>(Artifact::Metadata) else {
            continue;
        };
        let Some(session) = metadata.session.clone() else {
            continue;
        };
        let state = super::state(&capsule, &metadata);
        let result = (state == State::Ended)
            .then(|| capsule.read_artifact::<RunResult>(Artifact::Result).ok())
            .flatten();
        rows.push(Row {
            id: id.to_string(),
            agent: session.agent,
            agent_session_id: session.agent_session_id,
            state,
            created_at: metadata.created_at,
            status: result.as_ref().map(|r| r.status),
            changes: result.as_ref().map(|r| r.changes.len()),
        });
    }
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
                    (Some(status), Some(n)) => format!("{status:?} {n} change(s)").to_lowercase(),
                    _ => String::new(),
                };
                outln!(
                    "{}  {:<11}  {}  {} {}  {}",
                    r.id,
                    r.state.as_str(),
                    escape_terminal(&r.created_at),
                    escape_terminal(&r.agent),
                    escape_terminal(&r.agent_session_id),
                    outcome
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
