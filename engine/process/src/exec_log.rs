//! Which programs the run's processes executed, not only what each process ran when first seen.
//!
//! Mechanisms, strongest first:
//! - `cn_proc`: the kernel's process events connector (see [`super::cn_proc`]) reports every
//!   `exec` of the root and of every process forked from it. Complete as a list of exec events;
//!   the program of each is read from `/proc` when the event is handled, so a process that execs
//!   again or exits within that instant is recorded with what was readable.
//! - `proc_poll`: at every tracking poll, `/proc/PID/exe` and `/proc/PID/cmdline` of each live
//!   tracked process are re-read; a change for a pid whose start time is unchanged is an exec.
//!   Misses a process that starts and exits between two polls, and every exec but the last
//!   between two polls; an exec of the same program with the same arguments is invisible.
//!
//! Invariants: argument vectors are redacted ([`agentdiff_host::redact::redact_argv_deep`], before they
//! are cut) and bounded ([`MAX_ARGS`], [`MAX_ARG_BYTES`]) before they are kept; the log keeps at most
//! [`super::cn_proc::MAX_EXEC_EVENTS`] events and counts the rest.

use std::collections::HashMap;

use super::ProcessIdentity;
pub use agentdiff_backend_api::exec::{ExecEvent, ExecEvidence, ExecMechanism};

/// Arguments kept per exec; the rest is counted in [`ExecEvent::args_omitted`].
pub const MAX_ARGS: usize = 64;
/// Bytes kept per argument.
pub const MAX_ARG_BYTES: usize = 512;

pub const CN_PROC_NOTE: &str = "kernel process events connector: every exec of the run's \
    process tree is reported; the program is read from /proc when the event is handled, so a \
    process that exits (or execs again) at once may show as `unreadable`";
pub const POLL_NOTE: &str = "re-read /proc/PID/exe and cmdline at each poll: a process that \
    starts and exits between two polls, all but the last of several execs between two polls, \
    and a re-exec of the same program with the same arguments are missed";

fn bounded_argv(raw: &[u8]) -> (Vec<String>, u64) {
    let mut args: Vec<String> = Vec::new();
    let mut omitted = 0u64;
    for a in raw.split(|b| *b == 0).filter(|a| !a.is_empty()) {
        if args.len() >= MAX_ARGS {
            omitted += 1;
        } else {
            args.push(String::from_utf8_lossy(a).into_owned());
        }
    }
    // Redacted whole, then cut: a cut secret could escape recognition.
    let mut args = agentdiff_host::redact::redact_argv_deep(&args);
    for s in &mut args {
        if s.len() > MAX_ARG_BYTES {
            let mut cut = MAX_ARG_BYTES;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            s.truncate(cut);
            s.push('…');
        }
    }
    (args, omitted)
}

/// Read what `pid` runs now into an event.
pub fn read_program(pid: u32, at_ms: u64) -> ExecEvent {
    let executable = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unreadable".into());
    let (argv, args_omitted) = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| bounded_argv(&raw))
        .unwrap_or_default();
    ExecEvent {
        pid,
        start_time_ticks: super::read_stat(pid).ok().map(|s| s.start_time_ticks),
        executable,
        argv,
        args_omitted,
        at_ms,
    }
}

/// The polling fallback: the last program seen per identity.
#[derive(Debug, Default)]
pub struct ExecPoller {
    last: HashMap<u32, (u64, String, Vec<String>)>,
    events: Vec<ExecEvent>,
    dropped: u64,
}

