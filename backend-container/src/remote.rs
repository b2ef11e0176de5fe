//! Remote mode: the engine may run on another machine, so nothing of this machine is mounted.
//! The container is created with an engine-side volume on `/workspace`; the private workspace is
//! shipped in with the engine's archive upload (`cp - CTR:/workspace`, a tar stream agentdiff
//! builds, [`crate::archive::pack`]), the container is started and waited for, and the workspace
//! is shipped back (`cp CTR:/workspace/. -`) through [`crate::archive::unpack`] into a fresh
//! directory next to the private workspace, which then replaces it. The engine captures,
//! classifies and promotes from the private workspace exactly as for a local engine.
//!
//! Remote mode is chosen explicitly (`engine-host=URL`, or `engine-host=env` to honour
//! DOCKER_HOST / CONTAINER_HOST). Without it, an engine client environment that points elsewhere
//! (DOCKER_HOST other than a unix socket, CONTAINER_HOST, CONTAINER_CONNECTION, a DOCKER_CONTEXT
//! other than `default`) is refused: a bind mount would name the other machine's filesystem.
//!
//! Invariants: the returned archive is untrusted input (see [`crate::archive`]); when it is
//! refused, the private workspace keeps its pre-run content and the run records the failure;
//! the container is removed by id with its volume and its absence is checked.
//!
//! Not defended: the engine itself (it runs the command and could return anything a command
//! could have written); a plain `tcp://` address is neither authenticated nor encrypted, which
//! the evidence says; a unix socket forwarded from another machine is not detected.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::archive::{self, ArchiveError, Limits, Shipped};
use crate::engine::{Engine, EngineError, EngineKind};
use crate::options::{EngineHost, UserSpec};

/// Client variables that choose which engine the client talks to.
pub const ENDPOINT_VARS: [&str; 4] = [
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "CONTAINER_HOST",
    "CONTAINER_CONNECTION",
];

/// Deadline of one shipping direction.
pub const SHIP_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("engine-host=env, but {0} is not set in agentdiff's environment; set it, or give the address (`--backend-option engine-host=tcp://HOST:PORT`)")]
    NoEnvEndpoint(&'static str),
    #[error("{name}={value} points the {engine} client at an engine that may run on another machine, where a bind mount of the workspace would name that machine's filesystem; pass `--backend-option engine-host=env` to run there with the workspace shipped through the engine API, or unset {name}")]
    RemoteClientEnv {
        name: &'static str,
        value: String,
        engine: &'static str,
    },
    #[error("`--env {0}` would point the engine client at another engine; the engine's address is chosen with `--backend-option engine-host=…` only")]
    EndpointPassedThrough(String),
    #[error("{0}")]
    Engine(#[from] EngineError),
    #[error("the engine's identity could not be read ({0}); is the address an engine API?")]
    Identity(String),
    #[error("shipping the workspace {direction}: {source}")]
    Archive {
        direction: &'static str,
        #[source]
        source: ArchiveError,
    },
    #[error("shipping the workspace {direction}: `{program} cp` failed (exit {code:?}): {stderr}")]
    Copy {
        direction: &'static str,
        program: String,
        code: Option<i32>,
        stderr: String,
    },
    #[error("shipping the workspace {direction} did not finish within {secs} s")]
    TimedOut { direction: &'static str, secs: u64 },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> RemoteError {
    let context = context.into();
    move |source| RemoteError::Io { context, source }
}

/// The variable the client of `kind` reads its address from.
pub fn endpoint_var(kind: EngineKind) -> &'static str {
    match kind {
        EngineKind::Docker => "DOCKER_HOST",
        EngineKind::Podman => "CONTAINER_HOST",
    }
}

fn env_value<'a>(env: &'a [(OsString, OsString)], name: &str) -> Option<&'a str> {
    env.iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.to_str())
        .filter(|v| !v.is_empty())
}

