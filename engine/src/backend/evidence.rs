use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Capabilities, Enforcement};
use crate::process::ProcessIdentity;

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

/// What cleanup did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanupReport {
    /// e.g. `pidfd`, `kill_with_start_time_check`, `container_engine`.
    pub mechanism: String,
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

/// Listening-socket observation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortEvidence {
    /// `observe` or `off`.
    pub mode: String,
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
    /// `inherit` or `scrub`.
    pub mode: String,
    /// Name → `sha256:<hex>` fingerprint of the value; never the value.
    pub variables: BTreeMap<String, String>,
    /// Names removed by scrubbing.
    pub dropped: Vec<String>,
}

/// Everything a backend reports about one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunEvidence {
    pub backend: String,
    pub enforcement: Enforcement,
    pub capabilities: Capabilities,
    pub exit: ExitInfo,
    pub failure: Option<FailureKind>,
    /// How processes were tracked: `cgroup`, `subreaper_proc_poll`, `proc_poll`, `sysinfo_poll`…
    pub tracking: String,
    pub processes: Vec<ProcessRecord>,
    pub cleanup: CleanupReport,
    pub ports: PortEvidence,
    /// The wrapper's argv (program first) when wrapped. Raw here; the transaction redacts it
    /// before anything is stored.
    pub wrapper_argv: Option<Vec<String>>,
    /// Wrapper facts (version, settings path and digest…).
    pub wrapper: Option<serde_json::Value>,
    pub container_id: Option<String>,
    pub image_digest: Option<String>,
    pub runtime_config: serde_json::Value,
    /// Directory whose changes were observed (the root, or a private workspace).
    pub observation_root: String,
    pub environment: Option<EnvironmentEvidence>,
    /// Every program the run's processes executed, and how that was observed.
    #[serde(default)]
    pub execs: crate::process::exec_log::ExecEvidence,
    /// Containers a reachable container engine created during the run (not owned by the run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containers: Option<crate::process::containers::ContainerEvidence>,
    pub warnings: Vec<String>,
}
