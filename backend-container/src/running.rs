//! Launching the engine client (`podman run …`) and waiting for it: timeout and interruption stop
//! the container (TERM to its init, KILL after the grace period), leftovers are removed by label,
//! and the evidence says what was requested from the engine and what was seen.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agentdiff_backend_api::{
    BackendError, BackendFacts, BoxFuture, CleanupMechanism, CleanupReport, EnvironmentEvidence,
    ExitInfo, FailureKind, LaunchContext, LaunchFacts, PortEvidence, PreparedLaunch, ProcessRecord,
    ProcessRelation, Result, RunEvidence, RunningCommand, StdioMode,
};
use serde::{Deserialize, Serialize};

use agentdiff_process::exec_shim::forward::NetnsForwarder;

use crate::engine::{Engine, EngineKind};
use crate::options::Source;
use crate::{ContainerBackend, Plan, ENFORCEMENT, ID};

fn unavailable(reason: String, remedy: impl Into<String>) -> BackendError {
    BackendError::Unavailable {
        backend: ID.into(),
        reason,
        remedy: remedy.into(),
    }
}

fn launch_error(message: String) -> BackendError {
    BackendError::Launch {
        backend: ID.into(),
        message,
    }
}

pub(crate) async fn launch(
    backend: &ContainerBackend,
    plan: Plan,
    prepared: PreparedLaunch,
    ctx: LaunchContext,
) -> Result<Box<dyn RunningCommand>> {
    let spec = prepared.spec();
    let run = crate::argv::RunIdentity::new(&spec.root, &spec.run_id)
        .map_err(|e| launch_error(e.to_string()))?;
    let engine = engine_for(backend, &plan, &prepared)?;
    let program = engine.program.clone();
    let Probed {
        version,
        server_version,
        rootfs: rootfs_facts,
    } = probe(&engine, &plan, spec).await?;
    if plan.endpoint.is_none() && plan.kind == EngineKind::Docker {
        refuse_other_host(&engine).await?;
    }
    let image_id = local_image(&engine, &plan).await?;
    let (mut warnings, remote) = match &plan.endpoint {
        None => (hand_over_workspace(backend, &plan, spec).await?, None),
        Some(endpoint) => {
            let (state, warnings) = remote_setup(&engine, &plan, &prepared, endpoint).await?;
            (warnings, Some(state))
        }
    };
    let seccomp = derived_seccomp(&plan, remote.is_some(), &mut warnings);
    let (mut args, cid) = client_args(&prepared, remote.is_some(), seccomp)?;
    // What the evidence records: the argv that carries the controls (`run`, or `create`).
    let controls_argv = match &remote {
        None => args.clone(),
        Some(_) => prepared.args().to_vec(),
    };
    let mut forwarder = None;
    if let Some(socket) = &plan.egress {
        let (id, started) = filtered_setup(&engine, &args, socket).await?;
        forwarder = Some(started);
        args = start_args(&id);
    }
    if let Some(r) = &remote {
        // The container exists (created and filled); the client attaches to it.
        args = start_args(&r.container_id);
    }
    let (mut cmd, relays) = client_command(&program, &args, &prepared, &ctx.stdio)?;
    let since_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs().saturating_sub(1))
        .unwrap_or(0);
    let started = Instant::now();
    let child = cmd
        .spawn()
        .map_err(|e| launch_error(format!("could not start {}: {e}", program.display())))?;
    let pid = child.id();
    let identity = pid.and_then(|p| agentdiff_process::read_identity(p).ok());

    let mut wrapper_argv = vec![prepared.program().clone()];
    wrapper_argv.extend(controls_argv);
    let environment = environment_evidence(&prepared, &plan, &mut warnings);
    let facts = ContainerFacts {
        engine: plan.kind.as_str().to_string(),
        program: program.display().to_string(),
        version,
        api_server_version: server_version,
        image: match &plan.options.source {
            Source::Image(i) => Some(i.clone()),
            Source::Rootfs(_) => None,
        },
        image_id: image_id.clone(),
        rootfs: rootfs_facts.as_ref().map(|r| RootfsFacts {
            path: r.path.display().to_string(),
            manifest_digest: r.manifest_digest.clone(),
            entries: r.entries,
        }),
        container_name: run.container_name(),
        container_id: None,
        leftover_containers_removed: Vec::new(),
        remote: remote.as_ref().map(|r| r.facts.clone()),
        egress_forwarder: forwarder
            .as_ref()
            .map(|f: &NetnsForwarder| EgressForwarderFacts {
                netns: f.netns().to_string(),
                listen: format!("127.0.0.1:{}", f.port()),
            }),
    };
    let mut capabilities = crate::capabilities_for(remote.is_some());
    if forwarder.is_some() {
        // The proxy is the only route out: the engine was asked for no network, and the
        // forwarder found only a loopback in the container's namespace before the command
        // started (it refuses any other interface).
        capabilities.network = agentdiff_backend_api::Level::Filtered;
        capabilities.network_enforcement = true;
    }
    let stdio_relayed = relays.names();
    Ok(Box::new(RunningContainer {
        relays: std::sync::Mutex::new(relays),
        engine,
        child,
        pid,
        identity,
        started,
        since_unix,
        cid,
        name: run.container_name(),
        run,
        timeout: spec.timeout,
        grace: spec.grace,
        interrupt: ctx.interrupt,
        evidence: RunEvidence {
            backend: ID.into(),
            enforcement: ENFORCEMENT,
            capabilities,
            tracking: agentdiff_backend_api::Tracking::ContainerEngine,
            wrapper_argv: Some(
                wrapper_argv
                    .iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect(),
            ),
            runtime_config: prepared.runtime_config().clone(),
            observation_root: spec.workdir.display().to_string(),
            environment: Some(environment),
            ports: PortEvidence {
                mode: agentdiff_backend_api::PortMode::Off,
                note: "the container has its own network namespace; host listening sockets are not observed by this backend".into(),
                ..PortEvidence::default()
            },
            warnings,
            stdio_relayed,
            ..RunEvidence::default()
        },
        facts,
        remote,
        forwarder,
        workdir: spec.workdir.clone(),
        image_pulled_ref: match (&plan.options.source, image_id.is_none()) {
            (Source::Image(i), true) => Some(i.clone()),
            _ => None,
        },
    }))
}

