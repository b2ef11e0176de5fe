//! Reports of a stored run for people: what the run did, read through the capsule's typed
//! readers (never JSON by string key), rendered by one module per surface.
//!
//! Invariant: a report only shows what the capsule records; every recorded string reaching a
//! report passes through that surface's one escaping function.

pub mod dashboard;
pub mod diff;
pub mod evidence;
pub mod html;
pub mod listing;
pub mod live;
pub mod markdown;
pub mod rows;
pub mod session;
pub mod terminal;
pub mod words;

use std::path::PathBuf;

use agentdiff_backend_api::{Enforcement, WorkspaceMode};
use agentdiff_host::redact::escape_terminal;
use agentdiff_plugins::external::{ExternalFacts, ExternalOrigin};
use agentdiff_policy::Action;
use agentdiff_store::doc::Event;
use agentdiff_store::schema::{ChangeRecord, RunResult, RuntimeSummary, Status};
use agentdiff_store::seal::VerifyContext;
use agentdiff_store::{Artifact, Capsule, ObjectStore, RuntimeDoc, StoreError, VerifyReport};

/// Errors of loading a run for a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(
        "run {0} has no result.json (it was interrupted before recording its result): there is \
         nothing to report; `agentdiff inspect {0}` says what is known"
    )]
    NoResult(String),
    #[error(
        "run {dir}'s result.json names another run ({recorded}): the capsule is corrupt or was \
         rewritten; nothing in it is reported (`agentdiff verify {dir}` says what does not match \
         its seal)"
    )]
    RunIdMismatch {
        dir: String,
        /// As recorded, made visible ([`escape_terminal`]).
        recorded: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// `capsule`'s result, refused when its `run_id` is not the capsule's directory id: a result
/// copied from another run, or a forged one whose id carries text for a report.
pub fn checked_result(capsule: &Capsule) -> Result<RunResult, ReportError> {
    let result = capsule.result()?;
    if result.run_id != capsule.id().as_str() {
        return Err(ReportError::RunIdMismatch {
            dir: capsule.id().to_string(),
            recorded: format!("{:?}", escape_terminal(&result.run_id)),
        });
    }
    Ok(result)
}

/// One run as the reports see it.
#[derive(Debug, Clone)]
pub struct RunView {
    /// The run id: the capsule's directory name (a validated [`agentdiff_store::RunId`]), which
    /// every command a report prints is built from, never `result.run_id`.
    pub id: String,
    pub result: RunResult,
    /// `runtime.json`, when the run recorded one.
    pub runtime: Option<RuntimeDoc>,
    /// `metadata.json`'s backend: the one chosen, even when nothing was launched.
    pub backend: Option<String>,
    /// Whether the capsule's seal is in place (integrity.json exists; says nothing about whether
    /// it matches: see `seal`).
    pub sealed: bool,
    /// The seal as `agentdiff verify` judges it, when the surface verified it.
    pub seal: Option<VerifyReport>,
    pub capsule_dir: PathBuf,
    /// `events.jsonl` (the timeline), empty when not read.
    pub events: Vec<Event>,
    /// Why `events.jsonl` could not be read, shown instead of a silently empty timeline.
    pub events_error: Option<String>,
}

/// How the command ended, in words: `exited with code 0 after 12 ms`, `killed by signal 9 …`,
/// with the deadline or an interruption when they ended it.
pub fn exit_text(e: &agentdiff_backend_api::ExitInfo) -> String {
    let how = match (e.code, e.signal) {
        (Some(c), _) => format!("exited with code {c}"),
        (_, Some(sig)) => format!("was killed by signal {sig}"),
        _ => "has no exit status".into(),
    };
    let mut s = format!("{how} after {} ms", e.duration_ms);
    if e.timed_out {
        s.push_str(" (the deadline expired)");
    }
    if let Some(sig) = e.interrupted_by {
        s.push_str(&format!(" (agentdiff was interrupted by signal {sig})"));
    }
    s
}

/// The launched backend in one line, the same words on every surface:
/// `NAME · enforcement E · sandboxed|not sandboxed · network blocked|filtered|not blocked` (`filtered`:
/// the network label is `filtered`, agentdiff's egress proxy the only route out), the name
/// through the surface's `escape`; `(declared by plugin)` after the claims when an external
/// plugin made them ([`RunView::plugin`]).
pub fn runtime_line(rt: &RuntimeSummary, plugin: bool, escape: fn(&str) -> String) -> String {
    let sandbox = if rt.sandboxed {
        "sandboxed"
    } else {
        "not sandboxed"
    };
    // A filtered network reaches the allowed hosts: "blocked" would claim more than that.
    let network = match (rt.capabilities.network, rt.network_enforcement) {
        (agentdiff_backend_api::Level::Filtered, _) => "filtered",
        (_, true) => "blocked",
        (_, false) => "not blocked",
    };
    let declared = if plugin { " (declared by plugin)" } else { "" };
    format!(
        "{} · enforcement {} · {sandbox} · network {network}{declared}",
        escape(&rt.backend),
        rt.enforcement.as_str()
    )
}

/// Whether the command could have read this user's seal key, for the reader of an
/// "authenticated" verdict (docs/security-model.md, who can read the key): `None` when the
/// backend keeps the state directory out of the command's reach by agentdiff's own mounts or by
/// not mounting it, else why "authenticated" proves less.
pub fn key_exposure(v: &RunView) -> Option<&'static str> {
    if v.plugin().is_some() {
        return Some(
            "the run went through an external plugin, which declares its own isolation: whether \
             the command could read the seal key is unknown, so authenticated means sealed by \
             agentdiff with this user's key, not that the command could not have forged it",
        );
    }
    match v.result.runtime.as_ref()?.enforcement {
        Enforcement::None => Some(
            "the command ran unconfined as this user and could read the seal key: authenticated \
             means sealed by agentdiff with this user's key, not that the command could not have \
             forged it",
        ),
        Enforcement::ExternalSandboxRequested => Some(
            "the command's access to the seal key was left to an external sandbox (requested, \
             not verified here; with a user-supplied settings file treat the key as readable): \
             authenticated means sealed by agentdiff with this user's key",
        ),
        Enforcement::ContainerRequested | Enforcement::BwrapSandbox => None,
    }
}

