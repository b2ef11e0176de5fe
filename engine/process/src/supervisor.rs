//! The supervisor every backend uses for its host-side process: launch the prepared argv directly
//! (no shell) in its own process group, track descendants, enforce the deadline, honour
//! interruption, hand the terminal over for interactive runs, observe listening sockets, clean up
//! leftovers by verified identity, and report [`RunEvidence`].
//!
//! The monitor is one OS thread per run. Each tick waits on the root's pidfd (so the root's exit is
//! seen at once) for at most the poll interval, then runs one tracking pass.

use std::ffi::OsString;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::ProcessError;
use agentdiff_backend_api::{
    BackendError, BoxFuture, Capabilities, Enforcement, LaunchContext, LaunchFacts, PreparedLaunch,
    RunEvidence, RunningCommand, Tracking,
};

/// The longest an exited root waits for its [`agentdiff_backend_api::ReapGate`]: the gate opens within
/// milliseconds in practice, and a run is never held forever by one that does not.
pub const MAX_REAP_HOLD: Duration = Duration::from_secs(60);
/// Default poll interval when the spec asks for zero.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(10);
/// How often listening sockets are sampled while the command runs. A sock_diag snapshot costs
/// tens of microseconds, so sampling this often is cheap and catches short-lived listeners while
/// their owner is still alive to be attributed.
pub const PORT_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

/// The labels a backend puts on the evidence of a supervised run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvidenceLabels {
    /// Backend id.
    pub backend: String,
    pub enforcement: Enforcement,
    pub capabilities: Capabilities,
}

/// A command running under the supervisor. Implements [`RunningCommand`]; `wait` returns the
/// evidence once the command has ended and its leftovers were cleaned up.
#[derive(Debug)]
pub struct SupervisedCommand {
    pid: u32,
    backend: String,
    facts: LaunchFacts,
    result: tokio::sync::oneshot::Receiver<Result<RunEvidence, ProcessError>>,
    /// When the command was let start: set at the spawn, or at [`SupervisedCommand::release`]
    /// for a held launch. The deadline and the recorded duration count from it.
    released: Arc<OnceLock<Instant>>,
    /// A held launch in a terminal: the foreground is handed over at the release.
    foreground_at_release: bool,
    /// agentdiff's interruption: a held launch is not released once it is set.
    interrupt: tokio::sync::watch::Receiver<Option<i32>>,
}

impl SupervisedCommand {
    /// Host pid of the launched process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A held launch ([`LaunchContext::hold_start`]) may start now: the terminal goes to its
    /// process group and the deadline starts. The caller lets the command itself go (the start
    /// gate) only when this returns `true`, so the command never runs without the terminal or
    /// the deadline. `false` once agentdiff was interrupted: the monitor is ending the held
    /// launch, and the command must not start.
    #[cfg(unix)]
    pub fn release(&mut self) -> bool {
        if self.released.get().is_some() {
            // Not held (or released already): the command has been let go.
            return true;
        }
        if self.interrupt.borrow().is_some() {
            return false;
        }
        if std::mem::take(&mut self.foreground_at_release) {
            crate::terminal::give_foreground(self.pid as libc::pid_t);
        }
        let _ = self.released.set(Instant::now());
        true
    }

    /// End a held launch that will not be released: its process group is killed (bwrap's
    /// sandbox dies with it); the monitor reaps it and ends what is left.
    #[cfg(unix)]
    pub fn abort(&self) {
        // SAFETY: kill(2) on our own child's process group.
        unsafe { libc::kill(-(self.pid as libc::pid_t), libc::SIGKILL) };
    }

    /// Wait without an async runtime (probes, harnesses). Must not be called from async code.
    pub fn wait_blocking(self) -> Result<RunEvidence, ProcessError> {
        self.result.blocking_recv().map_err(|_| {
            ProcessError::Unsupported("the process monitor stopped without a result".into())
        })?
    }
}

impl RunningCommand for SupervisedCommand {
    fn pid(&self) -> Option<u32> {
        Some(self.pid)
    }

    fn launch_facts(&self) -> LaunchFacts {
        self.facts.clone()
    }