/// The `--cidfile` path in its private directory (removed when dropped).
type CidFile = (tempfile::TempDir, PathBuf);

/// The client's argv. A local container's id comes back through a private `--cidfile` (returned
/// with it); a remote one's was printed by `create`.
/// With the seccomp profile derived at prepare (`seccomp`), the profile is written into the same
/// private directory and named with `--security-opt seccomp=` (the engine reads it when it creates
/// the container).
fn client_args(
    prepared: &PreparedLaunch,
    remote: bool,
    seccomp: Option<&crate::seccomp::Derived>,
) -> Result<(Vec<OsString>, Option<CidFile>)> {
    let mut args = prepared.args().to_vec();
    if remote {
        return Ok((args, None));
    }
    let (dir, path) = private_cid_file(&prepared.spec().workdir)?;
    let mut inserted = vec![OsString::from("--cidfile"), path.clone().into_os_string()];
    if let Some(derived) = seccomp {
        let profile = dir.path().join(SECCOMP_FILE);
        std::fs::write(&profile, &derived.profile).map_err(|e| {
            launch_error(format!(
                "could not write the seccomp profile {}: {e}",
                profile.display()
            ))
        })?;
        let mut opt = OsString::from("seccomp=");
        opt.push(profile.as_os_str());
        inserted.extend([OsString::from("--security-opt"), opt]);
    }
    args.splice(1..1, inserted);
    Ok((args, Some((dir, path))))
}

/// The profile `prepare` derived, if any; a local podman run that keeps podman's default says so
/// in its warnings (the command can then create `AF_VSOCK` sockets).
fn derived_seccomp<'p>(
    plan: &'p Plan,
    remote: bool,
    warnings: &mut Vec<String>,
) -> Option<&'p crate::seccomp::Derived> {
    match &plan.seccomp {
        crate::seccomp::Plan::Derived(derived) => Some(derived),
        crate::seccomp::Plan::EngineDefault { why } => {
            if plan.kind == EngineKind::Podman && !remote {
                warnings.push(format!(
                    "podman's default seccomp profile was kept, which lets the command create AF_VSOCK sockets: {why}"
                ));
            }
            None
        }
    }
}

/// The derived seccomp profile's name in the run's private client directory.
const SECCOMP_FILE: &str = "seccomp.json";

/// A fresh 0700 directory for the engine client's `--cidfile`, and the file's path in it (the
/// file must not exist yet: the client creates it). It lies next to the private workspace, named
/// after it (`.<run>.cid-XXXXXX`), so that `agentdiff cleanup` finds it after a killed run.
fn private_cid_file(workdir: &std::path::Path) -> Result<(tempfile::TempDir, std::path::PathBuf)> {
    let dir = tempfile::Builder::new()
        .prefix(&crate::siblings::sibling_prefix(
            workdir,
            crate::siblings::CID_DIR,
        ))
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir_in(workdir.parent().unwrap_or(std::path::Path::new("/")))
        .map_err(|e| {
            launch_error(format!(
                "could not create a private temporary directory: {e}"
            ))
        })?;
    let path = dir.path().join("cid");
    Ok((dir, path))
}

