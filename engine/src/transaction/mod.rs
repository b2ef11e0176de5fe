//! The evidence transaction (seed 003 lifecycle):
//!
//! policy load → private run capsule → command decision (deny = blocked, never launched) →
//! before manifest + backups → backend launch → process/port observation → after manifest →
//! path decisions → limits → blast radius → durable result → seal.
//!
//! The steps are modules: [`capture`] (before/after scans), [`launch`] (spec, backend, `launched`
//! event), [`decide`] (a pure function from evidence to [`RunResult`]) and [`seal`]; `run` only
//! sequences them and records what each produced.
//!
//! The command decision comes before the before-scan (the seed lists it after): a command that
//! will never run needs no tree captured, and the capsule still records the refusal.
//!
//! A backend that [`RuntimeBackend::holds_start`] is launched before the before-scan with the
//! command held, so its sandbox is set up meanwhile. Invariant: it is released only after the
//! before manifest, the store snapshot and the `launched` event are recorded, and every way out
//! before that ends it unreleased ([`launch::Started::abort`]; dropping it closes the start gate
//! too), so the command never runs before its before-state is on record.

mod capture;
mod classify;
pub mod decide;
mod discovery;
mod egress;
mod findings;
mod fingerprints;
mod guard;
mod launch;
mod preflight;
mod reserve;

mod seal;
pub mod session;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

pub use agentdiff_store::schema::{
    ChangeRecord, LimitViolation, Metadata, RunResult, RuntimeSummary, Status, Summary,
    VerifiedControl,
};
pub use classify::{classify_changes, evaluate_limits};
pub use decide::{Evidence, RunFrame};
pub use findings::{evidence_findings, EvidenceFinding};
pub use preflight::{check_request, effective_options, options_from_policy};

use agentdiff_backend_api::environment::EnvMode;
use agentdiff_backend_api::{
    Availability, BackendOptions, DynRuntimeBackend, RunEvidence, StdioMode, WorkspaceMode,
};
use agentdiff_host::redact;
use agentdiff_policy::{Action, LoadedPolicy};
use agentdiff_scan::ScanProgress;
use agentdiff_store::seal::{SealAuthority, StateDir};
use agentdiff_store::{
    Artifact, Capsule, ObjectsSnapshot, PolicyDoc, RecordedScan, RuntimeDoc, Store,
};
use capture::CapturePlan;
use seal::Sealer;

