//! Identity-checked cleanup: TERM, grace period, KILL — and never a signal to a process whose
//! identity does not match the record.
//!
//! On Linux each target is pinned with `pidfd_open` first and its start time is read *after*
//! that; from then on the pidfd refers to exactly that process, so a pid reused in between is
//! detected (start time differs) and signals through the pidfd cannot reach another process.

use std::time::Duration;

use super::ProcessIdentity;
use agentdiff_backend_api::{CleanupOutcome, CleanupRecord, CleanupReport};

/// One process to clean up, with the executable name recorded for it (may be empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupTarget {
    pub identity: ProcessIdentity,
    pub executable: String,
}

/// How a cleanup pass behaves.
#[derive(Debug, Clone)]
pub struct CleanupOptions {
    /// Time between TERM and KILL.
    pub grace: Duration,
    /// How long to wait for a KILLed process to disappear before calling it escaped.
    pub kill_wait: Duration,
    /// Reap targets that are children of this process (reparented daemons), except this pid
    /// (the supervisor reaps its root itself to read the exit status).
    pub reap_except: Option<u32>,
    pub reap: bool,
}

impl CleanupOptions {
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            kill_wait: Duration::from_secs(2),
            reap_except: None,
            reap: false,
        }
    }
}

/// Stop every identity that still runs, after verifying it. Used by `RuntimeBackend::cleanup` and
/// `agentdiff cleanup`: a record from another boot or whose pid now has another start time is
/// refused (`pid_reused`), never signalled.
pub fn cleanup_identities(ids: &[ProcessIdentity], grace: Duration) -> CleanupReport {
    let targets: Vec<CleanupTarget> = ids
        .iter()
        .map(|id| CleanupTarget {
            identity: id.clone(),
            executable: String::new(),
        })
        .collect();
    cleanup_targets(&targets, &CleanupOptions::new(grace))
}

/// Clean up `targets` with `opts`; one record per target, in the given order.
pub fn cleanup_targets(targets: &[CleanupTarget], opts: &CleanupOptions) -> CleanupReport {
    imp::cleanup_targets(targets, opts)
}

fn record(t: &CleanupTarget, outcome: CleanupOutcome, detail: Option<String>) -> CleanupRecord {
    CleanupRecord {
        identity: t.identity.clone(),
        executable: t.executable.clone(),
        outcome,
        detail,
    }
}

#[cfg(target_os = "linux")]
mod imp {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    use std::time::{Duration, Instant};

    use super::{record, CleanupOptions, CleanupTarget};
    use agentdiff_backend_api::{CleanupMechanism, CleanupOutcome, CleanupRecord, CleanupReport};
    use agentdiff_host::process_identity::{boot_id, executable_name, read_stat};

    pub(crate) fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
        // SAFETY: plain syscall with integer arguments; the result is a new fd we own.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0u32) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the kernel returned a fresh descriptor owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    }

