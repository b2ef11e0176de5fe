//! Agent sessions: a whole agent session recorded as one capsule of the run capsule format, so
//! `verify`, `inspect`, `attest` and rollback work on it unchanged. `metadata.json` carries
//! [`SessionMeta`]; `events.jsonl` carries one `tool_call` event per agent tool call
//! ([`ToolCallRecord`]) and, before the seal, one `session_ended` event ([`SessionEnd`]) with each
//! change attributed to the calls that could have made it.
//!
//! A session spans processes: [`open`] (the agent's session start) creates the capsule and takes
//! the before-scan with backups through the transaction's own capture ([`CapturePlan::before`]);
//! [`record_call`] appends calls; [`end`] takes the after-scan, classifies every change with the
//! policy through the transaction's decision step, attributes, and seals. The caller holds the
//! project lock only while [`open`] and [`end`] run: every sandboxed shell call of the session is
//! a run that takes the lock itself.
//!
//! Invariants: a sealed session is never written again (`AlreadyEnded`); a change no recorded
//! call names is `unattributed`, never guessed; the classification is the policy's, as for a run.
//!
//! Not defended: between start and end the capsule is unsealed and owned by the user the agent
//! runs as, so a process of that user outside any sandbox (a file tool is judged, not sandboxed)
//! could rewrite its before-state or log before the seal; the agent hook denies file-tool writes
//! below `.agentdiff/`, and sandboxed shell calls cannot write there. A shell call is attributed
//! from its own run's recorded changes, read without verifying that run's seal (`verify` does).
//! The after-scan does not use the scan record of the last run (its objects may be claimed only
//! by a run that holds the lock from before- to after-scan).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::json;

use super::capture::CapturePlan;
use super::decide::{self, Evidence, RunFrame};
use super::{resolve_root, seal, TransactionError};
use agentdiff_backend_api::RunEvidence;
use agentdiff_policy::{Action, LoadedPolicy};
use agentdiff_store::schema::{
    ChangeAttribution, Metadata, RunResult, SessionEnd, SessionMeta, ToolCallRecord,
};
use agentdiff_store::seal::{SealAuthority, StateDir};
use agentdiff_store::{Artifact, Capsule, PolicyDoc, Store, StoreError};

/// The `backend` a session capsule's metadata names: nothing was launched by it.
pub const SESSION_BACKEND: &str = "session";

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Transaction(#[from] TransactionError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("`{id}` is a run, not a session: `agentdiff session list` lists the sessions")]
    NotASession { id: String },
    #[error("session {id} has already ended (its capsule is sealed): nothing was changed")]
    AlreadyEnded { id: String },
    #[error("could not record the session's log: {0}")]
    Log(#[source] serde_json::Error),
    #[error("could not lock the session {id} for its log: {source}")]
    LogLock {
        id: String,
        #[source]
        source: std::io::Error,
    },
}

/// The `--task` of the run a sandboxed shell call becomes: how a session finds its runs.
pub fn shell_task(tool_use_id: Option<&str>, session_id: Option<&str>) -> String {
    format!(
        "Claude Code Bash call {} in session {}",
        tool_use_id.unwrap_or("(no id)"),
        session_id.unwrap_or("(no id)")
    )
}

/// What opening a session needs.
pub struct SessionStart<'a> {
    pub root: PathBuf,
    pub policy: &'a LoadedPolicy,
    pub meta: SessionMeta,
    pub state_dir: Option<StateDir>,
}

