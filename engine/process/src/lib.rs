//! Shared process helpers for backends: identities, descendant tracking, identity-checked cleanup,
//! listening-socket snapshots, terminal hand-over and the supervisor that ties them together.
//!
//! Linux is the first-class platform: `/proc` identities with start times in clock ticks, a child
//! subreaper, a cgroup where one can be created, and pidfd signalling. Elsewhere a portable
//! fallback (sysinfo polling, pid + start time in seconds, plain signals) is used and labelled as
//! weaker evidence.

#[cfg(target_os = "linux")]
pub mod cgroup;
pub mod cleanup;
#[cfg(target_os = "linux")]
pub mod cn_proc;
pub mod containers;
pub mod exec_log;
#[cfg(unix)]
pub mod exec_shim;
pub mod ports;
mod rfc3339;
pub mod seccomp_guard;
#[cfg(unix)]
pub mod shimmed;
#[cfg(target_os = "linux")]
pub mod spawn;
#[cfg(unix)]
pub mod stdio_relay;
pub mod supervisor;
pub mod terminal;
pub mod tracker;
pub mod tree;

pub use cleanup::{cleanup_identities, CleanupTarget};

/// Every run cgroup's name starts with this (the one place it is spelled).
pub const RUN_CGROUP_PREFIX: &str = "agentdiff-";
pub use agentdiff_host::process_identity::{
    boot_id, read_identity, read_stat, IdentityError, ProcessIdentity, StatInfo,
};
pub use supervisor::{spawn_supervised, EvidenceLabels, SupervisedCommand};
pub use tracker::{tracking_mechanisms_available, TrackingMechanism};
pub use tree::{cleanup_host_processes, process_tree};

/// Errors of the process helpers.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// Reading a process's identity from `/proc` failed (the host toolkit's error, kept whole).
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error("could not read {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("could not start `{program}`: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Unsupported(String),
    #[cfg(unix)]
    #[error(transparent)]
    Relay(#[from] crate::stdio_relay::RelayError),
}

impl ProcessError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        ProcessError::Io {
            what: what.into(),
            source,
        }
    }
}
