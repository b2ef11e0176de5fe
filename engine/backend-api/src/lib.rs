//! The runtime-backend contract: how a command is launched, observed and cleaned up.
//!
//! A backend turns a [`LaunchSpec`] into a [`PreparedLaunch`] (pure, so argv boundaries and labels
//! are testable without running anything), launches it, and reports [`RunEvidence`] whose labels never
//! claim more than the backend verified (see [`Level`]).

mod capabilities;
pub mod citation;
pub mod containers;
pub mod descriptor;
pub mod egress;
pub mod environment;
mod evidence;
pub mod exec;
pub mod protected;
pub mod protocol;
pub mod recommend;
pub mod serve;
mod spec;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub use capabilities::{Availability, Boundary, Capabilities, Enforcement, Level, WorkspaceMode};
pub use descriptor::{
    validate_options, BackendDescriptor, DiagnosticFact, Diagnostics, DiagnosticsFuture,
    DiagnosticsHook, FailClosedSpec, OptionError, OptionKind, OptionSpec,
};
pub use evidence::{
    BackendFacts, CleanupMechanism, CleanupOutcome, CleanupRecord, CleanupReport,
    EnvironmentEvidence, ExitInfo, FactsError, FailureKind, InfrastructurePort, PortEvidence,
    PortMode, PortRecord, ProcessRecord, ProcessRelation, RunEvidence, Tracking,
};
pub use spec::{
    BackendOptions, EnvironmentPlan, LaunchCommand, LaunchContext, LaunchSpec, PreparedLaunch,
    ReapGate, ReapGateOpener, StdioMode,
};

pub use agentdiff_host::process_identity::ProcessIdentity;

/// A boxed, sendable future: what the object-safe halves of the contract
/// ([`RunningCommand`], [`DynRuntimeBackend`]) return, because a trait used as `dyn` cannot return
/// `impl Future`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Errors a backend reports. Each names what is wrong and, where there is one, what to do.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The backend cannot run here (missing wrapper or engine, prerequisite absent). Never a
    /// reason to fall back to a weaker backend.
    #[error("runtime backend `{backend}` is unavailable: {reason}; {remedy}")]
    Unavailable {
        backend: String,
        reason: String,
        remedy: String,
    },
    /// The launch request is invalid for this backend (bad option, bad path).
    #[error("invalid request for runtime backend `{backend}`: {message}")]
    InvalidRequest { backend: String, message: String },
    /// An option does not fit the backend's declaration.
    #[error(transparent)]
    Option(#[from] OptionError),
    /// Starting the process failed.
    #[error("could not launch the command through `{backend}`: {message}")]
    Launch { backend: String, message: String },
    /// Observing or waiting for the running command failed.
    #[error("runtime backend `{backend}` failed while the command ran: {message}")]
    Runtime { backend: String, message: String },
}

pub type Result<T, E = BackendError> = std::result::Result<T, E>;

/// What is recorded the moment the command started (the `launched` event), so that
/// `agentdiff cleanup` can still find the run's processes if agentdiff itself is killed before the
/// evidence is written.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LaunchFacts {
    /// Host pid of the launched process.
    #[serde(default)]
    pub pid: Option<u32>,
    /// Verified identity of the launched process.
    #[serde(default)]
    pub root: Option<ProcessIdentity>,
    /// The run's tracking cgroup, when the command was placed in one.
    #[serde(default)]
    pub cgroup: Option<String>,
    /// Identity of the agentdiff process supervising the run, set by the transaction: tells a
    /// run in progress from one whose monitor died.
    #[serde(default)]
    pub monitor: Option<ProcessIdentity>,
    /// What the backend needs at cleanup to reach resources it created away from this host's
    /// process table (a remote engine's address). Opaque to the engine and typed by the backend
    /// that wrote it; handed back by [`RuntimeBackend::cleanup_recorded_run`] only from an
    /// authenticated capsule (a MAC'd `launched` event or a sealed run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<serde_json::Value>,
}

