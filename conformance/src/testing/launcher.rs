//! A small, self-contained launcher used by the suite's own test backends: direct child in its
//! own process group, descendants tracked by a per-run marker variable in their environment
//! (inherited through forks and daemonisation), deadline and leftovers ended with identity-checked
//! pidfd signals.
//!
//! It exists so the suite can be validated without any production backend; it is deliberately
//! simple and labelled as such in evidence (`tracking: env_marker_proc_scan`).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::process::Stdio;
use std::time::{Duration, Instant};

use agentdiff_backend_api::{
    BackendError, BoxFuture, Capabilities, CleanupMechanism, CleanupOutcome, CleanupRecord,
    CleanupReport, Enforcement, EnvironmentEvidence, ExitInfo, LaunchContext, PortEvidence,
    PreparedLaunch, ProcessIdentity, ProcessRecord, ProcessRelation, RunEvidence, RunningCommand,
    StdioMode,
};

use crate::host::{self, SignalResult};

/// Name of the marker variable the launcher adds to the command's environment.
pub const MARKER_VAR: &str = "AGENTDIFF_CONFORMANCE_TRACK";

const SIGTERM: i32 = 15;
const SIGKILL: i32 = 9;

fn launch_error(backend: &str, message: impl Into<String>) -> BackendError {
    BackendError::Launch {
        backend: backend.to_string(),
        message: message.into(),
    }
}

fn open_stdio(ctx: &LaunchContext, backend: &str) -> Result<(Stdio, Stdio, Stdio), BackendError> {
    match &ctx.stdio {
        StdioMode::Inherit => Ok((Stdio::inherit(), Stdio::inherit(), Stdio::inherit())),
        StdioMode::StdoutToStderr => Ok((
            Stdio::inherit(),
            Stdio::from(std::io::stderr()),
            Stdio::inherit(),
        )),
        StdioMode::Files {
            stdin,
            stdout,
            stderr,
        } => {
            let sin =
                match stdin {
                    Some(p) => Stdio::from(std::fs::File::open(p).map_err(|e| {
                        launch_error(backend, format!("stdin {}: {e}", p.display()))
                    })?),
                    None => Stdio::null(),
                };
            let sout = std::fs::File::create(stdout)
                .map_err(|e| launch_error(backend, format!("stdout {}: {e}", stdout.display())))?;
            let serr = std::fs::File::create(stderr)
                .map_err(|e| launch_error(backend, format!("stderr {}: {e}", stderr.display())))?;
            Ok((sin, Stdio::from(sout), Stdio::from(serr)))
        }
    }
}

/// Labels a backend puts on the evidence.
#[derive(Debug, Clone)]
pub struct Labels {
    pub backend: &'static str,
    pub enforcement: Enforcement,
    pub capabilities: Capabilities,
    /// Relay streams that are not a terminal or a pipe, as the supervisor does for a backend
    /// that claims filesystem confinement (`agentdiff_process::stdio_relay`).
    pub relay_stdio: bool,
}

/// Start `prepared` and return a handle whose `wait` yields evidence.
pub fn spawn(
    prepared: PreparedLaunch,
    ctx: LaunchContext,
    labels: Labels,
) -> Result<Box<dyn RunningCommand>, BackendError> {
    let backend = labels.backend;
    let token = host::random_token();
    let (sin, sout, serr, relays) = if labels.relay_stdio {
        relayed_stdio(&ctx, backend)?
    } else {
        let (i, o, e) = open_stdio(&ctx, backend)?;
        (i, o, e, agentdiff_process::stdio_relay::Relays::default())
    };
    let mut cmd = std::process::Command::new(prepared.program());
    cmd.args(prepared.args())
        .env_clear()
        .envs(prepared.env().iter().map(|(k, v)| (k, v)))
        .env(MARKER_VAR, &token)
        .current_dir(prepared.cwd())
        .stdin(sin)
        .stdout(sout)
        .stderr(serr);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    let mut tcmd = tokio::process::Command::from(cmd);
    tcmd.kill_on_drop(false);
    let started = Instant::now();
    let child = tcmd.spawn().map_err(|e| {
        launch_error(
            backend,
            format!("{}: {e}", prepared.program().to_string_lossy()),
        )
    })?;
    let root = child.id().and_then(host::identity_of);
    Ok(Box::new(Running {
        child,
        root,
        token,
        prepared,
        ctx,
        labels,
        started,
        relays,
    }))
}

