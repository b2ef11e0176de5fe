//! [`ExternalBackend`]: a plugin executable as a [`RuntimeBackend`].
//!
//! What agentdiff checks itself rather than believing the plugin: the protocol version and the
//! id; that the launched process exists with the reported start time and descends from the
//! plugin process (else the run fails closed and nothing is signalled); that the labels on the
//! exit report do not exceed what was declared for the launch; that the plugin is alive until it
//! reports how the command ended (its death or silence fails the run, and the reported command's
//! tree, read from `/proc` before anything is signalled, is ended by verified identity); that an
//! `exited` report does not arrive while the launched process still runs (a forged report). The rest of the exit evidence is the plugin's word, and the run
//! evidence says so (`wrapper.external_backend`).

use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::session::{read_response, Plugin, PluginStdio, Session};
use super::verify::{verify_descendant, Parentage};
use super::ExternalError;
use agentdiff_backend_api::protocol::{
    options_to_wire, ExitReport, Request, Response, WireCommand, WireSpec,
};
use agentdiff_backend_api::{
    Availability, BackendError, BackendFacts, BoxFuture, Capabilities, CleanupOutcome,
    CleanupReport, Enforcement, LaunchContext, LaunchFacts, LaunchSpec, Level, PreparedLaunch,
    ProcessIdentity, Result, RunEvidence, RunningCommand, RuntimeBackend, StdioMode,
};
use agentdiff_process::cleanup_host_processes;

/// A plugin executable serving one backend id.
pub struct ExternalBackend {
    id: &'static str,
    plugin: Plugin,
    requires_scrub: bool,
    capabilities: Mutex<Vec<(String, Capabilities)>>,
    /// One plugin process answers this backend's queries in turn (a process start per query
    /// costs a Python plugin ~0.3 s on a loaded host); a launch always gets its own.
    queries: Arc<Mutex<Option<Session>>>,
}

impl ExternalBackend {
    /// The backend `id` served by the plugin at `plugin.path`. `id` is the registry's copy.
    pub fn new(id: &'static str, plugin: Plugin, requires_scrub: bool) -> Self {
        Self {
            id,
            plugin,
            requires_scrub,
            capabilities: Mutex::new(Vec::new()),
            queries: Arc::new(Mutex::new(None)),
        }
    }

    /// A handle for a blocking task, sharing the query process.
    fn handle(&self) -> Self {
        Self {
            queries: self.queries.clone(),
            ..Self::new(self.id, self.plugin.clone(), self.requires_scrub)
        }
    }

    fn query(&self, request: &Request, timeout: Duration) -> Result<Response, ExternalError> {
        self.query_for(|_| request.clone(), timeout)
            .map(|(answer, _)| answer)
    }

    /// A query whose request depends on the protocol version the plugin's handshake settled on;
    /// the answer with that version.
    fn query_for(
        &self,
        request: impl FnOnce(u32) -> Request,
        timeout: Duration,
    ) -> Result<(Response, u32), ExternalError> {
        let mut slot = self.queries.lock().map_err(|_| ExternalError::Protocol {
            id: self.id.into(),
            path: self.plugin.path.clone(),
            message: "an earlier query panicked".into(),
        })?;
        let mut session = match slot.take() {
            Some(s) => s,
            None => Session::start(&self.plugin, PluginStdio::Quiet)?,
        };
        let protocol = session.protocol();
        match session.request(&request(protocol), timeout) {
            // Only a well-formed answer keeps the process for the next query.
            Ok(answer) => {
                *slot = Some(session);
                Ok((answer, protocol))
            }
            Err(e) => {
                session.kill_with_descendants();
                Err(e)
            }
        }
    }

    /// The labels a prepared run may carry. `filtered` only from a version-2 plugin that was
    /// given the egress proxy's socket and said it routes the command through it (then the
    /// network is `filtered` whatever else it declared); any other `filtered` claim is refused.
    fn run_capabilities(
        &self,
        spec: &LaunchSpec,
        protocol: u32,
        egress_routed: bool,
    ) -> std::result::Result<Capabilities, String> {
        let mut capabilities = self.fetch_capabilities(&spec.options);
        let given = protocol >= 2 && spec.egress_proxy.is_some();
        if egress_routed && !given {
            return Err(format!(
                "it says it routes the command through the egress proxy, but it was given none \
                 (protocol {protocol}{})",
                if spec.egress_proxy.is_none() {
                    ", and the run has no proxy"
                } else {
                    ""
                }
            ));
        }
        if egress_routed {
            capabilities.network = Level::Filtered;
            capabilities.network_enforcement = true;
        } else if capabilities.network == Level::Filtered {
            return Err(FILTERED_REFUSED.to_string());
        }
        Ok(capabilities)
    }

