//! agentdiff runtime backend `container`: runs the command in an ephemeral podman or docker
//! container on a private copy of the project (the workspace agentdiff materialised from the
//! captured before-state), with restrictive defaults: no network, all capabilities dropped,
//! `no-new-privileges`, a read-only root filesystem with a tmpfs `/tmp`, a non-root user, memory,
//! CPU and pids limits and an init process. The host project tree is never mounted, and neither is
//! the engine's socket.
//!
//! [`RuntimeBackend::prepare`] is a pure transform to the engine argv ([`argv`]); everything that
//! depends on the machine (engine present, image present locally, rootfs usable) is checked in
//! [`RuntimeBackend::launch`], which fails closed with
//! [`BackendError::Unavailable`](agentdiff_backend_api::BackendError) and a remedy.
//!
//! Options (`LaunchSpec::options`, from flags or the policy's `runtime.options`) are listed in
//! [`options::KEYS`]; see `docs/backends/container.md`.

pub mod archive;
pub mod argv;
pub mod cleanup;
pub mod engine;
pub mod options;
pub mod ownership;
pub mod protected;
pub mod remote;
pub mod rootfs;
mod running;
pub mod seccomp;
mod siblings;

pub use running::{ContainerFacts, EgressForwarderFacts, RootfsFacts};

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentdiff_backend_api::{
    Availability, BackendError, BackendOptions, Capabilities, CleanupReport, Enforcement,
    FailClosedSpec, LaunchCommand, LaunchContext, LaunchSpec, Level, OptionKind, OptionSpec,
    PreparedLaunch, ProcessIdentity, Result, RunPlace, RunningCommand, RuntimeBackend,
    WorkspaceMode,
};
use agentdiff_process::cleanup_host_processes;

pub use cleanup::{remove_run_containers, CleanupError, RemovedContainers};
use engine::{Engine, EngineKind, ProgramSource, ENGINE_CLIENT_VARS};
use options::{ContainerOptions, EngineChoice, Source};
use ownership::Invoker;

/// Backend id used by `--runtime container`.
pub const ID: &str = "container";
/// Enforcement label in evidence: the controls were handed to the engine.
pub const ENFORCEMENT: Enforcement = Enforcement::ContainerRequested;

/// The options the container backend declares, each with the `agentdiff run` flag users rely on.
/// [`options::ContainerOptions::parse`] is the full check (exclusions between options).
pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec::new(
        "engine",
        OptionKind::Choice(&["podman", "docker", "auto"]),
        "container engine CLI: podman, docker, or auto (podman when found, else docker)",
    )
    .default_value("auto")
    .flag("engine"),
    OptionSpec::new(
        "engine-host",
        OptionKind::Text,
        "run on the engine at this address (tcp://, ssh://, unix://) or `env` (DOCKER_HOST / CONTAINER_HOST); the workspace is shipped through the engine API instead of mounted (command line only: a project's policy file cannot send the project elsewhere)",
    )
    .command_line_only()
    .validate(|v| options::parse_engine_host(v).map(|_| ()).map_err(|_| options::ENGINE_HOST_EXPECTED)),
    OptionSpec::new(
        "image",
        OptionKind::Text,
        "image reference, present locally unless pull=true",
    )
    .flag("image")
    .validate(|v| options::validate_image(v).map_err(|_| options::IMAGE_EXPECTED)),
    OptionSpec::new(
        "rootfs",
        OptionKind::Path,
        "root filesystem directory (podman only)",
    )
    .flag("rootfs"),
    OptionSpec::new(
        "network",
        OptionKind::Choice(&["none", "filtered", "bridge"]),
        "container network: none (loopback only), filtered (none, plus agentdiff's egress proxy on the container's 127.0.0.1:3128; local podman only; the default when network.egress allows a host) or the engine's bridge",
    )
    .default_value(options::DEFAULT_NETWORK.as_str())
    .flag("network"),
    OptionSpec::new("memory", OptionKind::Text, "memory limit, e.g. 512m")
        .default_value(options::DEFAULT_MEMORY)
        .flag("memory")
        .validate(|v| options::validate_memory(v).map_err(|_| options::MEMORY_EXPECTED)),
    OptionSpec::new("cpus", OptionKind::Text, "CPU limit, e.g. 1 or 0.5")
        .default_value(options::DEFAULT_CPUS)
        .flag("cpus")
        .validate(|v| options::validate_cpus(v).map_err(|_| options::CPUS_EXPECTED)),
    OptionSpec::new(
        "pids-limit",
        OptionKind::Integer,
        "process-count limit (1 to 1000000)",
    )
    .default_value("64")
    .flag("pids-limit"),
    OptionSpec::new(
        "user",
        OptionKind::Text,
        "numeric UID:GID of a non-root user inside the container",
    )
    .flag("user"),
    OptionSpec::new(
        "env",
        OptionKind::EnvName,
        "pass this host variable into the container (repeatable; the value is never on argv)",
    )
    .repeatable()
    .flag("env"),
    OptionSpec::new("pull", OptionKind::Bool, "allow pulling a missing image")
        .default_value("false")
        .flag("pull"),
];

