//! The kernel's process events connector (netlink `NETLINK_CONNECTOR`, group `CN_IDX_PROC`):
//! every fork, exec and exit on the host, delivered as it happens.
//!
//! Invariants:
//! - A [`Listener`] exists only after the kernel acknowledged `PROC_CN_MCAST_LISTEN` (a
//!   `PROC_EVENT_NONE` reply with error 0). Without the acknowledgement (no `CAP_NET_ADMIN`, a
//!   kernel without `CONFIG_PROC_EVENTS`, or a non-initial pid/user namespace, where the kernel
//!   drops events silently) [`Listener::open`] fails and callers fall back to polling.
//! - Events are read by one thread that blocks in `poll(2)` on the socket and an eventfd (written
//!   by [`Listener::finish`], so stopping never waits for a timeout); the receive buffer is enlarged
//!   (`SO_RCVBUFFORCE` as root) so a burst does not overflow it. An overflow (`ENOBUFS`) is counted
//!   in [`Snapshot::lost`]: the log is then known to be incomplete and says so.
//! - Attribution is by ancestry: the root, then every process forked by an attributed process
//!   (process forks only, not threads). Events that arrive before the root's pid is known are
//!   queued (bounded) and replayed once it is.
//! - `PROC_CN_MCAST_IGNORE` is sent when the listener is dropped (the kernel counts listeners).
//!
//! Not defended: an exec event carries only the pid, so the program is read from
//! `/proc/PID/exe` and `/proc/PID/cmdline` when the event is handled; a process that execs again
//! or exits before that is recorded with what was readable (or `unreadable`). Processes of the run
//! that enter another pid namespace are reported by their host pids, as the kernel does.

use std::collections::HashSet;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::exec_log::{read_program, ExecEvent};

/// Errors of the connector.
#[derive(Debug, thiserror::Error)]
pub enum CnProcError {
    #[error("{what}: {source}")]
    Sys {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the kernel did not acknowledge the process-events subscription within {0:?}")]
    NoAck(Duration),
    #[error("the kernel refused the process-events subscription (error {0})")]
    Refused(u32),
}

fn sys(what: &'static str) -> CnProcError {
    CnProcError::Sys {
        what,
        source: std::io::Error::last_os_error(),
    }
}

const NETLINK_CONNECTOR: i32 = 11;
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_CN_MCAST_IGNORE: u32 = 2;
const PROC_EVENT_NONE: u32 = 0;
const PROC_EVENT_FORK: u32 = 1;
const PROC_EVENT_EXEC: u32 = 2;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
const NLMSG_HDR: usize = 16;
const CN_MSG_HDR: usize = 20;
/// Offset of `proc_event.event_data` within the netlink payload.
const EVENT_DATA: usize = NLMSG_HDR + CN_MSG_HDR + 16;
/// Events queued before the root's pid is known (a fork storm on the host during the spawn).
const MAX_PENDING: usize = 65_536;
/// Exec events kept per run; beyond this only a count is kept.
pub const MAX_EXEC_EVENTS: usize = 10_000;
const ACK_TIMEOUT: Duration = Duration::from_millis(250);
/// Datagrams read past [`ACK_TIMEOUT`] while looking for the ack already queued.
const MAX_LATE_READS: u32 = 1024;

#[derive(Debug, Clone, Copy)]
enum Event {
    Fork { parent: u32, child: u32 },
    Exec { pid: u32 },
    Exit { pid: u32 },
}

/// What the listener has gathered so far.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    pub execs: Vec<ExecEvent>,
    /// Exec events beyond [`MAX_EXEC_EVENTS`].
    pub dropped: u64,
    /// Receive-buffer overflows: events the kernel could not deliver.
    pub lost: u64,
    /// Processes attributed to the run by fork ancestry.
    pub forks: u64,
}

#[derive(Debug, Default)]
struct Shared {
    root: Option<u32>,
    pending: Vec<Event>,
    ours: HashSet<u32>,
    snapshot: Snapshot,
    launched: Option<Instant>,
}

impl Shared {
    fn handle(&mut self, ev: Event) {
        let Some(root) = self.root else {
            if self.pending.len() < MAX_PENDING {
                self.pending.push(ev);
            } else {
                self.snapshot.lost += 1;
            }
            return;
        };
        match ev {
            Event::Fork { parent, child } => {
                if self.ours.contains(&parent) {
                    self.ours.insert(child);
                    self.snapshot.forks += 1;
                }
            }
            Event::Exec { pid } => {
                if !self.ours.contains(&pid) {
                    return;
                }
                if self.snapshot.execs.len() >= MAX_EXEC_EVENTS {
                    self.snapshot.dropped += 1;
                    return;
                }
                let at_ms = self
                    .launched
                    .map(|l| l.elapsed().as_millis() as u64)
                    .unwrap_or(0);
                let event = read_program(pid, at_ms);
                self.snapshot.execs.push(event);
            }
            Event::Exit { pid } => {
                // The pid may be reused by an unrelated process from now on.
                if pid != root {
                    self.ours.remove(&pid);
                }
            }
        }
    }
}

