//! The `bwrap` backend: plan (pure), launch through the shared supervisor, and evidence that
//! tells bwrap's setup failures from the command's exit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentdiff_backend_api::{
    Availability, BackendError, BackendFacts, BackendOptions, BoxFuture, Capabilities,
    CleanupReport, LaunchCommand, LaunchContext, LaunchFacts, LaunchSpec, Level, PreparedLaunch,
    ProcessRelation, Result, RunEvidence, RunningCommand, RuntimeBackend, WorkspaceMode,
};
use agentdiff_host::system::absolute_from_cwd as absolute;
use agentdiff_process::cleanup_host_processes;
use agentdiff_process::exec_shim::start_gate;
use agentdiff_process::exec_shim::{self, StartState};
use agentdiff_process::shimmed::{self, ShimmedCommand, ShimmedExit, StartFacts};
use agentdiff_process::supervisor::EvidenceLabels;
use agentdiff_process::ProcessIdentity;
use serde_json::{json, Value};

use crate::facts::{BwrapFacts, Control, SandboxClaim, SandboxInit};
use crate::host;
use crate::plan::{self, HostFacts, Network, Plan, PlanError, Programs};
use crate::{ENFORCEMENT, ENV_EXEC_SHIM, ID, OPT_EXECUTABLE, OPT_EXEC_SHIM, OPT_NETWORK};

/// What the bwrap backend declares by default (network unshared). Filesystem writes outside the
/// root and the writable options, network, processes (the pid namespace dies with its init, the
/// run), privileges (all capabilities dropped, no-new-privileges) and environment (agentdiff
/// hands over only the scrubbed set) are applied by the sandbox agentdiff builds, and the
/// conformance probes check each on this host. The project tree itself is writable and observed.
/// Resources are not limited.
pub fn capabilities() -> Capabilities {
    capabilities_for(Network::None)
}

/// The labels for a planned network mode: with the host network, network is `uncontrolled`;
/// filtered (the egress proxy the only route out) is `filtered`, no network at all `enforced`.
pub fn capabilities_for(network: Network) -> Capabilities {
    let enforced_net = network.unshared();
    Capabilities {
        filesystem_writes: Level::Enforced,
        host_repository: Level::Observed,
        network: match network {
            Network::None => Level::Enforced,
            Network::Filtered => Level::Filtered,
            Network::Host => Level::Uncontrolled,
        },
        processes: Level::Enforced,
        resources: Level::Uncontrolled,
        privileges: Level::Enforced,
        environment: Level::Enforced,
        sandboxed: true,
        network_enforcement: enforced_net,
        workspace: WorkspaceMode::InPlace,
    }
}

/// What the backend knows does not hold, stated with every run's evidence.
pub const LIMITS: &[&str] = &[
    "the host filesystem stays readable except the hidden credential locations; a secret \
     elsewhere on the host can be read (and, with the host network, sent out)",
    "writes below the project root are allowed and observed by the before/after manifests; \
     .git, .agentdiff and literal deny paths are read-only, wildcard deny patterns are decided \
     after the run",
    "no CPU, memory or process-count limit is applied",
    "an interactive run keeps the caller's terminal session (the terminal, Ctrl-C and job \
     control work); only TIOCSTI and TIOCLINUX are refused, other terminal ioctls are not",
];

/// The ports evidence of a run whose network namespace was unshared.
pub const PORTS_ISOLATED_NOTE: &str = "the command has its own network namespace \
(--unshare-net): a socket it listens on is reachable only from inside the sandbox, so the host's \
listening sockets are not observed by this backend";

/// The `bwrap` runtime backend.
#[derive(Debug, Default)]
pub struct BwrapBackend;

impl BwrapBackend {
    pub fn new() -> Self {
        BwrapBackend
    }
}

fn unavailable(reason: impl Into<String>, remedy: impl Into<String>) -> BackendError {
    BackendError::Unavailable {
        backend: ID.into(),
        reason: reason.into(),
        remedy: remedy.into(),
    }
}

fn launch_error(message: impl Into<String>) -> BackendError {
    BackendError::Launch {
        backend: ID.into(),
        message: message.into(),
    }
}

