//! The shapes of `result.json` and `metadata.json`. Field names and status values follow the seed's
//! tool so CI consumers keep working; fields may be added, never renamed.

use serde::{Deserialize, Serialize};

use agentdiff_backend_api::{Boundary, Capabilities, ExitInfo, FailureKind};
use agentdiff_policy::score::BlastRadius;
use agentdiff_policy::{Action, Decision};
use agentdiff_scan::{ChangeType, EntryKind};

/// Operational status of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The command succeeded and no review or deny evidence was found.
    Passed,
    /// The command succeeded but review findings, warnings or budget violations exist.
    Review,
    /// The command succeeded but at least one denied mutation exists.
    Denied,
    /// Command policy prevented the launch.
    Blocked,
    /// The command failed or could not launch.
    Failed,
    /// The deadline expired.
    TimedOut,
    /// agentdiff was interrupted (SIGINT/SIGTERM) and ended the command.
    Terminated,
    /// agentdiff itself failed, or the backend could not run (nothing was launched).
    Error,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Passed => "passed",
            Status::Review => "review",
            Status::Denied => "denied",
            Status::Blocked => "blocked",
            Status::Failed => "failed",
            Status::TimedOut => "timed_out",
            Status::Terminated => "terminated",
            Status::Error => "error",
        }
    }
}

/// One observed change with its policy decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangeRecord {
    pub path: String,
    pub change_type: ChangeType,
    /// `file`, `directory` or `symlink` (the after-state's kind, or the before-state's for a
    /// deletion).
    pub entry_kind: EntryKind,
    pub content_changed: bool,
    pub mode_changed: bool,
    pub decision: Action,
    pub policy_decision: Decision,
    /// Whether rollback can undo this change from the capsule's evidence.
    pub reversible: bool,
    pub recovery_reason: String,
    pub sensitive: bool,
    pub dependency: bool,
    pub before_sha256: Option<String>,
    pub after_sha256: Option<String>,
}

/// A budget from `limits` that the run exceeded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitViolation {
    pub limit: String,
    pub limit_value: u64,
    pub observed: u64,
}

/// The counts a person reads first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Changes the policy allows.
    pub expected: u64,
    /// Changes for review.
    pub unexpected: u64,
    /// Denied changes.
    pub protected: u64,
    pub reversible: u64,
    pub leftover_processes: u64,
    /// Listening sockets that appeared during the run, machine-wide.
    pub opened_ports: u64,
    /// Of `opened_ports`, those held by one of the run's processes when sampled; the rest are
    /// machine-wide observations (another program's listener).
    #[serde(default)]
    pub opened_ports_attributed: u64,
    pub unsupported_entries: u64,
    /// Containers an engine created during the run window (not owned by the run; see
    /// `runtime.json` `containers`).
    #[serde(default)]
    pub containers_started: u64,
    /// Of `containers_started`, those whose monitor or main process was one of the run's.
    #[serde(default)]
    pub containers_attributed: u64,
}

/// A control that a recorded probe verified on this host for the same backend and settings
/// (`agentdiff doctor --probe --record`), cited by a run. The declared level is unchanged; the
/// citation says what was proven, where and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifiedControl {
    pub boundary: Boundary,
    /// The probe record's facts: backend, settings digest, host, when, what the probe saw.
    pub citation: agentdiff_backend_api::citation::Citation,
}

/// Runtime facts copied into the result for CI consumers (full evidence is in runtime.json).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimeSummary {
    pub backend: String,
    pub enforcement: agentdiff_backend_api::Enforcement,
    pub sandboxed: bool,
    pub network_enforcement: bool,
    pub capabilities: Capabilities,
    pub exit: ExitInfo,
    pub failure: Option<FailureKind>,
    pub tracking: agentdiff_backend_api::Tracking,
    pub observation_root: String,
    /// Controls a recent probe verified here (empty unless the run was given probe records).
    #[serde(default)]
    pub verified_controls: Vec<VerifiedControl>,
}