/// The streams of `ctx` as the supervisor hands them to a confined command.
fn relayed_stdio(
    ctx: &LaunchContext,
    backend: &str,
) -> Result<(Stdio, Stdio, Stdio, agentdiff_process::stdio_relay::Relays), BackendError> {
    let fds = agentdiff_process::stdio_relay::open_stdio(&ctx.stdio)
        .map_err(|e| launch_error(backend, e.to_string()))?;
    let (fds, relays) = agentdiff_process::stdio_relay::relay_stdio(fds)
        .map_err(|e| launch_error(backend, e.to_string()))?;
    let [i, o, e] = fds;
    let pick = |fd: Option<std::os::fd::OwnedFd>| fd.map_or_else(Stdio::inherit, Stdio::from);
    Ok((pick(i), pick(o), pick(e), relays))
}

struct Running {
    child: tokio::process::Child,
    root: Option<ProcessIdentity>,
    token: String,
    prepared: PreparedLaunch,
    ctx: LaunchContext,
    labels: Labels,
    started: Instant,
    relays: agentdiff_process::stdio_relay::Relays,
}

struct Tracker {
    root_pid: Option<u32>,
    seen: BTreeMap<ProcessIdentity, ProcessRecord>,
    started: Instant,
}

impl Tracker {
    fn scan(&mut self, entry: &str) -> Vec<ProcessIdentity> {
        let live = host::find_by_environ(entry);
        let known: Vec<u32> = self.seen.keys().map(|i| i.pid).collect();
        for id in &live {
            if self.seen.contains_key(id) {
                continue;
            }
            let st = host::stat(id.pid);
            let ppid = st.as_ref().map(|s| s.ppid).unwrap_or(0);
            let relation = if Some(id.pid) == self.root_pid {
                ProcessRelation::Root
            } else if known.contains(&ppid) || live.iter().any(|l| l.pid == ppid) {
                ProcessRelation::Descendant
            } else {
                ProcessRelation::Reparented
            };
            self.seen.insert(
                id.clone(),
                ProcessRecord {
                    identity: id.clone(),
                    ppid,
                    relation,
                    executable: st.map(|s| s.comm).unwrap_or_default(),
                    first_seen_ms: self.started.elapsed().as_millis() as u64,
                    alive_after_root_exit: false,
                    left_run_cgroup: None,
                },
            );
        }
        live
    }
}

