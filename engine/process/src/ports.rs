//! Listening-socket snapshots, read through netlink `NETLINK_SOCK_DIAG` with
//! `/proc/net/{tcp,tcp6,udp,udp6}` as the fallback.
//!
//! The `/proc/net` tables make the kernel walk every bucket of its socket hash tables, which costs
//! milliseconds per read on a machine with much memory even when few sockets exist. A sock_diag
//! dump asks only for listening TCP sockets (the kernel then skips the established table) and for
//! unconnected UDP sockets, and costs tens of microseconds. Which interface served each table is
//! recorded in the evidence note.
//!
//! This is observation only: it blocks no traffic, and a listener is attributed to a run only when
//! its socket inode is held open by a process the run owns at snapshot time. Everything else is a
//! machine-wide observation (seed 000).

// Elsewhere the sock_diag request and reply code is only exercised by the unit tests.
#![cfg_attr(not(target_os = "linux"), allow(dead_code))]

use std::collections::{BTreeMap, HashSet};
use std::net::{Ipv4Addr, Ipv6Addr};

use agentdiff_backend_api::{PortEvidence, PortRecord};

/// What observation means, recorded with the evidence.
pub const OBSERVE_NOTE: &str = "network.mode: observe compares machine-wide listening-socket \
snapshots (TCP/UDP, IPv4/IPv6) taken before, during and after the run. Observation only: it does \
not block inbound or outbound traffic. A listener is attributed to the run only when its socket \
inode was held open by a process the run owned at snapshot time; an unattributed listener does \
not prove that the command opened or closed it and establishes no ownership. Permissions may make \
the snapshot incomplete.";

/// What `off` means, recorded with the evidence.
pub const OFF_NOTE: &str = "network.mode: off disables listening-socket observation; it does not \
disable or block networking.";

/// One listening socket.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Listener {
    pub protocol: &'static str,
    pub address: String,
    pub port: u16,
    pub inode: u64,
}

impl Listener {
    fn key(&self) -> (&'static str, &str, u16) {
        (self.protocol, self.address.as_str(), self.port)
    }
}

/// Listening sockets at one moment, what could not be read, and where each table came from.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub listeners: Vec<Listener>,
    pub errors: Vec<String>,
    /// One entry per table (`tcp`, `tcp6`, `udp`, `udp6`) in that order.
    pub sources: Vec<(&'static str, Source)>,
}

/// The kernel interface one table of a snapshot was read from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// A netlink `NETLINK_SOCK_DIAG` dump.
    SockDiag,
    /// The `/proc/net` table, because sock_diag failed for the stated reason.
    ProcNet { sock_diag_error: String },
}

impl Source {
    fn describe(&self, table: &Table) -> String {
        match self {
            Source::SockDiag => format!("{} via netlink sock_diag", table.label),
            Source::ProcNet { sock_diag_error } => format!(
                "{} via {} because netlink sock_diag failed ({sock_diag_error})",
                table.label, table.path
            ),
        }
    }
}

/// One socket table: its `/proc/net` file and the equivalent sock_diag request.
#[derive(Debug)]
struct Table {
    label: &'static str,
    path: &'static str,
    family: u8,
    protocol: u8,
    /// Bit mask of TCP states to dump (`1 << state`).
    states: u32,
}

// Linux ABI values (include/net/tcp_states.h, include/linux/socket.h, netinet/in.h).
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const TCP_CLOSE: u8 = 7;
const TCP_LISTEN: u8 = 10;

const TABLES: [Table; 4] = [
    Table {
        label: "tcp",
        path: "/proc/net/tcp",
        family: AF_INET,
        protocol: IPPROTO_TCP,
        states: 1 << TCP_LISTEN,
    },
    Table {
        label: "tcp6",
        path: "/proc/net/tcp6",
        family: AF_INET6,
        protocol: IPPROTO_TCP,
        states: 1 << TCP_LISTEN,
    },
    // A bound UDP socket without a peer is in state CLOSE; connected ones are ESTABLISHED.
    Table {
        label: "udp",
        path: "/proc/net/udp",
        family: AF_INET,
        protocol: IPPROTO_UDP,
        states: 1 << TCP_CLOSE,
    },
    Table {
        label: "udp6",
        path: "/proc/net/udp6",
        family: AF_INET6,
        protocol: IPPROTO_UDP,
        states: 1 << TCP_CLOSE,
    },
];

