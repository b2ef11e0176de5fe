//! Probes: small programs run *inside* a backend that try to cross one boundary, observed from
//! the host. Shared by the suite's honesty checks and `agentdiff doctor --probe`.
//!
//! Every probe first writes `probe-ran` in its working directory, so "nothing happened because
//! the probe never ran" is told apart from "the control held". Probe programs use only `sh`,
//! `cat`, `sleep` and other busybox applets, so they also run in a minimal container root.

mod egress;
pub(crate) mod programs;
mod record;

pub use record::{
    cite, current_host, read_records, settings_digest, Citation, HostId, ProbeRecord, RecordError,
};

use std::path::PathBuf;

use agentdiff_backend_api::{BackendOptions, Boundary, DynRuntimeBackend, WorkspaceMode};
use serde::{Deserialize, Serialize};

/// What a probe tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeKind {
    /// Append to sentinel files outside the root (hashed before and after) and create new ones:
    /// next to the root, in `/var/tmp` and in `$HOME`.
    OutsideWrite,
    /// Read canary secret files outside the root (the same three places).
    OutsideRead,
    /// With `HOME` a fresh temporary directory, read a canary file planted there outside any
    /// home allowlist (and, for information, one in `~/.cargo`, which the bwrap allowlist shows).
    HomeRead,
    /// Connect to a TCP listener the probe opened on the host, at 127.0.0.1 and at this host's
    /// non-loopback address.
    HostLoopbackConnect,
    /// See exactly the environment handed over (a canary present, nothing of the host's own).
    Environment,
    /// Leave a daemon behind that outlives the command.
    Daemon,
    /// Start more processes than a pids limit allows.
    PidsLimit,
    /// Hold no effective capabilities.
    Privileges,
    /// Change the working tree and see whether the host project tree changes.
    HostTree,
    /// Handed agentdiff's egress proxy, a backend that labels its network `filtered` lets a
    /// listed host be reached through the proxy and nothing else (unlisted and loopback-resolving
    /// names refused and recorded, no direct TCP, no UDP, no resolver). Information only (no
    /// boundary's `enforced` rests on it): `not_applicable` for a backend that does not label
    /// the run `filtered`.
    EgressFiltered,
}

impl ProbeKind {
    pub const ALL: [ProbeKind; 10] = [
        ProbeKind::OutsideWrite,
        ProbeKind::OutsideRead,
        ProbeKind::HomeRead,
        ProbeKind::HostLoopbackConnect,
        ProbeKind::Environment,
        ProbeKind::Daemon,
        ProbeKind::PidsLimit,
        ProbeKind::Privileges,
        ProbeKind::HostTree,
        ProbeKind::EgressFiltered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::OutsideWrite => "outside_write",
            ProbeKind::OutsideRead => "outside_read",
            ProbeKind::HomeRead => "home_read",
            ProbeKind::HostLoopbackConnect => "host_loopback_connect",
            ProbeKind::Environment => "environment",
            ProbeKind::Daemon => "daemon",
            ProbeKind::PidsLimit => "pids_limit",
            ProbeKind::Privileges => "privileges",
            ProbeKind::HostTree => "host_tree",
            ProbeKind::EgressFiltered => "egress_filtered",
        }
    }

    /// The boundary whose `enforced` label this probe tests; `None` for information-only probes
    /// (reads are not a labelled boundary).
    pub fn boundary(self) -> Option<Boundary> {
        match self {
            ProbeKind::OutsideWrite => Some(Boundary::FilesystemWrites),
            ProbeKind::OutsideRead | ProbeKind::HomeRead | ProbeKind::EgressFiltered => None,
            ProbeKind::HostLoopbackConnect => Some(Boundary::Network),
            ProbeKind::Environment => Some(Boundary::Environment),
            ProbeKind::Daemon => Some(Boundary::Processes),
            ProbeKind::PidsLimit => Some(Boundary::Resources),
            ProbeKind::Privileges => Some(Boundary::Privileges),
            ProbeKind::HostTree => Some(Boundary::HostRepository),
        }
    }

    /// The probe for a boundary.
    pub fn for_boundary(boundary: Boundary) -> ProbeKind {
        match boundary {
            Boundary::FilesystemWrites => ProbeKind::OutsideWrite,
            Boundary::HostRepository => ProbeKind::HostTree,
            Boundary::Network => ProbeKind::HostLoopbackConnect,
            Boundary::Processes => ProbeKind::Daemon,
            Boundary::Resources => ProbeKind::PidsLimit,
            Boundary::Privileges => ProbeKind::Privileges,
            Boundary::Environment => ProbeKind::Environment,
        }
    }
}

/// What a probe established.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The attempt was made and the control held.
    Verified,
    /// The attempt was made and succeeded: the control does not hold here.
    NotEnforced,
    /// The probe does not apply to this backend (e.g. host tree for an in-place backend).
    NotApplicable,
    /// The probe could not establish either (it did not run, or had no tool to try with).
    Inconclusive,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Verified => "verified",
            Verdict::NotEnforced => "not_enforced",
            Verdict::NotApplicable => "not_applicable",
            Verdict::Inconclusive => "inconclusive",
        }
    }
}

/// One probe's result with the evidence of what happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeResult {
    pub probe: ProbeKind,
    pub boundary: Option<Boundary>,
    pub verdict: Verdict,
    /// One line saying what happened.
    pub summary: String,
    /// Hashes, exit facts, output excerpts.
    pub evidence: serde_json::Value,
}

/// Settings for probes.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// Backend options every probe launch carries (settings file, image…).
    pub backend_options: BackendOptions,
    /// Where scratch directories go (default: the system temp dir).
    pub scratch_base: Option<PathBuf>,
    /// How many processes the pids probe tries to start.
    pub pids_attempts: u32,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        Self {
            backend_options: BackendOptions::new(),
            scratch_base: None,
            pids_attempts: 200,
        }
    }
}

/// Run one probe through `backend`.
pub async fn run_probe(
    backend: &dyn DynRuntimeBackend,
    kind: ProbeKind,
    options: &ProbeOptions,
) -> ProbeResult {
    let workspace = backend.capabilities(&options.backend_options).workspace;
    let scratch = match crate::harness::Scratch::new(options.scratch_base.as_deref(), workspace) {
        Ok(s) => s,
        Err(e) => {
            return inconclusive(
                kind,
                format!("scratch directory: {e}"),
                serde_json::Value::Null,
            )
        }
    };
    match kind {
        ProbeKind::HostTree if workspace == WorkspaceMode::InPlace => ProbeResult {
            probe: kind,
            boundary: kind.boundary(),
            verdict: Verdict::NotApplicable,
            summary: "the command works on the host tree itself (in-place workspace)".into(),
            evidence: serde_json::Value::Null,
        },
        _ => programs::run(backend, kind, &scratch, options).await,
    }
}

/// Run every probe, in [`ProbeKind::ALL`] order.
pub async fn run_all(backend: &dyn DynRuntimeBackend, options: &ProbeOptions) -> Vec<ProbeResult> {
    let mut out = Vec::new();
    for kind in ProbeKind::ALL {
        out.push(run_probe(backend, kind, options).await);
    }
    out
}

pub(crate) fn inconclusive(
    kind: ProbeKind,
    summary: String,
    evidence: serde_json::Value,
) -> ProbeResult {
    ProbeResult {
        probe: kind,
        boundary: kind.boundary(),
        verdict: Verdict::Inconclusive,
        summary,
        evidence,
    }
}