/// Creates the session capsule and takes its before-scan (with the backups rollback needs).
/// Returns the capsule's id. Everything written is durable on return: the capsule is sealed by
/// another process.
pub fn open(req: SessionStart<'_>) -> Result<String, SessionError> {
    let root = resolve_root(&req.root)?;
    let state_dir = req.state_dir.clone().map_or_else(StateDir::from_env, Ok)?;
    let authority = SealAuthority::open(&state_dir, &root)?;
    let store = Store::open(&root)?;
    store.objects().load_verified_cache(authority.key());
    let capsule = store.create_run_unnoted(None)?;
    let id = capsule.id().to_string();
    let metadata = Metadata {
        schema_version: agentdiff_store::SCHEMA_VERSION,
        run_id: id.clone(),
        created_at: seal::now(),
        agentdiff_version: env!("CARGO_PKG_VERSION").to_string(),
        root: root.display().to_string(),
        argv: Vec::new(),
        task: Some(format!(
            "{} session {}",
            req.meta.agent, req.meta.agent_session_id
        )),
        backend: SESSION_BACKEND.to_string(),
        timeout_seconds: None,
        platform: format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH),
        uid: super::current_uid(),
        session: Some(req.meta),
    };
    capsule.write_artifact(Artifact::Metadata, &metadata)?;
    let policy_doc = PolicyDoc::of(req.policy).map_err(TransactionError::EffectivePolicy)?;
    capsule.write_artifact(Artifact::Policy, &policy_doc)?;
    capsule.event("capsule_created", json!({ "run_id": id }))?;
    capsule.event("session_started", json!({}))?;
    let capture = CapturePlan::new(
        &store,
        &capsule,
        &req.policy.policy,
        &authority,
        false,
        None,
    );
    let recent = authority.recent_sealed_runs(agentdiff_store::WATCHED_SEALED_RUNS);
    let previous = capture.previous_scan(&root, &recent);
    capture.before(&root, previous, None)?;
    store.flush_pending()?;
    Ok(id)
}

/// An unsealed session capsule and its metadata.
fn open_session(store: &Store, id: &str) -> Result<(Capsule, Metadata), SessionError> {
    let capsule = store.open_run(id)?;
    let metadata: Metadata = capsule.read_artifact(Artifact::Metadata)?;
    if metadata.session.is_none() {
        return Err(SessionError::NotASession { id: id.to_string() });
    }
    if capsule.is_sealed() {
        return Err(SessionError::AlreadyEnded { id: id.to_string() });
    }
    Ok((capsule, metadata))
}

/// Appends one call to the session's log. Calls of one session may end at once: the log is
/// appended under a lock of the capsule directory (not the project lock, which a running shell
/// call holds).
pub fn record_call(store: &Store, id: &str, call: &ToolCallRecord) -> Result<(), SessionError> {
    let (capsule, _) = open_session(store, id)?;
    let fields = serde_json::to_value(call).map_err(SessionError::Log)?;
    let _held = lock_log(&capsule)?;
    // The end may have sealed it while this waited for the lock.
    if capsule.is_sealed() {
        return Err(SessionError::AlreadyEnded { id: id.to_string() });
    }
    capsule.event("tool_call", fields)?;
    store.flush_pending()?;
    Ok(())
}

/// The lock of a session's log: taken to append a call, and by the end from reading the calls to
/// the seal, so no call lands in a log already sealed (it would break the seal).
fn lock_log(capsule: &Capsule) -> Result<nix::fcntl::Flock<std::fs::File>, SessionError> {
    let lock_error = |source| SessionError::LogLock {
        id: capsule.id().to_string(),
        source,
    };
    let dir = std::fs::File::open(capsule.dir()).map_err(lock_error)?;
    nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, errno)| lock_error(std::io::Error::from(errno)))
}

/// The sessions of `agent_session_id` still open (newest last).
pub fn open_sessions_of(store: &Store, agent_session_id: &str) -> Result<Vec<String>, StoreError> {
    let mut out = Vec::new();
    for id in store.run_ids()? {
        let Ok(capsule) = store.open_run(id.as_str()) else {
            continue;
        };
        if capsule.is_sealed() {
            continue;
        }
        let Ok(metadata) = capsule.read_artifact::<Metadata>(Artifact::Metadata) else {
            continue;
        };
        if metadata
            .session
            .is_some_and(|s| s.agent_session_id == agent_session_id)
        {
            out.push(id.to_string());
        }
    }
    Ok(out)
}

/// The runs created after the session `session` whose task is `task` (see [`shell_task`]).
pub fn runs_with_task(store: &Store, session: &str, task: &str) -> Vec<String> {
    runs_after(store, session)
        .into_iter()
        .filter(|(_, t)| t == task)
        .map(|(id, _)| id)
        .collect()
}

/// The runs created after `session`, with their tasks.
fn runs_after(store: &Store, session: &str) -> Vec<(String, String)> {
    let Ok(ids) = store.run_ids() else {
        return Vec::new();
    };
    // Ids start with their creation second (`YYYYMMDDTHHMMSSZ-…`); within that second their
    // random part orders them arbitrarily, so the whole second counts.
    let second = |id: &str| id.split('-').next().unwrap_or_default().to_string();
    let since = second(session);
    ids.into_iter()
        .filter(|id| id.as_str() != session && second(id.as_str()) >= since)
        .filter_map(|id| {
            let capsule = store.open_run(id.as_str()).ok()?;
            let metadata: Metadata = capsule.read_artifact(Artifact::Metadata).ok()?;
            Some((id.to_string(), metadata.task?))
        })
        .collect()
}