fn plan_error(e: PlanError) -> BackendError {
    if let PlanError::UntrustedBwrap(reason) = e {
        return unavailable(reason, host::TRUSTED_BWRAP_REMEDY);
    }
    BackendError::InvalidRequest {
        backend: ID.into(),
        message: e.to_string(),
    }
}

impl BwrapBackend {
    fn plan(&self, spec: &LaunchSpec) -> Result<Plan> {
        let o = &spec.options;
        let search = host::search_path(&spec.env);
        let bwrap =
            host::resolve_bwrap(o.get(OPT_EXECUTABLE).unwrap_or("bwrap"), search.as_deref())
                .map_err(|e| unavailable(e.reason, e.remedy))?;
        let remedy = format!(
            "run through the `agentdiff` binary, or set {ENV_EXEC_SHIM} (or the `{OPT_EXEC_SHIM}` \
             backend option) to the path of the agentdiff binary"
        );
        let shim = exec_shim::locate(
            o.get(OPT_EXEC_SHIM).map(absolute),
            &[ENV_EXEC_SHIM],
            &remedy,
        )
        .map_err(|e| unavailable(e.reason, e.remedy))?;
        plan::plan(
            spec,
            &HostFacts::current(&spec.env),
            Programs { bwrap, shim },
            &spec.deny_patterns,
        )
        .map_err(plan_error)
    }
}

fn runtime_config(plan: &Plan) -> Value {
    json!({
        "backend": ID,
        "bwrap_executable": plan.bwrap.to_string_lossy(),
        "exec_shim": plan.shim.to_string_lossy(),
        "start_marker": plan.marker.to_string_lossy(),
        "network": plan.network,
        "home": plan.home,
        "home_sockets": if plan.agent_sockets_allowed { "allow" } else { "hide" },
        "host_sockets": if plan.daemon_sockets_allowed { "allow" } else { "hide" },
        "base": base_mounts(),
        "mounts": plan.mounts,
        "not_applied": plan.not_applied,
        "namespaces": namespaces(plan.network),
        "die_with_parent": true,
        "new_session": plan.new_session,
        "seccomp_guard": agentdiff_process::seccomp_guard::SUMMARY,
        "cap_drop": "ALL",
        "env_dropped_by_backend": plan.env_dropped,
    })
}

fn namespaces(network: Network) -> Vec<&'static str> {
    let mut n = vec!["mount", "pid", "ipc", "uts"];
    if network.unshared() {
        n.push("net");
    }
    n
}

/// The fixed mounts before the plan's own, as `runtime_config.base` records them.
fn base_mounts() -> Vec<String> {
    let mut base = vec![
        "ro-bind / /".to_string(),
        "dev /dev".into(),
        "proc /proc".into(),
    ];
    base.extend(
        plan::PID1_MEMORY
            .iter()
            .map(|mem| format!("ro-bind /dev/null {mem}")),
    );
    base.push("tmpfs /tmp".into());
    base
}

/// The credentials control: enforced under the home allowlist (only the allowlist of each home
/// is shown); under the denylist only the listed locations are hidden and any other file of the
/// home is readable, which no label may call enforced; nor may it when the agent sockets were
/// allowed (the command can use the keys behind them).
fn credentials_control(home: plan::HomeMode, sockets_allowed: bool) -> Control {
    let (level, how) = match home {
        plan::HomeMode::Allowlist if sockets_allowed => (
            Level::Uncontrolled,
            "home allowlist, but /run/user, $XDG_RUNTIME_DIR and the agent sockets allowed \
             (runtime.bwrap.home.sockets: allow): the command can use the keys behind them",
        ),
        plan::HomeMode::Allowlist => (
            Level::Enforced,
            "home allowlist: each home hidden (read-only tmpfs) except the allowlist; \
             credential locations (the homes' and the system's), agentdiff's key directory, \
             /run/user, $XDG_RUNTIME_DIR, agent sockets and container engine sockets hidden; \
             the kernel keyrings refused by the exec shim's seccomp filter",
        ),
        plan::HomeMode::Denylist => (
            Level::Uncontrolled,
            "home denylist (runtime.bwrap.home.mode: denylist): only the listed credential \
             locations (the homes' and the system's), agentdiff's key directory and container \
             engine sockets are hidden; every other file of the home is readable",
        ),
    };
    Control {
        level,
        how: how.to_string(),
        hidden: None,
    }
}