/// A subscription to process events, read by a background thread.
#[derive(Debug)]
pub struct Listener {
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    fd: Arc<OwnedFd>,
    /// Written once to wake the reader when the listener stops.
    wake: Arc<OwnedFd>,
}

fn eventfd() -> Result<OwnedFd, CnProcError> {
    // SAFETY: eventfd(2) with constant flags; the fd is owned at once.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if raw < 0 {
        return Err(sys("eventfd"));
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

fn wake(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: write(2) of 8 bytes to an eventfd we own.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

fn lock(m: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// One `nlmsghdr` + `cn_msg` + u32 operation, as the kernel expects it.
fn control_message(op: u32) -> [u8; NLMSG_HDR + CN_MSG_HDR + 4] {
    let mut m = [0u8; NLMSG_HDR + CN_MSG_HDR + 4];
    let total = m.len() as u32;
    m[0..4].copy_from_slice(&total.to_ne_bytes());
    m[4..6].copy_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
    m[12..16].copy_from_slice(&std::process::id().to_ne_bytes());
    let c = NLMSG_HDR;
    m[c..c + 4].copy_from_slice(&CN_IDX_PROC.to_ne_bytes());
    m[c + 4..c + 8].copy_from_slice(&CN_VAL_PROC.to_ne_bytes());
    m[c + 16..c + 18].copy_from_slice(&4u16.to_ne_bytes());
    m[c + CN_MSG_HDR..].copy_from_slice(&op.to_ne_bytes());
    m
}

fn send_control(fd: &OwnedFd, op: u32) -> Result<(), CnProcError> {
    let m = control_message(op);
    // SAFETY: send(2) of a local buffer on a socket we own.
    let n = unsafe { libc::send(fd.as_raw_fd(), m.as_ptr().cast(), m.len(), 0) };
    if n < 0 {
        return Err(sys("send to the process-events connector"));
    }
    Ok(())
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    b.get(off..off + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_ne_bytes)
}

/// Parse every message of one datagram. Returns the events and any `PROC_EVENT_NONE` error
/// code seen (the subscription acknowledgement).
fn parse(buf: &[u8]) -> (Vec<Event>, Option<u32>) {
    let mut out = Vec::new();
    let mut ack = None;
    let mut off = 0;
    while off + NLMSG_HDR <= buf.len() {
        let Some(len) = u32_at(buf, off).map(|l| l as usize) else {
            break;
        };
        if len < NLMSG_HDR || off + len > buf.len() {
            break;
        }
        let msg = &buf[off..off + len];
        let what = u32_at(msg, NLMSG_HDR + CN_MSG_HDR);
        let d = EVENT_DATA;
        match what {
            Some(PROC_EVENT_NONE) => ack = u32_at(msg, d),
            Some(PROC_EVENT_FORK) => {
                // parent_pid, parent_tgid, child_pid, child_tgid: process forks only (a new
                // thread has child_pid != child_tgid).
                if let (Some(ptgid), Some(cpid), Some(ctgid)) =
                    (u32_at(msg, d + 4), u32_at(msg, d + 8), u32_at(msg, d + 12))
                {
                    if cpid == ctgid {
                        out.push(Event::Fork {
                            parent: ptgid,
                            child: ctgid,
                        });
                    }
                }
            }
            Some(PROC_EVENT_EXEC) => {
                if let Some(tgid) = u32_at(msg, d + 4) {
                    out.push(Event::Exec { pid: tgid });
                }
            }
            Some(PROC_EVENT_EXIT) => {
                if let (Some(pid), Some(tgid)) = (u32_at(msg, d), u32_at(msg, d + 4)) {
                    if pid == tgid {
                        out.push(Event::Exit { pid: tgid });
                    }
                }
            }
            _ => {}
        }
        off += (len + 3) & !3;
    }
    (out, ack)
}

fn open_socket() -> Result<OwnedFd, CnProcError> {
    // SAFETY: socket(2) with constant arguments; the fd is owned at once.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            NETLINK_CONNECTOR,
        )
    };
    if raw < 0 {
        return Err(sys("socket(AF_NETLINK, NETLINK_CONNECTOR)"));
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: an all-zero sockaddr_nl is valid; the fields are set below.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    addr.nl_groups = CN_IDX_PROC;
    // SAFETY: bind(2) with a properly sized sockaddr_nl.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if rc != 0 {
        return Err(sys("bind to the process-events group"));
    }
    let size: libc::c_int = 8 << 20;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: setsockopt(2) with an int option value.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            )
        };
        if rc == 0 {
            break;
        }
    }
    // A receive timeout lets the reader notice `stop`.
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 50_000,
    };
    // SAFETY: setsockopt(2) with a timeval.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    Ok(fd)
}

