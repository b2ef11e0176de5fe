//! The evidence transaction (seed 003 lifecycle):
//!
//! policy load → private run capsule → command decision (deny = blocked, never launched) →
//! before manifest + backups → backend launch → process/port observation → after manifest →
//! path decisions → limits → blast radius → durable result → seal.
//!
//! The command decision comes before the before-scan (the seed lists it after): a command that
//! will never run needs no tree captured, and the capsule still records the refusal.

mod classify;
mod guard;
mod result;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;

pub use classify::{classify_changes, evaluate_limits};
pub use result::{
    ChangeRecord, LimitViolation, Metadata, RunResult, RuntimeSummary, Status, Summary,
    VerifiedControl,
};

use crate::backend::{
    Availability, BackendError, BackendOptions, LaunchContext, LaunchSpec, RunEvidence,
    RuntimeBackend, StdioMode, WorkspaceMode,
};
use crate::environment::{self, EnvMode};
use crate::fs::{self, BackupRequest, IgnoreSource, Manifest, ScanOptions, ScanProgress};
use crate::policy::{Action, LoadedPolicy, NetworkMode};
use crate::redact;
use crate::score;
use crate::store::seal::{MacPurpose, SealAuthority, SealKey, StateDir};
use crate::store::{Artifact, Capsule, Store};

#[derive(Debug, thiserror::Error)]
pub enum TransactionError {
    #[error("project root {path}: {message}")]
    Root { path: PathBuf, message: String },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("scanning the project tree failed: {0}")]
    Scan(#[from] crate::fs::ScanError),
    #[error("the command is empty: give the command after `--`")]
    EmptyCommand,
    #[error("could not prepare the private workspace: {0}")]
    Workspace(String),
}

/// Progress callback for long scans (phase name, progress).
pub type ProgressFn<'a> = &'a (dyn Fn(&str, &ScanProgress) + Sync);

/// Everything a run needs.
pub struct RunRequest<'a> {
    pub root: PathBuf,
    pub policy: LoadedPolicy,
    pub argv: Vec<OsString>,
    pub task: Option<String>,
    /// `--timeout`; the effective deadline is the smaller of this and `limits.duration_seconds`.
    pub timeout: Option<Duration>,
    pub run_id: Option<String>,
    pub backend: &'a dyn RuntimeBackend,
    pub options: BackendOptions,
    pub stdio: StdioMode,
    pub interrupt: tokio::sync::watch::Receiver<Option<i32>>,
    /// Environment handling; `None` takes the policy's.
    pub env_mode: Option<EnvMode>,
    /// Extra variable names to pass when scrubbing.
    pub env_pass: Vec<String>,
    pub grace: Duration,
    pub poll_interval: Duration,
    pub progress: Option<ProgressFn<'a>>,
    /// Controls that recorded probes verified for this backend, settings and host.
    pub verified_controls: Vec<VerifiedControl>,
    /// Where the per-user seal key and ledger live; `None` resolves it from the environment
    /// (`AGENTDIFF_STATE_DIR`, `XDG_STATE_HOME`, `HOME`).
    pub state_dir: Option<StateDir>,
}

/// What a finished transaction hands back.
#[derive(Debug)]
pub struct RunOutcome {
    pub result: RunResult,
    pub capsule_dir: PathBuf,
    /// Why the command did not run, when it did not; the CLI maps it to its own exit code.
    pub refusal: Option<Refusal>,
}

/// Why a command was not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The backend cannot run here (fail closed; nothing was launched).
    BackendUnavailable,
    /// The request was invalid for the backend (a bad option or path).
    InvalidRequest,
    /// The process could not be started (not found, not executable).
    LaunchFailed,
    /// The backend failed in an unexpected way.
    Internal,
}

fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// Resolve and check the project root.
pub fn resolve_root(root: &Path) -> Result<PathBuf, TransactionError> {
    let resolved = root.canonicalize().map_err(|e| TransactionError::Root {
        path: root.to_path_buf(),
        message: format!("cannot be resolved ({e})"),
    })?;
    if !resolved.is_dir() {
        return Err(TransactionError::Root {
            path: resolved,
            message: "is not a directory".into(),
        });
    }
    Ok(resolved)
}