/// Why a sock_diag dump failed.
#[derive(Debug, thiserror::Error)]
pub enum SockDiagError {
    #[error("netlink sock_diag is not supported on this platform")]
    Unsupported,
    #[error("cannot open a NETLINK_SOCK_DIAG socket: {0}")]
    Socket(std::io::Error),
    #[error("sending the dump request failed: {0}")]
    Send(std::io::Error),
    #[error("receiving the dump failed: {0}")]
    Recv(std::io::Error),
    #[error("the kernel refused the dump: {0}")]
    Kernel(std::io::Error),
    #[error("a reply of {0} bytes did not fit the receive buffer")]
    Truncated(usize),
    #[error("the dump did not end within {0} replies")]
    TooLong(usize),
    #[error("malformed reply: {0}")]
    Malformed(&'static str),
}

/// Take a snapshot of every listening TCP socket and every bound, unconnected UDP socket.
/// A table that cannot be read (absent IPv6, permissions) becomes an error entry.
pub fn snapshot() -> Snapshot {
    let mut snap = Snapshot::default();
    SnapshotReader::default().read_into(&mut snap);
    snap
}

/// A snapshot read from the `/proc/net` tables only (the fallback path, and for comparison).
pub fn proc_net_snapshot() -> Snapshot {
    let mut snap = Snapshot::default();
    let mut text = String::new();
    for table in &TABLES {
        read_proc_table(table, &mut text, &mut snap);
        snap.sources.push((
            table.label,
            Source::ProcNet {
                sock_diag_error: "not attempted".into(),
            },
        ));
    }
    snap
}

/// A snapshot read through sock_diag only; the first failing table ends it with an error.
pub fn sock_diag_snapshot() -> Result<Snapshot, SockDiagError> {
    let mut snap = Snapshot::default();
    let mut diag = SockDiag::open()?;
    for table in &TABLES {
        diag.dump(table, &mut snap.listeners)?;
        snap.sources.push((table.label, Source::SockDiag));
    }
    Ok(snap)
}

fn read_proc_table(table: &Table, text: &mut String, snap: &mut Snapshot) {
    text.clear();
    match std::fs::File::open(table.path).and_then(|mut f| {
        use std::io::Read;
        f.read_to_string(text)
    }) {
        Ok(_) => parse_table(table.label, text, &mut snap.listeners),
        // An IPv6-less kernel has no tcp6/udp6 table: nothing is listening there.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && table.family == AF_INET6 => {}
        Err(e) => snap.errors.push(format!("{}: {e}", table.path)),
    }
}

/// Takes snapshots repeatedly, keeping the netlink socket and buffers between them. A table
/// whose sock_diag dump fails is read from `/proc/net` instead; a failure that will recur
/// (no netlink, the kernel refusing the request) sticks for the reader's lifetime.
#[derive(Debug, Default)]
pub struct SnapshotReader {
    diag: Option<SockDiag>,
    /// Why the netlink socket cannot be used at all.
    unavailable: Option<String>,
    /// Per table, why its dump is not tried again.
    refused: [Option<String>; 4],
    text: String,
}

impl SnapshotReader {
    /// Replace `snap`'s contents with a fresh snapshot.
    pub fn read_into(&mut self, snap: &mut Snapshot) {
        snap.listeners.clear();
        snap.errors.clear();
        snap.sources.clear();
        for (i, table) in TABLES.iter().enumerate() {
            let reason = match (&self.unavailable, &self.refused[i]) {
                (Some(r), _) | (None, Some(r)) => r.clone(),
                (None, None) => match self.dump(table, &mut snap.listeners) {
                    Ok(()) => {
                        snap.sources.push((table.label, Source::SockDiag));
                        continue;
                    }
                    Err(e) => {
                        let reason = e.to_string();
                        match e {
                            SockDiagError::Unsupported | SockDiagError::Socket(_) => {
                                self.unavailable = Some(reason.clone());
                            }
                            // The kernel refusing (e.g. no udp_diag module) will not change
                            // during the run; transport errors are retried next time.
                            SockDiagError::Kernel(_) => self.refused[i] = Some(reason.clone()),
                            _ => {}
                        }
                        reason
                    }
                },
            };
            read_proc_table(table, &mut self.text, snap);
            snap.sources.push((
                table.label,
                Source::ProcNet {
                    sock_diag_error: reason,
                },
            ));
        }
    }

    /// One table through sock_diag. Listeners of a failed dump are discarded; the socket is
    /// dropped so that no reply of the failed dump can be mistaken for the next one's.
    fn dump(&mut self, table: &Table, out: &mut Vec<Listener>) -> Result<(), SockDiagError> {
        let diag = match &mut self.diag {
            Some(d) => d,
            None => self.diag.insert(SockDiag::open()?),
        };
        let mark = out.len();
        let r = diag.dump(table, out);
        if r.is_err() {
            out.truncate(mark);
            self.diag = None;
        }
        r
    }
}

/// Parse one `/proc/net/*` table, appending listeners.
pub fn parse_table(protocol: &'static str, text: &str, out: &mut Vec<Listener>) {
    let tcp = protocol.starts_with("tcp");
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_ascii_whitespace().collect();
        if f.len() < 10 {
            continue;
        }
        let state = f[3];
        // TCP_LISTEN = 0A; for UDP, a bound socket without a peer is in state 07 (CLOSE).
        let listening = if tcp {
            state == "0A"
        } else {
            state == "07" && f[2].ends_with(":0000")
        };
        if !listening {
            continue;
        }
        let Some((addr_hex, port_hex)) = f[1].split_once(':') else {
            continue;
        };
        let Ok(port) = u16::from_str_radix(port_hex, 16) else {
            continue;
        };
        let Some(address) = parse_addr(addr_hex) else {
            continue;
        };
        let Ok(inode) = f[9].parse::<u64>() else {
            continue;
        };
        out.push(Listener {
            protocol,
            address,
            port,
            inode,
        });
    }
}