/// `result.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub schema_version: u32,
    pub run_id: String,
    pub status: Status,
    /// `allow`, `review` or `deny`.
    pub safety_outcome: Action,
    pub command_decision: Decision,
    pub exit_code: Option<i32>,
    pub changes: Vec<ChangeRecord>,
    pub limit_violations: Vec<LimitViolation>,
    pub observation_warnings: Vec<String>,
    /// What the process evidence says about the command's conduct (escapes, containers).
    #[serde(default)]
    pub evidence_findings: Vec<EvidenceFinding>,
    /// What changed under `.agentdiff/` while the command ran (a deny-level finding; the
    /// artifacts were put back from memory and changed backups no longer count as recovery).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capsule_tampered: Vec<crate::TamperFinding>,
    pub blast_radius: BlastRadius,
    pub runtime: Option<RuntimeSummary>,
    pub execution_error: Option<String>,
    pub summary: Summary,
    /// Whether at least one change can be rolled back.
    pub recovery_available: bool,
    pub task: Option<String>,
    pub started_at: String,
    pub finished_at: String,
    pub duration_ms: u64,
}

/// `metadata.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    pub schema_version: u32,
    pub run_id: String,
    pub created_at: String,
    pub agentdiff_version: String,
    pub root: String,
    /// The command, redacted.
    pub argv: Vec<String>,
    pub task: Option<String>,
    pub backend: String,
    pub timeout_seconds: Option<u64>,
    pub platform: String,
    pub uid: Option<u32>,
    /// Present only in a session capsule (an agent session recorded as one transaction); its
    /// absence marks a run capsule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionMeta>,
}

/// What `metadata.json` of a session capsule adds: the agent and its own id for the session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionMeta {
    /// The agent whose session this is (`claude-code`).
    pub agent: String,
    /// The agent's own id for the session (Claude Code's `session_id`).
    pub agent_session_id: String,
    /// How the agent said the session started (Claude Code's `source`: `startup`, `resume`…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The agent's process when the session started, and its start time (clock ticks since
    /// boot): while it lives, an unsealed session is open; after, it was interrupted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_started: Option<u64>,
}

/// One agent tool call in a session's log (the `tool_call` event of a session capsule).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    /// The agent's tool name (`Write`, `Edit`, `Bash`…).
    pub tool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
    /// The paths a file tool named, relative to the project root (as the tool gave them when
    /// outside it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// The run a sandboxed shell call was recorded as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// `ran` (the agent reported the call done), `failed` (the tool reported an error) or
    /// `denied` (the hook refused it before it ran).
    pub outcome: String,
    /// Why a call was denied, or the tool's error, shortened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The calls that could have made one change of a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeAttribution {
    pub path: String,
    pub decision: Action,
    /// `tool_use_id`s (or tool names, for a call without one) of the file tools that named the
    /// path and of the shell calls whose own run recorded a change of it; empty when
    /// `unattributed`.
    pub calls: Vec<String>,
    /// The runs of those shell calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<String>,
    /// No recorded call could have made it (a change outside the agent, or by an unsandboxed
    /// process the session does not see).
    pub unattributed: bool,
}

/// How a session ended (the `session_ended` event of a session capsule, before the seal).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionEnd {
    /// `session_end` (the agent's SessionEnd hook, with its `reason`) or `closed` (`agentdiff
    /// session end`, for a session whose end never came).
    pub ended_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub attributions: Vec<ChangeAttribution>,
    /// The runs the session's shell calls were recorded as.
    pub linked_runs: Vec<String>,
    /// The `tool_use_id`s (or tool names) of the calls the hook denied.
    pub denied_calls: Vec<String>,
}

/// One finding from the run's process evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceFinding {
    /// `left_run_cgroup` or `container_started` (from the process evidence), or
    /// `uncaptured_denied` (from the tree, see `classify::classify_uncaptured`), or
    /// `comparison_incomplete` (see `classify::classify_incomplete`), or `excluded_program` /
    /// `excluded_sweep_incomplete` (programs below excluded paths, see
    /// `classify::classify_programs`).
    pub kind: String,
    pub action: Action,
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<agentdiff_backend_api::ProcessIdentity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}
