//! Listening-socket snapshots from `/proc/net/{tcp,tcp6,udp,udp6}`.
//!
//! This is observation only: it blocks no traffic, and a listener is attributed to a run only when
//! its socket inode is held open by a process the run owns at snapshot time. Everything else is a
//! machine-wide observation (seed 000).

use std::collections::{BTreeMap, HashSet};
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::backend::{PortEvidence, PortRecord};

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

/// Listening sockets at one moment, and what could not be read.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub listeners: Vec<Listener>,
    pub errors: Vec<String>,
}

const TABLES: [(&str, &str); 4] = [
    ("tcp", "/proc/net/tcp"),
    ("tcp6", "/proc/net/tcp6"),
    ("udp", "/proc/net/udp"),
    ("udp6", "/proc/net/udp6"),
];

/// Take a snapshot of every listening TCP socket and every bound, unconnected UDP socket.
/// A table that cannot be read (absent IPv6, permissions) becomes an error entry.
pub fn snapshot() -> Snapshot {
    let mut snap = Snapshot::default();
    let mut buf = String::new();
    snapshot_into(&mut snap, &mut buf);
    snap
}

/// [`snapshot`] reusing caller buffers (the supervisor samples periodically).
pub fn snapshot_into(snap: &mut Snapshot, buf: &mut String) {
    snap.listeners.clear();
    snap.errors.clear();
    for (proto, path) in TABLES {
        buf.clear();
        match std::fs::File::open(path).and_then(|mut f| {
            use std::io::Read;
            f.read_to_string(buf)
        }) {
            Ok(_) => parse_table(proto, buf, &mut snap.listeners),
            // An IPv6-less kernel has no tcp6/udp6 table: nothing is listening there.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && proto.ends_with('6') => {}
            Err(e) => snap.errors.push(format!("{path}: {e}")),
        }
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
    opened: BTreeMap<u64, (Listener, Option<crate::process::ProcessIdentity>)>,
    last: Vec<Listener>,
    errors: Vec<String>,
    snap: Snapshot,
    buf: String,
}

impl PortObserver {
    /// Start observing: take the before-snapshot.
    pub fn start() -> Self {
        let mut o = PortObserver::default();
        snapshot_into(&mut o.snap, &mut o.buf);
        o.before = o.snap.listeners.clone();
        o.before_inodes = o.before.iter().map(|l| l.inode).collect();
        o.last = o.before.clone();
        o.record_errors();
        o
    }

    fn record_errors(&mut self) {
        for e in self.snap.errors.drain(..) {
            if !self.errors.contains(&e) {
                self.errors.push(e);
            }
        }
    }

    /// Take a snapshot now and attribute new listeners to the owned processes `owned`
    /// (pid → identity) that hold their socket inode.
    pub fn sample(&mut self, owned: &[(u32, crate::process::ProcessIdentity)]) {
        snapshot_into(&mut self.snap, &mut self.buf);
        self.record_errors();
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
                    if held.contains(&l.inode) {
                        self.opened.insert(l.inode, (l.clone(), Some(id.clone())));
                    }
                }
            }
            for l in fresh {
                self.opened.entry(l.inode).or_insert((l, None));
            }
        }
        self.last = self.snap.listeners.clone();
    }

    /// Evidence: listeners opened during the run (attributed or machine-wide) and listeners
    /// present before but gone at the last snapshot.
    pub fn finish(self) -> PortEvidence {
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
            mode: "observe".into(),
            opened,
            closed,
            errors: self.errors,
            note: OBSERVE_NOTE.into(),
        }
    }
}

/// Evidence for `network.mode: off`.
pub fn off_evidence() -> PortEvidence {
    PortEvidence {
        mode: "off".into(),
        opened: Vec::new(),
        closed: Vec::new(),
        errors: Vec::new(),
        note: OFF_NOTE.into(),
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
        let id = crate::process::read_identity(me).unwrap();
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
        assert_eq!(ev.mode, "observe");
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
}