/// A local run needs a local engine: a docker daemon that reports another host name is refused.
async fn refuse_other_host(engine: &Engine) -> Result<()> {
    match crate::remote::other_host(engine).await {
        Ok(None) => Ok(()),
        Ok(Some(name)) => Err(unavailable(
            format!("the docker engine reports host name {name:?}, not this machine's: it may run elsewhere, where a bind mount of the workspace would name that machine's filesystem"),
            "run remotely with `--backend-option engine-host=env` (or `=URL`), which ships the workspace through the engine API, or point the docker CLI at a local engine",
        )),
        Err(e) => Err(unavailable(
            format!("the docker engine could not say which host it runs on: {e}"),
            "check the engine (`docker info`)",
        )),
    }
}

/// The engine client `prepare` chose, when it still resolves to the same executable.
fn engine_for(
    backend: &ContainerBackend,
    plan: &Plan,
    prepared: &PreparedLaunch,
) -> Result<Engine> {
    let program = PathBuf::from(prepared.program());
    if backend.source(plan.kind).resolve(plan.kind).as_deref() != Some(program.as_path()) {
        return Err(unavailable(
            format!("no usable `{}` executable found", plan.kind.as_str()),
            match plan.kind {
                EngineKind::Podman => {
                    "install podman (`apt-get install podman runc`), or choose `--engine docker`"
                }
                EngineKind::Docker => "install the docker CLI, or choose `--engine podman`",
            },
        ));
    }
    Ok(Engine {
        kind: plan.kind,
        program,
        env: prepared.env().to_vec(),
    })
}

/// What the engine and the rootfs check said before the launch.
struct Probed {
    version: String,
    server_version: Option<String>,
    rootfs: Option<crate::rootfs::CheckedRootfs>,
}

