//! Cleaning up after a recorded run (`agentdiff cleanup RUN`): stop the processes it left behind,
//! remove its run cgroup and its private workspace, and record what happened as
//! `cleanup-result.json` beside the sealed evidence (which is never touched).
//!
//! Only evidence that authenticates under this user's seal key is acted on
//! ([`recorded_processes`] checks it first): a sealed capsule whose seal verifies as authenticated,
//! or — for a run whose agentdiff was killed before the seal — a `launched` event carrying this
//! user's MAC. Anything else is refused ([`CleanupError::NotAuthenticated`]) unless the caller
//! forces it, and the result records how the evidence was trusted. A forged capsule could
//! otherwise name any process of the user's (its real pid and start time) and have it signalled.
//!
//! The processes come from `runtime.json` of a sealed run; an unsealed run (its agentdiff was
//! killed) is cleaned from its `launched` event only: the root identity and every process still in
//! the run's cgroup (membership is the attribution). A process running as root can move itself out
//! of the run cgroup; a live monitor tracks it as a descendant and records it (`left_run_cgroup`),
//! but once the monitor is dead such a process is not attributable from the capsule. Every
//! identity is checked by the backend before it is signalled; a pid that now belongs to another
//! process is refused, never signalled.
//!
//! On request, the containers the run recorded as started during it are stopped through their
//! engine, each by id after the engine confirms its creation time lies inside the recorded run
//! window ([`agentdiff_process::containers::stop_recorded`]).
//!
//! Not defended: a capsule edited to name another agentdiff run's cgroup below the same mount
//! (the identities in it are still checked one by one before any signal).

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use agentdiff_backend_api::{CleanupOutcome, CleanupReport, DynRuntimeBackend, ProcessIdentity};
use agentdiff_process::containers::{self, ContainerEvidence, ContainerStop};
use agentdiff_process::RUN_CGROUP_PREFIX;
use agentdiff_store::seal::{trusted_process_evidence, TrustedEvidence, VerifyContext};
use agentdiff_store::{Capsule, RecoveryArtifact, Store, StoreError};

/// Why a recorded run's processes cannot be determined, or its cleanup not recorded.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    /// An artifact could not be read or is malformed.
    #[error(transparent)]
    Capsule(StoreError),
    /// The `launched` event names a directory that is not one of agentdiff's run cgroups.
    #[error(
        "run {run_id} has no runtime.json and its launched event names `{cgroup}`, which is not \
         an agentdiff run cgroup; refused"
    )]
    NotARunCgroup { run_id: String, cgroup: String },
    /// The capsule's process evidence does not authenticate under this user's key.
    #[error(
        "refusing to clean up run {run_id}: {reason}; nothing was signalled. Check it with \
         `agentdiff verify {run_id}`; `agentdiff cleanup --force` acts on it anyway, at the risk \
         of signalling an unrelated process the capsule names"
    )]
    NotAuthenticated { run_id: String, reason: String },
    /// The cleanup happened but could not be written to the capsule.
    #[error("cannot record the cleanup in run {run_id}: {source}")]
    Record {
        run_id: String,
        #[source]
        source: StoreError,
    },
}

/// What cleanup acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedProcesses {
    /// The backend that recorded the run (the one that must clean it up).
    pub backend: String,
    pub ids: Vec<ProcessIdentity>,
    /// The run's cgroup, when the run was interrupted before writing evidence.
    pub cgroup: Option<PathBuf>,
    /// How the evidence was trusted.
    pub trust: CleanupTrust,
    /// What the backend recorded at launch to reach resources away from this host (see
    /// `LaunchFacts::resources`); only from an authenticated capsule, never a forced one.
    pub resources: Option<serde_json::Value>,
}

/// How the evidence cleanup acted on was trusted (recorded in `cleanup-result.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum CleanupTrust {
    /// The sealed capsule authenticates under this user's key.
    AuthenticatedSeal,
    /// The run is unsealed and its `launched` event carries this user's MAC.
    AuthenticatedLaunchEvent,
    /// The run is unsealed and never launched anything.
    NothingLaunched,
    /// Nothing authenticated; the caller forced the cleanup anyway.
    Forced { reason: String },
}

/// `cleanup-result.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CleanupResult {
    pub schema_version: u32,
    pub run_id: String,
    pub backend: String,
    /// Identities refused (pid reused, access denied) or not stopped (escaped), and containers
    /// refused or not stopped.
    pub refused_or_escaped: usize,
    /// How the evidence was trusted (absent in results of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<CleanupTrust>,
    pub cleanup: CleanupReport,
    /// With `--containers`: what happened to each container the run recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containers: Option<Vec<ContainerStop>>,
}