/// A missing image must refuse the launch, never run the command elsewhere.
pub const FAIL_CLOSED: &[FailClosedSpec] = &[FailClosedSpec {
    name: "image missing",
    remove: &["image", "rootfs", "pull"],
    set: &[(
        "image",
        "localhost/agentdiff-conformance-missing-image:none",
    )],
}];

fn factory() -> Box<dyn agentdiff_backend_api::DynRuntimeBackend> {
    Box::new(ContainerBackend::new())
}

inventory::submit! {
    agentdiff_backend_api::BackendDescriptor::new(
        ID,
        "podman or docker container on a private workspace copy, with network, privilege and resource limits",
        factory,
    )
    .with_options(OPTIONS)
    .with_fail_closed(FAIL_CLOSED)
}

/// The container backend. [`ContainerBackend::new`] finds `podman`/`docker` on PATH; the builder
/// methods pin exact binaries (embedders, tests with a fake engine).
#[derive(Debug, Clone)]
pub struct ContainerBackend {
    podman: ProgramSource,
    docker: ProgramSource,
    /// Environment of the engine client process (not of the container).
    client_env: Vec<(OsString, OsString)>,
    invoker: Invoker,
}

impl Default for ContainerBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl ContainerBackend {
    /// Engines from PATH; the engine client gets agentdiff's own [`ENGINE_CLIENT_VARS`].
    pub fn new() -> Self {
        let client_env = std::env::vars_os()
            .filter(|(k, _)| ENGINE_CLIENT_VARS.iter().any(|n| k == *n))
            .collect();
        Self {
            podman: ProgramSource::SearchPath,
            docker: ProgramSource::SearchPath,
            client_env,
            invoker: Invoker::current(),
        }
    }

    /// Use these binaries instead of searching PATH.
    pub fn with_engines(mut self, podman: ProgramSource, docker: ProgramSource) -> Self {
        self.podman = podman;
        self.docker = docker;
        self
    }

    /// Add (or replace) one variable of the engine client's environment.
    pub fn with_client_env(
        mut self,
        name: impl Into<OsString>,
        value: impl Into<OsString>,
    ) -> Self {
        let name = name.into();
        self.client_env.retain(|(k, _)| *k != name);
        self.client_env.push((name, value.into()));
        self
    }

    /// Pretend to be invoked by another user (tests of the ownership decision).
    pub fn with_invoker(mut self, invoker: Invoker) -> Self {
        self.invoker = invoker;
        self
    }

    fn source(&self, kind: EngineKind) -> &ProgramSource {
        match kind {
            EngineKind::Podman => &self.podman,
            EngineKind::Docker => &self.docker,
        }
    }

