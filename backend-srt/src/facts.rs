//! The srt backend's own section of the evidence (`runtime.json` → `wrapper`), typed: written
//! with [`BackendFacts::new`](agentdiff_backend_api::BackendFacts::new) and read back with
//! `decode::<SrtFacts>()`. Field names are the recorded format (docs/backends/srt.md).

use agentdiff_process::shimmed::StartFacts;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::version::VersionSource;

/// What the backend knows does not hold, stated with every run's evidence.
pub const LIMITS: &[&str] = &[
    "srt owns the OS enforcement; agentdiff does not audit srt or prove that its settings are \
     restrictive, so filesystem and network controls are labelled requested, not enforced",
    "writes below the project root are allowed by typical settings and are observed by \
     agentdiff's before/after manifests, not prevented",
    "srt reports a command killed by signal N as exit code 128+N, so such a death is recorded as \
     that exit code, not as a signal",
];

/// What the srt backend records about one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SrtFacts {
    /// Always `srt`.
    pub kind: String,
    pub executable: String,
    pub version: String,
    pub version_source: VersionSource,
    pub settings: SettingsFacts,
    /// The program that ran the exec shim inside the sandbox.
    pub exec_shim: String,
    pub sandbox: SandboxClaim,
    /// What the backend knows does not hold ([`LIMITS`]).
    pub limits: Vec<String>,
    /// What the start marker said; absent until the run ended.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StartFacts>,
}

/// What agentdiff claims about srt's sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxClaim {
    /// srt was asked to sandbox the command; nothing here verified that it did.
    RequestedNotVerified,
}

/// Where srt's settings came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SettingsSource {
    /// The user's `--srt-settings` file.
    File,
    /// Derived from the effective policy ([`crate::settings::bridge`]).
    GeneratedFromPolicy,
}

/// The settings file srt was given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SettingsFacts {
    pub source: SettingsSource,
    pub path: String,
    pub sha256: String,
    pub bytes: u64,
    /// For derived settings: what the policy bridge made of the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<BridgeFacts>,
}

/// What the policy bridge derived. The generated file is removed after the run (the capsule
/// seals only its known artifacts), so its whole content is recorded here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BridgeFacts {
    /// The settings document as srt read it: srt's format, not agentdiff's.
    pub content: Value,
    pub file_removed_after_run: bool,
    /// `run_policy` (the run's effective policy, from the launch spec) or `none`.
    pub policy_source: String,
    pub expressed_denies: Vec<String>,
    pub not_expressed_denies: Vec<String>,
    pub reads_left_readable: Vec<String>,
    pub allowed_domains: Vec<String>,
    /// What the bridge cannot express ([`crate::settings::BRIDGE_LIMITS`]).
    pub limits: Vec<String>,
    /// Always `requested`: srt applies them, agentdiff does not verify it.
    pub controls: agentdiff_backend_api::Level,
}
