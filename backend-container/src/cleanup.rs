//! Cleanup of containers a crashed run left behind, found by their run label. The recorded
//! engine-client processes are ordinary host processes: the engine's identity-checked pidfd
//! cleanup stops them (see `ContainerBackend::cleanup_run`).

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