    /// The engine a request uses: explicit, or for `auto` podman when found, else docker.
    fn choose(&self, choice: EngineChoice) -> (EngineKind, Option<PathBuf>) {
        match choice {
            EngineChoice::Podman => (EngineKind::Podman, self.podman.resolve(EngineKind::Podman)),
            EngineChoice::Docker => (EngineKind::Docker, self.docker.resolve(EngineKind::Docker)),
            EngineChoice::Auto => match self.podman.resolve(EngineKind::Podman) {
                Some(p) => (EngineKind::Podman, Some(p)),
                None => match self.docker.resolve(EngineKind::Docker) {
                    Some(d) => (EngineKind::Docker, Some(d)),
                    None => (EngineKind::Podman, None),
                },
            },
        }
    }

    fn plan(&self, spec: &LaunchSpec) -> Result<Plan> {
        let invalid = |message: String| BackendError::InvalidRequest {
            backend: ID.into(),
            message,
        };
        let mut options =
            ContainerOptions::parse(&spec.options).map_err(|e| invalid(e.to_string()))?;
        let (mut kind, mut program) = self.choose(options.engine);
        if matches!(options.source, Source::Rootfs(_)) && kind == EngineKind::Docker {
            // `auto` with a rootfs can only mean podman (docker has no --rootfs).
            if options.engine == EngineChoice::Auto {
                kind = EngineKind::Podman;
                program = None;
            } else {
                return Err(invalid(
                    options::OptionsError::RootfsNeedsPodman.to_string(),
                ));
            }
        }
        check_private_workspace(&spec.root, &spec.workdir).map_err(|e| invalid(e.to_string()))?;
        if let Source::Rootfs(dir) = &options.source {
            if spec.root.starts_with(Path::new(dir)) {
                return Err(invalid(format!(
                    "rootfs {dir} is the project root or one of its ancestors; the host tree would be visible in the container"
                )));
            }
        }
        remote::refuse_endpoint_passthrough(&options.env).map_err(|e| invalid(e.to_string()))?;
        let endpoint = match &options.engine_host {
            Some(host) => Some(
                remote::endpoint(host, kind, &self.client_env)
                    .map_err(|e| invalid(e.to_string()))?,
            ),
            None => {
                remote::refuse_remote_client_env(kind, &self.client_env)
                    .map_err(|e| invalid(e.to_string()))?;
                None
            }
        };
        options.network = filtered_network(spec, &options, kind, endpoint.is_some())
            .map_err(|e| invalid(e.to_string()))?;
        let egress = (options.network == options::Network::Filtered)
            .then(|| spec.egress_proxy.clone())
            .flatten();
        let (user, keep_id) = match endpoint {
            // The remote engine's users are not this machine's: no keep-id, and the archive
            // carries the container user's ids.
            Some(_) => (options.user.unwrap_or(options::DEFAULT_USER), false),
            None => ownership::container_user(options.user, self.invoker, kind),
        };
        // A remote engine's workspace is a volume: nothing below it can be bound read-only.
        let read_only = match endpoint {
            Some(_) => protected::ReadOnly::default(),
            None => protected::read_only(spec),
        };
        let args = argv::run_args(&argv::RunRequest {
            kind,
            run_id: &spec.run_id,
            root: &spec.root,
            workspace: &spec.workdir,
            read_only: &read_only.entries,
            options: &options,
            user,
            userns_keep_id: keep_id,
            command: &spec.argv,
            remote: endpoint.is_some(),
        })
        .map_err(|e| invalid(e.to_string()))?;
        let seccomp = seccomp::Plan::choose(kind, endpoint.is_some());
        Ok(Plan {
            seccomp,
            read_only,
            endpoint,
            kind,
            program: program.unwrap_or_else(|| PathBuf::from(kind.as_str())),
            options,
            user,
            keep_id,
            args,
            egress,
        })
    }