/// A launched command. `wait` resolves when the command has ended (normally, by timeout or by
/// interruption) and its leftovers have been cleaned up, and returns the evidence.
///
/// Always used boxed ([`RuntimeBackend::launch`] returns `Box<dyn RunningCommand>`), so its two
/// asynchronous methods return a [`BoxFuture`]: `Box::pin(async move { … })`. Most backends return
/// the supervisor's command (`agentdiff_process::supervisor`) and never implement this.
pub trait RunningCommand: Send {
    /// Host pid of the launched process (the wrapper's pid for wrapping backends).
    fn pid(&self) -> Option<u32>;
    /// Facts recorded the moment the command started (see [`LaunchFacts`]). By default only the
    /// pid.
    fn launch_facts(&self) -> LaunchFacts {
        LaunchFacts {
            pid: self.pid(),
            ..LaunchFacts::default()
        }
    }
    /// Let a command launched with [`LaunchContext::hold_start`] start: called once, after the
    /// transaction recorded the before-state, before `wait`; the deadline counts from here. A
    /// launch that was not held has started already, so by default this does nothing.
    fn release(&mut self) -> Result<()> {
        Ok(())
    }
    /// End a held launch that will not be released (the transaction stopped before the start):
    /// nothing of the command has run and nothing may; returns once the wrapper is gone. Only
    /// held launches are aborted; the default waits for the end.
    fn abort(self: Box<Self>) -> BoxFuture<'static, ()> {
        let wait = self.wait();
        Box::pin(async move {
            let _ = wait.await;
        })
    }
    /// Wait for the end of the command and collect its evidence.
    fn wait(self: Box<Self>) -> BoxFuture<'static, Result<RunEvidence>>;
}