impl ExecPoller {
    /// One pass over the live identities.
    pub fn poll(&mut self, live: &[(u32, ProcessIdentity)], at_ms: u64) {
        for (pid, id) in live {
            let ev = read_program(*pid, at_ms);
            // Another process under a recycled pid, or gone: not this identity's exec.
            if ev.start_time_ticks != Some(id.start_time_ticks) || ev.executable == "unreadable" {
                continue;
            }
            let changed = match self.last.get(pid) {
                Some((start, exe, argv)) => {
                    *start != id.start_time_ticks || *exe != ev.executable || *argv != ev.argv
                }
                None => true,
            };
            if changed {
                self.last.insert(
                    *pid,
                    (id.start_time_ticks, ev.executable.clone(), ev.argv.clone()),
                );
                if self.events.len() >= super::cn_proc::MAX_EXEC_EVENTS {
                    self.dropped += 1;
                } else {
                    self.events.push(ev);
                }
            }
        }
    }

    pub fn finish(self) -> ExecEvidence {
        ExecEvidence {
            mechanism: ExecMechanism::ProcPoll,
            note: POLL_NOTE.into(),
            events: self.events,
            dropped: self.dropped,
            lost: 0,
        }
    }
}

/// The exec mechanism `auto` would use here, and why (for availability reports).
pub fn exec_mechanism_available() -> (String, String) {
    #[cfg(target_os = "linux")]
    match super::cn_proc::probe() {
        Ok(()) => ("cn_proc".into(), CN_PROC_NOTE.into()),
        Err(e) => (
            "proc_poll".into(),
            format!("the process events connector is unavailable ({e}); {POLL_NOTE}"),
        ),
    }
    #[cfg(not(target_os = "linux"))]
    ("proc_poll".into(), POLL_NOTE.into())
}

/// Which exec mechanism a run asks for (`exec-events` backend option).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecRequest {
    /// `cn_proc` where the kernel acknowledges the subscription, else polling (with a warning).
    Auto,
    /// `cn_proc` or an error.
    CnProc,
    /// Polling even where `cn_proc` works.
    Poll,
}

impl ExecRequest {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(Self::Auto),
            "cn_proc" => Some(Self::CnProc),
            "proc_poll" | "poll" => Some(Self::Poll),
            _ => None,
        }
    }
}

/// The exec observer of one run.
#[derive(Debug)]
pub enum ExecObserver {
    #[cfg(target_os = "linux")]
    CnProc(super::cn_proc::Listener),
    Poll(ExecPoller),
}

impl ExecObserver {
    /// Start observing (before the spawn, so the root's own exec is seen). Returns a warning when
    /// `Auto` falls back to polling.
    pub fn start(request: ExecRequest) -> Result<(Self, Option<String>), super::ProcessError> {
        if request == ExecRequest::Poll {
            return Ok((ExecObserver::Poll(ExecPoller::default()), None));
        }
        #[cfg(target_os = "linux")]
        match super::cn_proc::Listener::open() {
            Ok(l) => Ok((ExecObserver::CnProc(l), None)),
            Err(e) if request == ExecRequest::CnProc => {
                Err(super::ProcessError::Unsupported(format!(
                    "exec events through the kernel connector were requested but are unavailable \
                     ({e}); use exec-events=auto or proc_poll"
                )))
            }
            Err(e) => Ok((
                ExecObserver::Poll(ExecPoller::default()),
                Some(format!(
                    "the kernel process events connector is unavailable ({e}); execs are observed \
                     by polling /proc, which can miss short-lived programs"
                )),
            )),
        }
        #[cfg(not(target_os = "linux"))]
        match request {
            ExecRequest::CnProc => Err(super::ProcessError::Unsupported(
                "exec events through the kernel connector exist only on Linux".into(),
            )),
            _ => Ok((
                ExecObserver::Poll(ExecPoller::default()),
                Some("execs are observed by polling, which can miss short-lived programs".into()),
            )),
        }
    }

    /// The root is known.
    pub fn set_root(&self, _root: u32, _launched: std::time::Instant) {
        #[cfg(target_os = "linux")]
        if let ExecObserver::CnProc(l) = self {
            l.set_root(_root, _launched);
        }
    }