    /// The engine client's environment: its own variables, then each `--env NAME` taken from the
    /// command's environment (so the engine copies exactly that value into the container).
    fn client_env(
        &self,
        spec: &LaunchSpec,
        options: &ContainerOptions,
        kind: EngineKind,
        endpoint: Option<&str>,
    ) -> Vec<(OsString, OsString)> {
        let mut env: Vec<(OsString, OsString)> = self
            .client_env
            .iter()
            .filter(|(k, _)| !options.env.iter().any(|n| k == n.as_str()))
            .filter(|(k, _)| endpoint.is_none() || !remote::ENDPOINT_VARS.iter().any(|n| k == n))
            .cloned()
            .collect();
        if let Some(url) = endpoint {
            // The one address the run uses, whatever agentdiff's environment said.
            env.push((remote::endpoint_var(kind).into(), url.into()));
        }
        for name in &options.env {
            if let Some((k, v)) = spec.env.iter().find(|(k, _)| k == name.as_str()) {
                env.push((k.clone(), v.clone()));
            }
        }
        env
    }
}

/// What `prepare` decided, recomputed identically by `launch`.
#[derive(Debug, Clone)]
struct Plan {
    kind: EngineKind,
    /// Remote mode: the engine's address (the workspace is shipped, never mounted).
    endpoint: Option<String>,
    program: PathBuf,
    options: ContainerOptions,
    user: options::UserSpec,
    keep_id: bool,
    args: Vec<OsString>,
    /// `network: filtered`: the egress proxy's socket, which a forwarder in the container's
    /// network namespace relays to.
    egress: Option<PathBuf>,
    /// The seccomp profile the container gets.
    seccomp: seccomp::Plan,
    /// The workspace entries bound read-only ([`protected`]).
    read_only: protected::ReadOnly,
}

/// Why a run cannot have the network it asked for.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NetworkError {
    #[error("network `filtered` needs agentdiff's egress proxy, which a run has only when the policy's network.egress allows a host: add `network.egress.allow` (or `--allow-host`), or use `--network none`")]
    NoProxy,
    #[error("network `filtered` needs the egress proxy's socket on this machine, which a remote engine (engine-host) cannot reach; the command would run without the allowlist. Use `--network none` (no network at all; the run then says the allowlist was not applied) or a local engine")]
    Remote,
    #[error("network `filtered` needs podman: agentdiff starts its forwarder in the container's network namespace between `podman init` and the command's start, and the docker CLI has no such step. Use `--engine podman`, or `--network none`")]
    Docker,
}

/// The run's network: `filtered` when asked for, and by default when the run has the egress
/// proxy and a local podman (as under bwrap). Asked for where agentdiff cannot make the proxy
/// the only route out (no proxy, a remote engine, docker), it is refused; by default there the
/// network stays `none`, and the transaction warns that the allowlist was not applied.
fn filtered_network(
    spec: &LaunchSpec,
    options: &ContainerOptions,
    kind: EngineKind,
    remote: bool,
) -> std::result::Result<options::Network, NetworkError> {
    let servable = !remote && kind == EngineKind::Podman;
    let network = match (spec.options.get("network"), &spec.egress_proxy) {
        (None, Some(_)) if servable => options::Network::Filtered,
        _ => options.network,
    };
    if network != options::Network::Filtered {
        return Ok(network);
    }
    if spec.egress_proxy.is_none() {
        Err(NetworkError::NoProxy)
    } else if remote {
        Err(NetworkError::Remote)
    } else if kind == EngineKind::Docker {
        Err(NetworkError::Docker)
    } else {
        Ok(network)
    }
}

/// Why a workspace cannot be mounted into the container.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WorkspaceError {
    #[error("the workspace {} is the project root or one of its ancestors; the container backend only mounts a private workspace (the transaction materialises it)", .0.display())]
    HostTree(PathBuf),
    #[error("the workspace {} lies inside the project tree; the container backend only mounts a private workspace under .agentdiff/workspaces/", .0.display())]
    InsideProject(PathBuf),
}

/// The container must never see the host tree: the workspace may not be the root, an ancestor of
/// it, or a directory of the project other than agentdiff's own store.
fn check_private_workspace(root: &Path, workdir: &Path) -> std::result::Result<(), WorkspaceError> {
    if root.starts_with(workdir) {
        return Err(WorkspaceError::HostTree(workdir.to_path_buf()));
    }
    if workdir.starts_with(root) && !workdir.starts_with(root.join(".agentdiff")) {
        return Err(WorkspaceError::InsideProject(workdir.to_path_buf()));
    }
    Ok(())
}

