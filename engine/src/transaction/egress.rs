//! The run's egress proxy: started before the launch when the effective policy's
//! `network.egress` allows anything, on a Unix socket in a private directory, and stopped once
//! the command has ended; its connection log is sealed into `runtime.json` (`network.egress`).
//!
//! Invariants: the socket's directory is created mode 0700 under `/tmp` (never inside the
//! project tree, whose scan would see it) by a `mkdir` that fails on anything already there, and it is removed when
//! the proxy stops or is dropped; the socket itself is mode 0600 (the proxy crate). A backend
//! only reaches the proxy through [`agentdiff_backend_api::LaunchSpec::egress_proxy`].
//!
//! Not defended: another process of the same user can connect to the socket while the run lasts
//! (its connections are decided and recorded like the command's).

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentdiff_backend_api::{Level, RunEvidence};
use agentdiff_egress::{Bind, ProxyConfig, ProxyThread, SystemResolver};
use agentdiff_policy::Policy;
use agentdiff_store::NetworkEvidence;

/// The socket's name inside the private directory.
pub const SOCKET_NAME: &str = "egress.sock";

/// Errors of starting the run's proxy.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("cannot create the egress proxy's directory {}: {source}", path.display())]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the egress proxy: {0}")]
    Proxy(#[from] agentdiff_egress::ProxyError),
}

/// The private directory, removed on drop.
struct PrivateDir(PathBuf);

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running proxy for one run.
pub(super) struct RunProxy {
    // Field order: the proxy stops (dropped) before its directory is removed.
    thread: ProxyThread,
    socket: PathBuf,
    _dir: PrivateDir,
}

impl RunProxy {
    /// Starts the proxy when the policy's egress allows anything; `None` otherwise.
    pub(super) fn start(policy: &Policy) -> Result<Option<RunProxy>, EgressError> {
        if !policy.egress().allows_anything() {
            return Ok(None);
        }
        // `mkdir` fails on anything that exists (a planted directory or symlink), so the name
        // needs to be unique, not secret.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("agentdiff-egress-{}-{nanos:09}", std::process::id());
        let path = Path::new("/tmp").join(name);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|source| EgressError::Dir {
                path: path.clone(),
                source,
            })?;
        let dir = PrivateDir(path);
        let socket = dir.0.join(SOCKET_NAME);
        let thread = ProxyThread::spawn(
            policy.egress().clone(),
            Arc::new(SystemResolver),
            ProxyConfig::default(),
            Bind::Unix(socket.clone()),
        )?;
        Ok(Some(RunProxy {
            thread,
            socket,
            _dir: dir,
        }))
    }

    pub(super) fn socket(&self) -> &Path {
        &self.socket
    }

    /// Stops the proxy (open connections are ended) and returns what it saw, when the backend
    /// made it the command's route out (the run's network is labelled `filtered`). Elsewhere the
    /// log is not evidence of the command's connections, and the decision warns that the
    /// allowlist was not applied.
    pub(super) fn stop_for(self, evidence: &RunEvidence) -> Option<NetworkEvidence> {
        let RunProxy { thread, _dir, .. } = self;
        let log = thread.stop().log;
        (evidence.capabilities.network == Level::Filtered)
            .then_some(NetworkEvidence { egress: log })
    }
}