fn effective_timeout(cli: Option<Duration>, policy_seconds: Option<u64>) -> Option<Duration> {
    let from_policy = policy_seconds.map(Duration::from_secs);
    match (cli, from_policy) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Run one command in an evidence transaction.
pub async fn run(req: RunRequest<'_>) -> Result<RunOutcome, TransactionError> {
    if req.argv.is_empty() {
        return Err(TransactionError::EmptyCommand);
    }
    let started = Instant::now();
    let started_at = now();
    let root = resolve_root(&req.root)?;
    let policy = &req.policy.policy;
    // The key is loaded before anything is written and kept in memory: replacing the key file
    // during the run does not change what seals this run.
    let state_dir = match &req.state_dir {
        Some(dir) => dir.clone(),
        None => StateDir::from_env()?,
    };
    let authority = SealAuthority::open(&state_dir, &root)?;
    let store = Store::open(&root)?;
    let capsule = store.create_run(req.run_id.as_deref())?;
    let run_id = capsule.id().to_string();
    let timeout = effective_timeout(req.timeout, policy.limits().duration_seconds);

    let metadata = Metadata {
        schema_version: crate::SCHEMA_VERSION,
        run_id: run_id.clone(),
        created_at: started_at.clone(),
        agentdiff_version: env!("CARGO_PKG_VERSION").to_string(),
        root: root.display().to_string(),
        argv: redact::redact_os_argv(&req.argv),
        task: req.task.clone(),
        backend: req.backend.id().to_string(),
        timeout_seconds: timeout.map(|t| t.as_secs()),
        platform: format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH),
        uid: current_uid(),
    };
    capsule.write_artifact(Artifact::Metadata, &metadata)?;
    capsule.write_artifact(
        Artifact::Policy,
        &json!({
            "schema_version": crate::SCHEMA_VERSION,
            "source": req.policy.source,
            "policy_version": policy.version(),
            "effective": policy.to_json(),
        }),
    )?;
    capsule.event("capsule_created", json!({ "run_id": run_id }))?;

    // Command decision: a denied executable is never launched.
    let command_decision = policy.decide_command(&req.argv[0]);
    capsule.event(
        "command_decided",
        json!({ "action": command_decision.action, "rule": command_decision.rule }),
    )?;
    let base = Finisher {
        capsule: &capsule,
        authority: &authority,
        run_id: run_id.clone(),
        command_decision: command_decision.clone(),
        task: req.task.clone(),
        started,
        started_at: started_at.clone(),
    };
    if command_decision.action == Action::Deny {
        let message = format!(
            "command `{}` blocked by {} ({})",
            redact::escape_terminal(&req.argv[0].to_string_lossy()),
            command_decision.rule,
            command_decision.reason
        );
        return base.finish_without_run(Status::Blocked, Some(message), None, &[]);
    }

    // Fail closed before touching anything when the backend cannot run here.
    if let Availability::Unavailable { reason, remedy } = req.backend.availability().await {
        let message = format!(
            "runtime backend `{}` is unavailable: {reason}; {remedy}",
            req.backend.id()
        );
        capsule.write_artifact(
            Artifact::Runtime,
            &json!({
                "schema_version": crate::SCHEMA_VERSION,
                "backend": req.backend.id(),
                "launched": false,
                "availability": { "state": "unavailable", "reason": reason, "remedy": remedy },
            }),
        )?;
        return base.finish_without_run(
            Status::Error,
            Some(message),
            Some(Refusal::BackendUnavailable),
            &[],
        );
    }

    // Before-state.
    let rollback = policy.rollback();
    let capabilities = req.backend.capabilities();
    let private_workspace = capabilities.workspace == WorkspaceMode::Private;
    let max_backup = rollback.max_backup_file_mb.saturating_mul(1024 * 1024);
    // Deny patterns and `observe.include` (v2) bring default-excluded directories back into view.
    let mut reinclude = policy.deny_patterns();
    reinclude.extend(policy.observe().include.iter().cloned());
    let mut before = {
        let mut opts = ScanOptions::new();
        opts.reinclude = reinclude.clone();
        if rollback.enabled || private_workspace {
            opts.backup = Some(BackupRequest {
                sink: store.objects(),
                // A private workspace is materialised from backups, so every file is captured.
                max_file_bytes: if private_workspace {
                    fs::DEFAULT_MAX_HASH_BYTES
                } else {
                    max_backup
                },
            });
        }
        let progress = req.progress.map(|p| move |s: &ScanProgress| p("before", s));
        let progress_ref: Option<&(dyn Fn(&ScanProgress) + Sync)> = progress
            .as_ref()
            .map(|p| p as &(dyn Fn(&ScanProgress) + Sync));
        opts.progress = progress_ref;
        fs::scan(&root, &opts)?
    };
    let mut before_entries = capsule.write_manifest(Artifact::Before, &before, store.objects())?;
    capsule.event(
        "before_captured",
        json!({ "entries": before.entries.len(), "unsupported": before.unsupported.len() }),
    )?;

    let workdir = if private_workspace {
        let dir = crate::workspace::materialize(&store, &capsule, &before)
            .map_err(|e| TransactionError::Workspace(e.to_string()))?;
        capsule.event(
            "workspace_materialized",
            json!({ "path": dir.display().to_string() }),
        )?;
        dir
    } else {
        root.clone()
    };

    // Environment.
    let env_settings = policy.environment();
    let env_mode = req.env_mode.unwrap_or(match env_settings.mode {
        crate::policy::EnvMode::Scrub => EnvMode::Scrub,
        crate::policy::EnvMode::Inherit => EnvMode::Inherit,
    });
    let mut pass = env_settings.pass.clone();
    pass.extend(req.env_pass.iter().cloned());
    let env_plan = environment::plan(env_mode, &pass, std::env::vars_os());

    let mut options = req.options.clone();
    for (key, values) in &policy.runtime().options {
        if !options.is_set(key) {
            for v in values {
                options.push(key.clone(), v.clone());
            }
        }
    }
    let spec = LaunchSpec {
        run_id: run_id.clone(),
        root: root.clone(),
        workdir: workdir.clone(),
        capsule_dir: capsule.dir().to_path_buf(),
        argv: req.argv.clone(),
        env: env_plan.env,
        timeout,
        grace: req.grace,
        poll_interval: req.poll_interval,
        observe_ports: policy.network_mode() == NetworkMode::Observe,
        options,
    };

    // What agentdiff wrote before launch is checked against this after the command ran.
    let store_snapshot = store.snapshot()?;
    let evidence = match launch(
        req.backend,
        &spec,
        req.stdio.clone(),
        req.interrupt.clone(),
        &capsule,
        authority.key(),
    )
    .await
    {
        Ok(mut ev) => {
            // The backend fingerprints what it really passed. What the transaction's plan
            // dropped before the backend saw the environment is added; a backend that filtered
            // further (a container gets only named variables) keeps its own stricter mode.
            match ev.environment.as_mut() {
                Some(env) => {
                    if env.mode != "scrub" {
                        env.mode = env_plan.evidence.mode.clone();
                    }
                    env.dropped
                        .extend(env_plan.evidence.dropped.iter().cloned());
                    env.dropped.sort();
                    env.dropped.dedup();
                }
                None => ev.environment = Some(env_plan.evidence.clone()),
            }
            if let Some(env) = ev.environment.as_mut() {
                environment::key_fingerprints(env, authority.key());
            }
            ev
        }
        Err(err) => {
            let (status, refusal) = match &err {
                BackendError::Unavailable { .. } => (Status::Error, Refusal::BackendUnavailable),
                BackendError::InvalidRequest { .. } => (Status::Error, Refusal::InvalidRequest),
                BackendError::Launch { .. } => (Status::Failed, Refusal::LaunchFailed),
                BackendError::Runtime { .. } => (Status::Error, Refusal::Internal),
            };
            let message = match &err {
                BackendError::Launch { message, .. } => {
                    format!("the command could not be launched: {message}")
                }
                other => other.to_string(),
            };
            capsule.event("launch_refused", json!({ "message": message }))?;
            capsule.write_artifact(
                Artifact::Runtime,
                &json!({
                    "schema_version": crate::SCHEMA_VERSION,
                    "backend": req.backend.id(),
                    "launched": false,
                    "error": message,
                }),
            )?;
            // Nothing ran, so there is no after-state to capture.
            if private_workspace {
                discard_workspace(&store, &capsule)?;
            }
            let mut referenced = referenced_objects(&before);
            referenced.push(before_entries.clone());
            return base.finish_without_run(status, Some(message), Some(refusal), &referenced);
        }
    };
    let (capsule_tampered, rewritten) =
        guard::after_command(&store, &capsule, &store_snapshot, &mut before)?;
    if let Some(entries) = rewritten {
        before_entries = entries;
    }
    let mut runtime_doc = runtime_document(&evidence);
    runtime_doc["verified_controls"] = json!(req.verified_controls);
    capsule.write_artifact(Artifact::Runtime, &runtime_doc)?;
    capsule.event(
        "exited",
        json!({
            "code": evidence.exit.code,
            "signal": evidence.exit.signal,
            "timed_out": evidence.exit.timed_out,
            "interrupted_by": evidence.exit.interrupted_by,
        }),
    )?;

    // After-state, reusing unchanged hashes.
    let after = {
        let mut opts = ScanOptions::new();
        opts.reinclude = reinclude;
        // The before-scan's ignore rules are pinned: the command cannot hide its own writes by
        // editing `.agentdiffignore`.
        opts.ignore = IgnoreSource::Lines(before.ignore_lines.clone());
        opts.reuse = if private_workspace {
            None
        } else {
            Some(&before)
        };
        let progress = req.progress.map(|p| move |s: &ScanProgress| p("after", s));
        let progress_ref: Option<&(dyn Fn(&ScanProgress) + Sync)> = progress
            .as_ref()
            .map(|p| p as &(dyn Fn(&ScanProgress) + Sync));
        opts.progress = progress_ref;
        if private_workspace {
            // Changes in the workspace are kept as objects so promote can apply them.
            opts.backup = Some(BackupRequest {
                sink: store.objects(),
                max_file_bytes: fs::DEFAULT_MAX_HASH_BYTES,
            });
        }
        fs::scan(&workdir, &opts)?
    };
    let after_entries = capsule.write_manifest(Artifact::After, &after, store.objects())?;
    capsule.event(
        "after_captured",
        json!({ "entries": after.entries.len(), "unsupported": after.unsupported.len() }),
    )?;
    if private_workspace {
        // The after-state now lives in the object store (promote applies it from there); the
        // workspace copy of the whole tree is not needed any more.
        discard_workspace(&store, &capsule)?;
    }

    // Decisions, limits, score.
    let diff = fs::diff(&before, &after);
    let changes = classify_changes(policy, &diff, private_workspace);
    let (limit_violations, counts) = evaluate_limits(policy, &changes, &evidence);
    let blast_radius = score::compute(&counts, policy.weights());
    let warnings = observation_warnings(&before, &after, &diff, &evidence);
    let exit = &evidence.exit;
    // Tampering with the capsule is a deny-level finding whatever the changes were.
    let denied = changes.iter().any(|c| c.decision == Action::Deny) || !capsule_tampered.is_empty();
    let review = changes.iter().any(|c| c.decision == Action::Review)
        || !limit_violations.is_empty()
        || !warnings.is_empty()
        || command_decision.action == Action::Review;
    let safety_outcome = if denied {
        Action::Deny
    } else if review {
        Action::Review
    } else {
        Action::Allow
    };
    let status = if exit.interrupted_by.is_some() {
        Status::Terminated
    } else if exit.timed_out {
        Status::TimedOut
    } else if evidence.failure.is_some() || exit.code != Some(0) {
        Status::Failed
    } else {
        match safety_outcome {
            Action::Deny => Status::Denied,
            Action::Review => Status::Review,
            Action::Allow => Status::Passed,
        }
    };
    let execution_error = evidence.failure.as_ref().map(|f| match f {
        crate::backend::FailureKind::LaunchFailed { message } => {
            format!("the command could not be launched: {message}")
        }
        crate::backend::FailureKind::WrapperSetupFailed { message } => {
            format!("the wrapper failed before the command started: {message}")
        }
    });
    let summary = Summary {
        expected: changes
            .iter()
            .filter(|c| c.decision == Action::Allow)
            .count() as u64,
        unexpected: changes
            .iter()
            .filter(|c| c.decision == Action::Review)
            .count() as u64,
        protected: changes
            .iter()
            .filter(|c| c.decision == Action::Deny)
            .count() as u64,
        reversible: changes.iter().filter(|c| c.reversible).count() as u64,
        leftover_processes: evidence.cleanup.leftovers() as u64,
        opened_ports: evidence.ports.opened.len() as u64,
        // Each entry that could not be captured, once, whether before, after or both.
        unsupported_entries: before
            .unsupported
            .iter()
            .chain(&after.unsupported)
            .map(|u| (u.path.as_str(), u.kind.as_str()))
            .collect::<std::collections::BTreeSet<_>>()
            .len() as u64,
    };
    let result = RunResult {
        schema_version: crate::SCHEMA_VERSION,
        run_id: run_id.clone(),
        status,
        safety_outcome,
        command_decision: command_decision.clone(),
        exit_code: exit.code,
        recovery_available: summary.reversible > 0 && rollback.enabled,
        changes,
        limit_violations,
        observation_warnings: warnings,
        capsule_tampered,
        blast_radius,
        runtime: Some(RuntimeSummary {
            backend: evidence.backend.clone(),
            enforcement: evidence.enforcement.clone(),
            sandboxed: evidence.capabilities.sandboxed,
            network_enforcement: evidence.capabilities.network_enforcement,
            capabilities: evidence.capabilities.clone(),
            exit: evidence.exit.clone(),
            failure: evidence.failure.clone(),
            tracking: evidence.tracking.clone(),
            observation_root: evidence.observation_root.clone(),
            verified_controls: req.verified_controls.clone(),
        }),
        execution_error,
        summary,
        task: req.task.clone(),
        started_at,
        finished_at: now(),
        duration_ms: started.elapsed().as_millis() as u64,
    };
    let mut referenced = referenced_objects(&before);
    referenced.push(before_entries);
    referenced.push(after_entries);
    if private_workspace {
        referenced.extend(referenced_objects(&after));
    }
    base.seal(result, &referenced, None)
}