/// One `recv`: Ok(Some(bytes)) on data, Ok(None) on timeout or nothing pending, Err(ENOBUFS) on
/// overflow.
fn recv(fd: &OwnedFd, buf: &mut [u8], flags: i32) -> std::io::Result<Option<usize>> {
    // SAFETY: recv(2) into a local buffer of the given length.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
    if n >= 0 {
        return Ok(Some(n as usize));
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
        _ => Err(e),
    }
}

/// Open a socket, subscribe, and wait for the kernel's acknowledgement; events that arrive
/// first go to `shared`.
fn subscribe(
    shared: &Mutex<Shared>,
    buf: &mut [u8],
    ack_timeout: Duration,
) -> Result<OwnedFd, CnProcError> {
    let fd = open_socket()?;
    send_control(&fd, PROC_CN_MCAST_LISTEN)?;
    let deadline = Instant::now() + ack_timeout;
    let give_up = |fd: &OwnedFd| {
        let _ = send_control(fd, PROC_CN_MCAST_IGNORE);
        CnProcError::NoAck(ack_timeout)
    };
    let mut late_reads = 0;
    loop {
        // Past the deadline, reads stop blocking and an empty one gives up: what is queued is
        // read first, so a thread descheduled past the deadline still finds an ack the kernel
        // sent in time. A flood of other subscribers' events without our ack ends after
        // `MAX_LATE_READS` datagrams.
        let late = Instant::now() >= deadline;
        if late {
            late_reads += 1;
            if late_reads > MAX_LATE_READS {
                return Err(give_up(&fd));
            }
        }
        let flags = if late { libc::MSG_DONTWAIT } else { 0 };
        match recv(&fd, buf, flags) {
            Ok(Some(n)) => {
                let (events, ack) = parse(&buf[..n]);
                let mut s = lock(shared);
                for e in events {
                    s.handle(e);
                }
                match ack {
                    Some(0) => return Ok(fd),
                    Some(err) => return Err(CnProcError::Refused(err)),
                    None => {}
                }
            }
            Ok(None) if late => return Err(give_up(&fd)),
            Ok(None) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => lock(shared).snapshot.lost += 1,
            Err(source) => {
                return Err(CnProcError::Sys {
                    what: "recv from the process-events connector",
                    source,
                })
            }
        }
    }
}

impl Listener {
    /// Subscribe and wait for the kernel's acknowledgement; then read in the background.
    pub fn open() -> Result<Self, CnProcError> {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let mut buf = vec![0u8; 64 * 1024];
        let fd = subscribe(&shared, &mut buf, ACK_TIMEOUT)?;
        let fd = Arc::new(fd);
        let wake_fd = Arc::new(eventfd()?);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (fd, wake_fd, shared, stop) =
                (fd.clone(), wake_fd.clone(), shared.clone(), stop.clone());
            std::thread::Builder::new()
                .name("agentdiff-cn-proc".into())
                .spawn(move || read_loop(&fd, &wake_fd, &shared, &stop, buf))
                .map_err(|source| CnProcError::Sys {
                    what: "a process-events thread",
                    source,
                })?
        };
        Ok(Listener {
            shared,
            stop,
            thread: Some(thread),
            fd,
            wake: wake_fd,
        })
    }

    /// The run's root is `root`, launched at `launched`: replay what was queued.
    pub fn set_root(&self, root: u32, launched: Instant) {
        let mut s = lock(&self.shared);
        s.root = Some(root);
        s.launched = Some(launched);
        s.ours.insert(root);
        let pending = std::mem::take(&mut s.pending);
        for e in pending {
            s.handle(e);
        }
    }

    /// Stop reading and return everything gathered.
    pub fn finish(mut self) -> Snapshot {
        self.stop.store(true, Ordering::Relaxed);
        wake(&self.wake);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = send_control(&self.fd, PROC_CN_MCAST_IGNORE);
        std::mem::take(&mut lock(&self.shared).snapshot)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.store(true, Ordering::Relaxed);
            wake(&self.wake);
            let _ = t.join();
            let _ = send_control(&self.fd, PROC_CN_MCAST_IGNORE);
        }
    }
}

