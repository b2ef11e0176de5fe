//! The runtime-backend contract: how a command is launched, observed and cleaned up.
//!
//! A backend turns a [`LaunchSpec`] into a [`PreparedLaunch`] (pure, so argv boundaries and labels
//! are testable without running anything), launches it, and reports [`RunEvidence`] whose labels never
//! claim more than the backend verified (see [`Level`]).

mod capabilities;
mod evidence;
pub mod registry;
mod spec;

use std::time::Duration;

use async_trait::async_trait;

pub use capabilities::{Availability, Boundary, Capabilities, Level, WorkspaceMode};
pub use evidence::{
    CleanupOutcome, CleanupRecord, CleanupReport, EnvironmentEvidence, ExitInfo, FailureKind,
    PortEvidence, PortRecord, ProcessRecord, ProcessRelation, RunEvidence,
};
pub use registry::{BackendDescriptor, Registry, RegistryError};
pub use spec::{BackendOptions, LaunchContext, LaunchSpec, PreparedLaunch, StdioMode};

pub use crate::process::ProcessIdentity;

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
    /// Starting the process failed.
    #[error("could not launch the command through `{backend}`: {message}")]
    Launch { backend: String, message: String },
    /// Observing or waiting for the running command failed.
    #[error("runtime backend `{backend}` failed while the command ran: {message}")]
    Runtime { backend: String, message: String },
}

pub type Result<T, E = BackendError> = std::result::Result<T, E>;

/// A launched command. `wait` resolves when the command has ended (normally, by timeout or by
/// interruption) and its leftovers have been cleaned up, and returns the evidence.
#[async_trait]
pub trait RunningCommand: Send {
    /// Host pid of the launched process (the wrapper's pid for wrapping backends).
    fn pid(&self) -> Option<u32>;
    /// Facts recorded the moment the command started (root identity, tracking cgroup), so that
    /// `agentdiff cleanup` can still find the run's processes if agentdiff itself is killed before
    /// the evidence is written. `Null` when the backend has nothing to add.
    fn launch_facts(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    /// Wait for the end of the command and collect its evidence.
    async fn wait(self: Box<Self>) -> Result<RunEvidence>;
}

/// A pluggable runtime backend. Implementations must be honest: [`RuntimeBackend::capabilities`]
/// starts from [`Capabilities::default`] (everything `uncontrolled`) and raises a boundary only to
/// the level the backend really reaches.
#[async_trait]
pub trait RuntimeBackend: Send + Sync {
    /// Stable identifier used by `--runtime` (lowercase ASCII, digits, `-`).
    fn id(&self) -> &'static str;
    /// Declared capabilities per boundary.
    fn capabilities(&self) -> Capabilities;
    /// Whether the backend can run here, with a remedy when it cannot.
    async fn availability(&self) -> Availability;
    /// Whether the command always gets the scrubbed environment (allowlist, `--pass-env` names,
    /// credential-like and runtime-injection variables dropped), whatever `--scrub-env` and the
    /// policy's `environment.mode` say. A sandboxing backend scrubs by default so that an
    /// exported credential never reaches a command it confines.
    fn requires_scrubbed_environment(&self) -> bool {
        false
    }
    /// Pure transform from the request to what will be executed: no process started, no file
    /// written.
    fn prepare(&self, spec: &LaunchSpec) -> Result<PreparedLaunch>;
    /// Start the prepared command.
    async fn launch(
        &self,
        prepared: PreparedLaunch,
        ctx: LaunchContext,
    ) -> Result<Box<dyn RunningCommand>>;
    /// Stop processes recorded by an earlier run (`agentdiff cleanup`): each identity is verified
    /// before it is signalled, and a mismatch is refused, never signalled.
    async fn cleanup(&self, ids: &[ProcessIdentity], grace: Duration) -> CleanupReport;
    /// Clean up everything a recorded run left behind (`agentdiff cleanup RUN`): by default its
    /// processes; a backend that creates other resources (containers) removes those too, found by
    /// the run id.
    async fn cleanup_run(
        &self,
        run_id: &str,
        ids: &[ProcessIdentity],
        grace: Duration,
    ) -> CleanupReport {
        let _ = run_id;
        self.cleanup(ids, grace).await
    }
}
