use std::any::Any;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{BackendError, Enforcement};
use crate::environment::EnvMode;

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

/// The environment decision the transaction made before the backend saw the request: the mode
/// and the names it removed. The variables themselves are [`LaunchSpec::env`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvironmentPlan {
    pub mode: EnvMode,
    /// Names removed by scrubbing, sorted.
    pub dropped: Vec<String>,
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
    /// How `env` was decided (recorded in the evidence).
    pub env_plan: EnvironmentPlan,
    /// Wall-clock limit; the whole process tree is ended when it expires.
    pub timeout: Option<Duration>,
    /// Grace period between TERM and KILL during cleanup.
    pub grace: Duration,
    /// How often descendants are polled.
    pub poll_interval: Duration,
    /// Whether listening sockets are observed (`network.mode: observe`).
    pub observe_ports: bool,
    pub options: BackendOptions,
    /// The policy's `filesystem.deny` patterns, for a built-in backend that protects them in its
    /// sandbox (bwrap re-binds the literal ones read-only). Given here rather than read from the
    /// capsule's `policy.json`, so a held start can be prepared before the capsule is opened.
    /// Not sent to external backends, which read `policy.json` (the wire spec has no such field).
    pub deny_patterns: Vec<String>,
    /// The project's git directories and `.git` files, canonical, as the engine found them in
    /// the tree before the launch (`agentdiff_host::git_dirs::discover`: `ROOT/.git`, a `.git`
    /// file's `gitdir:` target inside or outside the root, `commondir`, nested and renamed
    /// repositories). A sandboxing backend keeps them read-only (bwrap re-binds them). Empty when
    /// the caller did not look (the preflight check, tests). In-process only, like
    /// `deny_patterns`: not on the wire.
    pub git_dirs: Vec<PathBuf>,
    /// The Unix socket of agentdiff's egress proxy for this run, when the policy's
    /// `network.egress` allows anything (the transaction started the proxy in a private 0700
    /// directory). A backend that labels its network `filtered` routes the command's traffic
    /// through it and nowhere else (and says so with [`PreparedLaunch::routes_egress`]). The
    /// external protocol carries it from version 2 only (`WireSpec::egress_proxy`).
    pub egress_proxy: Option<PathBuf>,
}

/// The process a backend starts: program, arguments, environment and working directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchCommand {
    /// Program to execute (the wrapper for wrapping backends).
    pub program: OsString,
    /// Arguments after the program.
    pub args: Vec<OsString>,
    /// The complete environment of the launched program.
    pub env: Vec<(OsString, OsString)>,
    pub cwd: PathBuf,
}

/// A backend's pure transform of a [`LaunchSpec`]: exactly what will be executed, plus the
/// backend's own typed plan.
///
/// Invariant: nothing can change a `PreparedLaunch` after `prepare` made it (the fields are
/// private), and `launch` reads the plan back with [`PreparedLaunch::plan`] instead of planning
/// again, so what runs is what was prepared. The engine never looks inside the plan.
#[derive(Clone)]
pub struct PreparedLaunch {
    command: LaunchCommand,
    enforcement: Enforcement,
    wrapped: bool,
    runtime_config: serde_json::Value,
    spec: LaunchSpec,
    backend: &'static str,
    plan: Arc<dyn Any + Send + Sync>,
    engine_reach: crate::containers::EngineReach,
    egress_routed: bool,
}

impl std::fmt::Debug for PreparedLaunch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedLaunch")
            .field("backend", &self.backend)
            .field("command", &self.command)
            .field("enforcement", &self.enforcement)
            .field("wrapped", &self.wrapped)
            .field("runtime_config", &self.runtime_config)
            .finish_non_exhaustive()
    }
}

impl PreparedLaunch {
    /// What backend `backend` prepared for `spec`: the command to start, the enforcement label
    /// and the backend's own `plan`, which `launch` gets back with [`PreparedLaunch::plan`].
    pub fn new<P: Any + Send + Sync>(
        backend: &'static str,
        spec: &LaunchSpec,
        command: LaunchCommand,
        enforcement: Enforcement,
        plan: P,
    ) -> Self {
        Self {
            command,
            enforcement,
            wrapped: false,
            runtime_config: serde_json::Value::Null,
            spec: spec.clone(),
            backend,
            plan: Arc::new(plan),
            engine_reach: crate::containers::EngineReach::default(),
            egress_routed: false,
        }
    }

    /// The launch routes the command's network through the spec's egress proxy and nothing
    /// else (what a `filtered` network label rests on; the SDK's `serve` tells agentdiff so).
    pub fn routes_egress(mut self) -> Self {
        self.egress_routed = self.spec.egress_proxy.is_some();
        self
    }

    pub fn egress_routed(&self) -> bool {
        self.egress_routed
    }

    /// What the backend established about the command's reach to container engine APIs (the
    /// supervisor's container observation is skipped only when it shows none is reachable).
    pub fn with_engine_reach(mut self, reach: crate::containers::EngineReach) -> Self {
        self.engine_reach = reach;
        self
    }

    pub fn engine_reach(&self) -> &crate::containers::EngineReach {
        &self.engine_reach
    }

    /// The program is a wrapper around the command (a sandbox, a container engine): its full
    /// argv is recorded (redacted) as `wrapper_argv`.
    pub fn wrapped(mut self) -> Self {
        self.wrapped = true;
        self
    }

    /// The requested runtime configuration, recorded as evidence.
    pub fn with_runtime_config(mut self, config: serde_json::Value) -> Self {
        self.runtime_config = config;
        self
    }