    fn wait(self: Box<Self>) -> BoxFuture<'static, agentdiff_backend_api::Result<RunEvidence>> {
        Box::pin(async move {
            let backend = self.backend.clone();
            match self.result.await {
                Ok(Ok(ev)) => Ok(ev),
                Ok(Err(e)) => Err(BackendError::Runtime {
                    backend,
                    message: e.to_string(),
                }),
                Err(_) => Err(BackendError::Runtime {
                    backend,
                    message: "the process monitor stopped without a result".into(),
                }),
            }
        })
    }
}

/// How the wait loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Exited,
    TimedOut,
    Interrupted(i32),
    /// The root could not be waited for (someone else reaped it).
    Lost,
}

fn lossy(v: &[OsString]) -> Vec<String> {
    v.iter().map(|s| s.to_string_lossy().into_owned()).collect()
}

#[cfg(unix)]
pub use unix::spawn_supervised;

#[cfg(unix)]
mod unix {
    use std::os::fd::OwnedFd;
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    use super::*;
    use crate::cleanup::{cleanup_targets, CleanupOptions, CleanupTarget};
    use crate::containers;
    use crate::exec_log::{ExecObserver, ExecRequest};
    use crate::ports::{off_evidence, PortObserver};
    use crate::terminal::{self, Terminal};
    use crate::tracker::{self, Tracker, TrackingRequest};
    use agentdiff_backend_api::{CleanupReport, ExitInfo, StdioMode};

    /// Replacement descriptors for the child's fds 0, 1, 2 (`None` = inherit).
    fn stdio_fds(ctx: &LaunchContext) -> Result<[Option<OwnedFd>; 3], ProcessError> {
        crate::stdio_relay::open_stdio(&ctx.stdio).map_err(ProcessError::from)
    }

    /// A backend that keeps the command off the host's files must not hand it one as a stream
    /// either: `/proc/self/fd/N` would reopen it (see `stdio_relay`).
    fn relayed_stdio(
        labels: &EvidenceLabels,
        stdio: [Option<OwnedFd>; 3],
    ) -> Result<([Option<OwnedFd>; 3], crate::stdio_relay::Relays), ProcessError> {
        let caps = &labels.capabilities;
        let confined =
            caps.filesystem_writes >= agentdiff_backend_api::Level::Requested || caps.sandboxed;
        if !confined {
            return Ok((stdio, crate::stdio_relay::Relays::default()));
        }
        Ok(crate::stdio_relay::relay_stdio(stdio)?)
    }