/// The engine runs (and the docker CLI reaches its server), and the rootfs, when the run uses
/// one, is usable. The version probe and the rootfs check (a tree walk) run concurrently: both
/// sit on the launch path whose overhead over a bare engine run is budgeted.
async fn probe(
    engine: &Engine,
    plan: &Plan,
    spec: &agentdiff_backend_api::LaunchSpec,
) -> Result<Probed> {
    let rootfs_check = async {
        match &plan.options.source {
            Source::Image(_) => None,
            Source::Rootfs(dir) => {
                let dir = PathBuf::from(dir);
                let root = spec.root.clone();
                let command = spec
                    .argv
                    .first()
                    .map(|a| a.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let non_root = plan.user.uid != 0;
                Some(
                    tokio::task::spawn_blocking(move || {
                        crate::rootfs::check(&dir, &root, &command, non_root)
                    })
                    .await,
                )
            }
        }
    };
    let probes = async {
        let version = engine.version().await;
        let server = match &version {
            Ok(_) => engine.server_version().await,
            Err(_) => Ok(None),
        };
        (version, server)
    };
    let ((version, server_version), rootfs_checked) = tokio::join!(probes, rootfs_check);
    let version = version.map_err(|e| {
        unavailable(
            format!("{} does not run: {e}", plan.kind.as_str()),
            "repair the engine installation (try `podman info` / `docker version`)",
        )
    })?;
    let server_version = server_version.map_err(|e| match &plan.endpoint {
        // A remote engine: the address, the network or the TLS material is what to check.
        Some(endpoint) => unavailable(
            format!("the docker CLI cannot reach the engine at {endpoint}: {e}"),
            "check the address and that an engine API service listens there; for TLS, that DOCKER_CERT_PATH holds the ca.pem that signed the engine's certificate and a client cert.pem/key.pem it accepts (`docker -H URL --tlsverify version`)",
        ),
        None => unavailable(
            format!("the docker CLI cannot reach its API server: {e}"),
            "start the Docker daemon, or point DOCKER_HOST at a running socket (e.g. `podman system service --time=0 unix:///run/podman/podman.sock` and DOCKER_HOST=unix:///run/podman/podman.sock)",
        ),
    })?;
    let rootfs = match rootfs_checked {
        Some(checked) => Some(
            checked
                .map_err(|e| launch_error(format!("rootfs check did not finish: {e}")))?
                .map_err(|e| unavailable(format!("unusable rootfs: {e}"), e.remedy()))?,
        ),
        None => None,
    };
    Ok(Probed {
        version,
        server_version,
        rootfs,
    })
}

/// The image's local id; an absent image is refused unless pulling was allowed (never pulled
/// otherwise).
async fn local_image(engine: &Engine, plan: &Plan) -> Result<Option<String>> {
    let Source::Image(image) = &plan.options.source else {
        return Ok(None);
    };
    let image_id = engine.local_image_id(image).await.map_err(|e| {
        unavailable(
            format!(
                "could not ask {} about image {image}: {e}",
                plan.kind.as_str()
            ),
            "check the engine works (`podman info` / `docker version`)",
        )
    })?;
    if image_id.is_none() && !plan.options.pull {
        return Err(unavailable(
            format!("image {image} is not present locally and pulling was not allowed"),
            format!(
                "load or import it first (`{0} pull {image}`, `{0} load`, or `{0} import rootfs.tar {image}`), or pass `--pull` to let the engine pull it",
                plan.kind.as_str()
            ),
        ));
    }
    Ok(image_id)
}

/// Remote mode before the client starts: the engine says who it is, the container is created
/// (no host path in its argv) and the private workspace is shipped into its volume. A failure
/// removes the container; the command never ran.
async fn remote_setup(
    engine: &Engine,
    plan: &Plan,
    prepared: &PreparedLaunch,
    endpoint: &str,
) -> Result<(RemoteState, Vec<String>)> {
    let spec = prepared.spec();
    let identity = crate::remote::identify(engine, endpoint)
        .await
        .map_err(|e| {
            unavailable(
                format!("the engine at {endpoint} did not identify itself: {e}"),
                "check the address and that an engine API service listens there (`docker -H URL info` or `podman --url URL info`)",
            )
        })?;
    let mut warnings = Vec::new();
    if identity.transport == "tcp" && !identity.tls.as_ref().is_some_and(|t| t.verify) {
        warnings.push(format!(
            "the engine API at {endpoint} is plain TCP without verified TLS: neither side is authenticated and the workspace crosses the network unencrypted"
        ));
    }
    workspace_dir(&spec.workdir)?;
    let container_id =
        create_container(engine, prepared.args(), &format!(" at {endpoint}")).await?;
    match crate::remote::ship_in(engine, &container_id, &spec.workdir, plan.user).await {
        Ok(shipped) => Ok((
            RemoteState {
                container_id,
                facts: crate::remote::RemoteFacts {
                    engine: identity,
                    shipped_in: Some(shipped),
                    shipped_out: None,
                    container_removed_verified: false,
                    volumes_removed: Vec::new(),
                },
            },
            warnings,
        )),
        Err(e) => {
            let removed = match crate::remote::remove_verified(engine, &container_id).await {
                Ok(r) if r.complete() => "the container and its volume were removed".to_string(),
                Ok(r) => format!(
                    "container {container_id} or its volume is still listed by the engine (container gone: {}, volumes left: {:?})",
                    r.container_gone, r.volumes_left
                ),
                Err(r) => format!("removing container {container_id} failed: {r}"),
            };
            Err(launch_error(format!(
                "{e}; {removed}; the command never ran"
            )))
        }
    }
}

/// The id `create` printed (its last line).
/// `create` with `args` (the engine client's argv, `create` first) and the new container's id, as
/// the client prints it last; `place` names the engine in errors (empty for the local one).
async fn create_container(engine: &Engine, args: &[OsString], place: &str) -> Result<String> {
    let args: Vec<&str> = args
        .iter()
        .map(|a| {
            a.to_str()
                .ok_or_else(|| launch_error("the create argv is not UTF-8".into()))
        })
        .collect::<Result<_>>()?;
    let created = engine
        .call_ok(&args)
        .await
        .map_err(|e| launch_error(format!("creating the container{place}: {e}")))?;
    created_id(&created).ok_or_else(|| {
        launch_error(format!(
            "the engine{place} created a container but did not print its id (it printed {created:?})"
        ))
    })
}

fn created_id(out: &str) -> Option<String> {
    out.lines()
        .last()
        .map(str::trim)
        .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_string)
}

/// The client that attaches to a created container.
fn start_args(id: &str) -> Vec<OsString> {
    ["start", "-a", "-i", id]
        .into_iter()
        .map(OsString::from)
        .collect()
}

/// `network: filtered` before the client starts: the container is created and initialised (its
/// network namespace exists, its command does not run yet), and the egress forwarder listens on
/// that namespace's `127.0.0.1`. A failure removes the container; the command never ran.
async fn filtered_setup(
    engine: &Engine,
    create_args: &[OsString],
    socket: &std::path::Path,
) -> Result<(String, NetnsForwarder)> {
    let id = create_container(engine, create_args, "").await?;
    let started = async {
        let pid = engine
            .init_pid(&id)
            .await
            .map_err(|e| format!("initialising the container: {e}"))?;
        let netns = PathBuf::from(format!("/proc/{pid}/ns/net"));
        let socket = socket.to_path_buf();
        tokio::task::spawn_blocking(move || {
            NetnsForwarder::start(
                &netns,
                agentdiff_backend_api::egress::FORWARDER_PORT,
                &socket,
            )
        })
        .await
        .map_err(|e| format!("the egress forwarder did not start: {e}"))?
        .map_err(|e| format!("the egress forwarder did not start: {e}"))
    };
    match started.await {
        Ok(forwarder) => Ok((id, forwarder)),
        Err(why) => {
            let removed = match engine.remove(&id).await {
                Ok(()) => "the container was removed".to_string(),
                Err(e) => format!("removing container {id} failed: {e}"),
            };
            Err(launch_error(format!(
                "network filtered: {why}; {removed}; the command never ran"
            )))
        }
    }
}