    pub(crate) fn pidfd_send_signal(fd: &OwnedFd, sig: i32) -> std::io::Result<()> {
        // SAFETY: valid pidfd, null siginfo (the kernel fills in a default), no flags.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0u32,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Whether the pidfd reports its process as exited, waiting at most `timeout`.
    pub(crate) fn pidfd_wait(fd: &OwnedFd, timeout: Duration) -> bool {
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        rc > 0 && pfd.revents & (libc::POLLIN | libc::POLLHUP) != 0
    }

    /// Reap `pid` if it is a zombie child of this process (a reparented daemon).
    pub(crate) fn reap_if_child(pid: u32) {
        let mut status = 0;
        // SAFETY: WNOHANG waitpid on one pid; ECHILD when it is not our child is ignored.
        unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) };
    }

    enum Handle {
        Pidfd(OwnedFd),
        /// pidfd_open is unavailable (old kernel, seccomp): plain kill after a start-time check,
        /// with the residual race that implies.
        Plain,
    }

    struct Pending<'a> {
        target: &'a CleanupTarget,
        executable: String,
        handle: Handle,
        done: Option<(CleanupOutcome, Option<String>)>,
    }

    impl Pending<'_> {
        fn signal(&self, sig: i32) -> std::io::Result<()> {
            match &self.handle {
                Handle::Pidfd(fd) => pidfd_send_signal(fd, sig),
                Handle::Plain => {
                    // Re-check right before the signal: the best a pid-only interface allows.
                    match read_stat(self.target.identity.pid) {
                        Ok(s) if s.start_time_ticks == self.target.identity.start_time_ticks => {}
                        _ => return Err(std::io::Error::from_raw_os_error(libc::ESRCH)),
                    }
                    // SAFETY: kill(2) with a verified positive pid.
                    let rc = unsafe { libc::kill(self.target.identity.pid as libc::pid_t, sig) };
                    if rc < 0 {
                        Err(std::io::Error::last_os_error())
                    } else {
                        Ok(())
                    }
                }
            }
        }

        fn exited(&self) -> bool {
            match &self.handle {
                // A zombie that its own parent has not reaped yet has ended too; the pidfd pins
                // the pid, so the stat read is of the same process.
                Handle::Pidfd(fd) => {
                    pidfd_wait(fd, Duration::ZERO)
                        || read_stat(self.target.identity.pid).map_or(true, |s| s.is_zombie())
                }
                Handle::Plain => match read_stat(self.target.identity.pid) {
                    Ok(s) => {
                        s.start_time_ticks != self.target.identity.start_time_ticks || s.is_zombie()
                    }
                    Err(_) => true,
                },
            }
        }
    }

    pub(super) fn cleanup_targets(
        targets: &[CleanupTarget],
        opts: &CleanupOptions,
    ) -> CleanupReport {
        let mut report = CleanupReport {
            mechanism: CleanupMechanism::Pidfd,
            grace_ms: opts.grace.as_millis() as u64,
            records: Vec::with_capacity(targets.len()),
            errors: Vec::new(),
            resources_removed: Vec::new(),
        };
        let this_boot = match boot_id() {
            Ok(b) => b,
            Err(e) => {
                report.errors.push(e.to_string());
                for t in targets {
                    report.records.push(record(
                        t,
                        CleanupOutcome::AccessDenied,
                        Some("identity cannot be verified without the boot id; refused".into()),
                    ));
                }
                return report;
            }
        };

        // Phase 1: pin and verify.
        let mut plain_used = false;
        let mut pending: Vec<Pending> = targets
            .iter()
            .map(|t| pin(t, &this_boot, opts, &mut plain_used))
            .collect();
        if plain_used {
            report.mechanism = CleanupMechanism::KillWithStartTimeCheck;
            report
                .errors
                .push("pidfd_open is unavailable; signals were sent by pid after a start-time check (a narrow pid-reuse race remains)".into());
        }

        // Phase 2: TERM (and CONT, so a stopped process can act on it).
        send_term(&mut pending);
        wait_all(&mut pending, opts.grace, CleanupOutcome::Terminated, opts);

        // Phase 3: KILL what is left.
        send_kill(&mut pending);
        wait_all(&mut pending, opts.kill_wait, CleanupOutcome::Killed, opts);
        for p in pending.iter_mut().filter(|p| p.done.is_none()) {
            p.done = Some((
                CleanupOutcome::Escaped,
                Some("still running after SIGKILL".into()),
            ));
        }

        report.records = pending
            .into_iter()
            .map(|p| {
                let (outcome, detail) = p
                    .done
                    .unwrap_or((CleanupOutcome::Escaped, Some("no outcome".into())));
                let mut r: CleanupRecord = record(p.target, outcome, detail);
                r.executable = p.executable;
                r
            })
            .collect();
        report
    }

    /// Pin one target with a pidfd and check its identity; `done` is set when it must not be
    /// signalled. `plain_used` is set when pidfds are unavailable and the pid is signalled.
    fn pin<'a>(
        t: &'a CleanupTarget,
        this_boot: &str,
        opts: &CleanupOptions,
        plain_used: &mut bool,
    ) -> Pending<'a> {
        let id = &t.identity;
        let mut p = Pending {
            target: t,
            executable: t.executable.clone(),
            handle: Handle::Plain,
            done: None,
        };
        if id.boot_id != this_boot {
            p.done = Some((
                CleanupOutcome::AlreadyExited,
                Some("recorded during another boot".into()),
            ));
            return p;
        }
        match pidfd_open(id.pid) {
            Ok(fd) => p.handle = Handle::Pidfd(fd),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                p.done = Some((CleanupOutcome::AlreadyExited, None));
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM)) => {
                *plain_used = true;
            }
            Err(e) => {
                p.done = Some((
                    CleanupOutcome::AccessDenied,
                    Some(format!("pidfd_open failed: {e}; refused")),
                ));
            }
        }
        if p.done.is_none() {
            // Read the start time only now: the pidfd pins the process we compare against.
            match read_stat(id.pid) {
                Ok(stat) if stat.start_time_ticks != id.start_time_ticks => {
                    p.done = Some((
                        CleanupOutcome::PidReused,
                        Some(format!(
                            "pid {} now belongs to `{}` started at tick {}; not signalled",
                            id.pid, stat.comm, stat.start_time_ticks
                        )),
                    ));
                }
                Ok(stat) if stat.is_zombie() => {
                    if opts.reap && opts.reap_except != Some(id.pid) {
                        reap_if_child(id.pid);
                    }
                    p.done = Some((CleanupOutcome::AlreadyExited, None));
                }
                Ok(stat) => {
                    if p.executable.is_empty() {
                        p.executable = executable_name(id.pid, &stat.comm);
                    }
                }
                Err(agentdiff_host::process_identity::IdentityError::NoSuchProcess(_)) => {
                    p.done = Some((CleanupOutcome::AlreadyExited, None));
                }
                Err(e) => {
                    p.done = Some((
                        CleanupOutcome::AccessDenied,
                        Some(format!("identity cannot be verified: {e}; refused")),
                    ));
                }
            }
        }
        p
    }

    fn send_term(pending: &mut [Pending]) {
        for p in pending.iter_mut().filter(|p| p.done.is_none()) {
            match p.signal(libc::SIGTERM) {
                Ok(()) => {
                    let _ = p.signal(libc::SIGCONT);
                }
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                    p.done = Some((CleanupOutcome::AlreadyExited, None));
                }
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                    p.done = Some((
                        CleanupOutcome::AccessDenied,
                        Some(format!("SIGTERM refused: {e}")),
                    ));
                }
                Err(e) => {
                    p.done = Some((
                        CleanupOutcome::Escaped,
                        Some(format!("SIGTERM failed: {e}")),
                    ));
                }
            }
        }
    }

    fn send_kill(pending: &mut [Pending]) {
        for p in pending.iter_mut().filter(|p| p.done.is_none()) {
            match p.signal(libc::SIGKILL) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                    p.done = Some((CleanupOutcome::Terminated, None));
                }
                Err(e) => {
                    p.done = Some((
                        CleanupOutcome::Escaped,
                        Some(format!("SIGKILL failed: {e}")),
                    ));
                }
            }
        }
    }

    /// Wait up to `limit` for pending targets to exit; those that do get `outcome`.
    fn wait_all(
        pending: &mut [Pending],
        limit: Duration,
        outcome: CleanupOutcome,
        opts: &CleanupOptions,
    ) {
        let deadline = Instant::now() + limit;
        loop {
            let mut fds: Vec<libc::pollfd> = Vec::new();
            let mut any_plain = false;
            for p in pending.iter_mut().filter(|p| p.done.is_none()) {
                if p.exited() {
                    if opts.reap && opts.reap_except != Some(p.target.identity.pid) {
                        reap_if_child(p.target.identity.pid);
                    }
                    p.done = Some((outcome, None));
                    continue;
                }
                match &p.handle {
                    Handle::Pidfd(fd) => fds.push(libc::pollfd {
                        fd: fd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    }),
                    Handle::Plain => any_plain = true,
                }
            }
            if fds.is_empty() && !any_plain {
                return;
            }
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            // Wake up regularly even with pidfds: a zombie whose parent has not reaped it may not
            // make its pidfd readable, and is noticed by the stat check above.
            let slice =
                (deadline - now).min(Duration::from_millis(if any_plain { 10 } else { 50 }));
            if fds.is_empty() {
                std::thread::sleep(slice);
            } else {
                let ms = slice.as_millis().clamp(1, i32::MAX as u128) as i32;
                // SAFETY: a valid array of pollfds.
                unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            }
        }
    }
}