/// The level of every control, as recorded with the run.
fn controls(plan: &Plan) -> BTreeMap<String, Control> {
    let caps = capabilities_for(plan.network);
    let control = |level: Level, how: &str| Control {
        level,
        how: how.to_string(),
        hidden: None,
    };
    let hidden = plan
        .mounts
        .iter()
        .filter(|m| {
            matches!(
                m.kind,
                plan::MountKind::HiddenDir | plan::MountKind::HiddenFile | plan::MountKind::LeftOut
            )
        })
        .map(|m| m.path.to_string_lossy().into_owned())
        .collect();
    let network_how = match plan.network {
        Network::None => {
            "network namespace unshared (loopback only); AF_VSOCK sockets and io_uring refused \
             by the exec shim's seccomp filter"
        }
        Network::Filtered => {
            "network namespace unshared; the only route out is agentdiff's egress proxy \
             (network.egress), through its Unix socket and a forwarder on 127.0.0.1, with the \
             proxy variables set; AF_VSOCK sockets and io_uring refused by the exec shim's \
             seccomp filter"
        }
        Network::Host => "host network (runtime.bwrap.network: host)",
    };
    let terminal_how = if plan.new_session {
        "new session (no controlling terminal); TIOCSTI and TIOCLINUX refused by a seccomp filter"
    } else {
        "interactive: the caller's session is kept; TIOCSTI and TIOCLINUX refused by a seccomp \
         filter"
    };
    [
        (
            "filesystem_writes",
            control(
                caps.filesystem_writes,
                "host read-only; root and writable options bound writable; private /tmp",
            ),
        ),
        (
            "host_repository",
            control(
                caps.host_repository,
                "root writable and observed; .git, .agentdiff and literal deny paths read-only",
            ),
        ),
        (
            "credentials",
            Control {
                hidden: Some(hidden),
                ..credentials_control(plan.home, plan.agent_sockets_allowed)
            },
        ),
        ("network", control(caps.network, network_how)),
        (
            "processes",
            control(
                caps.processes,
                "pid namespace: everything the command starts dies with it",
            ),
        ),
        (
            "privileges",
            control(caps.privileges, "--cap-drop ALL, no-new-privileges"),
        ),
        (
            "environment",
            control(
                caps.environment,
                "scrubbed allowlist; runtime-injection variables dropped",
            ),
        ),
        ("resources", control(caps.resources, "no limit applied")),
        ("terminal", control(Level::Enforced, terminal_how)),
    ]
    .into_iter()
    .map(|(name, c)| (name.to_string(), c))
    .collect()
}