/// A pluggable runtime backend. Implementations must be honest: [`RuntimeBackend::capabilities`]
/// starts from [`Capabilities::default`] (everything `uncontrolled`) and raises a boundary only to
/// the level the backend really reaches with these options.
///
/// Everything else the CLI needs (options, fail-closed cases, diagnostics) is declared in the
/// backend's [`BackendDescriptor`].
///
/// The asynchronous methods are written `async fn` in an implementation (no macro); their futures
/// must be `Send`, which the compiler checks there. The engine holds a backend as
/// `Box<dyn DynRuntimeBackend>`, which every implementation gets for free.
pub trait RuntimeBackend: Send + Sync {
    /// Stable identifier used by `--runtime` (lowercase ASCII, digits, `-`).
    fn id(&self) -> &'static str;
    /// Declared capabilities per boundary, for a run with these options.
    fn capabilities(&self, options: &BackendOptions) -> Capabilities;
    /// Whether the backend can run here with these options, with a remedy when it cannot. Must
    /// not answer `Ready` when `prepare` would refuse for a missing component.
    fn availability(&self, options: &BackendOptions) -> impl Future<Output = Availability> + Send;
    /// Whether the command always gets the scrubbed environment (allowlist, `--pass-env` names,
    /// credential-like and runtime-injection variables dropped), whatever `--scrub-env` and the
    /// policy's `environment.mode` say. A sandboxing backend scrubs by default so that an
    /// exported credential never reaches a command it confines.
    fn requires_scrubbed_environment(&self) -> bool {
        false
    }
    /// Whether `launch` honours [`LaunchContext::hold_start`]: it starts the backend's own setup
    /// (a sandbox's namespaces and mounts) at once, and nothing of the command before
    /// [`RunningCommand::release`]; a failure before the release means the command did not run.
    /// The transaction then launches before its before-capture, so that the setup overlaps it.
    fn holds_start(&self) -> bool {
        false
    }
    /// Pure transform from the request to what will be executed: no process started, no file
    /// written. The backend's own plan travels inside the [`PreparedLaunch`].
    fn prepare(&self, spec: &LaunchSpec) -> Result<PreparedLaunch>;
    /// Whether [`RuntimeBackend::prepare`] would refuse `spec` as invalid (`InvalidRequest`, a bad
    /// option): every such error `prepare` gives, without building what only the launch needs.
    /// The transaction asks it before anything is written (`transaction::check_request`); a
    /// backend whose `prepare` does work past its checks (a per-run secret, a probe of
    /// agentdiff's own namespaces) answers it cheaper. Other failures may be left to `prepare`.
    fn check(&self, spec: &LaunchSpec) -> Result<()> {
        self.prepare(spec).map(|_| ())
    }
    /// Start exactly what `prepare` made.
    fn launch(
        &self,
        prepared: PreparedLaunch,
        ctx: LaunchContext,
    ) -> impl Future<Output = Result<Box<dyn RunningCommand>>> + Send;
    /// Clean up everything a recorded run left behind (`agentdiff cleanup RUN`, and the
    /// conformance suite): its processes, each identity verified before it is signalled (a
    /// mismatch is refused, never signalled); a backend that creates other resources (containers)
    /// removes those too, found by the run id.
    fn cleanup_run(
        &self,
        run_id: &str,
        ids: &[ProcessIdentity],
        grace: Duration,
    ) -> impl Future<Output = CleanupReport> + Send;
    /// [`RuntimeBackend::cleanup_run`] with what the backend itself recorded at launch
    /// ([`LaunchFacts::resources`]), when the capsule authenticates; `agentdiff cleanup` calls
    /// this. A backend whose resources are found from this host alone keeps the default.
    fn cleanup_recorded_run(
        &self,
        run_id: &str,
        ids: &[ProcessIdentity],
        grace: Duration,
        resources: Option<&serde_json::Value>,
    ) -> impl Future<Output = CleanupReport> + Send {
        let _ = resources;
        self.cleanup_run(run_id, ids, grace)
    }
    /// [`RuntimeBackend::cleanup_recorded_run`] knowing where the run lived ([`RunPlace`]):
    /// `agentdiff cleanup` calls this. A backend whose resources are named after the project (so
    /// that two projects using the same run id never share one) or lie next to the run's private
    /// workspace finds them from here; others keep the default.
    fn cleanup_run_at(
        &self,
        place: RunPlace<'_>,
        run_id: &str,
        ids: &[ProcessIdentity],
        grace: Duration,
        resources: Option<&serde_json::Value>,
    ) -> impl Future<Output = CleanupReport> + Send {
        let _ = place;
        self.cleanup_recorded_run(run_id, ids, grace, resources)
    }
}

/// The object-safe form of [`RuntimeBackend`], implemented for every backend: what the registry,
/// the transaction and the conformance suite hold (`Box<dyn DynRuntimeBackend>`). Each method
/// forwards to the backend's own, boxing the future. Implement [`RuntimeBackend`], never this.
pub trait DynRuntimeBackend: Send + Sync {
    /// [`RuntimeBackend::id`].
    fn id(&self) -> &'static str;
    /// [`RuntimeBackend::capabilities`].
    fn capabilities(&self, options: &BackendOptions) -> Capabilities;
    /// [`RuntimeBackend::availability`].
    fn availability<'a>(&'a self, options: &'a BackendOptions) -> BoxFuture<'a, Availability>;
    /// [`RuntimeBackend::requires_scrubbed_environment`].
    fn requires_scrubbed_environment(&self) -> bool;
    /// [`RuntimeBackend::holds_start`].
    fn holds_start(&self) -> bool;
    /// [`RuntimeBackend::prepare`].
    fn prepare(&self, spec: &LaunchSpec) -> Result<PreparedLaunch>;
    /// [`RuntimeBackend::check`].
    fn check(&self, spec: &LaunchSpec) -> Result<()>;
    /// [`RuntimeBackend::launch`].
    fn launch(
        &self,
        prepared: PreparedLaunch,
        ctx: LaunchContext,
    ) -> BoxFuture<'_, Result<Box<dyn RunningCommand>>>;
    /// [`RuntimeBackend::cleanup_run`].
    fn cleanup_run<'a>(
        &'a self,
        run_id: &'a str,
        ids: &'a [ProcessIdentity],
        grace: Duration,
    ) -> BoxFuture<'a, CleanupReport>;
    /// [`RuntimeBackend::cleanup_recorded_run`].
    fn cleanup_recorded_run<'a>(
        &'a self,
        run_id: &'a str,
        ids: &'a [ProcessIdentity],
        grace: Duration,
        resources: Option<&'a serde_json::Value>,
    ) -> BoxFuture<'a, CleanupReport>;
    /// [`RuntimeBackend::cleanup_run_at`].
    fn cleanup_run_at<'a>(
        &'a self,
        place: RunPlace<'a>,
        run_id: &'a str,
        ids: &'a [ProcessIdentity],
        grace: Duration,
        resources: Option<&'a serde_json::Value>,
    ) -> BoxFuture<'a, CleanupReport>;
}