    fn fetch_capabilities(&self, options: &agentdiff_backend_api::BackendOptions) -> Capabilities {
        let key = serde_json::to_string(&options_to_wire(options)).unwrap_or_default();
        if let Ok(cache) = self.capabilities.lock() {
            if let Some((_, c)) = cache.iter().find(|(k, _)| *k == key) {
                return c.clone();
            }
        }
        let request = Request::Capabilities {
            options: options_to_wire(options),
        };
        // A plugin that cannot say what it controls controls nothing, as far as labels go.
        let caps = match self.query(&request, self.plugin.timeouts.request) {
            Ok(Response::Capabilities { capabilities }) => capabilities,
            _ => Capabilities::default(),
        };
        if let Ok(mut cache) = self.capabilities.lock() {
            cache.push((key, caps.clone()));
        }
        caps
    }

    fn error(&self, e: ExternalError) -> BackendError {
        BackendError::Unavailable {
            backend: self.id.into(),
            reason: e.to_string(),
            remedy: format!(
                "fix or remove {} (`agentdiff doctor` lists external backends)",
                self.plugin.path.display()
            ),
        }
    }

    /// A plugin's `error` response as the matching [`BackendError`].
    fn plugin_error(
        &self,
        kind: agentdiff_backend_api::protocol::ErrorKind,
        message: String,
        remedy: Option<String>,
    ) -> BackendError {
        use agentdiff_backend_api::protocol::ErrorKind as K;
        let backend = self.id.to_string();
        match kind {
            K::Unavailable => BackendError::Unavailable {
                backend,
                reason: message,
                remedy: remedy.unwrap_or_else(|| "see the backend's documentation".into()),
            },
            K::InvalidRequest => BackendError::InvalidRequest { backend, message },
            K::Launch => BackendError::Launch { backend, message },
            K::Runtime | K::Protocol => BackendError::Runtime { backend, message },
        }
    }
}

/// What `prepare` decided, carried to `launch`.
#[derive(Debug, Clone)]
struct Plan {
    command: WireCommand,
    capabilities: Capabilities,
    /// The version the `prepare` exchange settled on.
    protocol: u32,
    /// A version-2 plugin given the proxy said it routes the command through it.
    egress_routed: bool,
}

/// The spec as a plugin speaking `version` receives it: the egress proxy only in version 2.
fn wire_for(mut wire: WireSpec, version: u32) -> WireSpec {
    if version < 2 {
        wire.egress_proxy = None;
    }
    wire
}

/// Where an external run's evidence came from, stored as the run's `wrapper` facts; read back
/// with `BackendFacts::decode::<ExternalFacts>()`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExternalFacts {
    pub external_backend: ExternalOrigin,
}

/// The plugin a run went through, and how much of its report agentdiff checked.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExternalOrigin {
    pub path: String,
    pub protocol: u32,
    /// Whether the launched process descended from the plugin when agentdiff looked.
    pub launched_process: Parentage,
    /// Everything in the exit report other than what agentdiff checked is the plugin's word.
    pub evidence_source: String,
    /// The plugin's own facts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facts: Option<serde_json::Value>,
}