/// Addresses are printed as 32-bit words in host byte order holding network-order bytes.
fn parse_addr(hex: &str) -> Option<String> {
    let word = |s: &str| u32::from_str_radix(s, 16).ok().map(|w| w.to_ne_bytes());
    match hex.len() {
        8 => {
            let b = word(hex)?;
            Some(Ipv4Addr::new(b[0], b[1], b[2], b[3]).to_string())
        }
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                let b = word(hex.get(i * 8..i * 8 + 8)?)?;
                bytes[i * 4..i * 4 + 4].copy_from_slice(&b);
            }
            Some(Ipv6Addr::from(bytes).to_string())
        }
        _ => None,
    }
}

// Netlink ABI (include/uapi/linux/netlink.h, sock_diag.h, inet_diag.h). Integers in netlink
// headers are in host byte order; ports and addresses in the socket id are in network order.
const NETLINK_SOCK_DIAG: i32 = 4;
const NLMSG_HDRLEN: usize = 16;
const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
/// `struct inet_diag_req_v2`: family, protocol, ext, pad, states (u32), `inet_diag_sockid` (48).
const REQ_LEN: usize = NLMSG_HDRLEN + 56;
/// `struct inet_diag_msg`: family, state, timer, retrans, `inet_diag_sockid` (48), expires,
/// rqueue, wqueue, uid, inode (u32 each).
const DIAG_MSG_LEN: usize = 72;
const DIAG_MSG_SPORT: usize = 4;
const DIAG_MSG_DPORT: usize = 6;
const DIAG_MSG_SRC: usize = 8;
const DIAG_MSG_INODE: usize = 68;
/// The kernel sizes dump replies to at most 32 KiB; twice that leaves room.
const RECV_BUF_LEN: usize = 64 * 1024;
/// Bound on the replies of one dump (each holds hundreds of sockets).
const MAX_REPLIES: usize = 16 * 1024;

/// A `SOCK_DIAG_BY_FAMILY` dump request for `table`.
fn diag_request(table: &Table, seq: u32) -> [u8; REQ_LEN] {
    let mut r = [0u8; REQ_LEN];
    r[0..4].copy_from_slice(&(REQ_LEN as u32).to_ne_bytes());
    r[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    r[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    r[8..12].copy_from_slice(&seq.to_ne_bytes());
    // nlmsg_pid 0: the kernel fills in our port id.
    r[16] = table.family;
    r[17] = table.protocol;
    r[20..24].copy_from_slice(&table.states.to_ne_bytes());
    // A zero socket id matches every socket.
    r
}

/// Whether a dump continues after one reply datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    More,
    Done,
}

fn ne_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn ne_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Parse one reply datagram of the dump `seq` for `table`, appending listeners. Every length is
/// checked against the datagram; anything unexpected is an error, never a panic.
fn parse_diag_reply(
    table: &Table,
    seq: u32,
    datagram: &[u8],
    out: &mut Vec<Listener>,
) -> Result<Progress, SockDiagError> {
    use SockDiagError::Malformed;
    if datagram.is_empty() {
        return Err(Malformed("empty reply"));
    }
    let mut rest = datagram;
    while !rest.is_empty() {
        let (Some(len), Some(kind), Some(msg_seq)) =
            (ne_u32(rest, 0), ne_u16(rest, 4), ne_u32(rest, 8))
        else {
            return Err(Malformed("truncated message header"));
        };
        let len = len as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            return Err(Malformed("message length out of bounds"));
        }
        if msg_seq != seq {
            return Err(Malformed("reply to another request"));
        }
        let payload = &rest[NLMSG_HDRLEN..len];
        match kind {
            NLMSG_DONE => return Ok(Progress::Done),
            NLMSG_ERROR => {
                let errno = ne_u32(payload, 0).ok_or(Malformed("truncated error message"))? as i32;
                // The kernel sends -errno; 0 would be an acknowledgement, which was not asked for.
                return match errno.checked_neg() {
                    Some(e) if e > 0 => {
                        Err(SockDiagError::Kernel(std::io::Error::from_raw_os_error(e)))
                    }
                    _ => Err(Malformed("error message without an error number")),
                };
            }
            NLMSG_NOOP => {}
            SOCK_DIAG_BY_FAMILY => parse_diag_msg(table, payload, out)?,
            _ => return Err(Malformed("unexpected message type")),
        }
        // Messages are 4-byte aligned; the last one may end the datagram without padding.
        let step = len.saturating_add(3) & !3;
        rest = rest.get(step..).unwrap_or(&[]);
    }
    Ok(Progress::More)
}