/// Whether the capsule's process evidence may be acted on; with `force`, evidence that does not
/// authenticate is accepted and the reason recorded.
pub fn authenticate(
    capsule: &Capsule,
    store: &Store,
    ctx: &VerifyContext,
    force: bool,
) -> Result<CleanupTrust, CleanupError> {
    let checked =
        trusted_process_evidence(capsule, store.objects(), ctx).map_err(CleanupError::Capsule)?;
    match checked {
        Ok(TrustedEvidence::Sealed) => Ok(CleanupTrust::AuthenticatedSeal),
        Ok(TrustedEvidence::LaunchEvent) => Ok(CleanupTrust::AuthenticatedLaunchEvent),
        Ok(TrustedEvidence::NothingLaunched) => Ok(CleanupTrust::NothingLaunched),
        Err(reason) if force => Ok(CleanupTrust::Forced {
            reason: reason.to_string(),
        }),
        Err(reason) => Err(CleanupError::NotAuthenticated {
            run_id: capsule.id().to_string(),
            reason: reason.to_string(),
        }),
    }
}

/// The processes a run recorded, after [`authenticate`]: from the sealed `runtime.json`, or, for a
/// run whose agentdiff died before the seal, from the `launched` event and the run's cgroup.
pub fn recorded_processes(
    capsule: &Capsule,
    store: &Store,
    ctx: &VerifyContext,
    force: bool,
) -> Result<RecordedProcesses, CleanupError> {
    let trust = authenticate(capsule, store, ctx, force)?;
    // An unsealed run's runtime.json, if any, was never sealed: only the launched event counts.
    if !capsule.is_sealed() {
        return from_launch_event(capsule, trust);
    }
    let runtime = capsule.runtime().map_err(CleanupError::Capsule)?;
    let mut ids = Vec::new();
    // A run that never launched recorded no processes.
    for p in runtime.evidence().map_or(&[][..], |e| &e.processes) {
        push_unique(&mut ids, p.identity.clone());
    }
    let resources = recorded_resources(capsule, &trust)?;
    Ok(RecordedProcesses {
        backend: runtime.backend().to_string(),
        ids,
        cgroup: None,
        trust,
        resources,
    })
}

/// Whether this user's agentdiff vouched for the evidence (a sealed capsule or a MAC'd
/// `launched` event under this user's key).
fn vouched(trust: &CleanupTrust) -> bool {
    matches!(
        trust,
        CleanupTrust::AuthenticatedSeal | CleanupTrust::AuthenticatedLaunchEvent
    )
}

/// The `launched` event's `resources`, when the capsule authenticated: a forced cleanup acts on
/// processes it can verify one by one, but never sends a backend to an address nobody vouched for.
fn recorded_resources(
    capsule: &Capsule,
    trust: &CleanupTrust,
) -> Result<Option<serde_json::Value>, CleanupError> {
    if !vouched(trust) {
        return Ok(None);
    }
    Ok(capsule
        .launched_event()
        .map_err(CleanupError::Capsule)?
        .and_then(|launched| launched.resources))
}

fn from_launch_event(
    capsule: &Capsule,
    trust: CleanupTrust,
) -> Result<RecordedProcesses, CleanupError> {
    let backend = capsule.metadata().map_err(CleanupError::Capsule)?.backend;
    let Some(launched) = capsule.launched_event().map_err(CleanupError::Capsule)? else {
        // Nothing was launched: nothing to stop.
        return Ok(RecordedProcesses {
            backend,
            ids: Vec::new(),
            cgroup: None,
            trust,
            resources: None,
        });
    };
    let resources = launched.resources.clone().filter(|_| vouched(&trust));
    let mut ids: Vec<ProcessIdentity> = launched.root.into_iter().collect();
    let cgroup = launched.cgroup.map(PathBuf::from);
    if let Some(cg) = &cgroup {
        if !is_run_cgroup(cg, cgroup_mount().as_deref()) {
            return Err(CleanupError::NotARunCgroup {
                run_id: capsule.id().to_string(),
                cgroup: agentdiff_host::redact::escape_terminal(&cg.display().to_string()),
            });
        }
        if let Ok(text) = std::fs::read_to_string(cg.join("cgroup.procs")) {
            for pid in text.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                if let Ok(id) = agentdiff_process::read_identity(pid) {
                    push_unique(&mut ids, id);
                }
            }
        }
    }
    Ok(RecordedProcesses {
        backend,
        ids,
        cgroup,
        trust,
        resources,
    })
}

fn push_unique(ids: &mut Vec<ProcessIdentity>, id: ProcessIdentity) {
    if !ids.contains(&id) {
        ids.push(id);
    }
}

#[cfg(target_os = "linux")]
fn cgroup_mount() -> Option<PathBuf> {
    agentdiff_process::cgroup::cgroup2_mount()
}

#[cfg(not(target_os = "linux"))]
fn cgroup_mount() -> Option<PathBuf> {
    None
}