impl RuntimeBackend for ExternalBackend {
    fn id(&self) -> &'static str {
        self.id
    }

    fn capabilities(&self, options: &agentdiff_backend_api::BackendOptions) -> Capabilities {
        self.fetch_capabilities(options)
    }

    async fn availability(&self, options: &agentdiff_backend_api::BackendOptions) -> Availability {
        let this = self.handle();
        let request = Request::Availability {
            options: options_to_wire(options),
        };
        let timeout = self.plugin.timeouts.availability;
        let answer = tokio::task::spawn_blocking(move || this.query(&request, timeout)).await;
        let unavailable = |reason: String| Availability::Unavailable {
            reason,
            remedy: format!("fix or remove {}", self.plugin.path.display()),
        };
        match answer {
            Ok(Ok(Response::Availability { availability })) => availability,
            Ok(Ok(Response::Error { message, .. })) => unavailable(message),
            Ok(Ok(other)) => unavailable(
                Session::describe_unexpected(&self.plugin, "availability", &other).to_string(),
            ),
            Ok(Err(e)) => unavailable(e.to_string()),
            Err(e) => unavailable(format!("the availability query did not complete: {e}")),
        }
    }

    fn requires_scrubbed_environment(&self) -> bool {
        self.requires_scrub
    }

    fn prepare(&self, spec: &LaunchSpec) -> Result<PreparedLaunch> {
        let wire = WireSpec::from_spec(spec).map_err(|e| BackendError::InvalidRequest {
            backend: self.id.into(),
            message: e.to_string(),
        })?;
        let (answer, protocol) = self
            .query_for(
                |version| Request::Prepare {
                    spec: wire_for(wire, version),
                },
                self.plugin.timeouts.request,
            )
            .map_err(|e| self.error(e))?;
        let (command, enforcement, wrapped, runtime_config, egress_routed) = match answer {
            Response::Prepared {
                command,
                enforcement,
                wrapped,
                runtime_config,
                egress_routed,
            } => (command, enforcement, wrapped, runtime_config, egress_routed),
            Response::Error {
                kind,
                message,
                remedy,
            } => return Err(self.plugin_error(kind, message, remedy)),
            other => {
                return Err(self.error(Session::describe_unexpected(
                    &self.plugin,
                    "prepared",
                    &other,
                )))
            }
        };
        let launch_command = command
            .to_command()
            .map_err(|e| self.error(session_wire(&self.plugin, e)))?;
        if enforcement == Enforcement::BwrapSandbox || launch_command.program.is_empty() {
            return Err(self.error(ExternalError::Protocol {
                id: self.id.into(),
                path: self.plugin.path.clone(),
                message: format!(
                    "its prepared launch is not acceptable (program {:?}, enforcement `{enforcement}`: \
                     an external backend may claim none, external_sandbox_requested or \
                     container_requested)",
                    command.program
                ),
            }));
        }
        let capabilities = self
            .run_capabilities(spec, protocol, egress_routed)
            .map_err(|message| {
                self.error(ExternalError::Protocol {
                    id: self.id.into(),
                    path: self.plugin.path.clone(),
                    message,
                })
            })?;
        let plan = Plan {
            command: command.clone(),
            capabilities,
            protocol,
            egress_routed,
        };
        let mut prepared = PreparedLaunch::new(self.id, spec, launch_command, enforcement, plan)
            .with_runtime_config(runtime_config);
        if wrapped {
            prepared = prepared.wrapped();
        }
        Ok(prepared)
    }

    async fn launch(
        &self,
        prepared: PreparedLaunch,
        ctx: LaunchContext,
    ) -> Result<Box<dyn RunningCommand>> {
        let plan = prepared.plan_for::<Plan>(self.id)?.clone();
        let launch_err = |message: String| BackendError::Launch {
            backend: self.id.into(),
            message,
        };
        let wire_spec =
            WireSpec::from_spec(prepared.spec()).map_err(|e| launch_err(e.to_string()))?;
        // The command as recorded (the transaction may have moved its working directory).
        let mut command = plan.command.clone();
        command.cwd = prepared
            .cwd()
            .to_str()
            .map(str::to_string)
            .ok_or_else(|| launch_err("the working directory is not UTF-8".into()))?;
        let stdio = launch_stdio(&ctx.stdio).map_err(|e| launch_err(e.to_string()))?;
        let plugin = self.plugin.clone();
        let request = Request::Launch {
            spec: wire_spec,
            command,
        };
        let routed = plan.egress_routed;
        let started =
            tokio::task::spawn_blocking(move || start_launch(&plugin, stdio, request, routed))
                .await
                .map_err(|e| launch_err(format!("the launch did not complete: {e}")))?;
        let (session, identity, parentage) = match started {
            Ok(s) => s,
            Err(Failure::Plugin(kind, message, remedy)) => {
                return Err(self.plugin_error(kind, message, remedy))
            }
            Err(Failure::External(e)) => return Err(launch_err(e.to_string())),
            Err(Failure::AfterRequest(e, started)) => {
                let grace = prepared.spec().grace;
                let report = cleanup_host_processes(&started, grace).await;
                let count = |wanted: &[CleanupOutcome]| {
                    let n = report
                        .records
                        .iter()
                        .filter(|r| wanted.contains(&r.outcome));
                    n.count()
                };
                let ended = count(&[CleanupOutcome::Terminated, CleanupOutcome::Killed]);
                let escaped = count(&[CleanupOutcome::Escaped, CleanupOutcome::AccessDenied]);
                return Err(BackendError::Runtime {
                    backend: self.id.into(),
                    message: format!(
                        "{e}, after the launch request and before a verified report of the launched \
                         process: the command may have run ({ended} process(es) it had started \
                         were still running and were ended, {escaped} could not be stopped)"
                    ),
                });
            }
        };
        Ok(Box::new(ExternalRun {
            id: self.id,
            session,
            identity,
            parentage,
            plan,
            prepared,
            interrupt: ctx.interrupt,
        }))
    }

    async fn cleanup_run(
        &self,
        run_id: &str,
        ids: &[ProcessIdentity],
        grace: Duration,
    ) -> CleanupReport {
        let this = self.handle();
        let request = Request::Cleanup {
            run_id: run_id.to_string(),
            identities: ids.to_vec(),
            grace_ms: grace.as_millis() as u64,
        };
        let timeout = self.plugin.timeouts.cleanup + grace * (ids.len() as u32).max(1);
        let answer = tokio::task::spawn_blocking(move || this.query(&request, timeout)).await;
        let error = match answer {
            Ok(Ok(Response::CleanupReport { report })) => return report,
            Ok(Ok(Response::Error { message, .. })) => message,
            Ok(Ok(other)) => {
                Session::describe_unexpected(&self.plugin, "cleanup_report", &other).to_string()
            }
            Ok(Err(e)) => e.to_string(),
            Err(e) => format!("the cleanup request did not complete: {e}"),
        };
        // The plugin could not clean up: the identities are still ended, each verified first.
        let mut report = cleanup_host_processes(ids, grace).await;
        report
            .errors
            .insert(0, format!("external backend cleanup failed: {error}"));
        report
    }
}