impl RuntimeBackend for BwrapBackend {
    fn id(&self) -> &'static str {
        ID
    }

    /// The labels follow the `network` option: with the host network, network is uncontrolled.
    fn capabilities(&self, options: &BackendOptions) -> Capabilities {
        match options.get(OPT_NETWORK) {
            Some("host") => capabilities_for(Network::Host),
            Some("filtered") => capabilities_for(Network::Filtered),
            _ => capabilities(),
        }
    }

    fn holds_start(&self) -> bool {
        // The exec shim waits at the plan's start gate: bwrap builds the sandbox while the
        // transaction captures the tree.
        true
    }

    fn requires_scrubbed_environment(&self) -> bool {
        true
    }

    async fn availability(&self, options: &BackendOptions) -> Availability {
        let requested = options.get(OPT_EXECUTABLE).unwrap_or("bwrap");
        let bwrap = match host::resolve_bwrap(requested, std::env::var_os("PATH").as_deref()) {
            Ok(b) => b,
            Err(e) => {
                return Availability::Unavailable {
                    reason: e.reason,
                    remedy: e.remedy,
                }
            }
        };
        let userns = host::user_namespaces();
        if !userns.allowed {
            return Availability::Unavailable {
                reason: format!("bwrap cannot create its namespaces: {}", userns.detail),
                remedy: userns.remedy.unwrap_or_default(),
            };
        }
        // Only a real start tells whether AppArmor lets bwrap have a user namespace; elsewhere a
        // setup failure is caught per run by the start marker, so no extra process is started.
        // A start that worked is remembered for this boot, kernel, user and bwrap binary: one
        // process fewer per run, and a stale entry still fails closed at launch.
        let euid = agentdiff_host::system::euid();
        let proc_sys = Path::new("/proc/sys");
        let mut detail = format!("bwrap at {}; {}", bwrap.display(), userns.detail);
        if host::apparmor_restricted(proc_sys, euid) {
            let state = agentdiff_host::state_dir::locate().ok();
            let state = state.as_deref();
            match host::smoke_test_cached(&bwrap, proc_sys, euid, state).await {
                Ok(host::StartCheck::Probed) => detail.push_str("; bwrap started a sandbox"),
                Ok(host::StartCheck::Cached) => detail.push_str(
                    "; this bwrap started a sandbox earlier on this boot and kernel (cached)",
                ),
                Err(e) => {
                    return Availability::Unavailable {
                        reason: e.reason,
                        remedy: e.remedy,
                    }
                }
            }
        }
        Availability::Ready { detail }
    }

    /// The plan is every check `prepare` makes; what comes after it (the argv digest's salt,
    /// agentdiff's namespace ids) only feeds the launch.
    fn check(&self, spec: &LaunchSpec) -> Result<()> {
        self.plan(spec).map(|_| ())
    }

    fn prepare(&self, spec: &LaunchSpec) -> Result<PreparedLaunch> {
        let plan = self.plan(spec)?;
        // The shim refuses TIOCSTI/TIOCLINUX for the command before it starts it (the argv
        // digest it checks reaches it through the secret FIFO at the launch, not the environment).
        let mut env = shimmed::shim_env(&plan.env, true);
        // The shim refuses to start the command unless each namespace bwrap should unshare
        // differs from agentdiff's own: a "bwrap" that only execs its argument runs nothing.
        let host_ns =
            exec_shim::namespace_ids(&plan::unshared_namespaces(plan.network)).map_err(|e| {
                unavailable(
                    format!("cannot read agentdiff's own namespaces in /proc/self/ns: {e}"),
                    "run agentdiff with /proc mounted",
                )
            })?;
        env.push((exec_shim::ENV_HOST_NAMESPACES.into(), host_ns.into()));
        // The shim waits at the gate until the launch is released (at once when not held).
        env.push((start_gate::ENV_START_GATE.into(), plan.gate.clone().into()));
        // The shim starts the egress forwarder before the command (filtered network only).
        if let Some(socket) = &plan.egress {
            let forward = exec_shim::forward::ForwardSpec {
                port: plan::EGRESS_PORT,
                socket: socket.clone(),
            };
            env.push((
                exec_shim::forward::ENV_EGRESS_FORWARD.into(),
                forward.env_value(),
            ));
        }
        let command = LaunchCommand {
            program: plan.bwrap.as_os_str().to_os_string(),
            args: plan.args.clone(),
            env,
            cwd: plan.workdir.clone(),
        };
        let config = runtime_config(&plan);
        let reach = plan.engine_reach();
        // With the network unshared, the command's listening sockets live in its own namespace,
        // out of the host's reach and out of sight of the host's socket tables: no host snapshot
        // is taken (it would read as "no listener opened"), and the evidence says why.
        let mut spec = spec.clone();
        spec.observe_ports &= plan.network == Network::Host;
        let filtered = plan.egress.is_some();
        let prepared = PreparedLaunch::new(ID, &spec, command, ENFORCEMENT, plan)
            .wrapped()
            .with_runtime_config(config)
            .with_engine_reach(reach);
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
        // Exactly what prepare planned: the PreparedLaunch cannot be edited after prepare.
        let plan = prepared.plan_for::<Plan>(ID)?.clone();
        let labels = EvidenceLabels {
            backend: ID.into(),
            enforcement: ENFORCEMENT,
            capabilities: capabilities_for(plan.network),
        };
        let wrapper = BwrapFacts {
            kind: ID.into(),
            executable: plan.bwrap.to_string_lossy().into_owned(),
            exec_shim: plan.shim.to_string_lossy().into_owned(),
            sandbox: SandboxClaim::AppliedByAgentdiff,
            controls: controls(&plan),
            limits: LIMITS.iter().map(|s| s.to_string()).collect(),
            start: None,
            sandbox_init: None,
            egress_forwarder: None,
        };
        let env_dropped = plan.env_dropped.clone();
        let gate = Some(plan.gate.as_path());
        let inner = ShimmedCommand::spawn(prepared, ctx, labels, &plan.marker, gate, "bwrap")
            .map_err(|e| launch_error(e.to_string()))?;
        Ok(Box::new(BwrapRunning {
            inner,
            plan: plan.clone(),
            bwrap: plan.bwrap.clone(),
            wrapper,
            network: plan.network,
            env_dropped,
        }))
    }

    async fn cleanup_run(
        &self,
        _run_id: &str,
        ids: &[ProcessIdentity],
        grace: Duration,
    ) -> CleanupReport {
        // bwrap and the command are ordinary host processes (the pid namespace only renumbers
        // them inside): the identity-checked cleanup applies unchanged.
        cleanup_host_processes(ids, grace).await
    }
}