fn workspace_dir(workdir: &std::path::Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(workdir).map_err(|e| BackendError::InvalidRequest {
        backend: ID.into(),
        message: format!("private workspace {}: {e}", workdir.display()),
    })?;
    if meta.is_dir() {
        Ok(())
    } else {
        Err(BackendError::InvalidRequest {
            backend: ID.into(),
            message: format!("private workspace {} is not a directory", workdir.display()),
        })
    }
}

/// The private workspace exists and the container user can write it; returns the hand-over's
/// warnings.
async fn hand_over_workspace(
    backend: &ContainerBackend,
    plan: &Plan,
    spec: &agentdiff_backend_api::LaunchSpec,
) -> Result<Vec<String>> {
    workspace_dir(&spec.workdir)?;
    {
        let ws = spec.workdir.clone();
        let (user, invoker) = (plan.user, backend.invoker);
        let handed =
            tokio::task::spawn_blocking(move || crate::ownership::hand_over(&ws, user, invoker))
                .await
                .map_err(|e| launch_error(format!("workspace hand-over did not finish: {e}")))?
                .map_err(|e| launch_error(e.to_string()))?;
        Ok(handed.into_iter().collect())
    }
}

/// The engine client's command with the run's stdio, in a process group of its own. A stream
/// that is not a terminal or a pipe reaches the client (and so the command) only through a pipe
/// agentdiff relays (`agentdiff_process::stdio_relay`): the command never holds a host file or
/// directory, whatever the engine does with the client's descriptors.
fn client_command(
    program: &std::path::Path,
    args: &[OsString],
    prepared: &PreparedLaunch,
    stdio: &StdioMode,
) -> Result<(
    tokio::process::Command,
    agentdiff_process::stdio_relay::Relays,
)> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(prepared.env().iter().map(|(k, v)| (k, v)))
        .current_dir(prepared.cwd())
        .kill_on_drop(false);
    // Own process group: agentdiff decides how the container is stopped (interrupt channel),
    // not a terminal signal racing it.
    cmd.process_group(0);
    let (fds, relays) = agentdiff_process::stdio_relay::relay_stdio(client_stdio(stdio)?)
        .map_err(|e| launch_error(format!("could not relay the standard streams: {e}")))?;
    let [stdin, stdout, stderr] = fds;
    let pass = |fd: Option<std::os::fd::OwnedFd>| fd.map_or_else(Stdio::inherit, Stdio::from);
    cmd.stdin(pass(stdin))
        .stdout(pass(stdout))
        .stderr(pass(stderr));
    Ok((cmd, relays))
}

/// The client's fds 0–2 for `stdio` (`None`: agentdiff's own).
fn client_stdio(stdio: &StdioMode) -> Result<[Option<std::os::fd::OwnedFd>; 3]> {
    agentdiff_process::stdio_relay::open_stdio(stdio).map_err(|e| launch_error(e.to_string()))
}

/// Names handed to the container with their fingerprints; values are never recorded.
fn environment_evidence(
    prepared: &PreparedLaunch,
    plan: &Plan,
    warnings: &mut Vec<String>,
) -> EnvironmentEvidence {
    let mut variables = BTreeMap::new();
    for name in &plan.options.env {
        match prepared.spec().env.iter().find(|(k, _)| k == name.as_str()) {
            Some((_, v)) => {
                variables.insert(
                    name.clone(),
                    agentdiff_host::redact::fingerprint(name, v.as_encoded_bytes()),
                );
            }
            None => warnings.push(format!(
                "--env {name}: the variable is not set, so the container does not get it"
            )),
        }
    }
    let mut dropped: Vec<String> = prepared
        .spec()
        .env
        .iter()
        .filter_map(|(k, _)| k.to_str())
        .filter(|k| !plan.options.env.iter().any(|n| n == k))
        .map(str::to_string)
        .collect();
    dropped.sort();
    dropped.dedup();
    EnvironmentEvidence {
        // Scrubbed: the container gets only the named variables.
        mode: agentdiff_backend_api::environment::EnvMode::Scrub,
        variables,
        dropped,
    }
}