enum Failure {
    Plugin(
        agentdiff_backend_api::protocol::ErrorKind,
        String,
        Option<String>,
    ),
    External(ExternalError),
    /// The plugin failed after the `launch` request and before a verified `launched` (it died,
    /// its answer was garbled — the command may have done either — or it named a process that is
    /// not its descendant): the command may have run.
    /// Holds the plugin's descendants as they were before it was killed.
    AfterRequest(ExternalError, Vec<ProcessIdentity>),
}

impl From<ExternalError> for Failure {
    fn from(e: ExternalError) -> Self {
        Failure::External(e)
    }
}

fn launch_stdio(mode: &StdioMode) -> std::io::Result<PluginStdio> {
    use std::os::fd::{AsFd, OwnedFd};
    Ok(PluginStdio::Given(match mode {
        StdioMode::Inherit => [None, None, None],
        StdioMode::StdoutToStderr => [
            None,
            Some(std::io::stderr().as_fd().try_clone_to_owned()?),
            None,
        ],
        StdioMode::Files {
            stdin,
            stdout,
            stderr,
        } => [
            Some(OwnedFd::from(match stdin {
                Some(p) => std::fs::File::open(p)?,
                None => std::fs::File::open("/dev/null")?,
            })),
            Some(OwnedFd::from(std::fs::File::create(stdout)?)),
            Some(OwnedFd::from(std::fs::File::create(stderr)?)),
        ],
    }))
}

