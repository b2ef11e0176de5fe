//! Cleanup of what a crashed run left behind: its containers (with their volumes), found by the
//! run's label, which carries the run id and a digest of the project root
//! ([`crate::argv::RunIdentity`]), so a cleanup never touches another project's run of the same
//! id; and the directories it created next to its private workspace (ship-out staging, the
//! `--cidfile` directory), found by their names (`.<run>.shipped-XXXXXX[.old]`,
//! `.<run>.cid-XXXXXX`). The recorded engine-client processes are ordinary host processes: the
//! engine's identity-checked pidfd cleanup stops them (see `ContainerBackend::cleanup_run_at`).
//!
//! A remote run's containers live on the engine it ran on, which the environment of a later
//! `agentdiff cleanup` need not name. So a remote run records that engine at launch
//! ([`RecordedEngine`], in the MAC'd `launched` event) and cleanup asks it, removing the run's
//! containers by label and the recorded one by id, with their volumes, and checking the engine
//! lists none of them any more. The engine hands the record back only from an authenticated
//! capsule; its address is still checked here like a `--backend-option engine-host=` value.
//!
//! Not defended: a run killed between creating its remote container and writing the `launched`
//! event has no record; its container (and volume) is found only through an engine the
//! cleanup's own environment names.

use serde::{Deserialize, Serialize};

use std::path::{Path, PathBuf};

use crate::argv::RunIdentity;
use crate::engine::{Engine, EngineError, EngineKind, ProgramSource, ENGINE_CLIENT_VARS};
use crate::remote::ENDPOINT_VARS;

#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    #[error("run id {0:?} is not valid")]
    RunId(String),
    #[error("{0}")]
    Engine(#[from] EngineError),
    #[error("the run's recorded engine address {0:?} is not an engine API address")]
    RecordedEndpoint(String),
    #[error("no {0} client is installed to reach the run's recorded engine")]
    NoClient(&'static str),
    #[error("container {id} is still listed by the {engine} engine after its removal")]
    StillListed { id: String, engine: String },
    #[error("volume(s) {volumes:?} of container {id} are still present on the {engine} engine after their removal")]
    VolumesLeft {
        id: String,
        engine: String,
        volumes: Vec<String>,
    },
}

/// Client variables that carry the TLS material's location (paths, not secrets); recorded with
/// the endpoint because a `tcp://` engine with TLS cannot be reached without them.
const TLS_VARS: [&str; 2] = ["DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY"];

/// What a remote run records at launch so that cleanup reaches the engine it ran on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedEngine {
    pub engine: EngineKind,
    /// The address the run's client was given.
    pub endpoint: String,
    /// [`TLS_VARS`] as the run's client had them.
    #[serde(default)]
    pub tls: Vec<(String, String)>,
    /// The container the run created.
    #[serde(default)]
    pub container_id: Option<String>,
    /// The value of the run's label ([`crate::argv::RunIdentity::key`]).
    #[serde(default)]
    pub run_key: Option<String>,
}

impl RecordedEngine {
    /// The record of a run whose client talked to `endpoint` with environment `env`.
    pub fn of(
        engine: EngineKind,
        endpoint: &str,
        env: &[(std::ffi::OsString, std::ffi::OsString)],
        container_id: Option<&str>,
        run_key: &str,
    ) -> RecordedEngine {
        RecordedEngine {
            engine,
            endpoint: endpoint.to_string(),
            tls: env
                .iter()
                .filter(|(k, _)| TLS_VARS.iter().any(|n| k == n))
                .filter_map(|(k, v)| Some((k.to_str()?.to_string(), v.to_str()?.to_string())))
                .collect(),
            container_id: container_id.map(str::to_string),
            run_key: Some(run_key.to_string()),
        }
    }

    /// The client environment cleanup uses: this process's client variables without any that
    /// choose an engine or TLS material, then the recorded ones.
    fn client_env(
        &self,
        current: &[(std::ffi::OsString, std::ffi::OsString)],
    ) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
        let mut env: Vec<_> = current
            .iter()
            .filter(|(k, _)| ENGINE_CLIENT_VARS.iter().any(|n| k == *n))
            .filter(|(k, _)| !ENDPOINT_VARS.iter().chain(&TLS_VARS).any(|n| k == *n))
            .cloned()
            .collect();
        env.push((
            crate::remote::endpoint_var(self.engine).into(),
            self.endpoint.clone().into(),
        ));
        env.extend(self.tls.iter().map(|(k, v)| (k.into(), v.into())));
        env
    }
}

