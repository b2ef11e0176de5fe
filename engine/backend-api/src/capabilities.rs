use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How far agentdiff controls one boundary. Ordered weakest first; the default is the weakest.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Nothing is applied and nothing is watched.
    #[default]
    Uncontrolled,
    /// agentdiff watches the boundary and reports what it saw; nothing is prevented.
    Observed,
    /// The control was handed to an external tool (a sandbox, a container engine) whose effect was
    /// not verified here.
    Requested,
    /// Only for the network: agentdiff's egress proxy decided every connection the command could
    /// make (the host allowlist, `network.egress`), in a sandbox with no other route out. Below
    /// `enforced`, which for the network means no network at all.
    Filtered,
    /// agentdiff applies the control itself, or a probe proved it in this environment.
    Enforced,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Uncontrolled => "uncontrolled",
            Level::Observed => "observed",
            Level::Requested => "requested",
            Level::Filtered => "filtered",
            Level::Enforced => "enforced",
        }
    }
}

/// What a run's controls rest on, as a whole: the label on the evidence next to the per-boundary
/// [`Level`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Enforcement {
    /// Nothing is applied; the command runs with the user's authority.
    #[default]
    None,
    /// The controls were handed to an external sandbox tool (e.g. srt), not verified here.
    ExternalSandboxRequested,
    /// The controls were handed to a container engine, not verified here.
    ContainerRequested,
    /// A bubblewrap sandbox whose every control agentdiff chose itself.
    BwrapSandbox,
}

impl Enforcement {
    pub fn as_str(self) -> &'static str {
        match self {
            Enforcement::None => "none",
            Enforcement::ExternalSandboxRequested => "external_sandbox_requested",
            Enforcement::ContainerRequested => "container_requested",
            Enforcement::BwrapSandbox => "bwrap_sandbox",
        }
    }
}

impl std::fmt::Display for Enforcement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The boundaries every backend labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Boundary {
    /// Writes to the filesystem outside the project root.
    FilesystemWrites,
    /// Writes to the host project tree itself.
    HostRepository,
    /// Network traffic.
    Network,
    /// Processes the command starts and leaves behind.
    Processes,
    /// CPU, memory and process-count limits.
    Resources,
    /// Privileges (capabilities, setuid, user).
    Privileges,
    /// Environment variables handed to the command.
    Environment,
}

impl Boundary {
    pub const ALL: [Boundary; 7] = [
        Boundary::FilesystemWrites,
        Boundary::HostRepository,
        Boundary::Network,
        Boundary::Processes,
        Boundary::Resources,
        Boundary::Privileges,
        Boundary::Environment,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Boundary::FilesystemWrites => "filesystem_writes",
            Boundary::HostRepository => "host_repository",
            Boundary::Network => "network",
            Boundary::Processes => "processes",
            Boundary::Resources => "resources",
            Boundary::Privileges => "privileges",
            Boundary::Environment => "environment",
        }
    }
}

/// Where the command works: on the host tree itself, or on a private copy that agentdiff
/// materialises from the captured before-state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceMode {
    #[default]
    InPlace,
    Private,
}

/// Declared capabilities of a backend: a flat struct whose default is "uncontrolled" everywhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Capabilities {
    pub filesystem_writes: Level,
    pub host_repository: Level,
    pub network: Level,
    pub processes: Level,
    pub resources: Level,
    pub privileges: Level,
    pub environment: Level,
    /// True only when the command runs inside an isolation boundary the backend sets up.
    pub sandboxed: bool,
    /// True only when network access is blocked, not merely watched.
    pub network_enforcement: bool,
    /// Whether the command sees the host tree or a private copy.
    pub workspace: WorkspaceMode,
}

impl Capabilities {
    pub fn level(&self, boundary: Boundary) -> Level {
        match boundary {
            Boundary::FilesystemWrites => self.filesystem_writes,
            Boundary::HostRepository => self.host_repository,
            Boundary::Network => self.network,
            Boundary::Processes => self.processes,
            Boundary::Resources => self.resources,
            Boundary::Privileges => self.privileges,
            Boundary::Environment => self.environment,
        }
    }

    pub fn set_level(&mut self, boundary: Boundary, level: Level) {
        let slot = match boundary {
            Boundary::FilesystemWrites => &mut self.filesystem_writes,
            Boundary::HostRepository => &mut self.host_repository,
            Boundary::Network => &mut self.network,
            Boundary::Processes => &mut self.processes,
            Boundary::Resources => &mut self.resources,
            Boundary::Privileges => &mut self.privileges,
            Boundary::Environment => &mut self.environment,
        };
        *slot = level;
    }

    /// Boundary name → level, in a stable order, for reports.
    pub fn matrix(&self) -> BTreeMap<&'static str, Level> {
        Boundary::ALL
            .iter()
            .map(|b| (b.as_str(), self.level(*b)))
            .collect()
    }
}

/// Whether a backend can run here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Availability {
    Ready {
        /// What was found (versions, paths).
        detail: String,
    },
    Unavailable {
        /// What is missing.
        reason: String,
        /// What to do about it.
        remedy: String,
    },
}

impl Availability {
    pub fn is_ready(&self) -> bool {
        matches!(self, Availability::Ready { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_capabilities_are_the_weakest() {
        let caps = Capabilities::default();
        for b in Boundary::ALL {
            assert_eq!(caps.level(b), Level::Uncontrolled, "{}", b.as_str());
        }
        assert!(!caps.sandboxed);
        assert!(!caps.network_enforcement);
        assert_eq!(caps.workspace, WorkspaceMode::InPlace);
    }

    #[test]
    fn levels_order_weakest_first() {
        assert!(Level::Uncontrolled < Level::Observed);
        assert!(Level::Observed < Level::Requested);
        assert!(Level::Requested < Level::Filtered);
        assert!(Level::Filtered < Level::Enforced);
    }

    #[test]
    fn set_level_round_trips_every_boundary() {
        let mut caps = Capabilities::default();
        for b in Boundary::ALL {
            caps.set_level(b, Level::Requested);
            assert_eq!(caps.level(b), Level::Requested);
        }
    }
}