/// TERM, grace, KILL each identity; every signal is identity-checked.
async fn end_all(ids: &[ProcessIdentity], grace: Duration) -> Vec<CleanupRecord> {
    let mut records = Vec::new();
    let mut termed = Vec::new();
    for id in ids {
        match host::signal_identity(id, SIGTERM) {
            Ok(SignalResult::Sent) => termed.push(id.clone()),
            Ok(SignalResult::Gone) => records.push(record(id, CleanupOutcome::AlreadyExited, None)),
            Ok(SignalResult::Mismatch) => records.push(record(id, CleanupOutcome::PidReused, None)),
            Err(e) => records.push(record(
                id,
                CleanupOutcome::AccessDenied,
                Some(e.to_string()),
            )),
        }
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && termed.iter().any(host::is_alive) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for id in termed {
        if !host::is_alive(&id) {
            records.push(record(&id, CleanupOutcome::Terminated, None));
            continue;
        }
        let outcome = match host::signal_identity(&id, SIGKILL) {
            Ok(SignalResult::Sent) | Ok(SignalResult::Gone) => CleanupOutcome::Killed,
            Ok(SignalResult::Mismatch) => CleanupOutcome::PidReused,
            Err(_) => CleanupOutcome::Escaped,
        };
        records.push(record(&id, outcome, None));
    }
    records
}

fn record(id: &ProcessIdentity, outcome: CleanupOutcome, detail: Option<String>) -> CleanupRecord {
    CleanupRecord {
        identity: id.clone(),
        executable: host::stat(id.pid).map(|s| s.comm).unwrap_or_default(),
        outcome,
        detail,
    }
}

/// Cleanup of identities recorded by an earlier run.
pub async fn cleanup_identities(ids: &[ProcessIdentity], grace: Duration) -> CleanupReport {
    CleanupReport {
        mechanism: CleanupMechanism::Pidfd,
        grace_ms: grace.as_millis() as u64,
        records: end_all(ids, grace).await,
        errors: Vec::new(),
        resources_removed: Vec::new(),
    }
}

impl RunningCommand for Running {
    fn pid(&self) -> Option<u32> {
        self.root.as_ref().map(|r| r.pid)
    }

    fn wait(self: Box<Self>) -> BoxFuture<'static, Result<RunEvidence, BackendError>> {
        Box::pin(async move {
            let Running {
                mut child,
                root,
                token,
                prepared,
                mut ctx,
                labels,
                started,
                mut relays,
            } = *self;
            let spec = prepared.spec();
            let entry = format!("{MARKER_VAR}={token}");
            let mut tracker = Tracker {
                root_pid: root.as_ref().map(|r| r.pid),
                seen: BTreeMap::new(),
                started,
            };
            if let Some(r) = &root {
                tracker.scan(&entry);
                tracker
                    .seen
                    .entry(r.clone())
                    .or_insert_with(|| ProcessRecord {
                        identity: r.clone(),
                        ppid: std::process::id(),
                        relation: ProcessRelation::Root,
                        executable: host::stat(r.pid).map(|s| s.comm).unwrap_or_default(),
                        first_seen_ms: 0,
                        alive_after_root_exit: false,
                        left_run_cgroup: None,
                    });
            }
            let poll = spec.poll_interval.max(Duration::from_millis(10));
            let deadline = spec.timeout.map(|t| started + t);
            let mut timed_out = false;
            let mut interrupted_by = None;
            let mut cleanup_records = Vec::new();
            let status = loop {
                let sleep_for = match deadline {
                    Some(d) => poll.min(d.saturating_duration_since(Instant::now())),
                    None => poll,
                };
                tokio::select! {
                    status = child.wait() => break status,
                    _ = tokio::time::sleep(sleep_for) => {
                        tracker.scan(&entry);
                        if deadline.is_some_and(|d| Instant::now() >= d) {
                            timed_out = true;
                        }
                    }
                    changed = ctx.interrupt.changed() => {
                        if changed.is_ok() {
                            interrupted_by = *ctx.interrupt.borrow();
                        }
                    }
                }
                if timed_out || interrupted_by.is_some() {
                    let live = tracker.scan(&entry);
                    cleanup_records.extend(end_all(&live, spec.grace).await);
                    break child.wait().await;
                }
            };
            let status = status.map_err(|e| BackendError::Runtime {
                backend: labels.backend.to_string(),
                message: format!("waiting for the command: {e}"),
            })?;
            // Leftovers: anything of the tree still alive once the root has exited.
            let leftovers = tracker.scan(&entry);
            for id in &leftovers {
                if let Some(r) = tracker.seen.get_mut(id) {
                    r.alive_after_root_exit = true;
                }
            }
            cleanup_records.extend(end_all(&leftovers, spec.grace).await);
            // A second sweep catches processes forked while the first sweep ran.
            let late = tracker.scan(&entry);
            cleanup_records.extend(end_all(&late, spec.grace).await);

            let (code, signal) = exit_parts(&status);
            let environment = EnvironmentEvidence {
                mode: agentdiff_backend_api::environment::EnvMode::Inherit,
                variables: prepared
                    .env()
                    .iter()
                    .map(|(k, v)| {
                        let name = k.to_string_lossy().into_owned();
                        let fp = agentdiff_host::redact::fingerprint(&name, v.as_encoded_bytes());
                        (name, fp)
                    })
                    .collect(),
                dropped: Vec::new(),
            };
            Ok(RunEvidence {
                backend: labels.backend.to_string(),
                enforcement: labels.enforcement,
                capabilities: labels.capabilities,
                exit: ExitInfo {
                    code,
                    signal,
                    timed_out,
                    interrupted_by,
                    duration_ms: started.elapsed().as_millis() as u64,
                },
                failure: None,
                tracking: agentdiff_backend_api::Tracking::EnvMarkerProcScan,
                processes: tracker.seen.into_values().collect(),
                cleanup: CleanupReport {
                    mechanism: CleanupMechanism::Pidfd,
                    grace_ms: spec.grace.as_millis() as u64,
                    records: cleanup_records,
                    errors: Vec::new(),
                    resources_removed: Vec::new(),
                },
                ports: PortEvidence {
                    mode: agentdiff_backend_api::PortMode::Off,
                    note: "listening sockets are not observed by this backend".into(),
                    ..PortEvidence::default()
                },
                wrapper_argv: prepared
                    .wrapper_argv()
                    .as_ref()
                    .map(|w| w.iter().map(|a| a.to_string_lossy().into_owned()).collect()),
                wrapper: None,
                runtime_config: prepared.runtime_config().clone(),
                observation_root: prepared.cwd().display().to_string(),
                environment: Some(environment),
                execs: Default::default(),
                containers: None,
                stdio_relayed: {
                    relays.drain();
                    relays.names()
                },
                warnings: Vec::new(),
            })
        })
    }
}

fn exit_parts(status: &std::process::ExitStatus) -> (Option<i32>, Option<i32>) {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        (status.code(), status.signal())
    }
    #[cfg(not(unix))]
    {
        (status.code(), None)
    }
}

/// The OS strings of an argv, for evidence.
pub fn os_vec<S: AsRef<std::ffi::OsStr>>(items: &[S]) -> Vec<OsString> {
    items.iter().map(|s| s.as_ref().to_os_string()).collect()
}