/// An event field's value as one line of text: strings as they are, anything else as compact
/// JSON (the surface escapes it).
pub fn field_text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// What can be done about a run's changes, derived once for every surface.
#[derive(Debug)]
pub enum Recovery<'a> {
    /// The command worked on a private copy: the host tree is unchanged; `promote` applies.
    PrivateCopy,
    /// The capsule is not sealed (the run was interrupted): rollback refuses it; `cleanup`
    /// stops what it left behind.
    Unsealed,
    /// The run changed nothing.
    NothingChanged,
    /// Rollback is not available for this run's changes (e.g. disabled by the policy).
    NotAvailable { lost: Vec<&'a ChangeRecord> },
    /// Rollback restores every change except `lost` (whose backup is missing, e.g. on a full
    /// disk): per path, from what was captured and verified.
    Available { lost: Vec<&'a ChangeRecord> },
}

impl RunView {
    /// The view of a run this process has just sealed, from what it wrote (the result, the
    /// `runtime.json` document, the backend it chose): the bytes the capsule holds, so nothing is
    /// read back. Its id is the result's, which this process set from the capsule's
    /// [`agentdiff_store::RunId`]. The timeline is not included (`inspect` shows it).
    pub fn of_sealed_run(
        result: RunResult,
        runtime: Option<RuntimeDoc>,
        backend: &str,
        capsule_dir: PathBuf,
    ) -> RunView {
        RunView {
            id: result.run_id.clone(),
            result,
            runtime,
            backend: Some(backend.to_string()),
            sealed: true,
            seal: None,
            capsule_dir,
            events: Vec::new(),
            events_error: None,
        }
    }

    /// The external plugin the run went through, decoded from the evidence's typed `wrapper`
    /// facts: everything such a run reports about its isolation is the plugin's word.
    pub fn plugin(&self) -> Option<ExternalOrigin> {
        let facts = self.runtime.as_ref()?.evidence()?.wrapper.as_ref()?;
        facts
            .decode::<ExternalFacts>()
            .ok()
            .map(|f| f.external_backend)
    }

    /// The policy outcome, or `None` when nothing ran: no change was decided, so there is no
    /// outcome to report as if it had.
    pub fn policy_outcome(&self) -> Option<Action> {
        let r = &self.result;
        // Not launched (no runtime evidence) and not blocked by command policy, whose refusal
        // is itself the outcome: the command could not be run.
        let not_launched = r.runtime.is_none() && r.status != Status::Blocked;
        let nothing_ran = r.changes.is_empty() && (r.status == Status::Error || not_launched);
        (!nothing_ran).then_some(r.safety_outcome)
    }

    /// What rollback (or promote) can do for this run.
    pub fn recovery(&self) -> Recovery<'_> {
        let r = &self.result;
        let private = r
            .runtime
            .as_ref()
            .is_some_and(|rt| rt.capabilities.workspace == WorkspaceMode::Private);
        let lost = || r.changes.iter().filter(|c| !c.reversible).collect();
        if private {
            Recovery::PrivateCopy
        } else if !self.sealed {
            Recovery::Unsealed
        } else if r.changes.is_empty() {
            Recovery::NothingChanged
        } else if !r.recovery_available {
            Recovery::NotAvailable { lost: lost() }
        } else {
            Recovery::Available { lost: lost() }
        }
    }

    /// [`RunView::load`], with the seal verified as `agentdiff verify` does (this user's key and
    /// ledger in `ctx`).
    pub fn load_verified(
        capsule: &Capsule,
        objects: &ObjectStore,
        ctx: &VerifyContext,
    ) -> Result<RunView, ReportError> {
        let mut view = RunView::load(capsule)?;
        view.seal = Some(capsule.verify_with(objects, ctx)?);
        Ok(view)
    }

    /// Read a run through the capsule's typed readers.
    pub fn load(capsule: &Capsule) -> Result<RunView, ReportError> {
        let present =
            |a: Artifact| std::fs::symlink_metadata(capsule.dir().join(a.file_name())).is_ok();
        if !present(Artifact::Result) {
            return Err(ReportError::NoResult(capsule.id().to_string()));
        }
        let result = checked_result(capsule)?;
        let runtime = if present(Artifact::Runtime) {
            Some(capsule.runtime()?)
        } else {
            None
        };
        let backend = if present(Artifact::Metadata) {
            Some(capsule.metadata()?.backend)
        } else {
            None
        };
        let (events, events_error) = match capsule.events() {
            Ok(events) => (events, None),
            Err(e) => (Vec::new(), Some(e.to_string())),
        };
        Ok(RunView {
            id: capsule.id().to_string(),
            result,
            runtime,
            backend,
            sealed: capsule.is_sealed(),
            seal: None,
            capsule_dir: capsule.dir().to_path_buf(),
            events,
            events_error,
        })
    }
}