    /// Start the program in `dir` instead of the project root, when the launch runs in the host
    /// tree itself (cwd, workdir and root are the same) and `dir` lies below the root; otherwise
    /// unchanged. The transaction uses it so a command started from a subdirectory works there.
    pub fn starting_in(mut self, dir: PathBuf) -> Self {
        let spec = &self.spec;
        if self.command.cwd == spec.workdir
            && spec.workdir == spec.root
            && dir.starts_with(&spec.root)
        {
            self.command.cwd = dir;
        }
        self
    }

    /// The backend's plan, when this launch was prepared by that backend with a plan of type `P`.
    pub fn plan<P: Any>(&self) -> Option<&P> {
        self.plan.downcast_ref::<P>()
    }

    /// Like [`PreparedLaunch::plan`], refusing a launch another backend (or another plan type)
    /// prepared.
    pub fn plan_for<P: Any>(&self, backend: &'static str) -> Result<&P, BackendError> {
        match self.plan::<P>() {
            Some(p) if self.backend == backend => Ok(p),
            _ => Err(BackendError::InvalidRequest {
                backend: backend.into(),
                message: format!(
                    "this launch was prepared by `{}`, not by `{backend}`; prepare it with the \
                     backend that launches it",
                    self.backend
                ),
            }),
        }
    }

    pub fn command(&self) -> &LaunchCommand {
        &self.command
    }
    pub fn program(&self) -> &OsString {
        &self.command.program
    }
    pub fn args(&self) -> &[OsString] {
        &self.command.args
    }
    pub fn env(&self) -> &[(OsString, OsString)] {
        &self.command.env
    }
    pub fn cwd(&self) -> &PathBuf {
        &self.command.cwd
    }
    pub fn enforcement(&self) -> Enforcement {
        self.enforcement
    }
    pub fn runtime_config(&self) -> &serde_json::Value {
        &self.runtime_config
    }
    /// The request this was prepared from.
    pub fn spec(&self) -> &LaunchSpec {
        &self.spec
    }
    /// Id of the backend that prepared it.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Program followed by its arguments.
    pub fn full_argv(&self) -> Vec<OsString> {
        let mut argv = Vec::with_capacity(self.command.args.len() + 1);
        argv.push(self.command.program.clone());
        argv.extend(self.command.args.iter().cloned());
        argv
    }

    /// The wrapper's full argv (program first) when the command is wrapped; redacted before it is
    /// stored.
    pub fn wrapper_argv(&self) -> Option<Vec<OsString>> {
        self.wrapped.then(|| self.full_argv())
    }
}

/// Run-time context for a launch.
#[derive(Debug, Clone)]
pub struct LaunchContext {
    pub stdio: StdioMode,
    /// Becomes `Some(signal)` when agentdiff itself receives SIGINT/SIGTERM: the backend ends the
    /// command, cleans up and still returns evidence.
    pub interrupt: tokio::sync::watch::Receiver<Option<i32>>,
    /// When set, a root process that has exited stays unreaped (a zombie) until the gate opens.
    pub hold_reap: Option<ReapGate>,
    /// Start held: a backend that [`crate::RuntimeBackend::holds_start`] sets up its
    /// wrapper but lets nothing of the command run until
    /// [`crate::RunningCommand::release`]; the deadline counts from the release. Other
    /// backends are never launched with it.
    pub hold_start: bool,
}

impl LaunchContext {
    /// A context with no interruption source (tests, probes).
    pub fn new(stdio: StdioMode) -> Self {
        let (_tx, rx) = tokio::sync::watch::channel(None);
        Self {
            stdio,
            interrupt: rx,
            hold_reap: None,
            hold_start: false,
        }
    }
}

/// Holds back the reaping of a launched command's root process until it opens. The plugin side
/// of the external backend protocol keeps an exited command a zombie until agentdiff has checked
/// the identity it reported (`ack`): a reaped pid could be reused before the check.
///
/// Invariant: the gate only ever goes from closed to open, and dropping its
/// [`ReapGateOpener`] opens it, so no path of the opener's owner can hold a run forever.
#[derive(Debug, Clone)]
pub struct ReapGate(Arc<(Mutex<bool>, Condvar)>);

/// The one handle that opens a [`ReapGate`].
#[derive(Debug)]
pub struct ReapGateOpener(Arc<(Mutex<bool>, Condvar)>);

impl ReapGate {
    /// A closed gate and its opener.
    pub fn closed() -> (ReapGateOpener, ReapGate) {
        let shared = Arc::new((Mutex::new(false), Condvar::new()));
        (ReapGateOpener(shared.clone()), ReapGate(shared))
    }

    pub fn is_open(&self) -> bool {
        *self.0 .0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wait until the gate opens, at most `limit`; whether it opened.
    pub fn wait_open(&self, limit: Duration) -> bool {
        let (lock, opened) = &*self.0;
        let guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
        let (guard, _) = opened
            .wait_timeout_while(guard, limit, |open| !*open)
            .unwrap_or_else(PoisonError::into_inner);
        *guard
    }
}

impl ReapGateOpener {
    pub fn open(self) {
        // Dropping opens.
    }
}

impl Drop for ReapGateOpener {
    fn drop(&mut self) {
        let (lock, opened) = &*self.0;
        *lock.lock().unwrap_or_else(PoisonError::into_inner) = true;
        opened.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reap_gate_opens_once_and_when_its_opener_is_dropped() {
        let (opener, gate) = ReapGate::closed();
        assert!(!gate.is_open());
        assert!(!gate.wait_open(Duration::from_millis(20)));
        let waiter = {
            let gate = gate.clone();
            std::thread::spawn(move || gate.wait_open(Duration::from_secs(30)))
        };
        opener.open();
        assert!(waiter.join().unwrap());
        assert!(gate.is_open());
        let (opener, gate) = ReapGate::closed();
        drop(opener);
        assert!(gate.wait_open(Duration::ZERO));
    }

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