/// The address a remote run uses.
pub fn endpoint(
    host: &EngineHost,
    kind: EngineKind,
    client_env: &[(OsString, OsString)],
) -> Result<String, RemoteError> {
    match host {
        EngineHost::Url(url) => Ok(url.clone()),
        EngineHost::Env => {
            let var = endpoint_var(kind);
            let url = env_value(client_env, var).ok_or(RemoteError::NoEnvEndpoint(var))?;
            crate::options::validate_engine_url(url).map_err(|_| {
                RemoteError::Identity(format!(
                    "{var}={url:?} is not {}",
                    crate::options::ENGINE_HOST_EXPECTED
                ))
            })?;
            Ok(url.to_string())
        }
    }
}

/// Both modes: `--env` of an address variable is refused (the engine client would read the
/// command's value and talk to another engine).
pub fn refuse_endpoint_passthrough(passed_through: &[String]) -> Result<(), RemoteError> {
    match passed_through
        .iter()
        .find(|n| ENDPOINT_VARS.contains(&n.as_str()))
    {
        Some(name) => Err(RemoteError::EndpointPassedThrough(name.clone())),
        None => Ok(()),
    }
}

/// Local mode: refuse a client environment that points the engine elsewhere.
pub fn refuse_remote_client_env(
    kind: EngineKind,
    client_env: &[(OsString, OsString)],
) -> Result<(), RemoteError> {
    let remote = |name: &'static str, value: &str| RemoteError::RemoteClientEnv {
        name,
        value: value.to_string(),
        engine: kind.as_str(),
    };
    match kind {
        EngineKind::Docker => {
            if let Some(v) =
                env_value(client_env, "DOCKER_HOST").filter(|v| !v.starts_with("unix://"))
            {
                return Err(remote("DOCKER_HOST", v));
            }
            if let Some(v) = env_value(client_env, "DOCKER_CONTEXT").filter(|v| *v != "default") {
                return Err(remote("DOCKER_CONTEXT", v));
            }
        }
        EngineKind::Podman => {
            for name in ["CONTAINER_HOST", "CONTAINER_CONNECTION"] {
                if let Some(v) = env_value(client_env, name) {
                    return Err(remote(name, v));
                }
            }
        }
    }
    Ok(())
}

/// Who ran the command, as the engine reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineIdentity {
    /// The address agentdiff gave the client.
    pub endpoint: String,
    /// `tcp`, `ssh` or `unix`.
    pub transport: String,
    /// The engine's own id (docker reports one; podman does not).
    pub engine_id: Option<String>,
    /// The engine host's name.
    pub name: Option<String>,
    pub server_version: Option<String>,
    pub os: Option<String>,
    pub arch: Option<String>,
    /// For `tcp://` with TLS: the client's certificate material, by digest.
    pub tls: Option<TlsIdentity>,
    /// For `ssh://`: the destination; the host key is checked by ssh (known_hosts).
    pub ssh_destination: Option<String>,
}

/// TLS material of a docker client (`DOCKER_TLS_VERIFY`, `DOCKER_CERT_PATH`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsIdentity {
    pub verify: bool,
    pub cert_path: Option<String>,
    /// sha256 of `ca.pem`, the authority the server's certificate was checked against.
    pub ca_sha256: Option<String>,
    /// sha256 of `cert.pem`, the client's own certificate.
    pub client_cert_sha256: Option<String>,
}

/// The `info` template per engine: one JSON object, read into [`InfoReply`].
fn info_format(kind: EngineKind) -> &'static str {
    match kind {
        EngineKind::Docker => {
            r#"{"id":{{json .ID}},"name":{{json .Name}},"version":{{json .ServerVersion}},"os":{{json .OSType}},"arch":{{json .Architecture}}}"#
        }
        EngineKind::Podman => {
            r#"{"name":{{json .Host.Hostname}},"version":{{json .Version.Version}},"os":{{json .Host.OS}},"arch":{{json .Host.Arch}}}"#
        }
    }
}