    /// Whether [`Self::poll`] does anything (the fallback).
    pub fn polls(&self) -> bool {
        matches!(self, ExecObserver::Poll(_))
    }

    /// One tracking poll happened (only the fallback acts on it).
    pub fn poll(&mut self, live: &[(u32, ProcessIdentity)], at_ms: u64) {
        if let ExecObserver::Poll(p) = self {
            p.poll(live, at_ms);
        }
    }

    pub fn finish(self) -> ExecEvidence {
        match self {
            #[cfg(target_os = "linux")]
            ExecObserver::CnProc(l) => {
                let s = l.finish();
                ExecEvidence {
                    mechanism: ExecMechanism::CnProc,
                    note: CN_PROC_NOTE.into(),
                    events: s.execs,
                    dropped: s.dropped,
                    lost: s.lost,
                }
            }
            ExecObserver::Poll(p) => p.finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_is_bounded_and_redacted() {
        let mut raw = b"curl\0-H\0x\0--token\0hunter2\0".to_vec();
        raw.extend(std::iter::repeat(b"a\0".as_slice()).take(100).flatten());
        let (argv, omitted) = bounded_argv(&raw);
        assert_eq!(argv.len(), MAX_ARGS);
        assert_eq!(omitted, 105 - MAX_ARGS as u64);
        assert!(!argv.iter().any(|a| a.contains("hunter2")), "{argv:?}");
        let long = vec![b'x'; 4000];
        let (argv, _) = bounded_argv(&long);
        assert!(argv[0].len() <= MAX_ARG_BYTES + '…'.len_utf8());
    }

    #[test]
    fn the_last_readable_exec_of_each_identity_names_it() {
        let ev = |pid, start, exe: &str| ExecEvent {
            pid,
            start_time_ticks: start,
            executable: exe.into(),
            argv: Vec::new(),
            args_omitted: 0,
            at_ms: 0,
        };
        let log = ExecEvidence {
            events: vec![
                ev(10, Some(5), "/usr/bin/dash"),
                ev(10, Some(5), "/usr/bin/sleep"),
                ev(10, Some(5), "unreadable"),
                ev(10, Some(9), "/usr/bin/python3 (deleted)"),
                ev(11, None, "/usr/bin/true"),
            ],
            ..ExecEvidence::default()
        };
        let last = log.last_programs();
        assert_eq!(last.get(&(10, 5)).map(String::as_str), Some("sleep"));
        assert_eq!(last.get(&(10, 9)).map(String::as_str), Some("python3"));
        assert_eq!(last.len(), 2);
    }

    #[test]
    fn requests_parse() {
        assert_eq!(ExecRequest::parse("auto"), Some(ExecRequest::Auto));
        assert_eq!(ExecRequest::parse("cn_proc"), Some(ExecRequest::CnProc));
        assert_eq!(ExecRequest::parse("proc_poll"), Some(ExecRequest::Poll));
        assert_eq!(ExecRequest::parse("ptrace"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_poller_records_a_pid_that_execs_under_the_same_start_time() {
        use std::io::Write;
        // The shell execs only when told to, so the first poll sees it before the exec and the
        // second after it, however slow the machine.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read go; exec sleep 5"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let id = crate::read_identity(pid).unwrap();
        let mut p = ExecPoller::default();
        p.poll(&[(pid, id.clone())], 0);
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap() != "sleep\n" {
            assert!(
                std::time::Instant::now() < deadline,
                "the shell never exec'd"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        p.poll(&[(pid, id.clone())], 600);
        let _ = child.kill();
        let _ = child.wait();
        let ev = p.finish();
        let exes: Vec<&str> = ev.events.iter().map(|e| e.executable.as_str()).collect();
        assert_eq!(ev.events.len(), 2, "{exes:?}");
        assert!(exes[1].ends_with("sleep"), "{exes:?}");
        assert_eq!(ev.events[1].argv, ["sleep", "5"]);
    }
}
