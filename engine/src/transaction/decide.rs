//! The decision step: a pure function from a run's evidence to its [`RunResult`].
//!
//! Nothing here launches, scans, reads the clock or writes: the caller passes the manifests, the
//! backend's evidence and the run's timing, so every status, safety outcome, limit and summary
//! count can be tested from literal inputs (see `tests.rs`).
//!
//! Precedence, strongest first: an interrupt, then the deadline, then a failed or non-zero command,
//! then the safety outcome (deny > review > allow). A run that succeeded with denied changes is
//! `denied`, never `passed`; review findings include warnings about what could not be observed.

use std::collections::BTreeSet;

use super::classify::{
    classify_changes, classify_incomplete, classify_programs, classify_uncaptured, evaluate_limits,
};
use super::findings::{evidence_findings, with_findings};
use super::{Refusal, VerifiedControl};
use agentdiff_backend_api::{BackendError, ExitInfo, FailureKind, RunEvidence};
use agentdiff_policy::score;
use agentdiff_policy::{Action, Decision, Policy, Weights};
use agentdiff_scan::{self as fs, Manifest};
use agentdiff_store::schema::{
    ChangeRecord, LimitViolation, RunResult, RuntimeSummary, Status, Summary,
};

/// Everything the decision reads about a run that was launched.
pub struct Evidence<'a> {
    pub policy: &'a Policy,
    pub command_decision: &'a Decision,
    /// The manifests' headers: their unsupported records are read, their entries are not.
    pub before: &'a Manifest,
    pub after: &'a Manifest,
    /// What changed between them ([`fs::compare`] or [`fs::compare_trees`]).
    pub comparison: &'a fs::Comparison,
    pub run: &'a RunEvidence,
    /// The command ran in a private workspace (its changes are promoted, not rolled back).
    pub private_workspace: bool,
    pub verified_controls: &'a [VerifiedControl],
    /// What changed under `.agentdiff/` while the command ran (a deny-level finding).
    pub capsule_tampered: &'a [agentdiff_store::TamperFinding],
    /// The git directories and `.git` files below the root found before the launch
    /// (root-relative): a change below one is decided as git metadata, as is a change below a
    /// directory either manifest shows with git's layout (`Manifest::git_layouts`).
    pub git_dirs: &'a [String],
    /// What the run's egress proxy saw (a refused connection is a finding at the level
    /// `network.egress.on_denied` gives).
    pub network: Option<&'a agentdiff_store::NetworkEvidence>,
}

/// Identity and timing of the run, taken by the caller so the decision stays pure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFrame {
    pub run_id: String,
    pub task: Option<String>,
    pub started_at: String,
    pub finished_at: String,
    pub duration_ms: u64,
}

/// The result of a run that was launched.
pub fn decide(ev: &Evidence<'_>, frame: RunFrame) -> RunResult {
    let git_dirs = all_git_dirs(ev.git_dirs, ev.before, ev.after);
    let changes = classify_changes(
        ev.policy,
        &ev.comparison.changes,
        ev.private_workspace,
        &git_dirs,
        &ev.comparison.links,
    );
    let (limit_violations, counts) = evaluate_limits(ev.policy, &changes, ev.run);
    let mut warnings = observation_warnings(ev.before, ev.after, ev.comparison, ev.run);
    warnings.extend(egress_not_applied(ev.policy, ev.run));
    let mut findings = evidence_findings(ev.run);
    findings.extend(super::findings::egress_findings(
        ev.network,
        ev.policy.egress().on_denied(),
    ));
    findings.extend(classify_uncaptured(ev.policy, &ev.comparison.unsupported));
    findings.extend(classify_incomplete(&ev.comparison.incomplete));
    findings.extend(classify_programs(ev.policy, ev.before, ev.after, &git_dirs));
    let outcome = with_findings(
        safety_outcome(
            &changes,
            &limit_violations,
            &warnings,
            ev.command_decision.action,
        ),
        &findings,
    );
    // Tampering with the capsule is denied whatever the changes were.
    let safety_outcome = if ev.capsule_tampered.is_empty() {
        outcome
    } else {
        Action::Deny
    };
    let status = status(&ev.run.exit, ev.run.failure.as_ref(), safety_outcome);
    let summary = summarize(&changes, ev.before, ev.after, ev.run);
    RunResult {
        schema_version: agentdiff_store::SCHEMA_VERSION,
        run_id: frame.run_id,
        status,
        safety_outcome,
        command_decision: ev.command_decision.clone(),
        exit_code: ev.run.exit.code,
        recovery_available: summary.reversible > 0 && ev.policy.rollback().enabled,
        changes,
        limit_violations,
        observation_warnings: warnings,
        evidence_findings: findings,
        capsule_tampered: ev.capsule_tampered.to_vec(),
        blast_radius: score::compute(&counts, ev.policy.weights()),
        runtime: Some(runtime_summary(ev.run, ev.verified_controls)),
        execution_error: ev.run.failure.as_ref().map(execution_error),
        summary,
        task: frame.task,
        started_at: frame.started_at,
        finished_at: frame.finished_at,
        duration_ms: frame.duration_ms,
    }
}