async fn launch(
    backend: &dyn RuntimeBackend,
    spec: &LaunchSpec,
    stdio: StdioMode,
    interrupt: tokio::sync::watch::Receiver<Option<i32>>,
    capsule: &Capsule,
    key: &SealKey,
) -> Result<RunEvidence, BackendError> {
    let prepared = backend.prepare(spec)?;
    let ctx = LaunchContext { stdio, interrupt };
    let running = backend.launch(prepared, ctx).await?;
    // Recorded before waiting: if agentdiff is killed now, `agentdiff cleanup` finds the run's
    // processes from this event. A failed write must not orphan the command, so it only warns.
    let mut fields = match running.launch_facts() {
        serde_json::Value::Object(map) => serde_json::Value::Object(map),
        _ => json!({}),
    };
    fields["pid"] = json!(running.pid());
    // MAC'd so that `agentdiff cleanup` of a run whose monitor died trusts only an event this
    // user's agentdiff wrote.
    let mac = key.mac(
        MacPurpose::LaunchEvent,
        &crate::store::seal::launch_event_body(capsule.id().as_str(), &fields),
    );
    fields["mac"] = json!(mac);
    let _ = capsule.event("launched", fields);
    running.wait().await
}

/// `runtime.json` as stored: the backend's evidence with the wrapper argv redacted, sensitive
/// keys in `runtime_config` and `wrapper` redacted, and `schema_version` and `launched` added.
pub fn runtime_document(evidence: &RunEvidence) -> serde_json::Value {
    let mut doc = serde_json::to_value(evidence).unwrap_or_else(|_| json!({}));
    if let Some(argv) = &evidence.wrapper_argv {
        doc["wrapper_argv"] = json!(redact::redact_argv(argv));
    }
    if let Some(cfg) = doc.get_mut("runtime_config") {
        redact::redact_value(cfg);
    }
    if let Some(w) = doc.get_mut("wrapper") {
        redact::redact_value(w);
    }
    if let Some(obj) = doc.as_object_mut() {
        obj.insert("schema_version".into(), json!(crate::SCHEMA_VERSION));
        obj.insert("launched".into(), json!(true));
    }
    doc
}