#[derive(Debug, Deserialize)]
struct InfoReply {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    os: Option<String>,
    #[serde(default)]
    arch: Option<String>,
}

/// Ask the engine who it is; the run needs an answer (an address that is no engine API fails
/// here, before anything is created).
pub async fn identify(engine: &Engine, endpoint: &str) -> Result<EngineIdentity, RemoteError> {
    let out = engine
        .call_ok(&["info", "--format", info_format(engine.kind)])
        .await?;
    let reply: InfoReply = serde_json::from_str(out.lines().last().unwrap_or(""))
        .map_err(|e| RemoteError::Identity(e.to_string()))?;
    let nonempty = |v: Option<String>| v.filter(|s| !s.is_empty());
    let transport = endpoint.split("://").next().unwrap_or("").to_string();
    let tls = (engine.kind == EngineKind::Docker && transport == "tcp")
        .then(|| tls_identity(&engine.env))
        .flatten();
    let ssh_destination = (transport == "ssh").then(|| {
        let rest = endpoint.trim_start_matches("ssh://");
        rest.split('/').next().unwrap_or(rest).to_string()
    });
    Ok(EngineIdentity {
        endpoint: endpoint.to_string(),
        transport,
        engine_id: nonempty(reply.id),
        name: nonempty(reply.name),
        server_version: nonempty(reply.version),
        os: nonempty(reply.os),
        arch: nonempty(reply.arch),
        tls,
        ssh_destination,
    })
}

/// This machine's host name, as engines on it report theirs (`/proc/sys/kernel/hostname`).
fn local_host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Local mode with the docker CLI (the only local client with a daemon that could be elsewhere,
/// e.g. behind a forwarded socket or a context in docker's configuration): the engine must
/// report this machine's host name, or the bind mount would name another machine's files.
/// Returns what the engine said when it differs.
pub async fn other_host(engine: &Engine) -> Result<Option<String>, RemoteError> {
    let Some(local) = local_host_name() else {
        return Ok(None);
    };
    let identity = identify(engine, "local").await?;
    Ok(identity.name.filter(|name| *name != local))
}

fn tls_identity(env: &[(OsString, OsString)]) -> Option<TlsIdentity> {
    let verify = env_value(env, "DOCKER_TLS_VERIFY").is_some_and(|v| v != "0");
    let cert_path = env_value(env, "DOCKER_CERT_PATH").map(str::to_string);
    if !verify && cert_path.is_none() {
        return None;
    }
    let digest = |name: &str| {
        let dir = cert_path.as_deref()?;
        let bytes = std::fs::read(Path::new(dir).join(name)).ok()?;
        Some(hex::encode(Sha256::digest(bytes)))
    };
    Some(TlsIdentity {
        verify,
        ca_sha256: digest("ca.pem"),
        client_cert_sha256: digest("cert.pem"),
        cert_path,
    })
}

/// One direction of shipping, for the evidence.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShipFacts {
    pub entries: u64,
    pub stream_bytes: u64,
    pub file_bytes: u64,
    pub duration_ms: u64,
}

impl ShipFacts {
    fn new(s: &Shipped, took: Duration) -> Self {
        Self {
            entries: s.entries,
            stream_bytes: s.stream_bytes,
            file_bytes: s.file_bytes,
            duration_ms: took.as_millis() as u64,
        }
    }
}

/// The remote part of the container evidence.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteFacts {
    pub engine: EngineIdentity,
    pub shipped_in: Option<ShipFacts>,
    pub shipped_out: Option<ShipFacts>,
    /// The container was removed by id and the engine lists neither it nor its volumes.
    pub container_removed_verified: bool,
    /// The container's workspace volume(s), removed with it and checked gone.
    #[serde(default)]
    pub volumes_removed: Vec<String>,
}