/// The git directories a change is decided against: those found before the launch and every
/// directory with git's layout in either scan. The after-scan's count too: a repository the
/// command created under another name (`git init --bare docs/tools`) is one as soon as it exists.
fn all_git_dirs(found: &[String], before: &Manifest, after: &Manifest) -> Vec<String> {
    let mut all: Vec<String> = found
        .iter()
        .chain(&before.git_layouts)
        .chain(&after.git_layouts)
        .cloned()
        .collect();
    all.sort();
    all.dedup();
    all
}

/// The result of a run whose command never started (blocked, backend unavailable, launch
/// refused): no changes, no runtime, and a safety outcome that never reads as clean.
pub fn not_run(
    command_decision: &Decision,
    status: Status,
    error: Option<String>,
    frame: RunFrame,
) -> RunResult {
    RunResult {
        schema_version: agentdiff_store::SCHEMA_VERSION,
        run_id: frame.run_id,
        status,
        safety_outcome: if status == Status::Blocked {
            Action::Deny
        } else {
            Action::Review
        },
        command_decision: command_decision.clone(),
        exit_code: None,
        changes: Vec::new(),
        limit_violations: Vec::new(),
        observation_warnings: Vec::new(),
        evidence_findings: Vec::new(),
        capsule_tampered: Vec::new(),
        blast_radius: score::compute(&score::Counts::default(), &Weights::default()),
        runtime: None,
        execution_error: error,
        summary: Summary::default(),
        recovery_available: false,
        task: frame.task,
        started_at: frame.started_at,
        finished_at: frame.finished_at,
        duration_ms: frame.duration_ms,
    }
}

/// Why a launch the backend refused did not run, as recorded and as the CLI maps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedLaunch {
    pub status: Status,
    pub refusal: Refusal,
    pub message: String,
}

/// Maps a backend error before or at launch: the command not starting is the command's failure;
/// anything else is agentdiff's or the backend's error.
pub fn refused_launch(err: &BackendError) -> RefusedLaunch {
    let (status, refusal) = match err {
        BackendError::Unavailable { .. } => (Status::Error, Refusal::BackendUnavailable),
        BackendError::InvalidRequest { .. } | BackendError::Option(_) => {
            (Status::Error, Refusal::InvalidRequest)
        }
        BackendError::Launch { .. } => (Status::Failed, Refusal::LaunchFailed),
        BackendError::Runtime { .. } => (Status::Error, Refusal::Internal),
    };
    let message = match err {
        BackendError::Launch { message, .. } => {
            format!("the command could not be launched: {message}")
        }
        other => other.to_string(),
    };
    RefusedLaunch {
        status,
        refusal,
        message,
    }
}

/// The strictest decision among changes, budgets, warnings and the command decision.
pub fn safety_outcome(
    changes: &[ChangeRecord],
    limit_violations: &[LimitViolation],
    warnings: &[String],
    command: Action,
) -> Action {
    if changes.iter().any(|c| c.decision == Action::Deny) {
        Action::Deny
    } else if changes.iter().any(|c| c.decision == Action::Review)
        || !limit_violations.is_empty()
        || !warnings.is_empty()
        || command == Action::Review
    {
        Action::Review
    } else {
        Action::Allow
    }
}

/// A warning when the policy allows hosts (`network.egress`) but the backend did not make
/// agentdiff's egress proxy the command's route out (its network is not `filtered`): the
/// allowlist was neither applied nor were the connections recorded.
fn egress_not_applied(policy: &Policy, run: &RunEvidence) -> Option<String> {
    let label = run.capabilities.network;
    (policy.egress().allows_anything() && label != agentdiff_backend_api::Level::Filtered).then(
        || {
            format!(
                concat!(
                    "network.egress allows hosts, but the {} backend did not apply the allowlist ",
                    "(network `{}`): the command's connections were neither filtered nor recorded"
                ),
                run.backend,
                label.as_str()
            )
        },
    )
}

/// The run's status from how the command ended and the safety outcome.
pub fn status(exit: &ExitInfo, failure: Option<&FailureKind>, safety: Action) -> Status {
    if exit.interrupted_by.is_some() {
        Status::Terminated
    } else if exit.timed_out {
        Status::TimedOut
    } else if failure.is_some() || exit.code != Some(0) {
        Status::Failed
    } else {
        match safety {
            Action::Deny => Status::Denied,
            Action::Review => Status::Review,
            Action::Allow => Status::Passed,
        }
    }
}