struct RunningContainer {
    engine: Engine,
    /// The relays of the client's standard streams, drained before the evidence is returned
    /// (in a mutex only so that the struct is `Sync`; nothing shares it).
    relays: std::sync::Mutex<agentdiff_process::stdio_relay::Relays>,
    child: tokio::process::Child,
    pid: Option<u32>,
    identity: Option<agentdiff_process::ProcessIdentity>,
    started: Instant,
    since_unix: u64,
    /// The `--cidfile` (local runs), in a directory kept until the id is read, removed on drop.
    cid: Option<CidFile>,
    name: String,
    /// The run of this root the container's name and label carry.
    run: crate::argv::RunIdentity,
    timeout: Option<Duration>,
    grace: Duration,
    interrupt: tokio::sync::watch::Receiver<Option<i32>>,
    evidence: RunEvidence,
    facts: ContainerFacts,
    /// Remote mode: the created container and what was shipped in.
    remote: Option<RemoteState>,
    /// `network: filtered`: the forwarder in the container's network namespace, stopped once
    /// the client has ended.
    forwarder: Option<NetnsForwarder>,
    /// The private workspace (remote mode ships the container's copy back into it).
    workdir: PathBuf,
    image_pulled_ref: Option<String>,
}

/// A remote run's container, created and filled before the client attaches.
struct RemoteState {
    container_id: String,
    facts: crate::remote::RemoteFacts,
}

/// The container backend's own section of the evidence (`wrapper` in runtime.json): the engine,
/// the image or rootfs the command ran from, and the container it ran in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerFacts {
    /// `podman` or `docker`.
    pub engine: String,
    pub program: String,
    pub version: String,
    /// The docker API server's version (docker CLI only).
    pub api_server_version: Option<String>,
    /// The image reference, when the run used one.
    pub image: Option<String>,
    /// The local image id (`sha256:…`): the digest of what ran.
    pub image_id: Option<String>,
    pub rootfs: Option<RootfsFacts>,
    pub container_name: String,
    /// The engine's id of the container (from `--cidfile`); none when none was created.
    #[serde(default)]
    pub container_id: Option<String>,
    /// Containers of this run still present after it and removed.
    #[serde(default)]
    pub leftover_containers_removed: Vec<String>,
    /// Remote mode: the engine that ran the command and what was shipped each way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<crate::remote::RemoteFacts>,
    /// `network: filtered`: where the egress forwarder listened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_forwarder: Option<EgressForwarderFacts>,
}

/// The egress forwarder of a `filtered` run: it ran in agentdiff's process, in the container's
/// network namespace (checked to hold only a loopback interface before the command started).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressForwarderFacts {
    /// `net:[INODE]` of the container's network namespace.
    pub netns: String,
    /// `127.0.0.1:PORT` inside it.
    pub listen: String,
}

/// A rootfs run's source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootfsFacts {
    pub path: String,
    pub manifest_digest: String,
    pub entries: usize,
}

enum Ending {
    Exited(std::io::Result<std::process::ExitStatus>),
    TimedOut,
    Interrupted(i32),
}

impl RunningContainer {
    /// TERM to the container's init, KILL after the grace period, then make sure the client ends.
    async fn stop(&mut self) -> std::io::Result<std::process::ExitStatus> {
        if let Err(e) = self.engine.stop(&self.name, self.grace).await {
            self.evidence
                .cleanup
                .errors
                .push(format!("stopping container {}: {e}", self.name));
        }
        let limit = self.grace + Duration::from_secs(10);
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                if let Err(e) = self.engine.remove(&self.name).await {
                    self.evidence
                        .cleanup
                        .errors
                        .push(format!("removing container {}: {e}", self.name));
                }
                let _ = self.child.start_kill();
                self.child.wait().await
            }
        }
    }
}

impl RunningCommand for RunningContainer {
    fn pid(&self) -> Option<u32> {
        self.pid
    }

    fn launch_facts(&self) -> LaunchFacts {
        // A remote run's container is on an engine a later `agentdiff cleanup` may not name.
        let resources = self.remote.as_ref().and_then(|remote| {
            let recorded = crate::cleanup::RecordedEngine::of(
                self.engine.kind,
                &remote.facts.engine.endpoint,
                &self.engine.env,
                Some(&remote.container_id),
                &self.run.key(),
            );
            serde_json::to_value(recorded).ok()
        });
        LaunchFacts {
            pid: self.pid,
            root: self.identity.clone(),
            cgroup: None,
            monitor: None,
            resources,
        }
    }