#[derive(Debug, thiserror::Error)]
pub enum TransactionError {
    #[error("project root {}: cannot be resolved ({source})", path.display())]
    RootUnresolvable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("project root {}: is not a directory", path.display())]
    RootNotDirectory { path: PathBuf },
    #[error(transparent)]
    Store(#[from] agentdiff_store::StoreError),
    #[error("scanning the project tree failed: {0}")]
    Scan(#[from] agentdiff_scan::ScanError),
    #[error("the command is empty: give the command after `--`")]
    EmptyCommand,
    #[error("could not record the effective policy: {0}")]
    EffectivePolicy(#[source] serde_json::Error),
    #[error("could not prepare the private workspace: {0}")]
    Workspace(#[source] crate::workspace::WorkspaceError),
    #[error("{0}; the command was not started (network.egress needs agentdiff's proxy)")]
    Egress(#[from] egress::EgressError),
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
    pub backend: &'a dyn DynRuntimeBackend,
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
    /// The `runtime.json` the run recorded (none when nothing was launched or refused), as
    /// written and sealed: a summary is shown from it without reading the capsule back.
    pub runtime: Option<RuntimeDoc>,
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
    /// `capture.require_backups`: a backup could not be written, so nothing was launched.
    BackupsMissing,
    /// The store's disk could not hold the reserve that records and seals a run, so nothing was
    /// launched.
    StoreFull,
}

/// Resolve and check the project root.
pub fn resolve_root(root: &Path) -> Result<PathBuf, TransactionError> {
    let resolved = root
        .canonicalize()
        .map_err(|source| TransactionError::RootUnresolvable {
            path: root.to_path_buf(),
            source,
        })?;
    if !resolved.is_dir() {
        return Err(TransactionError::RootNotDirectory { path: resolved });
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

/// Run one command in an evidence transaction: capture → launch → decide → seal.
pub async fn run(req: RunRequest<'_>) -> Result<RunOutcome, TransactionError> {
    if req.argv.is_empty() {
        return Err(TransactionError::EmptyCommand);
    }
    let started = Instant::now();
    let started_at = seal::now();
    let root = resolve_root(&req.root)?;
    // The git directories and linked protected files are found (the caller holds the project
    // lock) while the key, the store, the proxy, the verified-object cache and the capsule are
    // set up; the launch plan waits for them.
    let policy = &req.policy.policy;
    let discovery = discovery::Discovery::start(&root, policy.deny_patterns());
    // The key is loaded before anything is written and kept in memory: replacing the key file
    // during the run does not change what seals this run.
    let state_dir = req.state_dir.clone().map_or_else(StateDir::from_env, Ok)?;
    let authority = SealAuthority::open(&state_dir, &root)?;
    let store = Store::open(&root)?;
    // Before the capsule exists: a proxy that cannot start leaves nothing half-made.
    let proxy = egress::RunProxy::start(policy)?;
    // Objects found intact by earlier runs (MAC'd with the key) are not hashed again.
    store.objects().load_verified_cache(authority.key());
    let capsule = store.create_run_unnoted(req.run_id.as_deref())?;
    let timeout = effective_timeout(req.timeout, policy.limits().duration_seconds);
    let options = effective_options(&req.options, policy, req.backend.id());
    let capabilities = req.backend.capabilities(&options);
    let private_workspace = capabilities.workspace == WorkspaceMode::Private;
    let run_id = capsule.id().to_string();
    let discovered = discovery.finish();
    let link_refusal = discovered.refusal_for(&capabilities, &root);
    let git_dirs = discovered.git_dirs;
    let launcher = launch::Launcher {
        req: &req,
        policy,
        options,
        run_id: &run_id,
        root: &root,
        capsule: &capsule,
        timeout,
        key: authority.key(),
        git_dirs: &git_dirs,
        egress_proxy: proxy.as_ref().map(|p| p.socket().to_path_buf()),
    };
    // A backend that holds the start is launched first: its sandbox is set up while the capsule
    // is opened and the tree captured; the command runs only after the store snapshot below.
    let opening = Opening {
        store: &store,
        authority: &authority,
        started,
        started_at,
    };
    let (sealer, early) = match open_with_held_start(opening, &launcher, private_workspace).await {
        Ok(opened) => opened,
        Err(not_run) => return not_run,
    };
    // Capture before.
    let capture = CapturePlan::new(
        &store,
        &capsule,
        policy,
        &authority,
        private_workspace,
        req.progress,
    );
    // The project's latest sealed runs (ledger): stat-cache candidates, watched by the snapshot.
    let recent = authority.recent_sealed_runs(agentdiff_store::WATCHED_SEALED_RUNS);
    let (mut before, objects_snapshot, recorded) =
        match capture_before(&capture, &store, &root, &recent) {
            Ok(captured) => captured,
            Err(e) => return Err(abandon(early, e).await),
        };
    let claims = guard::Claims::new(recorded.is_some(), &store, &capsule);
    // The root trees name every tree object and backup below them: sealing them seals those.
    let mut referenced = vec![before.root_tree.clone()];
    let reserve = reserve::Reserve::hold(&store); // before the snapshot, which watches it
    if let Some((message, refusal)) =
        link_refusal.or_else(|| launch_blocker(policy, &before, &reserve))
    {
        abandon(early, ()).await;
        if claims.any() {
            let snapshot = store.snapshot_with(&recent, objects_snapshot)?;
            claims.settle(&snapshot, &mut before, &mut referenced)?;
        }
        return sealer.seal_not_run(Status::Error, Some(message), Some(refusal), &referenced);
    }
    let workdir = command_workdir(&store, &capsule, &root, private_workspace)?;
    // Launch.
    let store_snapshot = match snapshot_before_launch(&store, &recent, objects_snapshot) {
        Ok(snapshot) => snapshot,
        Err(e) => return Err(abandon(early, e.into()).await),
    };
    let launched = match early {
        Some((plan, started)) => started.finish(&plan, &capsule, authority.key()).await,
        None => launcher.launch(workdir.clone()).await,
    };
    let evidence = match launched {
        Ok(evidence) => evidence,
        Err(launch::LaunchFailure::Lost(evidence)) => record_lost(&capsule, *evidence)?,
        Err(launch::LaunchFailure::Refused(err)) => {
            let refused = decide::refused_launch(&err);
            record_refused(&sealer, req.backend.id(), &refused.message)?;
            claims.settle(&store_snapshot, &mut before, &mut referenced)?;
            // Nothing ran, so there is no after-state to capture.
            if private_workspace {
                seal::discard_workspace(&store, &capsule)?;
            }
            let (status, refusal) = (refused.status, Some(refused.refusal));
            return sealer.seal_not_run(status, Some(refused.message), refusal, &referenced);
        }
    };
    // The command has ended: nothing more can connect through the proxy.
    let network = proxy.and_then(|p| p.stop_for(&evidence));
    let capsule_tampered = guard::after_command(&store, &capsule, &store_snapshot, &before)?;
    capsule_tampered.apply(&mut before, &mut referenced);
    let failed = AfterCaptureFailed {
        evidence: &evidence,
        verified_controls: &req.verified_controls,
        tampered: &capsule_tampered.findings,
        reserve: &reserve,
    };
    // A write or capture that fails now (a full disk, a broken store) still ends sealed.
    record_exit_in_reserve(&sealer, &failed, network.clone())?;
    let store_untouched = capsule_tampered.findings.is_empty();
    let after = match capture.after(&workdir, &before, store_untouched) {
        Ok(after) => after,
        Err(e) => return failed.seal(&sealer, &capsule, &referenced, &e),
    };
    referenced.push(after.root_tree.clone());
    after_captured(&store, &capsule, private_workspace)?;

    // Decide and seal.
    let comparison = compare(&store, &before, &after, &capsule_tampered.unreadable);
    let evidence_in = Evidence {
        policy,
        command_decision: &sealer.command_decision,
        before: &before.manifest,
        after: &after.manifest,
        comparison: &comparison,
        run: &evidence,
        private_workspace,
        verified_controls: &req.verified_controls,
        capsule_tampered: &capsule_tampered.findings,
        git_dirs: &git_dirs.relative_to(&root),
        network: network.as_ref(),
    };
    let result = decide::decide(&evidence_in, sealer.frame());
    let sealed = sealer.seal(result, &referenced, None);
    let outcome = failed.unless_full(sealed, &sealer, &capsule, &referenced)?;
    capture.leave_record(&mut before, recorded.as_ref(), store_untouched);
    Ok(outcome)
}

/// The tree the command runs in: a private copy of the captured tree for a backend with a private
/// workspace, else the project root itself.
fn command_workdir(
    store: &Store,
    capsule: &Capsule,
    root: &Path,
    private_workspace: bool,
) -> Result<PathBuf, TransactionError> {
    if private_workspace {
        materialize_workspace(store, capsule)
    } else {
        Ok(root.to_path_buf())
    }
}

/// Once the after-state is captured: a private workspace is discarded (the after-state now lives
/// in the object store, promote applies it from there and the after tree references it), and the
/// after-state starts becoming durable while the run is decided.
fn after_captured(
    store: &Store,
    capsule: &Capsule,
    private_workspace: bool,
) -> Result<(), TransactionError> {
    if private_workspace {
        seal::discard_workspace(store, capsule)?;
    }
    store.objects().pending().flush_ahead();
    Ok(())
}

/// The store just before the launch: what agentdiff wrote before it is checked against this
/// after the command ran. What was written so far starts becoming durable as the command starts
/// (the seal waits for it).
fn snapshot_before_launch(
    store: &Store,
    recent: &[String],
    objects: ObjectsSnapshot,
) -> Result<agentdiff_store::StoreSnapshot, agentdiff_store::StoreError> {
    let snapshot = store.snapshot_with(recent, objects)?;
    store.objects().pending().flush_ahead();
    Ok(snapshot)
}

/// Why the command must not be launched after the before-capture: a backup missing under
/// `capture.require_backups`, or no room on the store's disk to record the run.
fn launch_blocker(
    policy: &agentdiff_policy::Policy,
    before: &capture::Captured,
    reserve: &reserve::Reserve,
) -> Option<(String, Refusal)> {
    let missing = policy
        .capture()
        .require_backups
        .then(|| capture::missing_backups(before))
        .flatten();
    missing
        .map(|m| (m, Refusal::BackupsMissing))
        .or_else(|| reserve.refusal().map(|m| (m, Refusal::StoreFull)))
}

/// A run whose command ran but whose after-capture failed: sealed as an error that never reads as
/// clean, with what is known (the command's exit, the runtime evidence, tampering).
struct AfterCaptureFailed<'a> {
    evidence: &'a RunEvidence,
    verified_controls: &'a [VerifiedControl],
    tampered: &'a [agentdiff_store::TamperFinding],
    /// Given back before sealing when the failure was a lack of space.
    reserve: &'a reserve::Reserve,
}

impl AfterCaptureFailed<'_> {
    /// `sealed`, or when sealing failed for lack of space, the run sealed as `error` in the
    /// reserve's room.
    fn unless_full(
        &self,
        sealed: Result<RunOutcome, TransactionError>,
        sealer: &Sealer<'_>,
        capsule: &Capsule,
        referenced: &[String],
    ) -> Result<RunOutcome, TransactionError> {
        match sealed {
            Err(e) if reserve::is_no_space(&e) => self.seal(sealer, capsule, referenced, &e),
            sealed => sealed,
        }
    }

    fn seal(
        &self,
        sealer: &Sealer<'_>,
        capsule: &Capsule,
        referenced: &[String],
        error: &TransactionError,
    ) -> Result<RunOutcome, TransactionError> {
        let full = reserve::is_no_space(error);
        self.reserve.release_for(error);
        let message = if full {
            format!(
                "the command ran, but the disk holding the store filled up ({error}), so what it \
                 changed could not be recorded: free space on that disk, then inspect the tree \
                 yourself (no change of this run is listed, so rollback has nothing to undo) and \
                 do not trust this run's absence of changes"
            )
        } else {
            format!(
                "the command ran, but the tree after it could not be captured ({error}); what it \
                 changed is not known: inspect the tree, repair or free the store, and do not \
                 trust this run's absence of changes"
            )
        };
        capsule.event(
            "after_capture_failed",
            json!({ "error": error.to_string() }),
        )?;
        let mut result = decide::not_run(
            &sealer.command_decision,
            Status::Error,
            Some(message),
            sealer.frame(),
        );
        // Unknown changes never read as clean.
        result.safety_outcome = Action::Deny;
        result.exit_code = self.evidence.exit.code;
        result.runtime = Some(decide::runtime_summary(
            self.evidence,
            self.verified_controls,
        ));
        result.capsule_tampered = self.tampered.to_vec();
        sealer.seal(result, referenced, None)
    }
}

/// What opening the capsule needs besides the launcher's request, root, capsule and timeout.
struct Opening<'c> {
    store: &'c Store,
    authority: &'c SealAuthority,
    started: Instant,
    started_at: String,
}

/// A held start (for a backend that [`agentdiff_backend_api::RuntimeBackend::holds_start`], in the
/// project root, for a command the policy does not block) made first, then the capsule opened.
/// A blocked command or an unavailable backend is reported as such before a failure of the held
/// start is; on every early end the held command is abandoned: nothing of it has run.
async fn open_with_held_start<'c>(
    o: Opening<'c>,
    launcher: &launch::Launcher<'c, '_>,
    private_workspace: bool,
) -> Result<(Sealer<'c>, EarlyStart), Result<RunOutcome, TransactionError>> {
    let req = launcher.req;
    let command_decision = req.policy.policy.decide_command(&req.argv[0]);
    let blocked = command_decision.action == Action::Deny;
    let hold = req.backend.holds_start() && !private_workspace && !blocked;
    let (mut held, start_failed) = match launcher.start_held_if(hold).await {
        Ok(held) => (held, None),
        Err(err) => (None, Some(err)),
    };
    o.store.note_last_run(launcher.capsule.id());
    let sealer = match open_capsule(o, launcher, command_decision) {
        Ok(sealer) => sealer,
        Err(e) => return Err(Err(abandon(held, e).await)),
    };
    let options = &launcher.options;
    if let Some(not_run) = refuse_before_capture(req, &sealer, options, &mut held).await {
        return Err(not_run);
    }
    match start_failed {
        None => Ok((sealer, held)),
        Some(err) => Err(seal_refused_start(&sealer, req.backend.id(), &err)),
    }
}

/// A command started held, with the plan it was started with.
type EarlyStart = Option<(launch::LaunchPlan, launch::Started)>;

/// Writes `metadata.json` and `policy.json`, and records the command's decision.
fn open_capsule<'c>(
    o: Opening<'c>,
    launcher: &launch::Launcher<'c, '_>,
    command_decision: agentdiff_policy::Decision,
) -> Result<Sealer<'c>, TransactionError> {
    let Opening {
        store,
        authority,
        started,
        started_at,
    } = o;
    let (req, capsule, root, timeout) = (
        launcher.req,
        launcher.capsule,
        launcher.root,
        launcher.timeout,
    );
    let run_id = capsule.id().to_string();
    let metadata = Metadata {
        schema_version: agentdiff_store::SCHEMA_VERSION,
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
        session: None,
    };
    capsule.write_artifact(Artifact::Metadata, &metadata)?;
    let policy_doc = PolicyDoc::of(&req.policy).map_err(TransactionError::EffectivePolicy)?;
    capsule.write_artifact(Artifact::Policy, &policy_doc)?;
    capsule.event("capsule_created", json!({ "run_id": run_id }))?;
    capsule.event(
        "command_decided",
        json!({ "action": command_decision.action, "rule": command_decision.rule }),
    )?;
    Ok(Sealer {
        capsule,
        objects: store.objects(),
        authority,
        run_id,
        command_decision,
        task: req.task.clone(),
        started,
        started_at,
        runtime: std::sync::Mutex::new(None),
    })
}

