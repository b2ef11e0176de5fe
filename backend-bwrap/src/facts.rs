//! The bwrap backend's own section of the evidence (`runtime.json` → `wrapper`), typed: written
//! with [`BackendFacts::new`](agentdiff_backend_api::BackendFacts::new) and read back with
//! `decode::<BwrapFacts>()`. Field names are the recorded format (docs/backends/bwrap.md).

use std::collections::BTreeMap;

use agentdiff_backend_api::{CleanupOutcome, Level};
use agentdiff_process::shimmed::StartFacts;
use serde::{Deserialize, Serialize};

/// What the bwrap backend records about one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BwrapFacts {
    /// Always `bwrap`.
    pub kind: String,
    pub executable: String,
    /// The program that ran the exec shim inside the sandbox.
    pub exec_shim: String,
    pub sandbox: SandboxClaim,
    /// Each control's level and how it is applied, by capability name.
    pub controls: BTreeMap<String, Control>,
    /// What the backend knows does not hold ([`crate::backend::LIMITS`]).
    pub limits: Vec<String>,
    /// What the start marker said; absent until the run ended.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StartFacts>,
    /// bwrap's own pid-1 init inside the sandbox, when it was seen (never a leftover).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_init: Option<SandboxInit>,
    /// The exec shim's egress forwarder (filtered network only), when it was seen: sandbox
    /// plumbing that dies with the sandbox, never a leftover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_forwarder: Option<SandboxInit>,
}

/// What agentdiff claims about the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxClaim {
    /// agentdiff chose every mount and namespace and bwrap applied them.
    AppliedByAgentdiff,
}

/// One control of the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Control {
    pub level: Level,
    pub how: String,
    /// For `credentials`: the locations hidden from the command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<Vec<String>>,
}

/// bwrap's pid-1 init and what happened to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxInit {
    pub pid: u32,
    pub alive_after_bwrap_exit: bool,
    pub ended_by_cleanup: Option<CleanupOutcome>,
    /// Always `false`: it is the sandbox's process, not the command's.
    pub counted_as_leftover: bool,
}
