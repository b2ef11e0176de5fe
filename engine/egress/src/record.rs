//! The connection log: one record per attempt, bounded against a flood.
//!
//! Invariants: `total` counts every attempt that named a host; `records` holds the first
//! `max_records` of them in start order (`records_omitted` says how many more there were);
//! `hosts` counts attempts per host for the first `max_hosts` distinct hosts (`hosts_omitted`
//! counts attempts to the others). Requests that never named a host are only counted
//! (`malformed`). Nothing here grows with the number of connections beyond those bounds.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::SystemTime;

use agentdiff_policy::{Action, EgressDecision};
use serde::{Deserialize, Serialize};

/// How the client asked for the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// An HTTP request with an absolute `http://` URI.
    Http,
    /// An HTTP `CONNECT` tunnel.
    Connect,
    /// A SOCKS5 `CONNECT`.
    Socks5,
}

/// One connection attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionRecord {
    pub host: String,
    pub port: u16,
    pub protocol: Protocol,
    pub action: Action,
    /// The rule that decided (see `EgressDecision::rule`).
    pub rule: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    pub reason: String,
    /// The address connected to, when a connection was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Bytes from the client to the host, and back.
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub started_at: String,
    /// `None` while open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// Why an allowed connection was not made, or how it ended early.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Attempts per host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostCount {
    pub host: String,
    pub allowed: u64,
    pub denied: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

/// Everything the proxy saw, bounded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressLog {
    /// Every attempt that named a host.
    pub total: u64,
    pub allowed: u64,
    pub denied: u64,
    /// Requests that named no host the proxy could read (not HTTP, SOCKS5 or within bounds).
    pub malformed: u64,
    /// Clients closed at once because the proxy was serving its maximum of connections.
    pub over_capacity: u64,
    /// The first attempts, in start order.
    pub records: Vec<ConnectionRecord>,
    pub records_omitted: u64,
    /// Per host, sorted by name.
    pub hosts: Vec<HostCount>,
    /// Attempts to hosts beyond the host bound.
    pub hosts_omitted: u64,
}

/// Bounds of the log.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub max_records: usize,
    pub max_hosts: usize,
}

#[derive(Default)]
struct State {
    log: EgressLog,
    hosts: BTreeMap<String, HostCount>,
}

/// The shared log a proxy writes.
pub(crate) struct Recorder {
    bounds: Bounds,
    state: Mutex<State>,
}

/// Where a started attempt is kept, so its end can be written.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot(Option<usize>);

pub(crate) fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

impl Recorder {
    pub(crate) fn new(bounds: Bounds) -> Recorder {
        Recorder {
            bounds,
            state: Mutex::new(State::default()),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // A poisoned lock means a panic while recording; the data is still counts and records.
        let mut guard = match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut guard)
    }

    pub(crate) fn malformed(&self) {
        self.with(|s| s.log.malformed += 1);
    }

    pub(crate) fn over_capacity(&self) {
        self.with(|s| s.log.over_capacity += 1);
    }

    /// Record a decided attempt (its final decision, after any address check).
    pub(crate) fn start(&self, protocol: Protocol, d: &EgressDecision) -> Slot {
        let bounds = self.bounds;
        self.with(|s| {
            s.log.total += 1;
            let allowed = d.action == Action::Allow;
            if allowed {
                s.log.allowed += 1;
            } else {
                s.log.denied += 1;
            }
            let known = s.hosts.len();
            match s.hosts.get_mut(&d.host) {
                Some(h) => bump(h, allowed),
                None if known < bounds.max_hosts => {
                    let mut h = HostCount {
                        host: d.host.clone(),
                        ..HostCount::default()
                    };
                    bump(&mut h, allowed);
                    s.hosts.insert(d.host.clone(), h);
                }
                None => s.log.hosts_omitted += 1,
            }
            if s.log.records.len() >= bounds.max_records {
                s.log.records_omitted += 1;
                return Slot(None);
            }
            s.log.records.push(ConnectionRecord {
                host: d.host.clone(),
                port: d.port,
                protocol,
                action: d.action,
                rule: d.rule.clone(),
                pattern: d.pattern.clone(),
                reason: d.reason.clone(),
                address: None,
                bytes_up: 0,
                bytes_down: 0,
                started_at: now(),
                ended_at: None,
                error: None,
            });
            Slot(Some(s.log.records.len() - 1))
        })
    }

    /// Record how an attempt ended.
    pub(crate) fn finish(&self, slot: Slot, host: &str, end: End) {
        self.with(|s| {
            if let Some(h) = s.hosts.get_mut(host) {
                h.bytes_up += end.bytes_up;
                h.bytes_down += end.bytes_down;
            }
            let Some(r) = slot.0.and_then(|i| s.log.records.get_mut(i)) else {
                return;
            };
            r.address = end.address;
            r.bytes_up = end.bytes_up;
            r.bytes_down = end.bytes_down;
            r.ended_at = Some(now());
            r.error = end.error;
        });
    }

    pub(crate) fn snapshot(&self) -> EgressLog {
        self.with(|s| {
            let mut log = s.log.clone();
            log.hosts = s.hosts.values().cloned().collect();
            log
        })
    }
}

fn bump(h: &mut HostCount, allowed: bool) {
    if allowed {
        h.allowed += 1;
    } else {
        h.denied += 1;
    }
}

/// How an attempt ended.
#[derive(Debug, Default)]
pub(crate) struct End {
    pub(crate) address: Option<String>,
    pub(crate) bytes_up: u64,
    pub(crate) bytes_down: u64,
    pub(crate) error: Option<String>,
}
