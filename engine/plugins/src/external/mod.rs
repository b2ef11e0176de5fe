//! External runtime backends: an executable named `agentdiff-backend-<id>` on `PATH` is backend
//! `<id>`, driven over the versioned JSON protocol of docs/backend-protocol.md. `agentdiff_backend_api::serve`
//! turns any [`agentdiff_backend_api::RuntimeBackend`] into such an executable.
//!
//! Invariants:
//! - A built-in id is never served by a plugin; two plugins with one id are an error naming both.
//! - A plugin planted where a sandboxed command could have written it (inside a project root,
//!   below a default-excluded directory, or changeable by others) is refused before it is ever
//!   executed (see `trust`).
//! - The plugin gets the user's standard streams for a launch; the protocol uses fds 3 and 4.
//! - Every request has a deadline, every message a size limit, and an unknown message type ends
//!   the exchange. The plugin's exit or silence during a run fails the run closed.
//! - The launched process must descend from the plugin (checked in `/proc`), or the run fails
//!   closed without signalling it; labels on the exit report may not exceed those declared.
//!
//! Not defended: a plugin is code the user installed and runs with the user's authority; it can
//! lie in its exit report (exit code, processes seen) and do anything the user can. Its evidence
//! is labelled as the plugin's word, and the conformance suite's probes check its declared
//! `enforced` labels, but a hostile plugin on `PATH` is as dangerous as any program there.

mod client;
mod discover;
mod session;
mod trust;
mod verify;

use std::path::PathBuf;
use std::time::Duration;

pub use client::{ExternalBackend, ExternalFacts, ExternalOrigin};
pub use discover::{describe, scan_path, External, EXECUTABLE_PREFIX};
pub use session::{Plugin, PluginStdio, Session, Timeouts};
pub use trust::{check as check_trusted, Untrusted};
pub use verify::{verify_descendant, NotDescendant, Parentage};

/// Errors talking to a plugin. Each names the plugin's id and path.
#[derive(Debug, thiserror::Error)]
pub enum ExternalError {
    #[error("could not start external backend `{id}` ({}): {source}", path.display())]
    Start {
        id: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "external backend `{id}` ({}) does not speak a protocol version this agentdiff speaks ({:?}): it answered {theirs}; \
         install a plugin built for this agentdiff", path.display(), agentdiff_backend_api::protocol::PROTOCOL_VERSIONS
    )]
    Version {
        id: String,
        path: PathBuf,
        theirs: String,
    },
    #[error("external backend `{id}` ({}) broke the protocol: {message}", path.display())]
    Protocol {
        id: String,
        path: PathBuf,
        message: String,
    },
    #[error("external backend `{id}` ({}) did not answer within {after:?}", path.display())]
    Timeout {
        id: String,
        path: PathBuf,
        after: Duration,
    },
    #[error("external backend `{id}` ({}) exited ({status}) without answering", path.display())]
    Died {
        id: String,
        path: PathBuf,
        status: String,
    },
    #[error("the protocol channel to external backend `{id}` ({}) failed: {source}", path.display())]
    Channel {
        id: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests;