#[cfg(target_os = "linux")]
pub(crate) use imp::{pidfd_open, pidfd_wait, reap_if_child as reap_child};

#[cfg(not(target_os = "linux"))]
mod imp {
    //! Portable fallback: pid + start time (seconds) check, then plain signals. A pid reused
    //! within the same second, or between the check and the signal, is not detected; the report
    //! says so.
    use std::time::{Duration, Instant};

    use super::{record, CleanupOptions, CleanupTarget};
    use agentdiff_backend_api::{CleanupMechanism, CleanupOutcome, CleanupReport};
    use agentdiff_host::process_identity::{boot_id, read_stat};

    fn matches(t: &CleanupTarget) -> Option<bool> {
        match read_stat(t.identity.pid) {
            Ok(s) => Some(s.start_time_ticks == t.identity.start_time_ticks && !s.is_zombie()),
            Err(_) => None,
        }
    }

    pub(super) fn cleanup_targets(
        targets: &[CleanupTarget],
        opts: &CleanupOptions,
    ) -> CleanupReport {
        let mut report = CleanupReport {
            mechanism: CleanupMechanism::KillWithStartTimeCheck,
            grace_ms: opts.grace.as_millis() as u64,
            records: Vec::new(),
            errors: vec!["pidfd is unavailable on this platform; start times are compared in seconds and a narrow pid-reuse race remains".into()],
            resources_removed: Vec::new(),
        };
        let this_boot = boot_id().unwrap_or_default();
        for t in targets {
            if t.identity.boot_id != this_boot {
                report.records.push(record(
                    t,
                    CleanupOutcome::AlreadyExited,
                    Some("recorded during another boot".into()),
                ));
                continue;
            }
            let outcome = match matches(t) {
                None => CleanupOutcome::AlreadyExited,
                Some(false) => CleanupOutcome::PidReused,
                Some(true) => {
                    let pid = nix::unistd::Pid::from_raw(t.identity.pid as i32);
                    match nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM) {
                        Err(nix::errno::Errno::EPERM) => CleanupOutcome::AccessDenied,
                        Err(_) => CleanupOutcome::AlreadyExited,
                        Ok(()) => {
                            let deadline = Instant::now() + opts.grace;
                            while Instant::now() < deadline && matches(t) == Some(true) {
                                std::thread::sleep(Duration::from_millis(10));
                            }
                            if matches(t) != Some(true) {
                                CleanupOutcome::Terminated
                            } else {
                                let _ =
                                    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                                let deadline = Instant::now() + opts.kill_wait;
                                while Instant::now() < deadline && matches(t) == Some(true) {
                                    std::thread::sleep(Duration::from_millis(10));
                                }
                                if matches(t) == Some(true) {
                                    CleanupOutcome::Escaped
                                } else {
                                    CleanupOutcome::Killed
                                }
                            }
                        }
                    }
                }
            };
            report.records.push(record(t, outcome, None));
        }
        report
    }
}

