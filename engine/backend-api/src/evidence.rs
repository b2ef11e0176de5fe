use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Capabilities, Enforcement};
use crate::environment::EnvMode;
use crate::ProcessIdentity;

/// How the command ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    /// Exit code when the command exited normally.
    pub code: Option<i32>,
    /// Terminating signal when the command was killed by one.
    pub signal: Option<i32>,
    /// The deadline expired and the tree was ended.
    pub timed_out: bool,
    /// agentdiff itself received this signal (SIGINT/SIGTERM) and ended the command.
    pub interrupted_by: Option<i32>,
    pub duration_ms: u64,
}

/// Why the command did not run as asked, when that is the case.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FailureKind {
    /// The process could not be started at all.
    LaunchFailed { message: String },
    /// A wrapper (sandbox, container engine) failed before the command started; the exit code is
    /// the wrapper's, not the command's.
    WrapperSetupFailed { message: String },
    /// The command was launched, or may have been (the backend failed right after the launch
    /// request), and the backend failed before it reported how the command ended
    /// (its plugin died or answered garbage): the exit is unknown, and the run's changes are still
    /// captured and classified.
    BackendFailed { message: String },
}

/// How a process relates to the launched command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessRelation {
    /// The launched process itself.
    Root,
    /// Seen as a descendant of the root while its parent was alive.
    Descendant,
    /// Re-parented to agentdiff (the subreaper) after its parent exited: a daemon.
    Reparented,
}

/// One process attributed to the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRecord {
    pub identity: ProcessIdentity,
    pub ppid: u32,
    pub relation: ProcessRelation,
    /// Basename of the executable (from `/proc/PID/exe` or `comm`).
    pub executable: String,
    /// Milliseconds after launch when it was first seen.
    pub first_seen_ms: u64,
    /// Still alive when the root process exited (a leftover that cleanup handled).
    pub alive_after_root_exit: bool,
    /// The cgroup this process was found in after it moved itself out of the run cgroup: the
    /// command tried to escape observation (a deny-level finding). `None` when it stayed, or
    /// when the run had no cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left_run_cgroup: Option<String>,
}

/// Outcome of cleanup for one identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CleanupOutcome {
    AlreadyExited,
    Terminated,
    Killed,
    /// The pid now belongs to another process: never signalled.
    PidReused,
    AccessDenied,
    /// Seen alive, could not be stopped.
    Escaped,
}

impl CleanupOutcome {
    /// Whether the identity was still running when cleanup started (a leftover).
    pub fn was_leftover(self) -> bool {
        matches!(
            self,
            CleanupOutcome::Terminated
                | CleanupOutcome::Killed
                | CleanupOutcome::AccessDenied
                | CleanupOutcome::Escaped
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanupRecord {
    pub identity: ProcessIdentity,
    pub executable: String,
    pub outcome: CleanupOutcome,
    pub detail: Option<String>,
}

/// How cleanup reached the run's processes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CleanupMechanism {
    /// Nothing was cleaned up (no cleanup ran). Read from `""` too, what older capsules of such
    /// runs hold.
    #[default]
    #[serde(alias = "")]
    None,
    /// Signals through a pidfd opened after the identity (pid, start time, boot id) was checked.
    Pidfd,
    /// `kill(2)` after checking the start time (where pidfds are unavailable): a pid reused in
    /// between could be signalled.
    KillWithStartTimeCheck,
    /// The container engine stopped and removed the container.
    ContainerEngine,
}

impl CleanupMechanism {
    pub fn as_str(self) -> &'static str {
        match self {
            CleanupMechanism::None => "none",
            CleanupMechanism::Pidfd => "pidfd",
            CleanupMechanism::KillWithStartTimeCheck => "kill_with_start_time_check",
            CleanupMechanism::ContainerEngine => "container_engine",
        }
    }
}

impl std::fmt::Display for CleanupMechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What cleanup did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanupReport {
    pub mechanism: CleanupMechanism,
    pub grace_ms: u64,
    pub records: Vec<CleanupRecord>,
    pub errors: Vec<String>,
    /// Other resources removed (e.g. `podman container 3f2a…`), for backends that create them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources_removed: Vec<String>,
}

impl CleanupReport {
    /// Processes that were still running after the command ended.
    pub fn leftovers(&self) -> usize {
        self.records
            .iter()
            .filter(|r| r.outcome.was_leftover())
            .count()
    }
}

/// A listening socket.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PortRecord {
    /// `tcp`, `tcp6`, `udp`, `udp6`.
    pub protocol: String,
    pub address: String,
    pub port: u16,
    pub inode: u64,
    /// True only when the socket inode was held open by a process owned by the run at snapshot
    /// time; otherwise this is a machine-wide observation.
    pub attributed: bool,
    pub owner: Option<ProcessIdentity>,
}

/// Whether listening sockets were watched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PortMode {
    /// Sampled while the command ran.
    Observe,
    /// Not observed.
    #[default]
    Off,
}

/// How a run's processes were tracked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tracking {
    /// Nothing tracked the processes.
    #[default]
    Untracked,
    /// A run cgroup: every process of the run stays in it.
    Cgroup,
    /// Child subreaper and `/proc/PID/task/TID/children` polling.
    SubreaperProcPoll,
    /// Child subreaper and a full `/proc` scan per poll.
    SubreaperProcScan,
    /// Portable polling (non-Linux).
    SysinfoPoll,
    /// The container engine owns the command's processes.
    ContainerEngine,
    /// A marker variable found by scanning `/proc` (the conformance suite's test launcher).
    EnvMarkerProcScan,
}