/// Declared capabilities; see docs/backends/container.md for why each level is what it is.
pub fn declared_capabilities() -> Capabilities {
    Capabilities {
        // agentdiff itself never mounts the host tree: the container gets a private copy only.
        host_repository: Level::Enforced,
        // Read-only rootfs, network none, cgroup limits, dropped capabilities and the env
        // allowlist are handed to the engine; unverified here until a probe checks them.
        filesystem_writes: Level::Requested,
        network: Level::Requested,
        resources: Level::Requested,
        privileges: Level::Requested,
        environment: Level::Requested,
        // The engine client is observed on the host; processes inside the container end with it.
        processes: Level::Observed,
        // The command only ever runs inside a container: without one it never runs (fail closed).
        sandboxed: true,
        network_enforcement: false,
        workspace: WorkspaceMode::Private,
    }
}

/// Remote mode: nothing of this host is mounted (host_repository stays enforced), and the
/// command's processes are the remote engine's to contain and report.
pub fn capabilities_for(remote: bool) -> Capabilities {
    let mut c = declared_capabilities();
    if remote {
        c.processes = Level::Requested;
    }
    c
}

impl RuntimeBackend for ContainerBackend {
    fn id(&self) -> &'static str {
        ID
    }

    fn capabilities(&self, options: &BackendOptions) -> Capabilities {
        capabilities_for(options.get("engine-host").is_some())
    }

    async fn availability(&self, options: &BackendOptions) -> Availability {
        let remote = options.get("engine-host").is_some();
        let mut found = Vec::new();
        let mut problems = Vec::new();
        let mut seccomp = Vec::new();
        for kind in [EngineKind::Podman, EngineKind::Docker] {
            let Some(program) = self.source(kind).resolve(kind) else {
                continue;
            };
            let engine = Engine {
                kind,
                program: program.clone(),
                env: self.client_env.clone(),
            };
            let ready = found.len();
            match engine.version().await {
                Err(e) => problems.push(e.to_string()),
                Ok(version) => match engine.server_version().await {
                    Ok(Some(server)) => found.push(format!(
                        "{} at {} ({version}; API server {server})",
                        kind.as_str(),
                        program.display()
                    )),
                    Ok(None) => found.push(format!(
                        "{} at {} ({version})",
                        kind.as_str(),
                        program.display()
                    )),
                    Err(e) => problems.push(format!(
                        "docker CLI at {} cannot reach its API server: {e}",
                        program.display()
                    )),
                },
            }
            if found.len() > ready {
                seccomp.push(seccomp::Plan::choose(kind, remote).summary(kind));
            }
        }
        if found.is_empty() {
            Availability::Unavailable {
                reason: if problems.is_empty() {
                    "no container engine (podman or docker) found on PATH".into()
                } else {
                    problems.join("; ")
                },
                remedy: "install podman (`apt-get install podman runc`) or the docker CLI with a reachable DOCKER_HOST; image or rootfs checks happen at launch".into(),
            }
        } else {
            let mut detail = found.join("; ");
            if !problems.is_empty() {
                detail.push_str("; also: ");
                detail.push_str(&problems.join("; "));
            }
            detail.push_str("; ");
            detail.push_str(&seccomp.join("; "));
            Availability::Ready { detail }
        }
    }

    fn prepare(&self, spec: &LaunchSpec) -> Result<PreparedLaunch> {
        let plan = self.plan(spec)?;
        // Checked by `plan` (run_args) already.
        let identity = argv::RunIdentity::new(&spec.root, &spec.run_id).map_err(|e| {
            BackendError::InvalidRequest {
                backend: ID.into(),
                message: e.to_string(),
            }
        })?;
        let env = self.client_env(spec, &plan.options, plan.kind, plan.endpoint.as_deref());
        let runtime_config = serde_json::json!({
            "engine": plan.kind.as_str(),
            "engine_program": plan.program.display().to_string(),
            "engine_choice": plan.options.engine,
            "source": plan.options.source,
            "pull": plan.options.pull,
            "network": plan.options.network.as_str(),
            "engine_network": plan.options.network.engine_value(),
            "egress_proxy": plan.egress.as_ref().map(|socket| serde_json::json!({
                "socket": socket.display().to_string(),
                "forwarder": format!("127.0.0.1:{} in the container's network namespace, run by agentdiff", agentdiff_backend_api::egress::FORWARDER_PORT),
            })),
            "memory": plan.options.memory,
            "memory_swap": plan.options.memory,
            "cpus": plan.options.cpus,
            "pids_limit": plan.options.pids_limit,
            "user": plan.user.render(),
            "userns_keep_id": plan.keep_id,
            "env_names": plan.options.env,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "seccomp": plan.seccomp.evidence(),
            "read_only_rootfs": true,
            "read_only_workspace_entries": plan.read_only.entries,
            "read_only_not_bound": plan.read_only.not_bound,
            "tmpfs": [options::TMPFS_TMP],
            "init": true,
            "remove_after_run": true,
            "started_by": if plan.egress.is_some() { "create, init, forwarder, start -a" } else if plan.endpoint.is_some() { "create, ship in, start -a" } else { "run" },
            "removed_by": match (plan.kind, &plan.endpoint) {
                (_, Some(_)) => "agentdiff (rm -f -v by id after the workspace is shipped back, then checked gone)",
                (EngineKind::Podman, None) => "engine (--rm)",
                (EngineKind::Docker, None) => "agentdiff (rm -f after the exit code is read)",
            },
            "engine_host": plan.endpoint,
            "container_name": identity.container_name(),
            "labels": {
                engine::RUN_LABEL: identity.key(),
                "agentdiff.managed": "true",
            },
            "mounts": [match &plan.endpoint {
                None => serde_json::json!({
                    "source": spec.workdir.display().to_string(),
                    "target": argv::CONTAINER_WORKDIR,
                    "kind": "private_workspace",
                }),
                Some(_) => serde_json::json!({
                    "source": "engine volume",
                    "target": argv::CONTAINER_WORKDIR,
                    "kind": "shipped_workspace",
                    "shipped_from": spec.workdir.display().to_string(),
                }),
            }],
            "workdir": argv::CONTAINER_WORKDIR,
            "host_repository_mounted": false,
            "engine_socket_mounted": false,
            "timeout_ms": spec.timeout.map(|t| t.as_millis() as u64),
            "grace_ms": spec.grace.as_millis() as u64,
        });
        let command = LaunchCommand {
            program: plan.program.clone().into_os_string(),
            args: plan.args.clone(),
            env,
            cwd: spec.workdir.clone(),
        };
        let filtered = plan.egress.is_some();
        let prepared = PreparedLaunch::new(ID, spec, command, ENFORCEMENT, plan)
            .wrapped()
            .with_runtime_config(runtime_config);
        Ok(if filtered {
            prepared.routes_egress()
        } else {
            prepared
        })
    }

    async fn launch(
        &self,
        prepared: PreparedLaunch,
        ctx: LaunchContext,
    ) -> Result<Box<dyn RunningCommand>> {
        let plan = prepared.plan_for::<Plan>(ID)?.clone();
        running::launch(self, plan, prepared, ctx).await
    }

    /// Host-side processes only: without the project root the run's containers cannot be told
    /// from another project's run of the same id (see [`RuntimeBackend::cleanup_run_at`]).
    async fn cleanup_run(
        &self,
        _run_id: &str,
        ids: &[ProcessIdentity],
        grace: Duration,
    ) -> CleanupReport {
        cleanup_host_processes(ids, grace).await
    }

    /// Without the project root: the host processes, and a remote run's containers on the engine
    /// it recorded, by its recorded label and container id.
    async fn cleanup_recorded_run(
        &self,
        _run_id: &str,
        ids: &[ProcessIdentity],
        grace: Duration,
        resources: Option<&serde_json::Value>,
    ) -> CleanupReport {
        let mut report = cleanup_host_processes(ids, grace).await;
        if let Some(resources) = resources {
            self.cleanup_recorded_engine(None, resources, &mut report)
                .await;
        }
        report
    }

    /// Host-side processes first; then the run's containers with their volumes, by the label
    /// that carries this root's digest (on the engine a remote run recorded, else on every
    /// engine found on PATH); then what the run left next to its private workspace.
    async fn cleanup_run_at(
        &self,
        place: RunPlace<'_>,
        run_id: &str,
        ids: &[ProcessIdentity],
        grace: Duration,
        resources: Option<&serde_json::Value>,
    ) -> CleanupReport {
        let mut report = cleanup_host_processes(ids, grace).await;
        match argv::RunIdentity::new(place.root, run_id) {
            Ok(identity) => match resources {
                Some(resources) => {
                    self.cleanup_recorded_engine(Some(&identity.key()), resources, &mut report)
                        .await
                }
                None => add_removed(
                    &mut report,
                    cleanup::remove_run_containers_with(
                        &identity,
                        &[
                            (EngineKind::Podman, self.podman.clone()),
                            (EngineKind::Docker, self.docker.clone()),
                        ],
                        self.client_env.clone(),
                    )
                    .await,
                ),
            },
            Err(e) => report
                .errors
                .push(format!("the run's containers were not looked for: {e}")),
        }
        let leftovers = cleanup::remove_run_leftovers(place.workspace);
        for dir in leftovers.removed {
            report
                .resources_removed
                .push(format!("directory {} left by the run", dir.display()));
        }
        report.errors.extend(leftovers.errors);
        report
    }
}