/// A running sandbox: the supervised bwrap process plus the start marker.
struct BwrapRunning {
    inner: ShimmedCommand,
    /// The plan ran, to name a mount point that vanished when the sandbox did not start.
    plan: Plan,
    bwrap: PathBuf,
    wrapper: BwrapFacts,
    network: Network,
    env_dropped: Vec<String>,
}

impl RunningCommand for BwrapRunning {
    fn pid(&self) -> Option<u32> {
        Some(self.inner.pid())
    }

    fn launch_facts(&self) -> LaunchFacts {
        self.inner.launch_facts()
    }

    fn release(&mut self) -> Result<()> {
        self.inner
            .release()
            .map_err(|e| launch_error(e.to_string()))
    }

    fn abort(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            self.inner.abort().await;
        })
    }

    fn wait(self: Box<Self>) -> BoxFuture<'static, Result<RunEvidence>> {
        Box::pin(async move {
            let BwrapRunning {
                inner,
                plan,
                bwrap,
                mut wrapper,
                network,
                env_dropped,
            } = *self;
            let root_pid = inner.pid();
            let ShimmedExit {
                mut evidence,
                state,
                expected_argc,
            } = inner.wait().await?;
            if let Some(env) = &mut evidence.environment {
                env.mode = agentdiff_backend_api::environment::EnvMode::Scrub;
                env.dropped.extend(env_dropped);
                env.dropped.sort();
                env.dropped.dedup();
            }
            wrapper.sandbox_init = discount_sandbox_init(&mut evidence, root_pid);
            if network == Network::Filtered {
                let init = wrapper.sandbox_init.as_ref().map(|i| i.pid);
                let shim = Path::new(&wrapper.exec_shim).file_name();
                let shim = shim.map(|n| n.to_string_lossy().into_owned());
                wrapper.egress_forwarder = init
                    .zip(shim)
                    .and_then(|(init, shim)| discount_forwarder(&mut evidence, init, &shim));
            }
            if network.unshared() {
                evidence.ports.note = PORTS_ISOLATED_NOTE.into();
            }
            // bwrap's own message went to the terminal; only a failed start is diagnosed, by one more
            // minimal start whose message is read here (the kernel refusing namespaces, AppArmor),
            // so the remedy can be named. A run that started pays nothing.
            let ended_by_agentdiff =
                evidence.exit.timed_out || evidence.exit.interrupted_by.is_some();
            let diagnosis = match state {
                StartState::NotStarted if !ended_by_agentdiff => {
                    match plan.vanished_mount_point() {
                        Some(gone) => Some(vanished(gone)),
                        None => host::smoke_test(&bwrap).await.err(),
                    }
                }
                _ => None,
            };
            attribute_exit(
                &mut evidence,
                &state,
                expected_argc,
                network,
                wrapper,
                diagnosis.as_ref(),
            )?;
            Ok(evidence)
        })
    }
}