    fn wait(mut self: Box<Self>) -> BoxFuture<'static, Result<RunEvidence>> {
        Box::pin(async move {
            let exit = self.wait_for_end().await;
            if let Some(f) = self.forwarder.take() {
                let _ = tokio::task::spawn_blocking(move || f.stop()).await;
            }
            let exit = exit?;
            let mut relays = std::mem::take(
                self.relays
                    .get_mut()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
            let drained = tokio::task::spawn_blocking(move || relays.drain())
                .await
                .unwrap_or(false);
            let container_id = match &self.remote {
                Some(r) => Some(r.container_id.clone()),
                None => self
                    .cid
                    .as_ref()
                    .and_then(|(_, path)| std::fs::read_to_string(path).ok())
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit())),
            };
            let mut ev = std::mem::take(&mut self.evidence);
            if !drained {
                ev.warnings.push(
                "a relayed output stream was still open after the command ended; what it wrote \
                 after that was not copied"
                    .into(),
            );
            }
            self.facts.container_id = container_id.clone();
            self.attribute_engine_exit(&exit, container_id.as_deref(), &mut ev)
                .await;
            ev.exit = exit;
            if self.remote.is_some() {
                self.ship_back(&mut ev).await;
            }
            let (cleanup, removed) = self.remove_leftovers(&mut ev, container_id.is_some()).await;
            self.facts.remote = self.remote.as_ref().map(|r| r.facts.clone());
            ev.cleanup = cleanup;
            if let Some(image) = &self.image_pulled_ref {
                match self.engine.local_image_id(image).await {
                    Ok(id) => self.facts.image_id = id,
                    Err(e) => ev.warnings.push(format!("image id after pull: {e}")),
                }
            }
            self.facts.leftover_containers_removed = removed;
            ev.wrapper =
                Some(
                    BackendFacts::new(&self.facts).map_err(|e| BackendError::Runtime {
                        backend: ID.into(),
                        message: e.to_string(),
                    })?,
                );
            if let Some(identity) = self.identity.clone() {
                ev.processes.push(ProcessRecord {
                    ppid: std::process::id(),
                    identity,
                    relation: ProcessRelation::Root,
                    executable: self.engine.kind.as_str().into(),
                    first_seen_ms: 0,
                    alive_after_root_exit: false,
                    left_run_cgroup: None,
                });
            }
            Ok(ev)
        })
    }
}