#[cfg(test)]
#[cfg(target_os = "linux")]
mod tests {
    use std::process::{Command, Stdio};
    use std::time::Duration;

    use super::*;
    use crate::read_identity;

    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn sleeper(script: &str) -> KillOnDrop {
        let child = Command::new("sh")
            .args(["-c", script])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        KillOnDrop(child)
    }

    fn wait_for_exit_status(child: &mut KillOnDrop) -> std::process::ExitStatus {
        child.0.wait().unwrap()
    }

    #[test]
    fn live_process_is_terminated_and_reused_pid_is_refused() {
        let mut a = KillOnDrop(
            Command::new("sleep")
                .arg("300")
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let mut id = read_identity(a.0.id()).unwrap();
        // A record with the wrong start time is a different process: never signalled.
        id.start_time_ticks += 7;
        let report = cleanup_identities(std::slice::from_ref(&id), Duration::from_millis(500));
        assert_eq!(report.records[0].outcome, CleanupOutcome::PidReused);
        assert!(a.0.try_wait().unwrap().is_none(), "must survive");
        id.start_time_ticks -= 7;
        let report = cleanup_identities(&[id], Duration::from_millis(500));
        assert_eq!(
            report.mechanism,
            agentdiff_backend_api::CleanupMechanism::Pidfd
        );
        assert_eq!(report.records[0].outcome, CleanupOutcome::Terminated);
        assert_eq!(report.records[0].executable, "sleep");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(wait_for_exit_status(&mut a).signal(), Some(libc::SIGTERM));
    }

    #[test]
    fn term_ignoring_process_is_killed_after_grace() {
        let mut a = KillOnDrop(
            Command::new("sh")
                .args([
                    "-c",
                    "trap '' TERM; echo ready; while :; do sleep 0.05; done",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        // The trap is installed once the shell says `ready`.
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(a.0.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line, "ready\n");
        let id = read_identity(a.0.id()).unwrap();
        let start = std::time::Instant::now();
        let report = cleanup_identities(&[id], Duration::from_millis(300));
        assert!(start.elapsed() >= Duration::from_millis(300));
        assert_eq!(report.records[0].outcome, CleanupOutcome::Killed);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(wait_for_exit_status(&mut a).signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn exited_and_other_boot_identities_are_already_exited() {
        let mut a = sleeper("exit 0");
        let id = read_identity(a.0.id()).unwrap();
        wait_for_exit_status(&mut a);
        let mut other_boot = id.clone();
        other_boot.boot_id = "00000000-0000-0000-0000-000000000000".into();
        let report = cleanup_identities(&[id, other_boot], Duration::from_millis(100));
        assert!(report
            .records
            .iter()
            .all(|r| r.outcome == CleanupOutcome::AlreadyExited));
        assert_eq!(report.leftovers(), 0);
    }
}
