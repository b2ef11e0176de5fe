use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Backend-specific options from the command line or the policy (e.g. `srt-executable`,
/// `image`, `env`). Keys are lowercase with `-`; a key may repeat.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendOptions {
    values: BTreeMap<String, Vec<String>>,
}

impl BackendOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add one value for `key`.
    pub fn push(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.values
            .entry(key.into())
            .or_default()
            .push(value.into());
    }

    /// The last value given for `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values
            .get(key)
            .and_then(|v| v.last())
            .map(String::as_str)
    }

    /// Every value given for `key`, in order.
    pub fn get_all(&self, key: &str) -> &[String] {
        self.values.get(key).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn is_set(&self, key: &str) -> bool {
        self.values.contains_key(key)
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.values.keys().map(String::as_str)
    }
}

/// Where the command's standard streams go.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StdioMode {
    /// Pass stdin, stdout and stderr through (the interactive default).
    #[default]
    Inherit,
    /// Pass stdin and stderr through; send the command's stdout to agentdiff's stderr so that
    /// agentdiff's stdout stays one JSON document (`--format json`).
    StdoutToStderr,
    /// Redirect to files (tests and probes).
    Files {
        stdin: Option<PathBuf>,
        stdout: PathBuf,
        stderr: PathBuf,
    },
}

/// What the transaction asks a backend to run.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub run_id: String,
    /// The resolved host project root.
    pub root: PathBuf,
    /// The directory the command works in: `root` for in-place backends, the materialised private
    /// workspace for private-workspace backends.
    pub workdir: PathBuf,
    /// The run's capsule directory; a backend may write launch artifacts here before the seal.
    pub capsule_dir: PathBuf,
    /// The command, launched as an argument vector, never through a shell.
    pub argv: Vec<OsString>,
    /// The complete environment handed to the command (already scrubbed when scrubbing is on).
    pub env: Vec<(OsString, OsString)>,
    /// Wall-clock limit; the whole process tree is ended when it expires.
    pub timeout: Option<Duration>,
    /// Grace period between TERM and KILL during cleanup.
    pub grace: Duration,
    /// How often descendants are polled.
    pub poll_interval: Duration,
    /// Whether listening sockets are observed (`network.mode: observe`).
    pub observe_ports: bool,
    pub options: BackendOptions,
}

/// A backend's pure transform of a [`LaunchSpec`]: exactly what will be executed.
#[derive(Debug, Clone)]
pub struct PreparedLaunch {
    /// Program to execute (the wrapper for wrapping backends).
    pub program: OsString,
    /// Arguments after the program.
    pub args: Vec<OsString>,
    /// The complete environment of the launched program.
    pub env: Vec<(OsString, OsString)>,
    pub cwd: PathBuf,
    /// Enforcement label for evidence: `none`, `external_sandbox_requested`, `container_requested`…
    pub enforcement: String,
    /// The wrapper's full argv (program first) when the command is wrapped; redacted before it is
    /// stored.
    pub wrapper_argv: Option<Vec<OsString>>,
    /// The requested runtime configuration, recorded as evidence.
    pub runtime_config: serde_json::Value,
    /// The request this was prepared from.
    pub spec: LaunchSpec,
}

impl PreparedLaunch {
    /// Program followed by its arguments.
    pub fn full_argv(&self) -> Vec<OsString> {
        let mut argv = Vec::with_capacity(self.args.len() + 1);
        argv.push(self.program.clone());
        argv.extend(self.args.iter().cloned());
        argv
    }
}

/// Run-time context for a launch.
#[derive(Debug, Clone)]
pub struct LaunchContext {
    pub stdio: StdioMode,
    /// Becomes `Some(signal)` when agentdiff itself receives SIGINT/SIGTERM: the backend ends the
    /// command, cleans up and still returns evidence.
    pub interrupt: tokio::sync::watch::Receiver<Option<i32>>,
}

impl LaunchContext {
    /// A context with no interruption source (tests, probes).
    pub fn new(stdio: StdioMode) -> Self {
        let (_tx, rx) = tokio::sync::watch::channel(None);
        Self {
            stdio,
            interrupt: rx,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_keep_order_and_last_wins() {
        let mut o = BackendOptions::new();
        o.push("env", "A");
        o.push("env", "B");
        o.push("image", "x");
        o.push("image", "y");
        assert_eq!(o.get_all("env"), ["A".to_string(), "B".to_string()]);
        assert_eq!(o.get("image"), Some("y"));
        assert_eq!(o.get("missing"), None);
        assert!(o.get_all("missing").is_empty());
    }
}