/// A cgroup directory agentdiff created for a run: below the cgroup v2 mount, named with the run
/// cgroup prefix, no `..`. Without a cgroup v2 mount no path qualifies.
pub fn is_run_cgroup(path: &Path, mount: Option<&Path>) -> bool {
    mount.is_some_and(|m| path.starts_with(m) && path != m)
        && path
            .components()
            .all(|c| !matches!(c, Component::ParentDir))
        && path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(RUN_CGROUP_PREFIX))
}

/// Identities refused (pid reused, access denied) or not stopped (escaped).
pub fn refused_or_escaped(report: &CleanupReport) -> usize {
    report
        .records
        .iter()
        .filter(|r| {
            matches!(
                r.outcome,
                CleanupOutcome::PidReused | CleanupOutcome::AccessDenied | CleanupOutcome::Escaped
            )
        })
        .count()
}

/// Cleans up one recorded run through `backend` (the one that recorded it) and writes
/// `cleanup-result.json` and a recovery event.
pub async fn cleanup_run(
    store: &Store,
    capsule: &Capsule,
    backend: &dyn DynRuntimeBackend,
    processes: RecordedProcesses,
    grace: Duration,
    stop_containers: bool,
) -> Result<CleanupResult, CleanupError> {
    let run_id = capsule.id().to_string();
    let resources = processes.resources.as_ref();
    let workspace = crate::workspace::workspace_dir(store, capsule.id());
    let place = agentdiff_backend_api::RunPlace {
        root: store.root(),
        workspace: &workspace,
    };
    let mut report = backend
        .cleanup_run_at(place, &run_id, &processes.ids, grace, resources)
        .await;
    if let Some(cg) = &processes.cgroup {
        remove_run_cgroup(cg, &mut report);
    }
    // A private workspace left by a crashed run holds a full copy of the tree.
    match crate::workspace::discard(store, capsule.id()) {
        Ok(true) => report
            .resources_removed
            .push(format!("private workspace of run {run_id}")),
        Ok(false) => {}
        Err(e) => report.errors.push(format!(
            "the run's private workspace could not be removed: {e}"
        )),
    }
    let stops = if stop_containers {
        Some(containers::stop_recorded(
            &recorded_containers(capsule)?,
            grace,
        ))
    } else {
        None
    };
    let containers_refused = stops.iter().flatten().filter(|s| !s.succeeded()).count();
    let result = CleanupResult {
        schema_version: agentdiff_store::SCHEMA_VERSION,
        run_id: run_id.clone(),
        backend: processes.backend,
        refused_or_escaped: refused_or_escaped(&report) + containers_refused,
        trust: Some(processes.trust),
        cleanup: report,
        containers: stops,
    };
    let record = |source| CleanupError::Record {
        run_id: run_id.clone(),
        source,
    };
    capsule
        .write_recovery(RecoveryArtifact::CleanupResult, &result)
        .map_err(record)?;
    capsule
        .recovery_event(
            "cleanup",
            json!({
                "identities": result.cleanup.records.len(),
                "refused_or_escaped": result.refused_or_escaped,
            }),
        )
        .map_err(record)?;
    Ok(result)
}

/// The containers a run recorded as started during it (none for a run without that evidence, or
/// whose monitor died before writing it).
pub fn recorded_containers(capsule: &Capsule) -> Result<ContainerEvidence, CleanupError> {
    match capsule.runtime() {
        Ok(doc) => Ok(doc
            .evidence()
            .and_then(|e| e.containers.clone())
            .unwrap_or_default()),
        Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(ContainerEvidence::default())
        }
        Err(e) => Err(CleanupError::Capsule(e)),
    }
}

/// Empty now that its processes were stopped; a leftover cgroup directory is harmless but
/// untidy, so a failure is only reported.
fn remove_run_cgroup(cg: &Path, report: &mut CleanupReport) {
    match std::fs::remove_dir(cg) {
        Ok(()) => report
            .resources_removed
            .push(format!("run cgroup {}", cg.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => report.errors.push(format!(
            "the run cgroup {} was not removed: {e}",
            cg.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_prefixed_directories_below_the_mount_are_run_cgroups() {
        let mount = Some(Path::new("/sys/fs/cgroup"));
        let yes = Path::new("/sys/fs/cgroup/user.slice/agentdiff-12-0");
        assert!(is_run_cgroup(yes, mount));
        for no in [
            "/sys/fs/cgroup/user.slice/other",
            "/tmp/agentdiff-12-0",
            "/sys/fs/cgroup/../../tmp/agentdiff-1",
            "/sys/fs/cgroup",
        ] {
            assert!(!is_run_cgroup(Path::new(no), mount), "{no}");
        }
        // A cgroup v2 mounted elsewhere is found where it is, not at a fixed path.
        let elsewhere = Some(Path::new("/run/cg2"));
        assert!(is_run_cgroup(
            Path::new("/run/cg2/agentdiff-1-0"),
            elsewhere
        ));
        assert!(!is_run_cgroup(yes, elsewhere));
        assert!(!is_run_cgroup(yes, None));
    }
}