/// Whether `key` may be passed to an engine client inside a label filter.
fn plain_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 160
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// Remove the run's containers from the engine `recorded` names: every container labelled with
/// `run_key` (the run's identity as this cleanup computed it, else as recorded) and the recorded
/// one by id, each removed with its volumes and checked gone. An engine that cannot be asked is
/// reported in `unreachable`, a container or volume still listed after removal in the error.
/// `client_env` is the client environment the backend was configured with; its engine choice is
/// replaced.
pub async fn remove_recorded_containers(
    run_key: Option<&str>,
    recorded: &RecordedEngine,
    program: &ProgramSource,
    client_env: &[(std::ffi::OsString, std::ffi::OsString)],
) -> Result<RemovedContainers, CleanupError> {
    let run_key = run_key.or(recorded.run_key.as_deref());
    if let Some(key) = run_key.filter(|k| !plain_key(k)) {
        return Err(CleanupError::RunId(key.to_string()));
    }
    crate::options::parse_engine_host(&recorded.endpoint)
        .ok()
        .filter(|h| !matches!(h, crate::options::EngineHost::Env))
        .ok_or_else(|| CleanupError::RecordedEndpoint(recorded.endpoint.clone()))?;
    let kind = recorded.engine;
    let program = program
        .resolve(kind)
        .ok_or(CleanupError::NoClient(kind.as_str()))?;
    let engine = Engine {
        kind,
        program,
        env: recorded.client_env(client_env),
    };
    let label = format!("{} at {}", kind.as_str(), recorded.endpoint);
    let mut out = RemovedContainers::default();
    let listed = match run_key {
        Some(key) => engine.containers_of_run(key).await,
        None => Ok(Vec::new()),
    };
    let mut ids = match listed {
        Ok(ids) => ids,
        Err(e) => {
            out.unreachable.push((label, e.to_string()));
            return Ok(out);
        }
    };
    // The recorded container by id too, should it have lost its label (a hex id only: it is
    // passed to the client as a filter).
    let unlisted = recorded
        .container_id
        .as_ref()
        .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .filter(|id| !ids.iter().any(|i| i.starts_with(id.as_str())));
    if let Some(id) = unlisted {
        let filter = format!("id={id}");
        let listed = engine
            .call_ok(&["ps", "-a", "-q", "--no-trunc", "--filter", &filter])
            .await?;
        ids.extend(
            listed
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string),
        );
    }
    for id in ids {
        remove_one(&engine, &label, id, &mut out).await?;
    }
    Ok(out)
}

/// Remove one container with its volumes, checked gone, into `out`.
async fn remove_one(
    engine: &Engine,
    label: &str,
    id: String,
    out: &mut RemovedContainers,
) -> Result<(), CleanupError> {
    let removal = crate::remote::remove_verified(engine, &id).await?;
    if !removal.container_gone {
        return Err(CleanupError::StillListed {
            id,
            engine: label.to_string(),
        });
    }
    for volume in removal.volumes_removed {
        out.volumes.push((label.to_string(), volume));
    }
    out.removed.push((label.to_string(), id.clone()));
    if !removal.volumes_left.is_empty() {
        return Err(CleanupError::VolumesLeft {
            id,
            engine: label.to_string(),
            volumes: removal.volumes_left,
        });
    }
    Ok(())
}

/// What [`remove_run_containers`] did, per engine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RemovedContainers {
    /// `(engine, container id)` of every container removed.
    pub removed: Vec<(String, String)>,
    /// `(engine, volume name)` of every volume removed with them (and checked gone).
    pub volumes: Vec<(String, String)>,
    /// Engines that could not be asked (not installed, daemon unreachable), with the reason.
    pub unreachable: Vec<(String, String)>,
}