/// One `inet_diag_msg`.
fn parse_diag_msg(table: &Table, msg: &[u8], out: &mut Vec<Listener>) -> Result<(), SockDiagError> {
    use SockDiagError::Malformed;
    if msg.len() < DIAG_MSG_LEN {
        return Err(Malformed("truncated inet_diag_msg"));
    }
    if msg[0] != table.family {
        return Err(Malformed("socket of another address family"));
    }
    let requested = 1u32
        .checked_shl(u32::from(msg[1]))
        .is_some_and(|bit| table.states & bit != 0);
    if !requested {
        return Err(Malformed("socket in a state that was not requested"));
    }
    let be16 = |at: usize| u16::from_be_bytes([msg[at], msg[at + 1]]);
    // Same rule as the /proc/net parser: a UDP socket with a peer port is connected.
    if table.protocol == IPPROTO_UDP && be16(DIAG_MSG_DPORT) != 0 {
        return Ok(());
    }
    let src = &msg[DIAG_MSG_SRC..DIAG_MSG_SRC + 16];
    let address = if table.family == AF_INET {
        Ipv4Addr::new(src[0], src[1], src[2], src[3]).to_string()
    } else {
        let mut b = [0u8; 16];
        b.copy_from_slice(src);
        Ipv6Addr::from(b).to_string()
    };
    let inode = ne_u32(msg, DIAG_MSG_INODE).ok_or(Malformed("truncated inet_diag_msg"))?;
    out.push(Listener {
        protocol: table.label,
        address,
        port: be16(DIAG_MSG_SPORT),
        inode: u64::from(inode),
    });
    Ok(())
}

/// A `NETLINK_SOCK_DIAG` socket with its receive buffer.
#[cfg(target_os = "linux")]
#[derive(Debug)]
struct SockDiag {
    fd: std::os::fd::OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

#[cfg(target_os = "linux")]
impl SockDiag {
    fn open() -> Result<Self, SockDiagError> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        // SAFETY: socket(2) with constant arguments; the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                NETLINK_SOCK_DIAG,
            )
        };
        if raw < 0 {
            return Err(SockDiagError::Socket(std::io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // A kernel that never answers must not stall the monitor.
        let timeout = libc::timeval {
            tv_sec: 2,
            tv_usec: 0,
        };
        // SAFETY: a valid timeval of the size passed, on our own socket.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(SockDiagError::Socket(std::io::Error::last_os_error()));
        }
        Ok(SockDiag {
            fd,
            seq: 0,
            buf: vec![0; RECV_BUF_LEN],
        })
    }

    fn dump(&mut self, table: &Table, out: &mut Vec<Listener>) -> Result<(), SockDiagError> {
        use std::os::fd::AsRawFd;
        self.seq = self.seq.wrapping_add(1);
        let req = diag_request(table, self.seq);
        // SAFETY: sockaddr_nl is plain data; all-zero is a valid value.
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        let mut tries = 0;
        loop {
            // SAFETY: the request and address outlive the call; lengths match the buffers.
            let n = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    req.as_ptr().cast(),
                    req.len(),
                    0,
                    (&kernel as *const libc::sockaddr_nl).cast(),
                    std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
                )
            };
            if n == req.len() as isize {
                break;
            }
            let e = std::io::Error::last_os_error();
            tries += 1;
            if n < 0 && e.kind() == std::io::ErrorKind::Interrupted && tries < 100 {
                continue;
            }
            return Err(SockDiagError::Send(if n < 0 {
                e
            } else {
                std::io::Error::other("short send")
            }));
        }
        for _ in 0..MAX_REPLIES {
            let n = self.recv()?;
            let datagram = self.buf.get(..n).unwrap_or(&[]);
            if parse_diag_reply(table, self.seq, datagram, out)? == Progress::Done {
                return Ok(());
            }
        }
        Err(SockDiagError::TooLong(MAX_REPLIES))
    }

    /// One datagram from the kernel into `buf`; its length.
    fn recv(&mut self) -> Result<usize, SockDiagError> {
        use std::os::fd::AsRawFd;
        let mut tries = 0;
        loop {
            // SAFETY: as above.
            let mut from: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
            let mut from_len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
            // SAFETY: `buf` and `from` are valid for the lengths passed. MSG_TRUNC makes the
            // call return the datagram's full length, so truncation is detected.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    libc::MSG_TRUNC,
                    (&mut from as *mut libc::sockaddr_nl).cast(),
                    &mut from_len,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                tries += 1;
                if e.kind() == std::io::ErrorKind::Interrupted && tries < 100 {
                    continue;
                }
                return Err(SockDiagError::Recv(e));
            }
            let n = n as usize;
            if n > self.buf.len() {
                return Err(SockDiagError::Truncated(n));
            }
            if from.nl_pid != 0 {
                return Err(SockDiagError::Malformed("reply not sent by the kernel"));
            }
            return Ok(n);
        }
    }
}

/// Elsewhere there is no sock_diag; every table comes from the fallback.
#[cfg(not(target_os = "linux"))]
#[derive(Debug)]
struct SockDiag;

#[cfg(not(target_os = "linux"))]
impl SockDiag {
    fn open() -> Result<Self, SockDiagError> {
        Err(SockDiagError::Unsupported)
    }

    fn dump(&mut self, _: &Table, _: &mut Vec<Listener>) -> Result<(), SockDiagError> {
        Err(SockDiagError::Unsupported)
    }
}

/// Socket inodes held open by `pid` (from `/proc/PID/fd/*` links `socket:[N]`). Unreadable fd
/// directories (another user's process) yield nothing.
pub fn socket_inodes(pid: u32, out: &mut HashSet<u64>) {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return;
    };
    for entry in dir.flatten() {
        if let Ok(target) = std::fs::read_link(entry.path()) {
            let t = target.to_string_lossy();
            if let Some(n) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                if let Ok(inode) = n.parse() {
                    out.insert(inode);
                }
            }
        }
    }
}