impl ContainerBackend {
    /// A remote run's containers on the engine it recorded ([`cleanup::RecordedEngine`]).
    async fn cleanup_recorded_engine(
        &self,
        run_key: Option<&str>,
        resources: &serde_json::Value,
        report: &mut CleanupReport,
    ) {
        match serde_json::from_value::<cleanup::RecordedEngine>(resources.clone()) {
            Ok(recorded) => {
                let program = self.source(recorded.engine);
                let removed = cleanup::remove_recorded_containers(
                    run_key,
                    &recorded,
                    program,
                    &self.client_env,
                )
                .await;
                add_removed(report, removed);
            }
            Err(e) => report.errors.push(format!(
                "the run's record of its engine could not be read ({e}); its containers were not looked for"
            )),
        }
    }
}

/// What a container removal did, into the cleanup report.
fn add_removed(
    report: &mut CleanupReport,
    removed: std::result::Result<cleanup::RemovedContainers, cleanup::CleanupError>,
) {
    match removed {
        Ok(removed) => {
            for (engine, id) in removed.removed {
                report
                    .resources_removed
                    .push(format!("{engine} container {id}"));
            }
            for (engine, volume) in removed.volumes {
                report
                    .resources_removed
                    .push(format!("{engine} volume {volume}"));
            }
            for (engine, why) in removed.unreachable {
                report.errors.push(format!(
                    "{engine} could not be asked for the run's containers: {why}"
                ));
            }
        }
        Err(e) => report
            .errors
            .push(format!("the run's containers could not be removed: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_are_honest() {
        let c = declared_capabilities();
        assert_eq!(c.workspace, WorkspaceMode::Private);
        assert_eq!(c.host_repository, Level::Enforced);
        for l in [
            c.filesystem_writes,
            c.network,
            c.resources,
            c.privileges,
            c.environment,
        ] {
            assert_eq!(l, Level::Requested);
        }
        assert_eq!(c.processes, Level::Observed);
        assert!(!c.network_enforcement);
    }

    #[test]
    fn workspace_must_be_private() {
        let root = Path::new("/p");
        assert!(check_private_workspace(root, Path::new("/p")).is_err());
        assert!(check_private_workspace(root, Path::new("/")).is_err());
        assert!(check_private_workspace(root, Path::new("/p/src")).is_err());
        assert!(check_private_workspace(root, Path::new("/p/.agentdiff/workspaces/r")).is_ok());
        assert!(check_private_workspace(root, Path::new("/var/tmp/ws")).is_ok());
    }
}