    /// fork + exec through std, joining the run cgroup (if any) between the two.
    fn std_spawn(
        prepared: &PreparedLaunch,
        stdio: [Option<OwnedFd>; 3],
        cgroup_fd: Option<i32>,
        foreground: bool,
    ) -> Result<(u32, Option<OwnedFd>), ProcessError> {
        let mut cmd = Command::new(prepared.program());
        cmd.args(prepared.args())
            .env_clear()
            .envs(prepared.env().iter().map(|(k, v)| (k, v)))
            .current_dir(prepared.cwd())
            .process_group(0);
        let [i, o, e] = stdio;
        let pick = |fd: Option<OwnedFd>| fd.map_or_else(Stdio::inherit, Stdio::from);
        cmd.stdin(pick(i)).stdout(pick(o)).stderr(pick(e));
        // SAFETY: the closure only makes async-signal-safe calls (write, sigprocmask,
        // tcsetpgrp, getpgrp) in the single-threaded child.
        unsafe {
            cmd.pre_exec(move || {
                #[cfg(target_os = "linux")]
                if let Some(fd) = cgroup_fd {
                    // Failure is detected by the parent (membership check) and reported.
                    let _ = crate::cgroup::join_in_child(fd);
                }
                #[cfg(not(target_os = "linux"))]
                let _ = cgroup_fd;
                if foreground {
                    let _ = terminal::child_take_foreground();
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|source| ProcessError::Spawn {
            program: prepared.program().to_string_lossy().into_owned(),
            source,
        })?;
        let pid = child.id();
        // std does not reap on drop; the monitor reaps the root itself with waitpid.
        drop(child);
        #[cfg(target_os = "linux")]
        let pidfd = crate::cleanup::pidfd_open(pid).ok();
        #[cfg(not(target_os = "linux"))]
        let pidfd = None;
        Ok((pid, pidfd))
    }

    /// The tracking and exec-events mechanisms the options ask for.
    fn requests(
        spec: &agentdiff_backend_api::LaunchSpec,
    ) -> Result<(TrackingRequest, ExecRequest), ProcessError> {
        let tracking = match spec.options.get("tracking") {
            None => TrackingRequest::Auto,
            Some(s) => TrackingRequest::parse(s).ok_or_else(|| {
                ProcessError::Unsupported(format!(
                    "unknown tracking mechanism `{s}`; use auto, cgroup, proc_poll or proc_scan"
                ))
            })?,
        };
        let exec = match spec.options.get("exec-events") {
            None => ExecRequest::Auto,
            Some(s) => ExecRequest::parse(s).ok_or_else(|| {
                ProcessError::Unsupported(format!(
                    "unknown exec-events mechanism `{s}`; use auto, cn_proc or proc_poll"
                ))
            })?,
        };
        Ok((tracking, exec))
    }

    /// Launch `prepared` under supervision. Returns once the process runs (or failed to start).
    pub fn spawn_supervised(
        prepared: PreparedLaunch,
        ctx: LaunchContext,
        labels: EvidenceLabels,
    ) -> Result<SupervisedCommand, ProcessError> {
        let spec = prepared.spec();
        let (request, exec_request) = requests(spec)?;
        // Everything that can fail before the spawn comes before the run cgroup exists.
        let stdio = stdio_fds(&ctx)?;
        let (stdio, relays) = relayed_stdio(&labels, stdio)?;
        // Subscribed before the spawn, so the root's own exec is seen.
        let (exec, exec_warning) = ExecObserver::start(exec_request)?;
        let ports = spec.observe_ports.then(PortObserver::start);
        let (cgroup, reservation, mut warnings) = tracker::prepare(request)?;
        warnings.extend(exec_warning);
        let container_watch = containers::ContainerWatch::start(
            containers::now_ns(),
            prepared.env(),
            prepared.engine_reach(),
        );

        let interactive = matches!(ctx.stdio, StdioMode::Inherit | StdioMode::StdoutToStderr);
        let terminal = if interactive {
            Terminal::acquire()
        } else {
            None
        };

        let hold = ctx.hold_start;
        // A held launch gets the terminal only when it is released.
        let foreground = terminal.is_some() && !hold;
        let foreground_at_release = terminal.is_some() && hold;
        let launched = Instant::now();
        let released = Arc::new(OnceLock::new());
        if !hold {
            let _ = released.set(launched);
        }
        #[cfg(target_os = "linux")]
        let spawned = match &cgroup {
            Some(cg) => {
                let req = crate::spawn::SpawnRequest {
                    program: prepared.program(),
                    args: prepared.args(),
                    env: prepared.env(),
                    cwd: prepared.cwd(),
                    stdio: &stdio,
                    foreground,
                };
                match crate::spawn::spawn_into_cgroup(req, cg.dir_fd()) {
                    Ok((pid, fd)) => Ok((pid, Some(fd))),
                    Err(crate::spawn::SpawnError::Failed(e)) => Err(e),
                    Err(crate::spawn::SpawnError::Unsupported(e)) => {
                        warnings.push(format!(
                            "clone3 into the run cgroup is unavailable ({e}); the command joins \
                             the cgroup after fork instead"
                        ));
                        std_spawn(&prepared, stdio, Some(cg.procs_write_fd()), foreground)
                    }
                }
            }
            None => std_spawn(&prepared, stdio, None, foreground),
        };
        #[cfg(not(target_os = "linux"))]
        let spawned = std_spawn(&prepared, stdio, None, foreground);
        let (pid, pidfd) = match spawned {
            Ok(s) => s,
            Err(e) => {
                #[cfg(target_os = "linux")]
                if let Some(cg) = cgroup {
                    let _ = cg.remove();
                }
                return Err(e);
            }
        };
        if let Some(t) = terminal.as_ref().filter(|_| foreground) {
            // Also from the parent, as shells do, so neither side races the other.
            t.give_to(pid as libc::pid_t);
        }
        exec.set_root(pid, launched);
        // What `agentdiff cleanup` needs if this process dies before writing evidence.
        #[cfg(target_os = "linux")]
        let cgroup_path = cgroup.as_ref().map(|c| c.path().display().to_string());
        #[cfg(not(target_os = "linux"))]
        let cgroup_path: Option<String> = None;
        let facts = LaunchFacts {
            pid: Some(pid),
            root: crate::read_identity(pid).ok(),
            cgroup: cgroup_path,
            monitor: None,
            resources: None,
        };
        #[allow(unused_mut)]
        let mut tracker = Tracker::new(pid, launched, cgroup, reservation);
        #[cfg(target_os = "linux")]
        if request == TrackingRequest::ProcScan {
            tracker.force_scan();
        }
        if tracker.mechanism() != Tracking::Cgroup && request == TrackingRequest::Cgroup {
            warnings.push(
                "cgroup tracking was requested but the command did not join the run cgroup".into(),
            );
        }

        let (tx, rx) = tokio::sync::oneshot::channel();
        let backend = labels.backend.clone();
        let interrupt = ctx.interrupt.clone();
        let monitor = Monitor {
            pid,
            launched,
            released: released.clone(),
            prepared,
            ctx,
            labels,
            tracker,
            ports,
            terminal,
            warnings,
            pidfd,
            exec,
            containers: Some(container_watch),
            relays,
        };
        let spawned = std::thread::Builder::new()
            .name("agentdiff-monitor".into())
            .spawn(move || {
                let _ = tx.send(monitor.run());
            });
        if let Err(e) = spawned {
            // Without a monitor nobody would end or reap the command.
            // SAFETY: kill(2) on our own unreaped child.
            unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
            return Err(ProcessError::io("a monitor thread", e));
        }
        Ok(SupervisedCommand {
            pid,
            backend,
            facts,
            result: rx,
            released,
            foreground_at_release,
            interrupt,
        })
    }

    struct Monitor {
        pid: u32,
        launched: Instant,
        /// See [`SupervisedCommand::released`].
        released: Arc<OnceLock<Instant>>,
        prepared: PreparedLaunch,
        ctx: LaunchContext,
        labels: EvidenceLabels,
        tracker: Tracker,
        ports: Option<PortObserver>,
        terminal: Option<Terminal>,
        warnings: Vec<String>,
        pidfd: Option<OwnedFd>,
        exec: ExecObserver,
        containers: Option<containers::ContainerWatch>,
        /// The command's streams agentdiff relays (see `stdio_relay`).
        relays: crate::stdio_relay::Relays,
    }

    /// waitpid(pid, WNOHANG|WUNTRACED): Ok(None) while running, Ok(Some(status)) on an event.
    fn poll_status(pid: u32) -> std::io::Result<Option<i32>> {
        let mut status = 0;
        // SAFETY: waitpid on our own child with a local status word.
        let rc = unsafe {
            libc::waitpid(
                pid as libc::pid_t,
                &mut status,
                libc::WNOHANG | libc::WUNTRACED,
            )
        };
        match rc {
            0 => Ok(None),
            r if r > 0 => Ok(Some(status)),
            _ => Err(std::io::Error::last_os_error()),
        }
    }

    /// Whether our child `pid` has exited, leaving it unreaped (waitid with WNOWAIT).
    fn exited_unreaped(pid: u32) -> std::io::Result<bool> {
        // SAFETY: an all-zero siginfo_t is a valid value; waitid fills it or leaves si_pid 0.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on our own child with a local siginfo; WNOWAIT leaves it waitable.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: si_pid is the field waitid sets for a child event.
        Ok(unsafe { info.si_pid() } != 0)
    }

    impl Monitor {
        fn run(mut self) -> Result<RunEvidence, ProcessError> {
            let spec = self.prepared.spec();
            let interval = if spec.poll_interval.is_zero() {
                DEFAULT_POLL_INTERVAL
            } else {
                spec.poll_interval
            };
            let timeout = spec.timeout;
            let grace = spec.grace;
            let pidfd = self.pidfd.take();
            let mut status: Option<i32> = None;
            let mut errors: Vec<String> = Vec::new();

            let end = self.watch(pidfd.as_ref(), interval, timeout, &mut status, &mut errors);
            // A held launch withheld because agentdiff was interrupted (the wrapper gave up at
            // the start gate) ended by that interruption, however the race with this loop went.
            let end = match (end, self.released.get(), *self.ctx.interrupt.borrow()) {
                (End::Exited, None, Some(sig)) => End::Interrupted(sig),
                (end, ..) => end,
            };
            let duration = self.released.get().unwrap_or(&self.launched).elapsed();

            // Leftovers: the root's children have been re-parented to us by now.
            let container_evidence = self.sample_after_end(end);

            let mut cleanup = self.end_leftovers(grace, status.is_some());
            // Everything the command's processes wrote is copied out before the evidence.
            if !self.relays.drain() {
                self.warnings.push(
                    "a process still held the command's relayed output after cleanup; what it \
                     writes later is not shown"
                        .into(),
                );
            }

            // The root's status, when cleanup ended it.
            if status.is_none() && end != End::Lost {
                status = self.reap_root(&mut errors);
            }
            let container_evidence = container_evidence.map(containers::refresh_after_cleanup);
            let execs = self.exec.finish();
            Self::name_records(&mut self.tracker, &mut self.warnings, &execs, &mut cleanup);
            // Give the terminal back only after the command is gone.
            if let Some(t) = self.terminal.take() {
                drop(t);
            }

            let (code, signal) = match status {
                Some(st) if libc::WIFEXITED(st) => (Some(libc::WEXITSTATUS(st)), None),
                Some(st) if libc::WIFSIGNALED(st) => (None, Some(libc::WTERMSIG(st))),
                _ => (None, None),
            };
            let tracking = self.tracker.mechanism();
            let (processes, tracker_errors) = self.tracker.into_parts();
            self.warnings.extend(tracker_errors);
            self.warnings.extend(errors);

            let ports = match self.ports {
                Some(p) => p.finish(),
                None => off_evidence(),
            };
            let spec = self.prepared.spec();
            let environment = agentdiff_backend_api::environment::evidence_for_launch(
                self.prepared.env(),
                spec.env_plan.mode,
                &spec.env_plan.dropped,
            );
            Ok(RunEvidence {
                stdio_relayed: self.relays.names(),
                backend: self.labels.backend,
                enforcement: self.labels.enforcement,
                capabilities: self.labels.capabilities,
                exit: ExitInfo {
                    code,
                    signal,
                    timed_out: end == End::TimedOut,
                    interrupted_by: match end {
                        End::Interrupted(sig) => Some(sig),
                        _ => None,
                    },
                    duration_ms: duration.as_millis() as u64,
                },
                failure: None,
                tracking,
                processes,
                cleanup,
                ports,
                wrapper_argv: self.prepared.wrapper_argv().as_deref().map(lossy),
                wrapper: None,
                runtime_config: self.prepared.runtime_config().clone(),
                observation_root: spec.workdir.display().to_string(),
                environment: Some(environment),
                execs,
                containers: container_evidence,
                warnings: self.warnings,
            })
        }

        /// Sample until the root exits, the deadline passes or agentdiff is interrupted.
        fn watch(
            &mut self,
            pidfd: Option<&OwnedFd>,
            interval: Duration,
            timeout: Option<Duration>,
            status: &mut Option<i32>,
            errors: &mut Vec<String>,
        ) -> End {
            let mut last_ports = Instant::now();
            loop {
                match pidfd {
                    #[cfg(target_os = "linux")]
                    Some(fd) => {
                        crate::cleanup::pidfd_wait(fd, interval);
                    }
                    _ => std::thread::sleep(interval),
                }

                let status_now = if self.may_reap() {
                    poll_status(self.pid)
                } else {
                    Ok(None)
                };
                match status_now {
                    Ok(None) => {}
                    Ok(Some(st)) if libc::WIFSTOPPED(st) => {
                        if let Some(t) = &mut self.terminal {
                            // Ctrl-Z: stop with the command, as if it ran directly.
                            t.command_stopped();
                            terminal::stop_self();
                            t.command_continues(self.pid as libc::pid_t);
                            // SAFETY: continue our own child's process group.
                            unsafe { libc::kill(-(self.pid as libc::pid_t), libc::SIGCONT) };
                        }
                    }
                    Ok(Some(st)) => {
                        *status = Some(st);
                        return End::Exited;
                    }
                    Err(e) => {
                        errors.push(format!("waiting for the command failed: {e}"));
                        return End::Lost;
                    }
                }
                self.tracker.tick();
                if self.exec.polls() {
                    let at_ms = self.launched.elapsed().as_millis() as u64;
                    self.exec.poll(&self.tracker.live_identities(), at_ms);
                }
                if let Some(p) = &mut self.ports {
                    if last_ports.elapsed() >= PORT_SAMPLE_INTERVAL {
                        p.sample(&self.tracker.live_identities());
                        last_ports = Instant::now();
                    }
                }
                // A held command has no deadline yet: it has not been let start.
                let released = self.released.get();
                if timeout.is_some_and(|t| released.is_some_and(|r| r.elapsed() >= t)) {
                    return End::TimedOut;
                }
                if let Some(sig) = *self.ctx.interrupt.borrow() {
                    return End::Interrupted(sig);
                }
            }
        }

        /// The last samples before cleanup, while leftovers still run and hold their sockets;
        /// returns which containers run now, and whose monitors are ours.
        fn sample_after_end(&mut self, end: End) -> Option<containers::ContainerEvidence> {
            let settled = self.tracker.settle_launches();
            self.tracker.tick();
            drop(settled);
            if end == End::Exited {
                self.tracker.mark_alive_after_root_exit();
            }
            if self.exec.polls() {
                let at_ms = self.launched.elapsed().as_millis() as u64;
                self.exec.poll(&self.tracker.live_identities(), at_ms);
            }
            if let Some(p) = &mut self.ports {
                // Before cleanup, while leftovers still hold their sockets.
                p.sample(&self.tracker.live_identities());
            }
            // Before cleanup: which containers run now, and whose monitors are ours.
            let run_pids: Vec<u32> = self
                .tracker
                .records()
                .iter()
                .map(|r| r.identity.pid)
                .collect();
            self.containers.take().map(|w| w.observe(&run_pids))
        }

        /// End every process of the run still alive (in rounds, for processes started while
        /// cleaning up), then the run cgroup. `root_exited`: the root is not a target.
        fn end_leftovers(&mut self, grace: Duration, root_exited: bool) -> CleanupReport {
            let mut cleanup = CleanupReport {
                mechanism: if cfg!(target_os = "linux") {
                    agentdiff_backend_api::CleanupMechanism::Pidfd
                } else {
                    agentdiff_backend_api::CleanupMechanism::KillWithStartTimeCheck
                },
                grace_ms: grace.as_millis() as u64,
                records: Vec::new(),
                errors: Vec::new(),
                resources_removed: Vec::new(),
            };
            let mut opts = CleanupOptions::new(grace);
            opts.reap = true;
            opts.reap_except = Some(self.pid);
            for round in 0..5 {
                self.tracker.refresh_liveness();
                // Executables are re-read by cleanup after verification (a process may have
                // exec'd since it was first seen); the recorded name fills in otherwise.
                let targets: Vec<CleanupTarget> = self
                    .tracker
                    .live_identities()
                    .into_iter()
                    .filter(|(pid, _)| !root_exited || *pid != self.pid)
                    .map(|(_, identity)| CleanupTarget {
                        executable: String::new(),
                        identity,
                    })
                    .collect();
                if targets.is_empty() {
                    break;
                }
                if round == 4 {
                    cleanup.errors.push(format!(
                        "{} processes were still being started after four cleanup rounds",
                        targets.len()
                    ));
                }
                let r = cleanup_targets(&targets, &opts);
                cleanup.mechanism = r.mechanism;
                cleanup.records.extend(r.records);
                cleanup.errors.extend(r.errors);
                // Anything forked while we were cleaning up.
                self.tracker.tick();
            }

            #[cfg(target_os = "linux")]
            if let Some(cg) = self.tracker.take_cgroup() {
                let mut buf = String::new();
                let mut left = Vec::new();
                if cg.pids(&mut buf, &mut left).is_ok() && !left.is_empty() {
                    cleanup.errors.push(format!(
                        "{} processes were still in the run cgroup after cleanup; ended with cgroup.kill",
                        left.len()
                    ));
                    if let Err(e) = cg.kill_all() {
                        cleanup.errors.push(format!("cgroup.kill failed: {e}"));
                    }
                }
                for pid in left {
                    crate::cleanup::reap_child(pid);
                }
                let shown = cg.path().display().to_string();
                if let Err(e) = cg.remove() {
                    self.warnings
                        .push(format!("the run cgroup {shown} could not be removed: {e}"));
                }
            }

            cleanup
        }

        /// The root's status after cleanup ended it (waited for up to five seconds).
        /// Whether the root may be reaped now: always, unless the context holds reaping back
        /// and the gate is still closed. A root that has exited meanwhile is waited for at the
        /// gate (at most [`MAX_REAP_HOLD`]), so its zombie never makes the pidfd wait spin.
        fn may_reap(&self) -> bool {
            let Some(gate) = &self.ctx.hold_reap else {
                return true;
            };
            if gate.is_open() {
                return true;
            }
            match exited_unreaped(self.pid) {
                Ok(false) => false,
                Ok(true) => {
                    gate.wait_open(MAX_REAP_HOLD);
                    true
                }
                // waitpid reports the error.
                Err(_) => true,
            }
        }

        fn reap_root(&self, errors: &mut Vec<String>) -> Option<i32> {
            if let Some(gate) = &self.ctx.hold_reap {
                gate.wait_open(MAX_REAP_HOLD);
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match poll_status(self.pid) {
                    Ok(Some(st)) if !libc::WIFSTOPPED(st) => {
                        return Some(st);
                    }
                    Ok(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Ok(_) => {
                        errors.push("the command did not end after cleanup".into());
                        return None;
                    }
                    Err(e) => {
                        errors.push(format!("waiting for the command failed: {e}"));
                        return None;
                    }
                }
            }
        }

        /// Every record names what its process ran last.
        fn name_records(
            tracker: &mut Tracker,
            warnings: &mut Vec<String>,
            execs: &crate::exec_log::ExecEvidence,
            cleanup: &mut CleanupReport,
        ) {
            // Every record names what its process ran last (an exec after first sight, or during
            // cleanup, included); cleanup read the program at verification and falls back to the
            // tracker's name for a process that was already gone.
            let last = execs.last_programs();
            tracker.name_from_execs(&last);
            for rec in &mut cleanup.records {
                let id = &rec.identity;
                if let Some(name) = last.get(&(id.pid, id.start_time_ticks)) {
                    rec.executable.clone_from(name);
                } else if rec.executable.is_empty() {
                    if let Some(p) = tracker.records().iter().find(|p| p.identity == *id) {
                        rec.executable.clone_from(&p.executable);
                    }
                }
            }
            if execs.lost > 0 {
                warnings.push(format!(
                    "{} process-event overflows: the exec log is incomplete",
                    execs.lost
                ));
            }
        }
    }
}

#[cfg(test)]
#[cfg(target_os = "linux")]
mod tests {
    use std::ffi::OsString;
    use std::path::PathBuf;

    use super::*;
    use agentdiff_backend_api::{BackendOptions, LaunchCommand, LaunchSpec, Level, StdioMode};

    fn prepared(dir: &std::path::Path, argv: &[&str], options: BackendOptions) -> PreparedLaunch {
        prepared_script(dir, argv, options, "echo wrapped; exit 3", None)
    }

    /// A wrapper running `script` under `sh`, with this deadline.
    fn prepared_script(
        dir: &std::path::Path,
        argv: &[&str],
        options: BackendOptions,
        script: &str,
        timeout: Option<Duration>,
    ) -> PreparedLaunch {
        let spec = LaunchSpec {
            run_id: "unit".into(),
            root: dir.to_path_buf(),
            workdir: dir.to_path_buf(),
            capsule_dir: dir.join("capsule"),
            argv: argv.iter().map(OsString::from).collect(),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            env_plan: Default::default(),
            timeout,
            grace: Duration::from_millis(300),
            poll_interval: Duration::from_millis(5),
            observe_ports: false,
            options,
            deny_patterns: Vec::new(),
            git_dirs: Vec::new(),
            egress_proxy: None,
        };
        let command = LaunchCommand {
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
            env: spec.env.clone(),
            cwd: dir.to_path_buf(),
        };
        PreparedLaunch::new(
            "wrapper",
            &spec,
            command,
            Enforcement::ExternalSandboxRequested,
            (),
        )
        .wrapped()
        .with_runtime_config(serde_json::json!({"wrapper": "sh"}))
    }

    #[test]
    fn a_closed_reap_gate_keeps_an_exited_root_a_zombie_until_it_opens() {
        let dir = tempfile::tempdir().unwrap();
        let labels = EvidenceLabels {
            backend: "wrapper".into(),
            enforcement: Enforcement::ExternalSandboxRequested,
            capabilities: Capabilities::default(),
        };
        let (opener, gate) = agentdiff_backend_api::ReapGate::closed();
        let mut ctx = LaunchContext::new(StdioMode::Files {
            stdin: None,
            stdout: dir.path().join("out"),
            stderr: dir.path().join("err"),
        });
        ctx.hold_reap = Some(gate);
        let cmd = spawn_supervised(
            prepared(dir.path(), &["inner"], BackendOptions::new()),
            ctx,
            labels,
        )
        .unwrap();
        let pid = cmd.pid();
        // Wait for the root's exit (it shows as a zombie), however slow the machine; then wait
        // far longer than the monitor's 5 ms ticks: without the gate it would be reaped by now.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let stat = crate::read_stat(pid).expect("the exited root is still there");
            if stat.is_zombie() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never exited: {stat:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(300));
        let stat = crate::read_stat(pid).expect("the exited root is still there");
        assert!(stat.is_zombie(), "{stat:?}");
        opener.open();
        let ev = cmd.wait_blocking().unwrap();
        assert_eq!(ev.exit.code, Some(3));
        assert!(crate::read_stat(pid).is_err());
    }

    #[test]
    fn a_held_launchs_deadline_and_duration_count_from_its_release() {
        let dir = tempfile::tempdir().unwrap();
        let labels = EvidenceLabels {
            backend: "wrapper".into(),
            enforcement: Enforcement::ExternalSandboxRequested,
            capabilities: Capabilities::default(),
        };
        let mut ctx = LaunchContext::new(StdioMode::Files {
            stdin: None,
            stdout: dir.path().join("out"),
            stderr: dir.path().join("err"),
        });
        ctx.hold_start = true;
        // Held for 2 s (a long before-capture), then 1 s more of the command: 3 s in all, past
        // a 2.5 s deadline counted from the spawn, within one counted from the release (1.5 s
        // to spare for a loaded machine).
        let deadline = Some(Duration::from_millis(2500));
        let prepared = prepared_script(
            dir.path(),
            &["inner"],
            BackendOptions::new(),
            "sleep 3",
            deadline,
        );
        let mut cmd = spawn_supervised(prepared, ctx, labels).unwrap();
        std::thread::sleep(Duration::from_millis(2000));
        cmd.release();
        let ev = cmd.wait_blocking().unwrap();
        assert!(
            !ev.exit.timed_out,
            "the held time counted against the deadline"
        );
        assert_eq!(ev.exit.code, Some(0));
        assert!(ev.exit.duration_ms < 2500, "{}", ev.exit.duration_ms);
    }

    #[test]
    fn wrapping_backends_get_their_labels_and_wrapper_argv_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let caps = Capabilities {
            network: Level::Requested,
            ..Capabilities::default()
        };
        let labels = EvidenceLabels {
            backend: "wrapper".into(),
            enforcement: Enforcement::ExternalSandboxRequested,
            capabilities: caps.clone(),
        };
        let ctx = LaunchContext::new(StdioMode::Files {
            stdin: None,
            stdout: dir.path().join("out"),
            stderr: dir.path().join("err"),
        });
        let cmd = spawn_supervised(
            prepared(dir.path(), &["inner"], BackendOptions::new()),
            ctx,
            labels,
        )
        .unwrap();
        assert!(cmd.pid() > 0);
        let ev = cmd.wait_blocking().unwrap();
        assert_eq!(ev.backend, "wrapper");
        assert_eq!(ev.enforcement, Enforcement::ExternalSandboxRequested);
        assert_eq!(ev.capabilities, caps);
        assert_eq!(ev.exit.code, Some(3));
        assert_eq!(
            ev.wrapper_argv.as_deref(),
            Some(&["sh".to_string(), "-c".into(), "echo wrapped; exit 3".into()][..])
        );
        assert_eq!(ev.runtime_config["wrapper"], "sh");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("out")).unwrap(),
            "wrapped\n"
        );
        assert_eq!(PathBuf::from(&ev.observation_root), dir.path());
        assert_eq!(
            ev.environment.unwrap().mode,
            agentdiff_backend_api::environment::EnvMode::Inherit
        );
    }

    #[test]
    fn unknown_tracking_request_is_refused_before_anything_starts() {
        let dir = tempfile::tempdir().unwrap();
        let mut options = BackendOptions::new();
        options.push("tracking", "psychic");
        let p = prepared(dir.path(), &["x"], options);
        let err = spawn_supervised(
            p,
            LaunchContext::new(StdioMode::Inherit),
            EvidenceLabels {
                backend: "t".into(),
                enforcement: Enforcement::None,
                capabilities: Capabilities::default(),
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("psychic"));
    }
}