pub(super) fn execution_error(failure: &FailureKind) -> String {
    match failure {
        FailureKind::BackendFailed { message } => format!(
            "the command was started (or may have been, when the backend failed right after the \
             launch request), and the runtime backend failed before it reported how the command \
             ended ({message}); its changes were captured and classified"
        ),
        FailureKind::LaunchFailed { message } => {
            format!("the command could not be launched: {message}")
        }
        FailureKind::WrapperSetupFailed { message } => {
            format!("the wrapper failed before the command started: {message}")
        }
    }
}

/// The counts a person reads first.
pub fn summarize(
    changes: &[ChangeRecord],
    before: &Manifest,
    after: &Manifest,
    run: &RunEvidence,
) -> Summary {
    let with = |action: Action| changes.iter().filter(|c| c.decision == action).count() as u64;
    Summary {
        expected: with(Action::Allow),
        unexpected: with(Action::Review),
        protected: with(Action::Deny),
        reversible: changes.iter().filter(|c| c.reversible).count() as u64,
        leftover_processes: run.cleanup.leftovers() as u64,
        opened_ports: run.ports.opened.len() as u64,
        opened_ports_attributed: run.ports.opened.iter().filter(|p| p.attributed).count() as u64,
        containers_started: run
            .containers
            .as_ref()
            .map_or(0, |c| c.containers.len() as u64 + c.omitted),
        containers_attributed: run.containers.as_ref().map_or(0, |c| {
            c.containers.iter().filter(|c| c.attributed).count() as u64
        }),
        // Each entry that could not be captured, once, whether before, after or both.
        unsupported_entries: before
            .unsupported
            .iter()
            .chain(&after.unsupported)
            .map(|u| (u.path.as_str(), u.kind.as_str()))
            .collect::<BTreeSet<_>>()
            .len() as u64,
    }
}

pub(super) fn runtime_summary(
    run: &RunEvidence,
    verified_controls: &[VerifiedControl],
) -> RuntimeSummary {
    RuntimeSummary {
        backend: run.backend.clone(),
        enforcement: run.enforcement,
        sandboxed: run.capabilities.sandboxed,
        network_enforcement: run.capabilities.network_enforcement,
        capabilities: run.capabilities.clone(),
        exit: run.exit.clone(),
        failure: run.failure.clone(),
        tracking: run.tracking,
        observation_root: run.observation_root.clone(),
        verified_controls: verified_controls.to_vec(),
    }
}

/// What could not be observed or captured: each makes the run need review.
/// How a change type reads in a warning ("created", not the type's name).
pub(crate) fn change_word(change: fs::ChangeType) -> &'static str {
    match change {
        fs::ChangeType::Created => "created",
        fs::ChangeType::Modified => "modified",
        fs::ChangeType::Deleted => "deleted",
    }
}

pub fn observation_warnings(
    before: &Manifest,
    after: &Manifest,
    comparison: &fs::Comparison,
    run: &RunEvidence,
) -> Vec<String> {
    let mut warnings = comparison.incomplete.clone();
    // Entries that are not files, directories or symlinks (FIFOs, sockets, devices, names that
    // are not UTF-8) and appeared, vanished or changed kind.
    for u in &comparison.unsupported {
        let kind = u
            .after_kind
            .as_deref()
            .or(u.before_kind.as_deref())
            .unwrap_or("entry");
        // Recorded as is: every renderer escapes warnings for its own output once.
        warnings.push(format!(
            "{}: {} {} — not captured",
            u.path,
            kind,
            change_word(u.change_type)
        ));
    }
    // Content that could not be captured after the run (too large, unreadable, changed while it
    // was read).
    for u in &after.unsupported {
        let new_problem = !before
            .unsupported
            .iter()
            .any(|b| b.path == u.path && b.kind == u.kind);
        if new_problem && comparison.after_unsupported_entries.contains(&u.path) {
            warnings.push(format!(
                "{}: {} ({}) — not captured",
                u.path, u.kind, u.reason
            ));
        }
    }
    for c in &comparison.changes {
        if let Some(note) = &c.unverified {
            warnings.push(format!("{}: {note}", c.path));
        }
    }
    for e in &run.ports.errors {
        warnings.push(format!("port observation: {e}"));
    }
    for e in &run.cleanup.errors {
        warnings.push(format!("cleanup: {e}"));
    }
    warnings.extend(run.warnings.iter().cloned());
    warnings
}