impl RunningContainer {
    /// Wait until the client exits, the deadline passes or agentdiff is interrupted (then stop
    /// the container); the exit as far as the client tells it.
    async fn wait_for_end(&mut self) -> Result<ExitInfo> {
        let deadline = self.timeout.map(|t| tokio::time::Instant::now() + t);
        let mut interrupts_open = true;
        let ending = loop {
            if let Some(sig) = *self.interrupt.borrow() {
                break Ending::Interrupted(sig);
            }
            tokio::select! {
                status = self.child.wait() => break Ending::Exited(status),
                _ = async {
                    match deadline {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending::<()>().await,
                    }
                } => break Ending::TimedOut,
                changed = self.interrupt.changed(), if interrupts_open => {
                    if changed.is_err() {
                        interrupts_open = false;
                    }
                }
            }
        };
        let mut exit = ExitInfo::default();
        let status = match ending {
            Ending::Exited(s) => s,
            Ending::TimedOut => {
                exit.timed_out = true;
                self.stop().await
            }
            Ending::Interrupted(sig) => {
                exit.interrupted_by = Some(sig);
                self.stop().await
            }
        };
        exit.duration_ms = self.started.elapsed().as_millis() as u64;
        let status = status.map_err(|e| BackendError::Runtime {
            backend: ID.into(),
            message: format!("waiting for the engine client failed: {e}"),
        })?;
        exit.code = status.code();
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            exit.signal = status.signal();
        }
        Ok(exit)
    }

    /// 125–127 come from the engine (it failed, or the OCI runtime could not start the process)
    /// or from the command itself; the engine's event log tells which.
    async fn attribute_engine_exit(
        &self,
        exit: &ExitInfo,
        container_id: Option<&str>,
        ev: &mut RunEvidence,
    ) {
        if !exit.timed_out && exit.interrupted_by.is_none() {
            if let Some(code @ 125..=127) = exit.code {
                match container_id {
                    None => {
                        ev.failure = Some(FailureKind::WrapperSetupFailed {
                            message: format!(
                                "{} exited {code} before creating a container; the command never ran (see the engine's message above)",
                                self.engine.kind.as_str()
                            ),
                        })
                    }
                    Some(id) => match self.engine.container_started(id, self.since_unix).await {
                        Ok(false) => {
                            ev.failure = Some(FailureKind::WrapperSetupFailed {
                                message: format!(
                                    "{} created container {id} but could not start it (exit {code}, e.g. an OCI runtime error); the command never ran (see the engine's message above); check the engine's OCI runtime (`podman info`; on cgroup v1 hybrid hosts set runtime = \"runc\" in containers.conf) and that the rootfs or image is readable by the container user",
                                    self.engine.kind.as_str()
                                ),
                            })
                        }
                        Ok(true) => {}
                        Err(e) => ev.warnings.push(format!(
                            "exit {code} may come from the engine or from the command; the engine's events could not tell: {e}"
                        )),
                    },
                }
            }
        }
    }

    /// Remote mode: copy the stopped container's workspace back into the private workspace
    /// (checked like any untrusted archive). A refusal leaves the private workspace as it was and
    /// is recorded as the run's failure.
    async fn ship_back(&mut self, ev: &mut RunEvidence) {
        let Some(remote) = &mut self.remote else {
            return;
        };
        let limits = crate::archive::Limits::default();
        match crate::remote::ship_out(&self.engine, &remote.container_id, &self.workdir, limits)
            .await
        {
            Ok(out) => {
                remote.facts.shipped_out = Some(out.facts);
                if !out.dropped_special_bits.is_empty() {
                    ev.warnings.push(format!(
                        "setuid/setgid bits were dropped from files shipped back: {}",
                        out.dropped_special_bits.join(", ")
                    ));
                }
            }
            Err(e) => {
                let message = format!(
                    "the container's workspace was not shipped back: {e}; the private workspace keeps its pre-run content, so nothing the command did is captured or can be promoted"
                );
                match &ev.failure {
                    None => ev.failure = Some(FailureKind::BackendFailed { message }),
                    Some(_) => ev.warnings.push(message),
                }
            }
        }
    }

    /// Leftovers: `--rm` normally removes the container; remove anything still labelled.
    /// `created`: the run's container was created (its removal failing is then an error).
    async fn remove_leftovers(
        &mut self,
        ev: &mut RunEvidence,
        created: bool,
    ) -> (CleanupReport, Vec<String>) {
        let mut cleanup = CleanupReport {
            mechanism: CleanupMechanism::ContainerEngine,
            grace_ms: self.grace.as_millis() as u64,
            records: Vec::new(),
            errors: std::mem::take(&mut ev.cleanup.errors),
            resources_removed: Vec::new(),
        };
        if let Some(remote) = &mut self.remote {
            match crate::remote::remove_verified(&self.engine, &remote.container_id).await {
                Ok(removal) => {
                    remote.facts.container_removed_verified = removal.complete();
                    if !removal.container_gone {
                        cleanup.errors.push(format!(
                            "container {} is still listed by the engine after its removal",
                            remote.container_id
                        ));
                    }
                    for volume in &removal.volumes_left {
                        cleanup.errors.push(format!(
                            "volume {volume} of container {} is still present after its removal",
                            remote.container_id
                        ));
                    }
                    remote.facts.volumes_removed = removal.volumes_removed;
                }
                Err(e) => cleanup
                    .errors
                    .push(format!("removing container {}: {e}", remote.container_id)),
            }
        } else if self.engine.kind == EngineKind::Docker {
            // docker runs have no `--rm` (see argv.rs): remove our own container now that its
            // exit code has been read.
            if let Err(e) = self.engine.remove(&self.name).await {
                if created {
                    cleanup
                        .errors
                        .push(format!("removing container {}: {e}", self.name));
                }
            }
        }
        let mut removed = Vec::new();
        // podman's client removes a `--rm` container itself before it exits normally; any other
        // ending (engine error codes, a signal, a stop, docker's asynchronous auto-remove) is
        // followed by a sweep by label.
        let clean_podman_exit = self.engine.kind == EngineKind::Podman
            && self.remote.is_none()
            && !ev.exit.timed_out
            && ev.exit.interrupted_by.is_none()
            && ev.exit.signal.is_none()
            && ev.failure.is_none()
            && !matches!(ev.exit.code, None | Some(125..=127));
        // The engine failed before it created anything (a name already taken, say): there is
        // nothing of this run to sweep, and nothing else may be touched.
        let created_nothing = !created
            && self.remote.is_none()
            && !ev.exit.timed_out
            && ev.exit.interrupted_by.is_none()
            && matches!(ev.exit.code, Some(125..=127));
        let listed = if clean_podman_exit || created_nothing {
            Ok(Vec::new())
        } else {
            self.engine.containers_of_run(&self.run.key()).await
        };
        match listed {
            Ok(ids) => {
                for id in ids {
                    match self.engine.remove(&id).await {
                        Ok(()) => removed.push(id),
                        Err(e) => cleanup.errors.push(format!("removing container {id}: {e}")),
                    }
                }
            }
            Err(e) => cleanup.errors.push(format!(
                "listing containers labelled {}: {e}",
                self.run.label()
            )),
        }
        if !removed.is_empty() {
            ev.warnings.push(format!(
                "removed {} container(s) still present after the run: {}",
                removed.len(),
                removed.join(", ")
            ));
        }
        (cleanup, removed)
    }
}