/// Start the plugin, ask it to launch, verify the process it reports, acknowledge.
/// `routed`: the prepared run routes the command through the egress proxy, which needs a
/// version-2 exchange here too.
fn start_launch(
    plugin: &Plugin,
    stdio: PluginStdio,
    request: Request,
    routed: bool,
) -> Result<(Session, ProcessIdentity, Parentage), Failure> {
    let mut session = Session::start(plugin, stdio)?;
    let version = session.protocol();
    if routed && version < 2 {
        let e = session.violation(format!(
            "it prepared a run routed through the egress proxy, then answered protocol {version} \
             for the launch; nothing was started"
        ));
        session.kill();
        return Err(e.into());
    }
    let request = match request {
        Request::Launch { spec, command } => Request::Launch {
            spec: wire_for(spec, version),
            command,
        },
        other => other,
    };
    let answer = session.request(&request, plugin.timeouts.launch);
    let (pid, start_time_ticks) = match answer {
        Ok(Response::Launched {
            pid,
            start_time_ticks,
        }) => (pid, start_time_ticks),
        Ok(Response::Error {
            kind,
            message,
            remedy,
        }) => {
            session.finish();
            return Err(Failure::Plugin(kind, message, remedy));
        }
        Ok(other) => {
            let e = session.unexpected("launched", &other);
            return Err(lost_after_request(&mut session, e));
        }
        Err(e) => return Err(lost_after_request(&mut session, e)),
    };
    match verify_descendant(pid, start_time_ticks, session.pid()) {
        Ok(parentage) => {
            let identity = ProcessIdentity {
                pid,
                start_time_ticks,
                boot_id: agentdiff_process::boot_id().unwrap_or_default(),
            };
            if let Err(e) = session.acknowledge() {
                session.kill();
                return Err(e.into());
            }
            Ok((session, identity, parentage))
        }
        Err(reason) => {
            // The plugin may well have started the command and then named another process: the
            // launch is lost, not refused, so the after-state is still captured and classified.
            // Never signal the process the plugin merely named; only the plugin's own
            // descendants, read before it is killed, are ended.
            let e = session.violation(format!(
                "it reported pid {pid} as the launched command, but {reason}; the run fails closed \
                 and pid {pid} was not signalled"
            ));
            Err(lost_after_request(&mut session, e))
        }
    }
}

/// The plugin failed after the `launch` request: note its descendants (what it may have started)
/// before killing it, since they move to another parent once it is gone.
fn lost_after_request(session: &mut Session, e: ExternalError) -> Failure {
    let plugin = agentdiff_process::read_identity(session.pid()).ok();
    let tree = plugin
        .as_ref()
        .map(agentdiff_process::process_tree)
        .unwrap_or_default();
    session.kill();
    let started = tree
        .into_iter()
        .filter(|p| p.pid != session.pid())
        .collect();
    Failure::AfterRequest(e, started)
}

/// A command launched by a plugin.
struct ExternalRun {
    id: &'static str,
    session: Session,
    identity: ProcessIdentity,
    parentage: Parentage,
    plan: Plan,
    prepared: PreparedLaunch,
    interrupt: tokio::sync::watch::Receiver<Option<i32>>,
}

impl RunningCommand for ExternalRun {
    fn pid(&self) -> Option<u32> {
        Some(self.identity.pid)
    }

    fn launch_facts(&self) -> LaunchFacts {
        LaunchFacts {
            pid: Some(self.identity.pid),
            root: Some(self.identity.clone()),
            ..LaunchFacts::default()
        }
    }

    fn wait(mut self: Box<Self>) -> BoxFuture<'static, Result<RunEvidence>> {
        Box::pin(async move {
            let spec = self.prepared.spec();
            let deadline = spec
                .timeout
                .map(|t| t + spec.grace + self.session.plugin.timeouts.exit_margin);
            let answer = self.next_response(deadline).await;
            let report = match answer {
                Ok(Response::Exited { report }) => report,
                Ok(Response::Error { message, .. }) => {
                    return Err(self
                        .abandon(format!("it reported an error: {message}"))
                        .await)
                }
                Ok(other) => {
                    let e = self.session.unexpected("exited", &other);
                    return Err(self.abandon(e.to_string()).await);
                }
                Err(e) => return Err(self.abandon(e.to_string()).await),
            };
            // The plugin reports an exit only once the command ended; a report while the launched
            // process still runs is false (forged by a process that reached the plugin's pipe, or the
            // plugin's mistake), and is not believed.
            if still_running(&self.identity) {
                return Err(self
                    .abandon(format!(
                    "it reported the command ended, but the launched process {} is still running",
                    self.identity.pid
                ))
                    .await);
            }
            if let Some(claim) = overclaim(
                &report,
                &self.plan.capabilities,
                self.prepared.enforcement(),
            ) {
                return Err(self
                    .abandon(format!(
                        "its exit report claims {claim}, more than it declared for this launch"
                    ))
                    .await);
            }
            let Self {
                session,
                parentage,
                prepared,
                plan,
                id,
                ..
            } = *self;
            let path = session.plugin.path.display().to_string();
            let _ = tokio::task::spawn_blocking(move || session.finish()).await;
            Ok(evidence(id, &prepared, plan, *report, path, parentage))
        })
    }
}