/// What ending a session needs.
pub struct SessionClose<'a> {
    pub root: PathBuf,
    /// The policy in force now; a policy changed since the start is a warning of the session.
    pub policy: &'a LoadedPolicy,
    /// The session capsule's id.
    pub id: String,
    /// `session_end` or `closed` (see [`SessionEnd::ended_by`]).
    pub ended_by: String,
    pub reason: Option<String>,
    pub state_dir: Option<StateDir>,
}

/// Takes the after-scan, classifies, attributes and seals the session.
pub fn end(req: SessionClose<'_>) -> Result<RunResult, SessionError> {
    let started = Instant::now();
    let root = resolve_root(&req.root)?;
    let state_dir = req.state_dir.clone().map_or_else(StateDir::from_env, Ok)?;
    let authority = SealAuthority::open(&state_dir, &root)?;
    let store = Store::open(&root)?;
    let (capsule, metadata) = open_session(&store, &req.id)?;
    let policy = &req.policy.policy;
    let capture = CapturePlan::new(&store, &capsule, policy, &authority, false, None);
    let (manifest, object) = capsule.read_manifest_header(Artifact::Before)?;
    let before = super::capture::Captured {
        manifest,
        root_tree: object.hex().to_string(),
        failed_backups: Default::default(),
        spool: None,
        digests: None,
    };
    let after = capture.after(&root, &before, false)?;
    // No capsule guard runs across a session (see capsule-format.md): nothing unreadable to add.
    let comparison = super::compare(&store, &before, &after, &None);
    let run = RunEvidence {
        backend: SESSION_BACKEND.to_string(),
        exit: agentdiff_backend_api::ExitInfo {
            code: Some(0),
            ..Default::default()
        },
        observation_root: root.display().to_string(),
        ..Default::default()
    };
    let command_decision = agentdiff_policy::Decision {
        action: Action::Allow,
        subject: SESSION_BACKEND.to_string(),
        rule: "session".to_string(),
        pattern: None,
        reason: "an agent session runs no command of its own".to_string(),
        policy_version: policy.version(),
        phase: agentdiff_policy::Phase::Command,
    };
    let evidence = Evidence {
        policy,
        command_decision: &command_decision,
        before: &before.manifest,
        after: &after.manifest,
        comparison: &comparison,
        run: &run,
        private_workspace: false,
        verified_controls: &[],
        capsule_tampered: &[],
        git_dirs: &agentdiff_host::git_dirs::discover(&root).relative_to(&root),
        // A session's own calls run no proxy; its shell calls' runs carry their own evidence.
        network: None,
    };
    let frame = RunFrame {
        run_id: req.id.clone(),
        task: metadata.task.clone(),
        started_at: metadata.created_at.clone(),
        finished_at: seal::now(),
        duration_ms: started.elapsed().as_millis() as u64,
    };
    let mut result = decide::decide(&evidence, frame);
    // A session launched nothing: there is no runtime evidence to show.
    result.runtime = None;
    if policy_changed(&capsule, req.policy) {
        result.observation_warnings.push(
            "the policy changed during the session: its changes are classified by the policy \
             in force at its end"
                .to_string(),
        );
        if result.safety_outcome == Action::Allow {
            result.safety_outcome = Action::Review;
            result.status = decide::status(&run.exit, None, Action::Review);
        }
    }
    let _held = lock_log(&capsule)?;
    if capsule.is_sealed() {
        return Err(SessionError::AlreadyEnded { id: req.id });
    }
    let calls = read_calls(&capsule)?;
    let session_id = metadata.session.map(|s| s.agent_session_id);
    let linked = linked_runs(&store, &req.id, session_id.as_deref(), &calls);
    let ended = SessionEnd {
        ended_by: req.ended_by,
        reason: req.reason,
        attributions: attribute(&store, &result, &calls, &linked),
        linked_runs: linked,
        denied_calls: calls
            .iter()
            .filter(|c| c.outcome == "denied")
            .map(call_name)
            .collect(),
    };
    let fields = serde_json::to_value(&ended).map_err(SessionError::Log)?;
    capsule.event("session_ended", fields)?;
    capsule.write_artifact(Artifact::Result, &result)?;
    capsule.event(
        "decided",
        json!({ "status": result.status, "safety_outcome": result.safety_outcome }),
    )?;
    let referenced = [before.root_tree.clone(), after.root_tree.clone()];
    capsule.seal_with(&referenced, Some(&authority))?;
    Ok(result)
}