fn cp_command(engine: &Engine, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(&engine.program);
    cmd.arg("cp")
        .args(args)
        .env_clear()
        .envs(engine.env.iter().map(|(k, v)| (k, v)))
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Upload the workspace's content into the created container's `/workspace`.
pub async fn ship_in(
    engine: &Engine,
    container: &str,
    workdir: &Path,
    owner: UserSpec,
) -> Result<ShipFacts, RemoteError> {
    let started = Instant::now();
    let dest = format!("{container}:{}", crate::argv::CONTAINER_WORKDIR);
    // `-a`: the engine keeps the archive's owner (the container user), for docker and podman.
    let mut child = cp_command(engine, &["-a", "-", &dest])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(io_err(format!(
            "could not run {}",
            engine.program.display()
        )))?;
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| io_err("engine client stdin")(std::io::ErrorKind::BrokenPipe.into()))?
        .into_owned_fd()
        .map_err(io_err("engine client stdin"))?;
    let dir = workdir.to_path_buf();
    let packing = tokio::task::spawn_blocking(move || {
        let out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::from(stdin));
        archive::pack(&dir, owner, out)
    });
    let both = async {
        let packed = packing.await;
        let output = child.wait_with_output().await;
        (packed, output)
    };
    let (packed, output) = tokio::time::timeout(SHIP_TIMEOUT, both)
        .await
        .map_err(|_| RemoteError::TimedOut {
            direction: "in",
            secs: SHIP_TIMEOUT.as_secs(),
        })?;
    let output = output.map_err(io_err("waiting for the engine client"))?;
    check_copy(engine, "in", &output)?;
    let packed = packed
        .map_err(|e| io_err("packing the workspace")(std::io::Error::other(e.to_string())))?
        .map_err(|source| RemoteError::Archive {
            direction: "in",
            source,
        })?;
    Ok(ShipFacts::new(&packed, started.elapsed()))
}

fn check_copy(
    engine: &Engine,
    direction: &'static str,
    output: &std::process::Output,
) -> Result<(), RemoteError> {
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let line = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no message");
    Err(RemoteError::Copy {
        direction,
        program: engine.program.display().to_string(),
        code: output.status.code(),
        stderr: agentdiff_host::redact::escape_terminal(line.trim()),
    })
}

/// What came back, and the paths whose setuid/setgid bits were dropped.
#[derive(Debug)]
pub struct ShippedOut {
    pub facts: ShipFacts,
    pub dropped_special_bits: Vec<String>,
}