fn read_loop(
    fd: &OwnedFd,
    wake_fd: &OwnedFd,
    shared: &Mutex<Shared>,
    stop: &AtomicBool,
    mut buf: Vec<u8>,
) {
    let mut fds = [
        libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake_fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // Drain what is pending first, so the events before a stop are all handled.
        loop {
            match recv(fd, &mut buf, libc::MSG_DONTWAIT) {
                Ok(Some(n)) => {
                    let (events, _) = parse(&buf[..n]);
                    let mut s = lock(shared);
                    for e in events {
                        s.handle(e);
                    }
                }
                Ok(None) => break,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    lock(shared).snapshot.lost += 1
                }
                Err(_) => {
                    // A broken socket: whatever follows is unknown.
                    lock(shared).snapshot.lost += 1;
                    return;
                }
            }
        }
        if stop.load(Ordering::Relaxed) {
            return;
        }
        // SAFETY: poll(2) on two descriptors we own, with a local array.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if rc < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            lock(shared).snapshot.lost += 1;
            return;
        }
        for f in &mut fds {
            f.revents = 0;
        }
    }
}

/// Whether the connector works here (for `doctor` and availability): subscribes and
/// unsubscribes, without a reader thread.
pub fn probe() -> Result<(), CnProcError> {
    let fd = subscribe(
        &Mutex::new(Shared::default()),
        &mut [0u8; 8 * 1024],
        ACK_TIMEOUT,
    )?;
    send_control(&fd, PROC_CN_MCAST_IGNORE)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A subscriber that reaches its deadline before its first read (here: a deadline of zero,
    /// as for a thread descheduled that long) still takes the ack the kernel already queued.
    #[test]
    fn an_ack_queued_before_the_deadline_is_read_after_it() {
        if let Err(e) = probe() {
            agentdiff_test_support::skip(&format!(
                "the process events connector is unavailable: {e}"
            ));
            return;
        }
        let fd = subscribe(
            &Mutex::new(Shared::default()),
            &mut [0u8; 8 * 1024],
            Duration::ZERO,
        )
        .unwrap();
        send_control(&fd, PROC_CN_MCAST_IGNORE).unwrap();
    }

    fn msg(what: u32, data: &[u32]) -> Vec<u8> {
        let mut m = vec![0u8; EVENT_DATA];
        m[NLMSG_HDR + CN_MSG_HDR..NLMSG_HDR + CN_MSG_HDR + 4].copy_from_slice(&what.to_ne_bytes());
        for d in data {
            m.extend_from_slice(&d.to_ne_bytes());
        }
        let len = m.len() as u32;
        m[0..4].copy_from_slice(&len.to_ne_bytes());
        m
    }

    #[test]
    fn parses_forks_execs_exits_and_the_ack() {
        let mut buf = msg(PROC_EVENT_FORK, &[10, 10, 11, 11]);
        buf.extend(msg(PROC_EVENT_FORK, &[10, 10, 12, 10])); // a thread: ignored
        buf.extend(msg(PROC_EVENT_EXEC, &[11, 11]));
        buf.extend(msg(PROC_EVENT_EXIT, &[11, 11, 0, 17]));
        buf.extend(msg(PROC_EVENT_NONE, &[0]));
        let (events, ack) = parse(&buf);
        assert_eq!(ack, Some(0));
        assert_eq!(events.len(), 3, "{events:?}");
        assert!(matches!(
            events[0],
            Event::Fork {
                parent: 10,
                child: 11
            }
        ));
        assert!(matches!(events[1], Event::Exec { pid: 11 }));
        assert!(matches!(events[2], Event::Exit { pid: 11 }));
    }

    #[test]
    fn truncated_datagrams_are_ignored_not_misread() {
        let buf = msg(PROC_EVENT_EXEC, &[11, 11]);
        assert!(parse(&buf[..buf.len() - 8]).0.is_empty());
        assert!(parse(&[1, 2, 3]).0.is_empty());
    }

    #[test]
    fn attribution_follows_ancestry_and_replays_the_queue() {
        let mut s = Shared::default();
        s.handle(Event::Fork {
            parent: 1,
            child: 100,
        });
        s.handle(Event::Fork {
            parent: 100,
            child: 101,
        });
        s.handle(Event::Fork {
            parent: 7,
            child: 200,
        });
        s.root = Some(100);
        s.ours.insert(100);
        for e in std::mem::take(&mut s.pending) {
            s.handle(e);
        }
        assert!(s.ours.contains(&101));
        assert!(!s.ours.contains(&200));
        s.handle(Event::Exit { pid: 101 });
        assert!(!s.ours.contains(&101));
    }
}