/// Accumulates listeners seen during a run and builds [`PortEvidence`].
#[derive(Debug, Default)]
pub struct PortObserver {
    before: Vec<Listener>,
    before_inodes: HashSet<u64>,
    /// New listeners (not present before), keyed by inode, with the owning identity if attributed.
    opened: BTreeMap<u64, (Listener, Option<crate::ProcessIdentity>)>,
    last: Vec<Listener>,
    errors: Vec<String>,
    snap: Snapshot,
    reader: SnapshotReader,
    /// Per table and interface ([`Source::describe`]), how many snapshots it served.
    sources: BTreeMap<String, usize>,
    snapshots: usize,
}

impl PortObserver {
    /// Start observing: take the before-snapshot.
    pub fn start() -> Self {
        Self::start_with(SnapshotReader::default())
    }

    fn start_with(reader: SnapshotReader) -> Self {
        let mut o = PortObserver {
            reader,
            ..PortObserver::default()
        };
        o.take_snapshot();
        o.before = o.snap.listeners.clone();
        o.before_inodes = o.before.iter().map(|l| l.inode).collect();
        o.last = o.before.clone();
        o
    }

    /// Read a snapshot into `snap`, keeping its errors and sources for the evidence.
    fn take_snapshot(&mut self) {
        self.reader.read_into(&mut self.snap);
        self.snapshots += 1;
        for e in self.snap.errors.drain(..) {
            if !self.errors.contains(&e) {
                self.errors.push(e);
            }
        }
        for (i, (_, source)) in self.snap.sources.iter().enumerate() {
            if let Some(table) = TABLES.get(i) {
                *self.sources.entry(source.describe(table)).or_default() += 1;
            }
        }
    }

    /// The note with the interfaces the snapshots were read from.
    fn note(&self) -> String {
        let all_sock_diag = self.sources.len() == TABLES.len()
            && self.sources.values().all(|n| *n == self.snapshots)
            && self
                .sources
                .keys()
                .all(|k| k.ends_with(" via netlink sock_diag"));
        if all_sock_diag {
            return format!(
                "{OBSERVE_NOTE} All {} snapshots were read via netlink sock_diag.",
                self.snapshots
            );
        }
        let parts: Vec<String> = self
            .sources
            .iter()
            .map(|(what, n)| format!("{what} in {n} of {} snapshots", self.snapshots))
            .collect();
        format!("{OBSERVE_NOTE} Sources: {}.", parts.join("; "))
    }

    /// Take a snapshot now and attribute new listeners to the owned processes `owned`
    /// (pid → identity) that hold their socket inode; of several holders, the earliest started.
    pub fn sample(&mut self, owned: &[(u32, crate::ProcessIdentity)]) {
        self.take_snapshot();
        let fresh: Vec<Listener> = self
            .snap
            .listeners
            .iter()
            .filter(|l| !self.before_inodes.contains(&l.inode))
            .filter(|l| self.opened.get(&l.inode).map_or(true, |(_, o)| o.is_none()))
            .cloned()
            .collect();
        if !fresh.is_empty() {
            // Only now pay for reading fd tables, and only of owned processes.
            let mut held = HashSet::new();
            for (pid, id) in owned {
                held.clear();
                socket_inodes(*pid, &mut held);
                for l in &fresh {
                    if !held.contains(&l.inode) {
                        continue;
                    }
                    // Children inherit descriptors (a fork holds its parent's sockets until it
                    // execs), so of several holders the earliest started is the creator's side.
                    let earlier = match self.opened.get(&l.inode) {
                        Some((_, Some(cur))) => id.start_time_ticks < cur.start_time_ticks,
                        _ => true,
                    };
                    if earlier {
                        self.opened.insert(l.inode, (l.clone(), Some(id.clone())));
                    }
                }
            }
            for l in fresh {
                self.opened.entry(l.inode).or_insert((l, None));
            }
        }
        self.last.clone_from(&self.snap.listeners);
    }

    /// Evidence: listeners opened during the run (attributed or machine-wide) and listeners
    /// present before but gone at the last snapshot.
    pub fn finish(self) -> PortEvidence {
        let note = self.note();
        let last_inodes: HashSet<u64> = self.last.iter().map(|l| l.inode).collect();
        let last_keys: HashSet<(&str, &str, u16)> = self.last.iter().map(Listener::key).collect();
        let mut opened: Vec<PortRecord> = self
            .opened
            .into_values()
            .map(|(l, owner)| PortRecord {
                protocol: l.protocol.to_string(),
                address: l.address,
                port: l.port,
                inode: l.inode,
                attributed: owner.is_some(),
                owner,
            })
            .collect();
        opened.sort();
        let mut closed: Vec<PortRecord> = self
            .before
            .iter()
            .filter(|l| !last_inodes.contains(&l.inode) && !last_keys.contains(&l.key()))
            .map(|l| PortRecord {
                protocol: l.protocol.to_string(),
                address: l.address.clone(),
                port: l.port,
                inode: l.inode,
                attributed: false,
                owner: None,
            })
            .collect();
        closed.sort();
        PortEvidence {
            mode: agentdiff_backend_api::PortMode::Observe,
            opened,
            closed,
            errors: self.errors,
            note,
            infrastructure: Vec::new(),
        }
    }
}