/// Whether the policy in force differs from the one the session recorded at its start.
fn policy_changed(capsule: &Capsule, now: &LoadedPolicy) -> bool {
    let recorded: Result<PolicyDoc, _> = capsule.read_artifact(Artifact::Policy);
    match (recorded, PolicyDoc::of(now)) {
        (Ok(recorded), Ok(now)) => recorded.effective != now.effective,
        _ => true,
    }
}

/// The session's `tool_call` events.
pub fn read_calls(capsule: &Capsule) -> Result<Vec<ToolCallRecord>, SessionError> {
    let mut out = Vec::new();
    for event in capsule.read_events()? {
        if event.get("event").and_then(|e| e.as_str()) != Some("tool_call") {
            continue;
        }
        out.push(serde_json::from_value(event).map_err(SessionError::Log)?);
    }
    Ok(out)
}

/// How a call is named in attributions.
fn call_name(call: &ToolCallRecord) -> String {
    call.tool_use_id
        .clone()
        .unwrap_or_else(|| call.tool.clone())
}

/// The runs of the session's shell calls: those its log names, and any other run whose task
/// says it is a shell call of this session (a call whose `PostToolUse` never came).
fn linked_runs(
    store: &Store,
    id: &str,
    session_id: Option<&str>,
    calls: &[ToolCallRecord],
) -> Vec<String> {
    let mut runs: Vec<String> = calls.iter().filter_map(|c| c.run_id.clone()).collect();
    if let Some(sid) = session_id {
        let suffix = format!(" in session {sid}");
        for (run, task) in runs_after(store, id) {
            if task.starts_with("Claude Code Bash call ") && task.ends_with(&suffix) {
                runs.push(run);
            }
        }
    }
    runs.sort();
    runs.dedup();
    runs
}

/// Each change of the session with the calls that could have made it.
fn attribute(
    store: &Store,
    result: &RunResult,
    calls: &[ToolCallRecord],
    linked: &[String],
) -> Vec<ChangeAttribution> {
    let run_changes: Vec<(String, Vec<String>)> = linked
        .iter()
        .map(|run| (run.clone(), changes_of(store, run)))
        .collect();
    result
        .changes
        .iter()
        .map(|change| {
            let path = change.path.as_str();
            let covers = |named: &str| named == path || is_below(named, path);
            let mut names = Vec::new();
            let mut runs = Vec::new();
            for call in calls
                .iter()
                .filter(|c| !matches!(c.outcome.as_str(), "denied" | "asked"))
            {
                if call.paths.iter().any(|p| covers(p)) {
                    names.push(call_name(call));
                }
            }
            for (run, changed) in &run_changes {
                if changed.iter().any(|p| covers(p)) {
                    runs.push(run.clone());
                    let call = calls.iter().find(|c| c.run_id.as_deref() == Some(run));
                    names.push(call.map_or_else(|| format!("run {run}"), call_name));
                }
            }
            ChangeAttribution {
                path: path.to_string(),
                decision: change.decision,
                unattributed: names.is_empty(),
                calls: names,
                runs,
            }
        })
        .collect()
}

/// Whether `path` lies below the directory `dir` (a directory a call's file created with it).
fn is_below(path: &str, dir: &str) -> bool {
    path.strip_prefix(dir)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// The paths a run recorded as changed (none when its result cannot be read).
fn changes_of(store: &Store, run: &str) -> Vec<String> {
    store
        .open_run(run)
        .and_then(|c| c.read_artifact::<RunResult>(Artifact::Result))
        .map(|r| r.changes.into_iter().map(|c| c.path).collect())
        .unwrap_or_default()
}

/// A tool's path as the session records it: relative to the root when below it.
pub fn relative_path(root: &Path, cwd: Option<&Path>, named: &str) -> String {
    let path = Path::new(named);
    let absolute = match (path.is_absolute(), cwd) {
        (true, _) => path.to_path_buf(),
        (false, Some(cwd)) => cwd.join(path),
        (false, None) => root.join(path),
    };
    match absolute.strip_prefix(root) {
        Ok(rel) => rel.to_string_lossy().into_owned(),
        Err(_) => named.to_string(),
    }
}