/// bwrap's own pid-1 init (the outer bwrap's only child) reports the command's exit to the
/// outer bwrap and exits a moment later, so the supervisor may still see it alive and end it.
/// It is the sandbox's process, not one the command left behind: it is not counted as a
/// leftover, and what happened to it is returned for the wrapper evidence. Everything the
/// command started runs below it, inside the pid namespace, and stays counted.
///
/// The init is known by its place, not its name alone: a `bwrap` child of the outer bwrap, or
/// a `bwrap` first seen already re-parented to agentdiff (the outer bwrap exited before the
/// first poll, which a short command makes the usual case). Only a process outside the
/// sandbox's pid namespace can be re-parented to agentdiff: an orphan inside it goes to the
/// init, never past it. The outer bwrap has one such child, so two candidates are not bwrap's
/// layout and every one of them stays counted.
fn discount_sandbox_init(evidence: &mut RunEvidence, root_pid: u32) -> Option<SandboxInit> {
    // The root is agentdiff's own child: its parent is the monitor orphans are re-parented to.
    let monitor = evidence
        .processes
        .iter()
        .find(|p| p.identity.pid == root_pid)
        .map(|p| p.ppid);
    discount_one(evidence, |p| {
        let placed = p.ppid == root_pid
            || (p.relation == ProcessRelation::Reparented && Some(p.ppid) == monitor);
        placed && p.executable == "bwrap" && p.identity.pid != root_pid
    })
}

/// The one process `is_it` picks (none when more than one does: not the layout expected),
/// taken out of the leftovers and their cleanup records.
fn discount_one(
    evidence: &mut RunEvidence,
    is_it: impl Fn(&agentdiff_backend_api::ProcessRecord) -> bool,
) -> Option<SandboxInit> {
    let mut found = evidence.processes.iter_mut().filter(|p| is_it(p));
    let process = found.next()?;
    if found.next().is_some() {
        return None;
    }
    let was_alive = process.alive_after_root_exit;
    process.alive_after_root_exit = false;
    let identity = process.identity.clone();
    let cleanup = evidence
        .cleanup
        .records
        .iter()
        .position(|r| r.identity == identity)
        .map(|i| evidence.cleanup.records.remove(i));
    Some(SandboxInit {
        pid: identity.pid,
        alive_after_bwrap_exit: was_alive,
        ended_by_cleanup: cleanup.map(|r| r.outcome),
        counted_as_leftover: false,
    })
}

/// The exec shim's egress forwarder: the one process running the shim's program whose parent
/// is the sandbox's init (the shim double-forks it so the init adopts it). It dies with the
/// sandbox; like the init, it may still be exiting when bwrap returns. Two candidates are not
/// the shim's layout, and both stay counted.
fn discount_forwarder(evidence: &mut RunEvidence, init: u32, shim: &str) -> Option<SandboxInit> {
    discount_one(evidence, |p| p.ppid == init && p.executable == shim)
}

/// Why a sandbox did not start when a path the plan mounts over was removed in between.
fn vanished(gone: &Path) -> host::Unusable {
    host::Unusable {
        reason: format!(
            "{} was removed after the plan and before bwrap mounted over it",
            gone.display()
        ),
        remedy: "nothing ran; run the command again (the next plan takes the host as it is then)"
            .into(),
    }
}