fn referenced_objects(manifest: &Manifest) -> Vec<String> {
    crate::store::manifest_objects(manifest)
}

fn observation_warnings(
    before: &Manifest,
    after: &Manifest,
    diff: &[fs::Change],
    evidence: &RunEvidence,
) -> Vec<String> {
    let mut warnings = Vec::new();
    // Entries that are not files, directories or symlinks (FIFOs, sockets, devices, names that
    // are not UTF-8) and appeared, vanished or changed kind.
    for u in fs::diff_unsupported(before, after) {
        let kind = u
            .after_kind
            .as_deref()
            .or(u.before_kind.as_deref())
            .unwrap_or("entry");
        warnings.push(format!(
            "{}: {} {:?} — not captured",
            redact::escape_terminal(&u.path),
            kind,
            u.change_type
        ));
    }
    // Content that could not be captured after the run (too large, unreadable, changed while it
    // was read).
    for u in &after.unsupported {
        let new_problem = !before
            .unsupported
            .iter()
            .any(|b| b.path == u.path && b.kind == u.kind);
        if new_problem && after.entries.contains_key(&u.path) {
            warnings.push(format!(
                "{}: {} ({}) — not captured",
                redact::escape_terminal(&u.path),
                u.kind,
                u.reason
            ));
        }
    }
    for c in diff {
        if let Some(note) = &c.unverified {
            warnings.push(format!(
                "{}: {}",
                redact::escape_terminal(&c.path),
                redact::escape_terminal(note)
            ));
        }
    }
    for e in &evidence.ports.errors {
        warnings.push(format!("port observation: {e}"));
    }
    for e in &evidence.cleanup.errors {
        warnings.push(format!("cleanup: {e}"));
    }
    warnings.extend(evidence.warnings.iter().cloned());
    warnings
}