/// A denied command (never launched) or a backend that cannot run here with these options
/// (fail closed before touching anything): sealed as not run. A command started held is
/// abandoned first (it has not run, and its start files leave the capsule before the seal).
async fn refuse_before_capture(
    req: &RunRequest<'_>,
    sealer: &Sealer<'_>,
    options: &BackendOptions,
    held: &mut EarlyStart,
) -> Option<Result<RunOutcome, TransactionError>> {
    let refused = if sealer.command_decision.action == Action::Deny {
        Refused::Blocked
    } else {
        match req.backend.availability(options).await {
            Availability::Unavailable { reason, remedy } => Refused::Unavailable(reason, remedy),
            _ => return None,
        }
    };
    abandon(held.take(), ()).await;
    Some(match refused {
        Refused::Blocked => {
            let message = blocked_message(&req.argv[0], &sealer.command_decision);
            sealer.seal_not_run(Status::Blocked, Some(message), None, &[])
        }
        Refused::Unavailable(reason, remedy) => {
            match record_unavailable(sealer, req.backend.id(), reason, remedy) {
                Ok(message) => {
                    let refusal = Some(Refusal::BackendUnavailable);
                    sealer.seal_not_run(Status::Error, Some(message), refusal, &[])
                }
                Err(e) => Err(e),
            }
        }
    })
}