/// Labels and start state on the evidence: the exit is the command's only when the shim marked
/// the start inside the sandbox.
pub fn attribute_exit(
    evidence: &mut RunEvidence,
    state: &StartState,
    expected_argc: usize,
    network: Network,
    mut wrapper: BwrapFacts,
    diagnosis: Option<&host::Unusable>,
) -> Result<()> {
    evidence.backend = ID.into();
    evidence.enforcement = ENFORCEMENT;
    evidence.capabilities = capabilities_for(network);
    let hint = if matches!(state, StartState::NotStarted) {
        host::setup_hint(diagnosis)
    } else {
        String::new()
    };
    let attribution = exec_shim::attribute_exit(evidence, state, expected_argc, "bwrap", &hint);
    if !attribution.started {
        // Nothing ran inside the sandbox: claim nothing about it.
        evidence.capabilities.sandboxed = false;
    }
    wrapper.start = Some(StartFacts::new(state, attribution));
    evidence.wrapper = Some(
        BackendFacts::new(&wrapper).map_err(|e| BackendError::Runtime {
            backend: ID.into(),
            message: e.to_string(),
        })?,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentdiff_backend_api::{
        CleanupOutcome, CleanupRecord, ExitInfo, FailureKind, ProcessRecord,
    };

    /// `check` refuses exactly what `prepare` refuses as invalid, and accepts what it accepts.
    /// The programs are ones every host has (the plan checks where they are, not what they do).
    #[test]
    fn check_refuses_what_prepare_refuses_as_invalid() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let spec = |extra: &[(&str, &str)]| {
            let mut options = agentdiff_backend_api::BackendOptions::default();
            options.push(crate::OPT_EXECUTABLE, "/bin/sh");
            options.push(crate::OPT_EXEC_SHIM, "/bin/sh");
            for (k, v) in extra {
                options.push(*k, *v);
            }
            agentdiff_conformance::testing::launch_spec(&root, ["true"])
                .capsule_dir(root.join(".agentdiff/runs/r1"))
                .options(options)
                .build()
        };
        let backend = BwrapBackend::new();
        let valid = spec(&[]);
        assert!(backend.check(&valid).is_ok());
        assert!(backend.prepare(&valid).is_ok());
        let writable_root = root.join("w");
        std::fs::create_dir(&writable_root).unwrap();
        let writable = writable_root.display().to_string();
        for bad in [
            vec![("network", "sideways")],
            vec![("image", "x")],
            vec![("writable", "relative/path")],
            vec![("writable", "/no/such/dir/here")],
            vec![("writable", writable.as_str()), ("network", "bogus")],
        ] {
            let s = spec(&bad);
            let (checked, prepared) = (backend.check(&s), backend.prepare(&s).map(|_| ()));
            let invalid = |r: &Result<()>| {
                matches!(
                    r,
                    Err(BackendError::InvalidRequest { .. } | BackendError::Option(_))
                )
            };
            assert!(invalid(&checked), "{bad:?}: check gave {checked:?}");
            assert!(invalid(&prepared), "{bad:?}: prepare gave {prepared:?}");
            assert_eq!(
                checked.unwrap_err().to_string(),
                prepared.unwrap_err().to_string()
            );
        }
    }

    fn ev(code: i32) -> RunEvidence {
        RunEvidence {
            exit: ExitInfo {
                code: Some(code),
                ..ExitInfo::default()
            },
            ..RunEvidence::default()
        }
    }

    fn process(pid: u32, ppid: u32, relation: ProcessRelation, exe: &str) -> ProcessRecord {
        ProcessRecord {
            identity: ProcessIdentity {
                pid,
                start_time_ticks: u64::from(pid),
                boot_id: "boot".into(),
            },
            ppid,
            relation,
            executable: exe.into(),
            first_seen_ms: 0,
            alive_after_root_exit: relation != ProcessRelation::Root,
            left_run_cgroup: None,
        }
    }

    /// A run of the outer bwrap (pid 20, child of the monitor 10) with these other processes;
    /// each of them was still alive and ended by cleanup.
    fn run_with(others: &[ProcessRecord]) -> RunEvidence {
        let mut e = ev(0);
        e.processes
            .push(process(20, 10, ProcessRelation::Root, "bwrap"));
        e.processes.extend(others.iter().cloned());
        e.cleanup.records = others
            .iter()
            .map(|p| CleanupRecord {
                identity: p.identity.clone(),
                executable: p.executable.clone(),
                outcome: CleanupOutcome::Terminated,
                detail: None,
            })
            .collect();
        e
    }

    fn leftovers(e: &RunEvidence) -> Vec<u32> {
        e.processes
            .iter()
            .filter(|p| p.alive_after_root_exit)
            .map(|p| p.identity.pid)
            .collect()
    }

    #[test]
    fn the_sandbox_init_seen_under_the_outer_bwrap_is_not_a_leftover() {
        let mut e = run_with(&[process(21, 20, ProcessRelation::Descendant, "bwrap")]);
        let init = discount_sandbox_init(&mut e, 20).expect("the init is recognised");
        assert_eq!(init.pid, 21);
        assert!(init.alive_after_bwrap_exit);
        assert_eq!(init.ended_by_cleanup, Some(CleanupOutcome::Terminated));
        assert!(leftovers(&e).is_empty());
        assert!(e.cleanup.records.is_empty());
    }

    /// The usual case for a short command: the outer bwrap exited before the first poll, so
    /// the init is first seen as agentdiff's own child.
    #[test]
    fn the_sandbox_init_first_seen_re_parented_to_agentdiff_is_not_a_leftover() {
        let mut e = run_with(&[process(21, 10, ProcessRelation::Reparented, "bwrap")]);
        let init = discount_sandbox_init(&mut e, 20).expect("the init is recognised");
        assert_eq!(init.pid, 21);
        assert!(leftovers(&e).is_empty());
        assert!(e.cleanup.records.is_empty());
    }

    #[test]
    fn processes_that_are_not_the_init_stay_counted() {
        // Inside the sandbox, a `bwrap` the command started has the init (or another command
        // process) as its parent; a re-parented process of another parent is not agentdiff's.
        for other in [
            process(22, 21, ProcessRelation::Descendant, "bwrap"),
            process(22, 21, ProcessRelation::Reparented, "bwrap"),
            process(22, 20, ProcessRelation::Descendant, "sh"),
            process(22, 10, ProcessRelation::Reparented, "sleep"),
        ] {
            let mut e = run_with(std::slice::from_ref(&other));
            assert_eq!(discount_sandbox_init(&mut e, 20), None, "{other:?}");
            assert_eq!(leftovers(&e), vec![22], "{other:?}");
            assert_eq!(e.cleanup.records.len(), 1, "{other:?}");
        }
    }

    #[test]
    fn two_init_candidates_are_not_bwraps_layout_and_both_stay_counted() {
        let mut e = run_with(&[
            process(21, 20, ProcessRelation::Descendant, "bwrap"),
            process(22, 10, ProcessRelation::Reparented, "bwrap"),
        ]);
        assert_eq!(discount_sandbox_init(&mut e, 20), None);
        assert_eq!(leftovers(&e), vec![21, 22]);
        assert_eq!(e.cleanup.records.len(), 2);
    }

    #[test]
    fn host_network_lowers_only_the_network_label() {
        let none = capabilities_for(Network::None);
        let host = capabilities_for(Network::Host);
        assert_eq!(none.network, Level::Enforced);
        assert!(none.network_enforcement && none.sandboxed);
        assert_eq!(host.network, Level::Uncontrolled);
        assert!(!host.network_enforcement);
        assert_eq!(host.filesystem_writes, Level::Enforced);
        assert_eq!(none.host_repository, Level::Observed);
        assert_eq!(none.resources, Level::Uncontrolled);
    }

    fn facts() -> BwrapFacts {
        BwrapFacts {
            kind: ID.into(),
            executable: "/usr/bin/bwrap".into(),
            exec_shim: "/usr/bin/agentdiff".into(),
            sandbox: SandboxClaim::AppliedByAgentdiff,
            controls: BTreeMap::new(),
            limits: Vec::new(),
            start: None,
            sandbox_init: None,
            egress_forwarder: None,
        }
    }

    #[test]
    fn exit_1_without_start_mark_is_bwraps_setup_failure() {
        let mut e = ev(1);
        attribute_exit(
            &mut e,
            &StartState::NotStarted,
            1,
            Network::None,
            facts(),
            None,
        )
        .unwrap();
        let Some(FailureKind::WrapperSetupFailed { message }) = &e.failure else {
            panic!("{:?}", e.failure)
        };
        assert!(message.contains("bwrap exited with code 1"), "{message}");
        assert!(message.contains("doctor"), "{message}");
        assert!(!e.capabilities.sandboxed);
        let w: BwrapFacts = e.wrapper.unwrap().decode().unwrap();
        assert_eq!(
            w.start.unwrap().exit_attribution,
            agentdiff_process::exec_shim::ExitBy::Wrapper
        );
    }

    #[test]
    fn exit_1_after_start_mark_is_the_commands() {
        let mut e = ev(1);
        attribute_exit(
            &mut e,
            &StartState::Started { argc: 1 },
            1,
            Network::None,
            facts(),
            None,
        )
        .unwrap();
        assert_eq!(e.failure, None);
        assert!(e.capabilities.sandboxed);
        let w = e.wrapper.unwrap();
        // The start facts sit beside the others in the one recorded object.
        assert_eq!(w["exit_attribution"], "command");
        assert_eq!(w["kind"], "bwrap");
        assert!(
            w.decode::<BwrapFacts>()
                .unwrap()
                .start
                .unwrap()
                .command_started
        );
    }
}
