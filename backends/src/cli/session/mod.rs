//! `agentdiff session list | show ID | rollback ID | end ID`: agent sessions, each recorded as one
//! capsule of the run capsule format (see `agentdiff_engine::transaction::session`) by the
//! session hooks (`agentdiff hook session-start` …).
//!
//! A session is `open` while its capsule is unsealed and the agent process that started it
//! lives, `interrupted` when it is unsealed and that process is gone (the agent was killed, or
//! its SessionEnd hook failed), `ended` once sealed. `session end` seals an interrupted one.

use std::path::Path;

use agentdiff_store::schema::Metadata;
use agentdiff_store::{Artifact, Capsule, Store, StoreError};

use crate::common::exit::{self, with_code};

mod end;
mod list;
mod rollback;
mod show;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// List recorded sessions with their state (open, interrupted, ended).
    List(list::Args),
    /// Show a session: every tool call, every change with the calls that could have made it.
    Show(show::Args),
    /// Undo a session's changes where nothing was edited since (the run rollback's rules).
    Rollback(rollback::Args),
    /// Seal a session whose end never came (after-scan, attribution, seal).
    End(end::Args),
}

pub fn run(command: Command) -> anyhow::Result<std::process::ExitCode> {
    match command {
        Command::List(a) => list::run(a),
        Command::Show(a) => show::run(a),
        Command::Rollback(a) => rollback::run(a),
        Command::End(a) => end::run(a),
    }
}

pub use agentdiff_report::session::{agent_runs, SessionState as State};

/// The state of a session capsule with this metadata.
pub fn state(capsule: &Capsule, metadata: &Metadata) -> State {
    match &metadata.session {
        Some(meta) => agentdiff_report::session::state(capsule, meta, &agent_runs),
        None if capsule.is_sealed() => State::Ended,
        None => State::Interrupted,
    }
}

/// The project's store (exit 66 when there is none).
pub fn store(root: &Path) -> anyhow::Result<Store> {
    Store::open_existing(root).map_err(store_error)
}

/// Session `id`: its capsule and metadata; a run that is not a session exits 66 too.
pub fn open(store: &Store, id: &str) -> anyhow::Result<(Capsule, Metadata)> {
    let capsule = store.open_run(id).map_err(store_error)?;
    let metadata: Metadata = capsule
        .read_artifact(Artifact::Metadata)
        .map_err(|e| with_code(exit::INVALID_CAPSULE, e))?;
    if metadata.session.is_none() {
        return Err(with_code(
            exit::NO_SUCH_RUN,
            anyhow::anyhow!(
                "`{id}` is a run, not a session: `agentdiff session list` lists the sessions"
            ),
        ));
    }
    Ok((capsule, metadata))
}

fn store_error(e: StoreError) -> anyhow::Error {
    let code = match e {
        StoreError::NoStore { .. }
        | StoreError::InvalidRunId { .. }
        | StoreError::RunNotFound { .. } => exit::NO_SUCH_RUN,
        _ => exit::INVALID_CAPSULE,
    };
    with_code(code, e)
}