/// Why a run is refused before its tree is captured.
enum Refused {
    /// The policy blocks the command.
    Blocked,
    /// The backend cannot run here: its reason and remedy.
    Unavailable(String, String),
}

/// Why a denied command was not launched.
fn blocked_message(argv0: &std::ffi::OsStr, decision: &agentdiff_policy::Decision) -> String {
    format!(
        "command `{}` blocked by {} ({})",
        redact::escape_terminal(&argv0.to_string_lossy()),
        decision.rule,
        decision.reason
    )
}

/// The before-capture, with the object store's part of the tamper snapshot, taken before it
/// (the before-scan's own writes are objects this process confirmed, never findings): from the
/// scan record's listing when the store is as that record found it, else listed now. The
/// record, when the before-scan used it (objects were then claimed as verified: see
/// `store::scan_record`), is kept to tell whether this run's record is the same.
fn capture_before(
    capture: &CapturePlan<'_>,
    store: &Store,
    root: &Path,
    recent: &[String],
) -> Result<(capture::Captured, ObjectsSnapshot, Option<RecordedScan>), TransactionError> {
    // The record's claims are made only for a before-scan that can use its digests: one with a
    // verified earlier scan of this root.
    let previous = capture.previous_scan(root, recent);
    let checked = match previous {
        Some(_) => capture.recorded_scan()?,
        None => None,
    };
    let (mut recorded, objects) = match checked {
        Some((recorded, objects)) => (Some(recorded), objects),
        None => (None, ObjectsSnapshot::take(store.objects())?),
    };
    let before = capture.before(root, previous, recorded.as_ref())?;
    if let Some(r) = recorded.as_mut() {
        r.release_digests();
    }
    Ok((before, objects, recorded))
}