/// Download `/workspace` of the stopped container, check it, and make it the private workspace.
/// On any refusal the private workspace is left as it was and the partial copy is removed.
pub async fn ship_out(
    engine: &Engine,
    container: &str,
    workdir: &Path,
    limits: Limits,
) -> Result<ShippedOut, RemoteError> {
    let started = Instant::now();
    let staging = staging_dir(workdir)?;
    let source = format!("{container}:{}/.", crate::argv::CONTAINER_WORKDIR);
    let mut child = cp_command(engine, &[&source, "-"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(io_err(format!(
            "could not run {}",
            engine.program.display()
        )))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| io_err("engine client stdout")(std::io::ErrorKind::BrokenPipe.into()))?
        .into_owned_fd()
        .map_err(io_err("engine client stdout"))?;
    let dest = staging.path().to_path_buf();
    let unpacking = tokio::task::spawn_blocking(move || {
        let input = std::io::BufReader::with_capacity(1 << 20, std::fs::File::from(stdout));
        archive::unpack(input, &dest, &limits)
    });
    let both = async {
        let unpacked = unpacking.await;
        let output = child.wait_with_output().await;
        (unpacked, output)
    };
    // On a timeout the client is killed (kill_on_drop), which ends the unpacking read.
    let (unpacked, output) = tokio::time::timeout(SHIP_TIMEOUT, both)
        .await
        .map_err(|_| RemoteError::TimedOut {
            direction: "out",
            secs: SHIP_TIMEOUT.as_secs(),
        })?;
    let unpacked = unpacked
        .map_err(|e| io_err("unpacking the workspace")(std::io::Error::other(e.to_string())))?
        .map_err(|source| RemoteError::Archive {
            direction: "out",
            source,
        })?;
    let output = output.map_err(io_err("waiting for the engine client"))?;
    check_copy(engine, "out", &output)?;
    replace_workspace(workdir, staging)?;
    Ok(ShippedOut {
        facts: ShipFacts::new(&unpacked, started.elapsed()),
        dropped_special_bits: unpacked.dropped_special_bits,
    })
}

/// A fresh 0700 directory next to the workspace (same filesystem, so the swap is a rename;
/// unique per run and attempt, so concurrent runs share no path), named after the workspace
/// (`.<run>.shipped-XXXXXX`) so that `agentdiff cleanup` finds it after a killed run.
fn staging_dir(workdir: &Path) -> Result<tempfile::TempDir, RemoteError> {
    let parent = workdir.parent().unwrap_or(Path::new("/"));
    tempfile::Builder::new()
        .prefix(&crate::siblings::sibling_prefix(
            workdir,
            crate::siblings::STAGING_DIR,
        ))
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir_in(parent)
        .map_err(io_err(format!(
            "could not create a directory next to {}",
            workdir.display()
        )))
}

/// Swap the unpacked copy in: the workspace keeps its own mode; the old content is removed.
fn replace_workspace(workdir: &Path, staging: tempfile::TempDir) -> Result<(), RemoteError> {
    let mode = std::fs::symlink_metadata(workdir)
        .map_err(io_err(workdir.display().to_string()))?
        .permissions();
    std::fs::set_permissions(staging.path(), mode).map_err(io_err("staging directory"))?;
    let staged: PathBuf = staging.keep();
    let mut old_name = staged.file_name().unwrap_or_default().to_os_string();
    old_name.push(".old");
    let old = staged.with_file_name(old_name);
    std::fs::rename(workdir, &old)
        .map_err(io_err(format!("moving {} aside", workdir.display())))?;
    if let Err(e) = std::fs::rename(&staged, workdir) {
        let _ = std::fs::rename(&old, workdir);
        let _ = std::fs::remove_dir_all(&staged);
        return Err(io_err(format!("replacing {}", workdir.display()))(e));
    }
    std::fs::remove_dir_all(&old).map_err(io_err(format!("removing {}", old.display())))
}

/// What removing one container did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removal {
    /// The engine no longer lists the container.
    pub container_gone: bool,
    /// Its volumes, removed and checked gone.
    pub volumes_removed: Vec<String>,
    /// Its volumes the engine still has after their removal.
    pub volumes_left: Vec<String>,
}

impl Removal {
    pub fn complete(&self) -> bool {
        self.container_gone && self.volumes_left.is_empty()
    }
}

/// Remove the container and its engine-side volumes by id, and check the engine lists neither
/// any more. A volume `rm -v` left (a named one, or an engine that ignores `-v`) is removed by
/// name.
pub async fn remove_verified(engine: &Engine, container: &str) -> Result<Removal, EngineError> {
    let volumes = engine.container_volumes(container).await;
    engine.remove(container).await?;
    let filter = format!("id={container}");
    let listed = engine
        .call_ok(&["ps", "-a", "-q", "--no-trunc", "--filter", &filter])
        .await?;
    let mut removal = Removal {
        container_gone: listed.lines().all(|l| l.trim().is_empty()),
        ..Removal::default()
    };
    for volume in volumes {
        let mut present = engine.volume_exists(&volume).await?;
        if present {
            // Best effort: whether it is gone is checked next.
            let _ = engine.call(&["volume", "rm", "-f", "--", &volume]).await;
            present = engine.volume_exists(&volume).await?;
        }
        if present {
            removal.volumes_left.push(volume);
        } else {
            removal.volumes_removed.push(volume);
        }
    }
    Ok(removal)
}
