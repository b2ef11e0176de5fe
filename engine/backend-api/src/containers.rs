//! Container-engine evidence types (`containers` in runtime.json) and what a backend
//! established about the command's reach to engine APIs ([`EngineReach`], carried by the launch
//! spec). The observer that queries the engines lives in the process crate
//! (`agentdiff_process::containers`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One reachable engine API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineRecord {
    pub socket: String,
    /// `podman` or `docker`.
    pub kind: String,
}

/// One container created during the run window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub id: String,
    /// The engine socket it was seen on.
    pub socket: String,
    pub name: String,
    /// Image name (empty for a container run from a root filesystem directory).
    pub image: String,
    /// Entrypoint and arguments, redacted.
    pub command: Vec<String>,
    /// Creation time as the engine reports it (RFC 3339).
    pub created: String,
    /// Its monitor or main process was one of the run's processes.
    pub attributed: bool,
    /// Host pid of its main process when it was inspected (0 when not running).
    #[serde(default)]
    pub main_pid: u32,
    /// Running when the command ended (before process cleanup).
    pub running_at_end: bool,
    /// Running after agentdiff's process cleanup, as the engine reports it (an engine whose
    /// monitor process was ended by cleanup may still report a container as running until it is
    /// stopped: `agentdiff cleanup RUN --containers`).
    pub running_after_cleanup: bool,
    /// Gone (removed) by the time it was inspected; image and command come from the event.
    pub removed: bool,
}

/// Whether the engines were asked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Observation {
    /// Every reachable engine's event log was read for the run window.
    #[default]
    Queried,
    /// Not asked: the backend showed that the command could reach no engine API, and every
    /// socket it hid was still the one it hid when the command ended (`note` says how).
    /// Containers other processes started during the run are not listed.
    NotApplicable,
}

/// The container observation of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerEvidence {
    /// Older capsules, which always queried, read as `queried`.
    #[serde(default)]
    pub observation: Observation,
    pub engines: Vec<EngineRecord>,
    /// The run window in nanoseconds since the Unix epoch: from just before the launch to the
    /// end of cleanup.
    pub since_ns: u64,
    pub until_ns: u64,
    pub containers: Vec<ContainerRecord>,
    #[serde(default)]
    pub omitted: u64,
    pub errors: Vec<String>,
    pub note: String,
}

/// What a stop request did to one recorded container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerStop {
    pub id: String,
    /// `stopped`, `already_stopped`, `gone`, `refused_outside_window`, `error`.
    pub outcome: String,
    pub detail: Option<String>,
}

impl ContainerStop {
    /// Stopped, or nothing to stop; anything else was refused or failed.
    pub fn succeeded(&self) -> bool {
        matches!(
            self.outcome.as_str(),
            "stopped" | "already_stopped" | "gone"
        )
    }
}

/// A Unix socket as a backend hid it: its resolved path and the inode that was there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HiddenSocket {
    pub path: PathBuf,
    dev: u64,
    ino: u64,
}

impl HiddenSocket {
    /// The socket at `path` now (symlinks resolved); `None` when nothing is there.
    pub fn of(path: &Path) -> Option<HiddenSocket> {
        use std::os::unix::fs::MetadataExt;
        let resolved = agentdiff_host::system::canonical_if_present(path).ok()?;
        let meta = std::fs::metadata(&resolved).ok()?;
        Some(HiddenSocket {
            path: resolved,
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }
}

/// What a backend established about the command's reach to container engine APIs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum EngineReach {
    /// The command may reach whatever engine agentdiff can: the engines are queried.
    #[default]
    Unrestricted,
    /// The backend covered `sockets` (every candidate socket that existed when it planned the
    /// launch) and cut every other route to an engine API (`how`: e.g. a network namespace of the
    /// command's own, which also separates abstract Unix sockets).
    Hidden {
        sockets: Vec<HiddenSocket>,
        how: String,
    },
}