/// Records a backend that cannot run here; returns the message for the result.
fn record_unavailable(
    sealer: &Sealer<'_>,
    backend: &str,
    reason: String,
    remedy: String,
) -> Result<String, TransactionError> {
    let message = format!("runtime backend `{backend}` is unavailable: {reason}; {remedy}");
    sealer.write_runtime(RuntimeDoc::unavailable(backend, reason, remedy))?;
    Ok(message)
}

/// Ends a held start the run will not release (it stopped before the launch); `value` passes
/// through.
async fn abandon<T>(early: Option<(launch::LaunchPlan, launch::Started)>, value: T) -> T {
    if let Some((_, started)) = early {
        started.abort().await;
    }
    value
}

/// A held start the backend refused or could not make: nothing ran, and nothing was captured.
fn seal_refused_start(
    sealer: &Sealer<'_>,
    backend: &str,
    err: &agentdiff_backend_api::BackendError,
) -> Result<RunOutcome, TransactionError> {
    let refused = decide::refused_launch(err);
    record_refused(sealer, backend, &refused.message)?;
    let (status, refusal) = (refused.status, Some(refused.refusal));
    sealer.seal_not_run(status, Some(refused.message), refusal, &[])
}

/// Records a command the backend lost after launching it. The command ran: what it changed is
/// captured and classified like any run's, from the evidence [`launch::LaunchFailure::Lost`] holds.
fn record_lost(capsule: &Capsule, evidence: RunEvidence) -> Result<RunEvidence, TransactionError> {
    let message = evidence.failure.as_ref().map(decide::execution_error);
    capsule.event("backend_failed", json!({ "error": message }))?;
    Ok(evidence)
}