impl ExternalRun {
    /// The next response, forwarding agentdiff's interruption to the plugin meanwhile.
    async fn next_response(
        &mut self,
        timeout: Option<Duration>,
    ) -> Result<Response, ExternalError> {
        let Some((mut reader, child)) = self.session.split_reader() else {
            return Err(self.session.violation("no response channel".into()));
        };
        let mut read = tokio::task::spawn_blocking(move || {
            let r = read_response(&mut reader, &child, timeout);
            (reader, r)
        });
        let mut listening = true;
        loop {
            tokio::select! {
                done = &mut read => {
                    return match done {
                        Ok((_reader, r)) => r.map_err(|e| self.session.wire(e)),
                        Err(e) => Err(self.session.violation(format!("the reader stopped: {e}"))),
                    };
                }
                changed = self.interrupt.changed(), if listening => {
                    if changed.is_err() {
                        listening = false;
                        continue;
                    }
                    let signal = *self.interrupt.borrow();
                    if let Some(signal) = signal {
                        listening = false;
                        // A plugin that cannot be told is ended with its command by `abandon`.
                        let _ = self.session.send(&Request::Interrupt { signal });
                    }
                }
            }
        }
    }

    /// The plugin failed while the command ran: end the plugin and the command it launched
    /// (identity-checked), and say so.
    async fn abandon(&mut self, what: String) -> BackendError {
        // The tree is read before anything dies: the command's children re-parent away once the
        // command (or the plugin, their ancestor) is gone.
        let mut tree = agentdiff_process::process_tree(&self.identity);
        if tree.is_empty() {
            tree.push(self.identity.clone());
        }
        self.session.kill();
        let grace = self.prepared.spec().grace;
        let report = cleanup_host_processes(&tree, grace).await;
        let outcome = report
            .records
            .iter()
            .find(|r| r.identity.pid == self.identity.pid)
            .map(|r| format!("{:?}", r.outcome).to_lowercase())
            .unwrap_or_else(|| "not found".into());
        BackendError::Runtime {
            backend: self.id.into(),
            message: format!(
                "external backend {} failed before reporting how the command ended: {what}; the \
                 run fails closed (launched process {}: {outcome}; {} of its descendants found \
                 and ended; one that had left the tree may remain, see `agentdiff cleanup`)",
                self.session.plugin.path.display(),
                self.identity.pid,
                tree.len().saturating_sub(1)
            ),
        }
    }
}

/// Whether `id` is still a running process (not an unreaped zombie).
fn still_running(id: &ProcessIdentity) -> bool {
    matches!(
        agentdiff_host::process_identity::still_matches(id),
        Ok(true)
    ) && agentdiff_process::read_stat(id.pid).is_ok_and(|s| !s.is_zombie())
}

/// A malformed part of a plugin's answer as its protocol error.
fn session_wire(plugin: &Plugin, e: agentdiff_backend_api::protocol::WireError) -> ExternalError {
    ExternalError::Protocol {
        id: plugin.id.clone(),
        path: plugin.path.clone(),
        message: e.to_string(),
    }
}

/// Why a plugin's `filtered` network label is refused: the protocol does not hand a plugin
/// agentdiff's egress proxy, so no external backend can route a command through it.
const FILTERED_REFUSED: &str = "it labels its network `filtered`, which only agentdiff's own \
     egress proxy can make true: an external backend may claim it only in a protocol-2 exchange \
     where it was given the proxy's socket and said in `prepared` that it routes the command \
     through it (`egress_routed`); otherwise it may claim at most `requested` for the network";