/// Evidence for `network.mode: off`.
pub fn off_evidence() -> PortEvidence {
    PortEvidence {
        mode: agentdiff_backend_api::PortMode::Off,
        opened: Vec::new(),
        closed: Vec::new(),
        errors: Vec::new(),
        note: OFF_NOTE.into(),
        infrastructure: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 100 0 0 10 0
   1: 0100007F:A1B2 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 22222 1 0000000000000000 20 4 30 10 -1
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0000000000000000 100 0 0 10 0
";
    const UDP: &str = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  100: 00000000:0044 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 999 2 0000000000000000 0
  101: 0100007F:0045 0200007F:0050 01 00000000:00000000 00:00000000 00000000     0        0 998 2 0000000000000000 0
";

    #[test]
    fn tables_parse_to_listeners_only() {
        let mut out = Vec::new();
        parse_table("tcp", TCP, &mut out);
        parse_table("tcp6", TCP6, &mut out);
        parse_table("udp", UDP, &mut out);
        if cfg!(target_endian = "little") {
            assert_eq!(
                out,
                vec![
                    Listener {
                        protocol: "tcp",
                        address: "127.0.0.1".into(),
                        port: 8080,
                        inode: 12345
                    },
                    Listener {
                        protocol: "tcp6",
                        address: "::1".into(),
                        port: 22,
                        inode: 777
                    },
                    Listener {
                        protocol: "udp",
                        address: "0.0.0.0".into(),
                        port: 68,
                        inode: 999
                    },
                ]
            );
        }
    }

    #[test]
    fn malformed_lines_are_skipped() {
        let mut out = Vec::new();
        parse_table(
            "tcp",
            "header\n0: zz:zz 0 0A a b c d e f\nshort line\n",
            &mut out,
        );
        assert!(out.is_empty());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn own_listener_is_seen_and_attributed_to_this_process() {
        let mut obs = PortObserver::start();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let me = std::process::id();
        let id = crate::read_identity(me).unwrap();
        obs.sample(&[(me, id.clone())]);
        let ev = obs.finish();
        let rec = ev
            .opened
            .iter()
            .find(|r| r.port == port && r.protocol == "tcp")
            .expect("listener seen");
        assert!(rec.attributed);
        assert_eq!(rec.owner.as_ref(), Some(&id));
        assert_eq!(rec.address, "127.0.0.1");
        assert_eq!(ev.mode, agentdiff_backend_api::PortMode::Observe);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn listener_of_an_unowned_process_is_machine_wide() {
        let mut obs = PortObserver::start();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        obs.sample(&[]);
        let ev = obs.finish();
        let rec = ev.opened.iter().find(|r| r.port == port).expect("seen");
        assert!(!rec.attributed);
        assert!(rec.owner.is_none());
        assert!(ev.note.contains("does not block"));
    }

    // --- sock_diag: replies crafted byte by byte ---

    const SEQ: u32 = 7;

    fn nlmsg(kind: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((NLMSG_HDRLEN + payload.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&0x2u16.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(payload);
        while m.len() % 4 != 0 {
            m.push(0);
        }
        m
    }

    fn diag_msg(family: u8, state: u8, sport: u16, dport: u16, src: &[u8], inode: u32) -> Vec<u8> {
        let mut m = vec![0u8; DIAG_MSG_LEN];
        m[0] = family;
        m[1] = state;
        m[DIAG_MSG_SPORT..DIAG_MSG_SPORT + 2].copy_from_slice(&sport.to_be_bytes());
        m[DIAG_MSG_DPORT..DIAG_MSG_DPORT + 2].copy_from_slice(&dport.to_be_bytes());
        m[DIAG_MSG_SRC..DIAG_MSG_SRC + src.len()].copy_from_slice(src);
        m[DIAG_MSG_INODE..DIAG_MSG_INODE + 4].copy_from_slice(&inode.to_ne_bytes());
        m
    }

    fn done() -> Vec<u8> {
        nlmsg(NLMSG_DONE, SEQ, &0i32.to_ne_bytes())
    }

    fn parse(table: usize, datagram: &[u8]) -> (Result<Progress, SockDiagError>, Vec<Listener>) {
        let mut out = Vec::new();
        let r = parse_diag_reply(&TABLES[table], SEQ, datagram, &mut out);
        (r, out)
    }

    #[test]
    fn request_is_an_inet_diag_req_v2_dump() {
        let r = diag_request(&TABLES[3], 42);
        assert_eq!(r.len(), 72);
        assert_eq!(u32::from_ne_bytes(r[0..4].try_into().unwrap()), 72);
        assert_eq!(u16::from_ne_bytes(r[4..6].try_into().unwrap()), 20);
        assert_eq!(u16::from_ne_bytes(r[6..8].try_into().unwrap()), 0x301);
        assert_eq!(u32::from_ne_bytes(r[8..12].try_into().unwrap()), 42);
        assert_eq!((r[16], r[17]), (10, 17));
        assert_eq!(u32::from_ne_bytes(r[20..24].try_into().unwrap()), 1 << 7);
        assert!(r[24..].iter().all(|b| *b == 0));
    }

    #[test]
    fn well_formed_replies_parse_to_listeners() {
        let mut d = nlmsg(
            SOCK_DIAG_BY_FAMILY,
            SEQ,
            &diag_msg(2, TCP_LISTEN, 8080, 0, &[127, 0, 0, 1], 12345),
        );
        d.extend(nlmsg(
            SOCK_DIAG_BY_FAMILY,
            SEQ,
            &diag_msg(2, TCP_LISTEN, 22, 0, &[0, 0, 0, 0], 6),
        ));
        let (r, out) = parse(0, &d);
        assert_eq!(r.unwrap(), Progress::More);
        assert_eq!(
            out,
            vec![
                Listener {
                    protocol: "tcp",
                    address: "127.0.0.1".into(),
                    port: 8080,
                    inode: 12345
                },
                Listener {
                    protocol: "tcp",
                    address: "0.0.0.0".into(),
                    port: 22,
                    inode: 6
                },
            ]
        );
        let mut loopback6 = [0u8; 16];
        loopback6[15] = 1;
        let mut d = nlmsg(
            SOCK_DIAG_BY_FAMILY,
            SEQ,
            &diag_msg(10, TCP_CLOSE, 53, 0, &loopback6, 9),
        );
        // A UDP socket with a peer port is connected, as in the /proc/net parser.
        d.extend(nlmsg(
            SOCK_DIAG_BY_FAMILY,
            SEQ,
            &diag_msg(10, TCP_CLOSE, 54, 443, &loopback6, 10),
        ));
        d.extend(done());
        let (r, out) = parse(3, &d);
        assert_eq!(r.unwrap(), Progress::Done);
        assert_eq!(
            out,
            vec![Listener {
                protocol: "udp6",
                address: "::1".into(),
                port: 53,
                inode: 9
            }]
        );
    }

    #[test]
    fn malformed_replies_are_rejected() {
        let good = nlmsg(
            SOCK_DIAG_BY_FAMILY,
            SEQ,
            &diag_msg(2, TCP_LISTEN, 80, 0, &[127, 0, 0, 1], 1),
        );
        let mut len_too_big = good.clone();
        len_too_big[0..4].copy_from_slice(&(good.len() as u32 + 4).to_ne_bytes());
        let mut len_max = good.clone();
        len_max[0..4].copy_from_slice(&u32::MAX.to_ne_bytes());
        let mut len_too_small = good.clone();
        len_too_small[0..4].copy_from_slice(&15u32.to_ne_bytes());
        let mut good_then_cut = good.clone();
        good_then_cut.extend_from_slice(&good[..20]);
        let short_msg = nlmsg(
            SOCK_DIAG_BY_FAMILY,
            SEQ,
            &diag_msg(2, TCP_LISTEN, 80, 0, &[], 1)[..DIAG_MSG_LEN - 1],
        );
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("short header", good[..10].to_vec()),
            ("length beyond the datagram", len_too_big),
            ("length u32::MAX", len_max),
            ("length below the header", len_too_small),
            ("truncated second message", good_then_cut),
            ("other sequence number", {
                let mut m = good.clone();
                m[8..12].copy_from_slice(&(SEQ + 1).to_ne_bytes());
                m
            }),
            ("unknown type", nlmsg(99, SEQ, &[0; 8])),
            ("short inet_diag_msg", short_msg),
            (
                "other family",
                nlmsg(
                    SOCK_DIAG_BY_FAMILY,
                    SEQ,
                    &diag_msg(10, TCP_LISTEN, 80, 0, &[], 1),
                ),
            ),
            (
                "state not requested",
                nlmsg(
                    SOCK_DIAG_BY_FAMILY,
                    SEQ,
                    &diag_msg(2, 1, 80, 0, &[127, 0, 0, 1], 1),
                ),
            ),
            (
                "state out of range",
                nlmsg(
                    SOCK_DIAG_BY_FAMILY,
                    SEQ,
                    &diag_msg(2, 200, 80, 0, &[127, 0, 0, 1], 1),
                ),
            ),
            ("error without errno", nlmsg(NLMSG_ERROR, SEQ, &[0, 0])),
            ("error 0", nlmsg(NLMSG_ERROR, SEQ, &0i32.to_ne_bytes())),
            (
                "error i32::MIN",
                nlmsg(NLMSG_ERROR, SEQ, &i32::MIN.to_ne_bytes()),
            ),
            (
                "positive error",
                nlmsg(NLMSG_ERROR, SEQ, &5i32.to_ne_bytes()),
            ),
        ];
        for (what, d) in cases {
            let (r, _) = parse(0, &d);
            assert!(
                matches!(r, Err(SockDiagError::Malformed(_))),
                "{what}: {r:?}"
            );
        }
        let (r, out) = parse(0, &nlmsg(NLMSG_ERROR, SEQ, &(-libc::EPERM).to_ne_bytes()));
        match r {
            Err(SockDiagError::Kernel(e)) => assert_eq!(e.raw_os_error(), Some(libc::EPERM)),
            other => panic!("kernel error expected: {other:?}"),
        }
        assert!(out.is_empty());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_replies_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400), table in 0usize..4) {
            let _ = parse(table, &bytes);
        }

        #[test]
        fn corrupted_replies_never_panic(
            flips in proptest::collection::vec((0usize..256, proptest::prelude::any::<u8>()), 1..8),
            cut in 0usize..256,
        ) {
            let mut d = nlmsg(SOCK_DIAG_BY_FAMILY, SEQ, &diag_msg(2, TCP_LISTEN, 80, 0, &[127, 0, 0, 1], 1));
            d.extend(nlmsg(SOCK_DIAG_BY_FAMILY, SEQ, &diag_msg(2, TCP_LISTEN, 81, 0, &[10, 0, 0, 1], 2)));
            d.extend(done());
            for (at, b) in flips {
                let at = at % d.len();
                d[at] = b;
            }
            d.truncate(cut.max(1).min(d.len()));
            let _ = parse(0, &d);
        }
    }

    // --- sock_diag against /proc/net on sockets this test opens ---

    #[cfg(target_os = "linux")]
    fn inode_of(fd: &impl std::os::fd::AsRawFd) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .unwrap()
            .ino()
    }

    /// Both interfaces' snapshots, or `None` (with the reason printed) when sock_diag is absent.
    #[cfg(target_os = "linux")]
    fn both_snapshots() -> Option<(Snapshot, Snapshot)> {
        match sock_diag_snapshot() {
            Ok(diag) => {
                let proc = proc_net_snapshot();
                assert!(proc.errors.is_empty(), "{:?}", proc.errors);
                Some((diag, proc))
            }
            Err(e @ SockDiagError::Socket(_)) => {
                eprintln!("SKIPPED: netlink sock_diag is unavailable here: {e}");
                None
            }
            Err(e) => panic!("sock_diag dump failed: {e}"),
        }
    }

    #[cfg(target_os = "linux")]
    fn find<'a>(snap: &'a Snapshot, protocol: &str, inode: u64) -> Vec<&'a Listener> {
        snap.listeners
            .iter()
            .filter(|l| l.protocol == protocol && l.inode == inode)
            .collect()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn sock_diag_and_proc_net_agree_on_own_listeners() {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let tcp6 = match std::net::TcpListener::bind("[::1]:0") {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("SKIPPED tcp6 part: cannot bind [::1]:0 (IPv6 disabled?): {e}");
                None
            }
        };
        let Some((diag, proc)) = both_snapshots() else {
            return;
        };
        assert!(diag.sources.iter().all(|(_, s)| *s == Source::SockDiag));
        let mut own = vec![
            (
                "tcp",
                inode_of(&tcp),
                "127.0.0.1",
                tcp.local_addr().unwrap().port(),
            ),
            (
                "udp",
                inode_of(&udp),
                "127.0.0.1",
                udp.local_addr().unwrap().port(),
            ),
        ];
        if let Some(l) = &tcp6 {
            own.push(("tcp6", inode_of(l), "::1", l.local_addr().unwrap().port()));
        }
        for (protocol, inode, address, port) in own {
            let expected = Listener {
                protocol: match protocol {
                    "tcp" => "tcp",
                    "udp" => "udp",
                    _ => "tcp6",
                },
                address: address.into(),
                port,
                inode,
            };
            assert_eq!(find(&diag, protocol, inode), vec![&expected], "sock_diag");
            assert_eq!(find(&proc, protocol, inode), vec![&expected], "/proc/net");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn connected_sockets_are_not_listeners() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        udp.connect(listener.local_addr().unwrap()).unwrap();
        let Some((diag, proc)) = both_snapshots() else {
            return;
        };
        for (what, snap) in [("sock_diag", &diag), ("/proc/net", &proc)] {
            assert_eq!(find(snap, "tcp", inode_of(&listener)).len(), 1, "{what}");
            for inode in [inode_of(&client), inode_of(&server), inode_of(&udp)] {
                assert!(
                    snap.listeners.iter().all(|l| l.inode != inode),
                    "{what}: connected socket {inode} reported: {:?}",
                    snap.listeners
                );
            }
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn observer_records_the_sock_diag_source() {
        if let Err(e @ SockDiagError::Socket(_)) = SockDiag::open() {
            eprintln!("SKIPPED: netlink sock_diag is unavailable here: {e}");
            return;
        }
        let mut obs = PortObserver::start();
        obs.sample(&[]);
        let ev = obs.finish();
        assert!(
            ev.note
                .ends_with("All 2 snapshots were read via netlink sock_diag."),
            "{}",
            ev.note
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn without_sock_diag_the_proc_net_fallback_is_used_and_recorded() {
        let reader = SnapshotReader {
            unavailable: Some("netlink disabled for this test".into()),
            ..SnapshotReader::default()
        };
        let mut obs = PortObserver::start_with(reader);
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let me = std::process::id();
        let id = crate::read_identity(me).unwrap();
        obs.sample(&[(me, id.clone())]);
        let ev = obs.finish();
        let rec = ev
            .opened
            .iter()
            .find(|r| r.port == port && r.protocol == "tcp")
            .expect("listener seen through /proc/net");
        assert_eq!(rec.owner.as_ref(), Some(&id));
        assert!(
            ev.note.contains(
                "tcp via /proc/net/tcp because netlink sock_diag failed \
                 (netlink disabled for this test) in 2 of 2 snapshots"
            ),
            "{}",
            ev.note
        );
        assert!(ev.note.contains("udp6 via /proc/net/udp6"), "{}", ev.note);
    }
}