/// Remove every container labelled with `run` (running or stopped), with its volumes, from
/// each engine found on PATH. `agentdiff cleanup RUN` calls this for local runs of the container
/// backend.
pub async fn remove_run_containers(run: &RunIdentity) -> Result<RemovedContainers, CleanupError> {
    remove_run_containers_with(
        run,
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
    run: &RunIdentity,
    engines: &[(EngineKind, ProgramSource)],
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
) -> Result<RemovedContainers, CleanupError> {
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
        let ids = match engine.containers_of_run(&run.key()).await {
            Ok(ids) => ids,
            Err(e) => {
                out.unreachable
                    .push((kind.as_str().to_string(), e.to_string()));
                continue;
            }
        };
        for id in ids {
            remove_one(&engine, kind.as_str(), id, &mut out).await?;
        }
    }
    Ok(out)
}

/// What [`remove_run_leftovers`] did.
#[derive(Debug, Default)]
pub struct LeftoverDirs {
    pub removed: Vec<PathBuf>,
    pub errors: Vec<String>,
}

/// Remove the directories a killed run left next to its private workspace `workdir` (a partial
/// ship-out copy, the workspace moved aside during the swap, the `--cidfile` directory). Only
/// real directories with exactly those names are removed; a symlink is neither followed nor
/// removed, and `remove_dir_all` never follows one below.
pub fn remove_run_leftovers(workdir: &Path) -> LeftoverDirs {
    let mut out = LeftoverDirs::default();
    let Some(parent) = workdir.parent() else {
        return out;
    };
    let entries = match std::fs::read_dir(parent) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return out,
        Err(e) => {
            out.errors
                .push(format!("listing {}: {e}", parent.display()));
            return out;
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name
            .to_str()
            .is_some_and(|n| crate::siblings::is_run_sibling(n, workdir))
        {
            continue;
        }
        let path = entry.path();
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => match std::fs::remove_dir_all(&path) {
                Ok(()) => out.removed.push(path),
                Err(e) => out.errors.push(format!("removing {}: {e}", path.display())),
            },
            Ok(_) => out.errors.push(format!(
                "{} is not a directory this run created; left in place",
                path.display()
            )),
            Err(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn pair(k: &str, v: &str) -> (OsString, OsString) {
        (k.into(), v.into())
    }

    #[test]
    fn the_recorded_engine_replaces_every_engine_choice_of_the_cleanups_environment() {
        let at_run = [
            pair("DOCKER_HOST", "tcp://build-1:2376"),
            pair("DOCKER_CERT_PATH", "/certs"),
            pair("DOCKER_TLS_VERIFY", "1"),
            pair("HOME", "/home/u"),
        ];
        let recorded = RecordedEngine::of(
            EngineKind::Docker,
            "tcp://build-1:2376",
            &at_run,
            Some("abc"),
            "run-1-0123456789abcdef",
        );
        assert_eq!(
            recorded.tls,
            [
                ("DOCKER_CERT_PATH".to_string(), "/certs".to_string()),
                ("DOCKER_TLS_VERIFY".to_string(), "1".to_string())
            ]
        );
        let now = [
            pair("DOCKER_HOST", "unix:///var/run/docker.sock"),
            pair("DOCKER_CONTEXT", "other"),
            pair("CONTAINER_HOST", "ssh://elsewhere"),
            pair("DOCKER_CERT_PATH", "/other-certs"),
            pair("HOME", "/home/u"),
            pair("SECRET_TOKEN", "x"),
        ];
        let mut env = recorded.client_env(&now);
        env.sort();
        assert_eq!(
            env,
            [
                pair("DOCKER_CERT_PATH", "/certs"),
                pair("DOCKER_HOST", "tcp://build-1:2376"),
                pair("DOCKER_TLS_VERIFY", "1"),
                pair("HOME", "/home/u"),
            ]
        );
    }

    #[tokio::test]
    async fn a_recorded_address_that_is_not_an_engine_address_is_refused_before_any_client_runs() {
        for endpoint in ["env", "http://x", "", "file:///etc/passwd"] {
            let recorded = RecordedEngine {
                engine: EngineKind::Podman,
                endpoint: endpoint.into(),
                tls: Vec::new(),
                container_id: None,
                run_key: None,
            };
            // A client that would fail loudly if it were run.
            let program = ProgramSource::Fixed("/nonexistent/podman".into());
            let err = remove_recorded_containers(Some("run-1-0a"), &recorded, &program, &[])
                .await
                .unwrap_err();
            assert!(
                matches!(err, CleanupError::RecordedEndpoint(_)),
                "{endpoint}: {err}"
            );
        }
    }
}