/// Remove the run's private workspace, recording that it happened (or why it could not).
fn discard_workspace(store: &Store, capsule: &Capsule) -> Result<(), TransactionError> {
    match crate::workspace::discard(store, capsule.id()) {
        Ok(_) => capsule.event("workspace_discarded", json!({}))?,
        Err(e) => capsule.event(
            "workspace_not_discarded",
            json!({ "error": e.to_string(), "remedy": "agentdiff cleanup RUN removes it" }),
        )?,
    }
    Ok(())
}

#[cfg(unix)]
fn current_uid() -> Option<u32> {
    Some(nix::unistd::getuid().as_raw())
}

#[cfg(not(unix))]
fn current_uid() -> Option<u32> {
    None
}

/// Writes the final artifacts and seals the capsule.
struct Finisher<'c> {
    capsule: &'c Capsule,
    authority: &'c SealAuthority,
    run_id: String,
    command_decision: crate::policy::Decision,
    task: Option<String>,
    started: Instant,
    started_at: String,
}

impl Finisher<'_> {
    /// A run that never launched (blocked, backend unavailable, launch refused).
    fn finish_without_run(
        &self,
        status: Status,
        error: Option<String>,
        refusal: Option<Refusal>,
        referenced: &[String],
    ) -> Result<RunOutcome, TransactionError> {
        let counts = score::Counts::default();
        let result = RunResult {
            schema_version: crate::SCHEMA_VERSION,
            run_id: self.run_id.clone(),
            status,
            safety_outcome: if status == Status::Blocked {
                Action::Deny
            } else {
                Action::Review
            },
            command_decision: self.command_decision.clone(),
            exit_code: None,
            changes: Vec::new(),
            limit_violations: Vec::new(),
            observation_warnings: Vec::new(),
            capsule_tampered: Vec::new(),
            blast_radius: score::compute(&counts, &crate::policy::Weights::default()),
            runtime: None,
            execution_error: error,
            summary: Summary::default(),
            recovery_available: false,
            task: self.task.clone(),
            started_at: self.started_at.clone(),
            finished_at: now(),
            duration_ms: self.started.elapsed().as_millis() as u64,
        };
        self.seal(result, referenced, refusal)
    }

    fn seal(
        &self,
        result: RunResult,
        referenced: &[String],
        refusal: Option<Refusal>,
    ) -> Result<RunOutcome, TransactionError> {
        self.capsule.write_artifact(Artifact::Result, &result)?;
        self.capsule.event(
            "decided",
            json!({ "status": result.status, "safety_outcome": result.safety_outcome }),
        )?;
        let mut objects = referenced.to_vec();
        objects.sort();
        objects.dedup();
        self.capsule.seal_with(&objects, Some(self.authority))?;
        Ok(RunOutcome {
            result,
            capsule_dir: self.capsule.dir().to_path_buf(),
            refusal,
        })
    }
}
