//! Cleanup: containers a crashed run left behind (found by label), and identity-checked stopping
//! of recorded engine-client processes.

use std::time::Duration;

use agentdiff_engine::backend::{CleanupOutcome, CleanupRecord, CleanupReport, ProcessIdentity};
use serde::Serialize;

use crate::engine::{Engine, EngineError, EngineKind, ProgramSource, ENGINE_CLIENT_VARS};

#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    #[error("run id {0:?} is not valid")]
    RunId(String),
    #[error("{0}")]
    Engine(#[from] EngineError),
}

/// What [`remove_run_containers`] did, per engine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RemovedContainers {
    /// `(engine, container id)` of every container removed.
    pub removed: Vec<(String, String)>,
    /// Engines that could not be asked (not installed, daemon unreachable), with the reason.
    pub unreachable: Vec<(String, String)>,
}

/// Remove every container labelled `agentdiff.run=<run_id>` (running or stopped) from each engine
/// found on PATH. `agentdiff cleanup RUN` calls this for runs of the container backend.
pub async fn remove_run_containers(run_id: &str) -> Result<RemovedContainers, CleanupError> {
    remove_run_containers_with(
        run_id,
        &[
            (EngineKind::Podman, ProgramSource::SearchPath),
            (EngineKind::Docker, ProgramSource::SearchPath),
        ],
        std::env::vars_os()
            .filter(|(k, _)| ENGINE_CLIENT_VARS.iter().any(|n| k == *n))
            .collect(),
    )
    .await
}

/// [`remove_run_containers`] with explicit engine binaries and client environment.
pub async fn remove_run_containers_with(
    run_id: &str,
    engines: &[(EngineKind, ProgramSource)],
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
) -> Result<RemovedContainers, CleanupError> {
    crate::argv::container_name(run_id).map_err(|_| CleanupError::RunId(run_id.to_string()))?;
    let mut out = RemovedContainers::default();
    for (kind, source) in engines {
        let Some(program) = source.resolve(*kind) else {
            continue;
        };
        let engine = Engine {
            kind: *kind,
            program,
            env: env.clone(),
        };
        let ids = match engine.containers_of_run(run_id).await {
            Ok(ids) => ids,
            Err(e) => {
                out.unreachable
                    .push((kind.as_str().to_string(), e.to_string()));
                continue;
            }
        };
        for id in ids {
            engine.remove(&id).await?;
            out.removed.push((kind.as_str().to_string(), id));
        }
    }
    Ok(out)
}

/// Stop recorded processes (the engine client of an earlier run), each only after its pid and
/// start time match the record.
pub async fn stop_identities(ids: &[ProcessIdentity], grace: Duration) -> CleanupReport {
    let mut report = CleanupReport {
        mechanism: "kill_with_start_time_check".into(),
        grace_ms: grace.as_millis() as u64,
        records: Vec::new(),
        errors: Vec::new(),
        resources_removed: Vec::new(),
    };
    for id in ids {
        let outcome = stop_one(id, grace).await;
        report.records.push(CleanupRecord {
            identity: id.clone(),
            executable: String::new(),
            outcome,
            detail: None,
        });
    }
    report
}

async fn stop_one(id: &ProcessIdentity, grace: Duration) -> CleanupOutcome {
    #[cfg(unix)]
    {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        // A killed child of the caller stays a zombie until reaped: it has ended all the same.
        let matches = || {
            crate::identity::read(id.pid).as_ref() == Some(id)
                && !crate::identity::is_zombie(id.pid)
        };
        match crate::identity::read(id.pid) {
            None => return CleanupOutcome::AlreadyExited,
            Some(now) if now != *id => return CleanupOutcome::PidReused,
            Some(_) => {}
        }
        let Ok(pid) = i32::try_from(id.pid).map(Pid::from_raw) else {
            return CleanupOutcome::AccessDenied;
        };
        if let Err(e) = kill(pid, Signal::SIGTERM) {
            return if e == nix::errno::Errno::ESRCH {
                CleanupOutcome::AlreadyExited
            } else {
                CleanupOutcome::AccessDenied
            };
        }
        let deadline = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if !matches() {
                return CleanupOutcome::Terminated;
            }
        }
        // Re-check right before KILL: the short window left is the documented residual risk of
        // plain signals (the process branch's pidfd path closes it for local runs).
        if !matches() {
            return CleanupOutcome::Terminated;
        }
        if kill(pid, Signal::SIGKILL).is_err() {
            return CleanupOutcome::Escaped;
        }
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(25)).await;
            if !matches() {
                return CleanupOutcome::Killed;
            }
        }
        CleanupOutcome::Escaped
    }
    #[cfg(not(unix))]
    {
        let _ = (id, grace);
        CleanupOutcome::AccessDenied
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_matching_identity_is_terminated_and_a_mismatch_is_never_signalled() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let id = crate::identity::read(child.id()).unwrap();
        let mut wrong = id.clone();
        wrong.start_time_ticks += 1;
        let report = stop_identities(&[wrong], Duration::from_millis(200)).await;
        assert_eq!(report.records[0].outcome, CleanupOutcome::PidReused);
        // The child is ours, so it stays a zombie until reaped: still reported as terminated.
        let report = stop_identities(&[id], Duration::from_secs(2)).await;
        assert_eq!(report.records[0].outcome, CleanupOutcome::Terminated);
        let status = child.wait().unwrap();
        assert!(!status.success());
    }
}