/// Records a launch the backend refused or could not start.
fn record_refused(
    sealer: &Sealer<'_>,
    backend: &str,
    message: &str,
) -> Result<(), TransactionError> {
    sealer
        .capsule
        .event("launch_refused", json!({ "message": message }))?;
    sealer.write_runtime(RuntimeDoc::refused(backend, message.to_string()))
}

/// Records the backend's evidence (`runtime.json`) and how the command ended.
fn record_exited(
    sealer: &Sealer<'_>,
    evidence: &RunEvidence,
    verified_controls: &[VerifiedControl],
    network: Option<agentdiff_store::NetworkEvidence>,
) -> Result<(), TransactionError> {
    sealer.write_runtime(RuntimeDoc::launched(evidence, verified_controls, network))?;
    sealer.capsule.event(
        "exited",
        json!({
            "code": evidence.exit.code,
            "signal": evidence.exit.signal,
            "timed_out": evidence.exit.timed_out,
            "interrupted_by": evidence.exit.interrupted_by,
        }),
    )?;
    Ok(())
}

/// [`record_exited`]; when it fails for lack of space, the reserve is given back and it is tried
/// once more (the event `store_reserve_used` says so).
fn record_exit_in_reserve(
    sealer: &Sealer<'_>,
    failed: &AfterCaptureFailed<'_>,
    network: Option<agentdiff_store::NetworkEvidence>,
) -> Result<(), TransactionError> {
    let (evidence, controls) = (failed.evidence, failed.verified_controls);
    let Err(e) = record_exited(sealer, evidence, controls, network.clone()) else {
        return Ok(());
    };
    if !failed.reserve.release_for(&e) {
        return Err(e);
    }
    record_exited(sealer, evidence, controls, network)?;
    sealer
        .capsule
        .event("store_reserve_used", json!({ "error": e.to_string() }))?;
    Ok(())
}