/// The first label in `report` above what was declared, if any.
fn overclaim(
    report: &ExitReport,
    declared: &Capabilities,
    enforcement: Enforcement,
) -> Option<String> {
    if let Some(e) = report.enforcement {
        if e != enforcement {
            return Some(format!("enforcement `{e}` (declared `{enforcement}`)"));
        }
    }
    let caps = report.capabilities.as_ref()?;
    if caps.network == Level::Filtered && declared.network != Level::Filtered {
        return Some(FILTERED_REFUSED.into());
    }
    for b in agentdiff_backend_api::Boundary::ALL {
        if caps.level(b) > declared.level(b) {
            return Some(format!(
                "{} `{}` (declared `{}`)",
                b.as_str(),
                caps.level(b).as_str(),
                declared.level(b).as_str()
            ));
        }
    }
    if (caps.sandboxed && !declared.sandboxed)
        || (caps.network_enforcement && !declared.network_enforcement)
        || caps.workspace != declared.workspace
    {
        return Some("sandboxing or workspace labels it did not declare".into());
    }
    None
}

fn evidence(
    id: &'static str,
    prepared: &PreparedLaunch,
    plan: Plan,
    report: ExitReport,
    path: String,
    parentage: Parentage,
) -> RunEvidence {
    let spec = prepared.spec();
    let origin = ExternalFacts {
        external_backend: ExternalOrigin {
            path,
            protocol: plan.protocol,
            launched_process: parentage,
            evidence_source: "exit, processes, cleanup, ports and execs as reported by the plugin"
                .to_string(),
            facts: report.facts,
        },
    };
    RunEvidence {
        stdio_relayed: Vec::new(),
        backend: id.to_string(),
        enforcement: prepared.enforcement(),
        capabilities: report.capabilities.unwrap_or(plan.capabilities),
        exit: report.exit,
        failure: report.failure,
        tracking: report.tracking,
        processes: report.processes,
        cleanup: report.cleanup,
        ports: report
            .ports
            .unwrap_or_else(agentdiff_process::ports::off_evidence),
        wrapper_argv: prepared
            .wrapper_argv()
            .map(|v| v.iter().map(|s| s.to_string_lossy().into_owned()).collect()),
        wrapper: BackendFacts::new(&origin).ok(),
        runtime_config: prepared.runtime_config().clone(),
        observation_root: spec.workdir.display().to_string(),
        environment: Some(agentdiff_backend_api::environment::evidence_for_launch(
            prepared.env(),
            spec.env_plan.mode,
            &spec.env_plan.dropped,
        )),
        execs: report.execs.unwrap_or_default(),
        containers: None,
        warnings: report.warnings,
    }
}

impl Session {
    /// An unexpected answer as an error of this plugin, without a session at hand.
    pub fn describe_unexpected(plugin: &Plugin, expected: &str, got: &Response) -> ExternalError {
        let kind = serde_json::to_value(got)
            .ok()
            .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_string))
            .unwrap_or_else(|| "?".into());
        ExternalError::Protocol {
            id: plugin.id.clone(),
            path: plugin.path.clone(),
            message: format!("it answered `{kind}` where `{expected}` was due"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_reports_may_not_raise_labels() {
        let declared = Capabilities {
            processes: Level::Observed,
            ..Capabilities::default()
        };
        let mut report = ExitReport::default();
        assert_eq!(overclaim(&report, &declared, Enforcement::None), None);
        report.capabilities = Some(Capabilities {
            filesystem_writes: Level::Enforced,
            ..declared.clone()
        });
        let claim = overclaim(&report, &declared, Enforcement::None).unwrap();
        assert!(claim.contains("filesystem_writes `enforced`"), "{claim}");
        report.capabilities = Some(declared.clone());
        report.enforcement = Some(Enforcement::ContainerRequested);
        assert!(overclaim(&report, &declared, Enforcement::None).is_some());
        report.enforcement = None;
        report.capabilities = Some(Capabilities {
            sandboxed: true,
            ..declared.clone()
        });
        assert!(overclaim(&report, &declared, Enforcement::None).is_some());
    }

    #[test]
    fn a_filtered_network_is_refused_even_below_what_was_declared() {
        let declared = Capabilities {
            network: Level::Enforced,
            ..Capabilities::default()
        };
        let report = ExitReport {
            capabilities: Some(Capabilities {
                network: Level::Filtered,
                ..declared.clone()
            }),
            ..ExitReport::default()
        };
        let claim = overclaim(&report, &declared, Enforcement::None).unwrap();
        assert!(claim.contains("`filtered`"), "{claim}");
    }
}