impl Tracking {
    pub fn as_str(self) -> &'static str {
        match self {
            Tracking::Untracked => "untracked",
            Tracking::Cgroup => "cgroup",
            Tracking::SubreaperProcPoll => "subreaper_proc_poll",
            Tracking::SubreaperProcScan => "subreaper_proc_scan",
            Tracking::SysinfoPoll => "sysinfo_poll",
            Tracking::ContainerEngine => "container_engine",
            Tracking::EnvMarkerProcScan => "env_marker_proc_scan",
        }
    }
}

impl std::fmt::Display for Tracking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Listening-socket observation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortEvidence {
    pub mode: PortMode,
    pub opened: Vec<PortRecord>,
    pub closed: Vec<PortRecord>,
    pub errors: Vec<String>,
    /// What this observation does and does not mean.
    pub note: String,
    /// Listeners held by the sandbox's own machinery (e.g. srt's host-side proxies, held by the
    /// wrapper process itself), moved out of `opened` by the backend that knows them: they are
    /// not the command's new listening sockets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub infrastructure: Vec<InfrastructurePort>,
}

/// A listening socket of the sandbox's own machinery.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct InfrastructurePort {
    #[serde(flatten)]
    pub port: PortRecord,
    /// The component that holds it (`srt`).
    pub component: String,
    /// Why it is there.
    pub role: String,
}

/// The command's environment, as names and fingerprints only.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvironmentEvidence {
    pub mode: EnvMode,
    /// Name → `sha256:<hex>` fingerprint of the value; never the value.
    pub variables: BTreeMap<String, String>,
    /// Names removed by scrubbing.
    pub dropped: Vec<String>,
}

/// Why a backend's facts could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum FactsError {
    #[error("the backend's facts cannot be recorded as JSON: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("the recorded backend facts do not have the expected shape: {0}")]
    Decode(#[source] serde_json::Error),
}

/// The backend-owned section of the evidence: a backend serialises its own typed facts into it
/// ([`BackendFacts::new`]) and reads them back with [`BackendFacts::decode`]; the engine only
/// stores it (redacting sensitive keys) and never interprets it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BackendFacts(serde_json::Value);

impl BackendFacts {
    /// The facts of a backend's own type.
    pub fn new<T: Serialize>(facts: &T) -> Result<Self, FactsError> {
        serde_json::to_value(facts)
            .map(BackendFacts)
            .map_err(FactsError::Encode)
    }

    /// Facts that arrive as JSON already (from a backend outside this process). A backend in
    /// this process records its own type with [`BackendFacts::new`] instead.
    pub fn from_value(value: serde_json::Value) -> Self {
        BackendFacts(value)
    }

    /// The facts as the backend's own type.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, FactsError> {
        T::deserialize(&self.0).map_err(FactsError::Decode)
    }
}

impl std::ops::Deref for BackendFacts {
    type Target = serde_json::Value;
    fn deref(&self) -> &serde_json::Value {
        &self.0
    }
}

impl std::ops::DerefMut for BackendFacts {
    fn deref_mut(&mut self) -> &mut serde_json::Value {
        &mut self.0
    }
}

/// Everything a backend reports about one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunEvidence {
    pub backend: String,
    pub enforcement: Enforcement,
    pub capabilities: Capabilities,
    pub exit: ExitInfo,
    pub failure: Option<FailureKind>,
    /// How processes were tracked.
    pub tracking: Tracking,
    pub processes: Vec<ProcessRecord>,
    pub cleanup: CleanupReport,
    pub ports: PortEvidence,
    /// The wrapper's argv (program first) when wrapped. Raw here; the transaction redacts it
    /// before anything is stored.
    pub wrapper_argv: Option<Vec<String>>,
    /// The backend's own facts about the run (wrapper version and settings, container id, image
    /// digest…), in a structure the backend owns; stored under `wrapper` in runtime.json.
    pub wrapper: Option<BackendFacts>,
    pub runtime_config: serde_json::Value,
    /// Directory whose changes were observed (the root, or a private workspace).
    pub observation_root: String,
    pub environment: Option<EnvironmentEvidence>,
    /// Every program the run's processes executed, and how that was observed.
    #[serde(default)]
    pub execs: crate::exec::ExecEvidence,
    /// Containers a reachable container engine created during the run (not owned by the run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containers: Option<crate::containers::ContainerEvidence>,
    /// The command's standard streams agentdiff handed it through pipes of its own, because
    /// they were neither a terminal nor a pipe (`stdin: regular_file`, `stdout: directory`, …):
    /// the command never held those descriptors.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stdio_relayed: Vec<String>,
    pub warnings: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_capsules_without_cleanup_read_as_none() {
        // Runs that never cleaned up recorded "" before the mechanism was an enum.
        let old: CleanupMechanism = serde_json::from_str("\"\"").unwrap();
        assert_eq!(old, CleanupMechanism::None);
        for m in [
            CleanupMechanism::None,
            CleanupMechanism::Pidfd,
            CleanupMechanism::KillWithStartTimeCheck,
            CleanupMechanism::ContainerEngine,
        ] {
            assert_eq!(serde_json::to_value(m).unwrap(), m.as_str());
        }
    }
}