/// Compares the stored before and after trees, skipping equal subtrees. A tree that cannot be
/// read (destroyed while the command ran) does not stop the run from being sealed: the
/// comparison lists what the readable side shows below it as unverified changes and says it is
/// incomplete, which denies the run (`comparison_incomplete`).
fn compare(
    store: &Store,
    before: &capture::Captured,
    after: &capture::Captured,
    unreadable: &Option<String>,
) -> agentdiff_scan::Comparison {
    let mut comparison = agentdiff_scan::compare_trees(
        &before.manifest,
        &before.root_tree,
        &after.manifest,
        &after.root_tree,
        &before.trees(store),
    );
    // What the capsule guard could not read back counts as not compared.
    comparison.incomplete.extend(unreadable.iter().cloned());
    comparison
}

/// Materialises the private workspace from the before-state's backups (the before manifest is
/// read back whole from its tree for this).
fn materialize_workspace(store: &Store, capsule: &Capsule) -> Result<PathBuf, TransactionError> {
    let before = capsule.read_manifest(Artifact::Before, store.objects())?;
    let dir = crate::workspace::materialize(store, capsule, &before)
        .map_err(TransactionError::Workspace)?;
    capsule.event(
        "workspace_materialized",
        json!({ "path": dir.display().to_string() }),
    )?;
    Ok(dir)
}

/// `runtime.json` as stored for this evidence (see [`RuntimeDoc::launched`]), as JSON.
pub fn runtime_document(evidence: &RunEvidence) -> serde_json::Value {
    serde_json::to_value(RuntimeDoc::launched(evidence, &[], None)).unwrap_or_else(|_| json!({}))
}

#[cfg(unix)]
fn current_uid() -> Option<u32> {
    Some(nix::unistd::getuid().as_raw())
}

#[cfg(not(unix))]
fn current_uid() -> Option<u32> {
    None
}

#[cfg(test)]
mod tests;