impl<B: RuntimeBackend> DynRuntimeBackend for B {
    fn id(&self) -> &'static str {
        RuntimeBackend::id(self)
    }
    fn capabilities(&self, options: &BackendOptions) -> Capabilities {
        RuntimeBackend::capabilities(self, options)
    }
    fn availability<'a>(&'a self, options: &'a BackendOptions) -> BoxFuture<'a, Availability> {
        Box::pin(RuntimeBackend::availability(self, options))
    }
    fn requires_scrubbed_environment(&self) -> bool {
        RuntimeBackend::requires_scrubbed_environment(self)
    }
    fn holds_start(&self) -> bool {
        RuntimeBackend::holds_start(self)
    }
    fn prepare(&self, spec: &LaunchSpec) -> Result<PreparedLaunch> {
        RuntimeBackend::prepare(self, spec)
    }
    fn check(&self, spec: &LaunchSpec) -> Result<()> {
        RuntimeBackend::check(self, spec)
    }
    fn launch(
        &self,
        prepared: PreparedLaunch,
        ctx: LaunchContext,
    ) -> BoxFuture<'_, Result<Box<dyn RunningCommand>>> {
        Box::pin(RuntimeBackend::launch(self, prepared, ctx))
    }
    fn cleanup_run<'a>(
        &'a self,
        run_id: &'a str,
        ids: &'a [ProcessIdentity],
        grace: Duration,
    ) -> BoxFuture<'a, CleanupReport> {
        Box::pin(RuntimeBackend::cleanup_run(self, run_id, ids, grace))
    }
    fn cleanup_recorded_run<'a>(
        &'a self,
        run_id: &'a str,
        ids: &'a [ProcessIdentity],
        grace: Duration,
        resources: Option<&'a serde_json::Value>,
    ) -> BoxFuture<'a, CleanupReport> {
        Box::pin(RuntimeBackend::cleanup_recorded_run(
            self, run_id, ids, grace, resources,
        ))
    }
    fn cleanup_run_at<'a>(
        &'a self,
        place: RunPlace<'a>,
        run_id: &'a str,
        ids: &'a [ProcessIdentity],
        grace: Duration,
        resources: Option<&'a serde_json::Value>,
    ) -> BoxFuture<'a, CleanupReport> {
        Box::pin(RuntimeBackend::cleanup_run_at(
            self, place, run_id, ids, grace, resources,
        ))
    }
}

/// Where a recorded run lived on this machine.
#[derive(Debug, Clone, Copy)]
pub struct RunPlace<'a> {
    /// The project root.
    pub root: &'a std::path::Path,
    /// The run's private workspace (which may be gone, or never have existed).
    pub workspace: &'a std::path::Path,
}
