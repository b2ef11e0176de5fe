//! The connection log: every attempt recorded from the moment its request is read, aggregated
//! per destination, bounded against a flood without losing what matters.
//!
//! Invariants:
//! - `total` counts every attempt that named a host, from the moment its request was read;
//!   once the proxy has stopped, `total = allowed + denied + undecided`, and the byte totals
//!   count every byte relayed.
//! - `destinations` aggregates attempts per (host, port, decision): repeats never cost an
//!   entry. Refused attempts, connections that were made, and allowed attempts that made none
//!   each have their own bound, so a flood of one kind never pushes out another: junk refused
//!   hosts cannot hide an allowed connection that moved bytes.
//! - What a bound left out is counted exactly in `omitted`, per decision (attempts, distinct
//!   hosts and destinations, bytes), so no attempt and no byte is lost from the totals.
//! - `records` keeps the first attempts in start order, refused and allowed names each within
//!   their own bound (`records_omitted` counts the rest).
//! - Nothing here grows with the number of connections beyond those bounds, except the
//!   fingerprints used to count omitted hosts exactly (8 bytes each, at most
//!   [`MAX_DISTINCT`] per decision; beyond that `distinct_capped` says the counts are lower
//!   bounds).

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::SystemTime;

use agentdiff_policy::{Action, EgressDecision};
use serde::{Deserialize, Serialize};

/// Distinct omitted hosts (and destinations) counted exactly per decision.
pub const MAX_DISTINCT: usize = 1 << 20;

/// Destinations tracked among a decision's omitted attempts (see [`Frequent`]).
pub const MAX_FREQUENT: usize = 32;

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

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Denied; the client was told so.
    Refused,
    /// Allowed, but no connection could be made (resolution or connect failed).
    Failed,
    /// Connected and relayed until one side closed.
    Relayed,
    /// Connected and still relaying when the proxy stopped; closed then.
    ClosedAtExit,
    /// Still being decided, resolved or connected when the proxy stopped: whatever the client
    /// meant to do was cut short, and an allowed name's addresses may never have been checked
    /// (then the action is `review`).
    InFlightAtExit,
}

/// One connection attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionRecord {
    pub host: String,
    pub port: u16,
    pub protocol: Protocol,
    /// The decision: the host's, then (once resolved) its address's; `review` when the
    /// proxy stopped before an allowed name's addresses were checked.
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
    /// When the request was read.
    pub started_at: String,
    /// `None` while open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// `None` while open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    /// Why an allowed connection was not made, or how it ended early.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The attempts to one (host, port) with one decision, ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Destination {
    pub host: String,
    pub port: u16,
    pub action: Action,
    /// The rule, pattern and reason of the first such attempt.
    pub rule: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    pub reason: String,
    pub attempts: u64,
    /// Attempts that reached the host (an upstream connection was made).
    pub connected: u64,
    /// Attempts still in flight when the proxy stopped ([`Outcome::InFlightAtExit`]).
    pub in_flight_at_exit: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

/// A destination seen often among a decision's omitted attempts. Tracked with the Space-Saving
/// algorithm: any destination with more than 1/[`MAX_FREQUENT`] of those attempts is listed, so
/// a flood of distinct junk hosts cannot hide a destination it repeats.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frequent {
    pub host: String,
    pub port: u16,
    /// Omitted attempts to it: at least `min_attempts`, at most `attempts`.
    pub attempts: u64,
    pub min_attempts: u64,
}

/// Attempts of one decision that a bound left out of `destinations`, counted exactly.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Omitted {
    pub attempts: u64,
    /// Distinct hosts, and distinct (host, port), among those attempts.
    pub hosts: u64,
    pub destinations: u64,
    pub connected: u64,
    pub in_flight_at_exit: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// More than [`MAX_DISTINCT`] distinct hosts: `hosts` and `destinations` are lower bounds.
    pub distinct_capped: bool,
    /// The destinations seen most often among these attempts, most first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub frequent: Vec<Frequent>,
}

impl Omitted {
    pub fn is_empty(&self) -> bool {
        self.attempts == 0
    }
}

/// What the bounds left out, per decision.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct OmittedByDecision {
    pub allowed: Omitted,
    /// Attempts the proxy stopped before their addresses were checked.
    pub undecided: Omitted,
    pub denied: Omitted,
}

/// Everything the proxy saw, bounded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EgressLog {
    /// Every attempt that named a host.
    pub total: u64,
    pub allowed: u64,
    pub denied: u64,
    /// Allowed by name, but the proxy stopped before its addresses were checked (`review`).
    pub undecided: u64,
    /// Attempts still being decided, resolved or connected when the proxy stopped (of any
    /// decision).
    pub in_flight_at_exit: u64,
    /// Clients whose request was still being read when the proxy stopped (no host known).
    pub unread_at_exit: u64,
    /// Requests that named no host the proxy could read (not HTTP, SOCKS5 or within bounds).
    pub malformed: u64,
    /// Clients closed at once because the proxy was serving its maximum of connections.
    pub over_capacity: u64,
    /// Bytes relayed over every attempt, listed or not.
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// The first attempts, in start order.
    pub records: Vec<ConnectionRecord>,
    pub records_omitted: u64,
    /// Per (host, port, decision), sorted by host, port and decision.
    pub destinations: Vec<Destination>,
    pub omitted: OmittedByDecision,
}

/// Bounds of the log, each applied per kind of attempt (see the module's invariants).
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub max_records: usize,
    pub max_destinations: usize,
}

/// The kinds of attempt that are bounded apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Denied = 0,
    Connected = 1,
    Unconnected = 2,
}

type Key = (String, u16, u8);

fn action_index(a: Action) -> u8 {
    match a {
        Action::Allow => 0,
        Action::Review => 1,
        Action::Deny => 2,
    }
}

#[derive(Default)]
struct Distinct {
    hosts: HashSet<u64>,
    destinations: HashSet<u64>,
}

#[derive(Default)]
struct State {
    log: EgressLog,
    /// Records kept so far for allowed names, and for refused ones.
    records_kept: [usize; 2],
    classes: [HashMap<Key, Destination>; 3],
    distinct: [Distinct; 3],
    /// Keyed per proxy, so a client cannot craft hosts whose fingerprints collide.
    keys: RandomState,
}

/// The shared log a proxy writes.
pub(crate) struct Recorder {
    bounds: Bounds,
    state: Mutex<State>,
}

/// A started attempt, so its end can be written.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot(Option<usize>);

pub(crate) fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// How an attempt ended, with its final decision.
#[derive(Debug)]
pub(crate) struct End {
    pub(crate) decision: EgressDecision,
    pub(crate) outcome: Outcome,
    pub(crate) address: Option<String>,
    pub(crate) bytes_up: u64,
    pub(crate) bytes_down: u64,
    pub(crate) error: Option<String>,
}

impl End {
    pub(crate) fn new(decision: EgressDecision, outcome: Outcome) -> End {
        End {
            decision,
            outcome,
            address: None,
            bytes_up: 0,
            bytes_down: 0,
            error: None,
        }
    }
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

    pub(crate) fn unread_at_exit(&self) {
        self.with(|s| s.log.unread_at_exit += 1);
    }

    /// Record an attempt as soon as its request is read and its host decided.
    pub(crate) fn start(&self, protocol: Protocol, d: &EgressDecision) -> Slot {
        let bound = self.bounds.max_records;
        self.with(|s| {
            s.log.total += 1;
            let kind = usize::from(d.action != Action::Allow);
            if s.records_kept[kind] >= bound {
                s.log.records_omitted += 1;
                return Slot(None);
            }
            s.records_kept[kind] += 1;
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
                outcome: None,
                error: None,
            });
            Slot(Some(s.log.records.len() - 1))
        })
    }

    /// Record how an attempt ended, with its final decision.
    pub(crate) fn finish(&self, slot: Slot, end: End) {
        let bound = self.bounds.max_destinations;
        self.with(|s| {
            let d = &end.decision;
            match d.action {
                Action::Allow => s.log.allowed += 1,
                Action::Deny => s.log.denied += 1,
                Action::Review => s.log.undecided += 1,
            }
            let in_flight = end.outcome == Outcome::InFlightAtExit;
            s.log.in_flight_at_exit += u64::from(in_flight);
            s.log.bytes_up += end.bytes_up;
            s.log.bytes_down += end.bytes_down;
            aggregate(s, bound, &end);
            let Some(r) = slot.0.and_then(|i| s.log.records.get_mut(i)) else {
                return;
            };
            r.action = d.action;
            r.rule = d.rule.clone();
            r.pattern = d.pattern.clone();
            r.reason = d.reason.clone();
            r.address = end.address;
            r.bytes_up = end.bytes_up;
            r.bytes_down = end.bytes_down;
            r.ended_at = Some(now());
            r.outcome = Some(end.outcome);
            r.error = end.error;
        });
    }

    pub(crate) fn snapshot(&self) -> EgressLog {
        self.with(|s| {
            let mut log = s.log.clone();
            let mut merged: HashMap<Key, Destination> = HashMap::new();
            for class in &s.classes {
                for (key, d) in class {
                    match merged.get_mut(key) {
                        Some(m) => add_counts(m, d),
                        None => {
                            merged.insert(key.clone(), d.clone());
                        }
                    }
                }
            }
            let mut list: Vec<(Key, Destination)> = merged.into_iter().collect();
            list.sort_by(|a, b| a.0.cmp(&b.0));
            log.destinations = list.into_iter().map(|(_, d)| d).collect();
            log
        })
    }
}

fn add_counts(into: &mut Destination, d: &Destination) {
    into.attempts += d.attempts;
    into.connected += d.connected;
    into.in_flight_at_exit += d.in_flight_at_exit;
    into.bytes_up += d.bytes_up;
    into.bytes_down += d.bytes_down;
}

/// Add an ended attempt to its destination, or, past its kind's bound, to `omitted`.
fn aggregate(s: &mut State, bound: usize, end: &End) {
    let d = &end.decision;
    let connected = matches!(end.outcome, Outcome::Relayed | Outcome::ClosedAtExit);
    let class = match (d.action, connected) {
        (Action::Deny, _) => Class::Denied,
        (_, true) => Class::Connected,
        (_, false) => Class::Unconnected,
    };
    let one = Destination {
        host: d.host.clone(),
        port: d.port,
        action: d.action,
        rule: d.rule.clone(),
        pattern: d.pattern.clone(),
        reason: d.reason.clone(),
        attempts: 1,
        connected: u64::from(connected),
        in_flight_at_exit: u64::from(end.outcome == Outcome::InFlightAtExit),
        bytes_up: end.bytes_up,
        bytes_down: end.bytes_down,
    };
    let key = (d.host.clone(), d.port, action_index(d.action));
    let map = &mut s.classes[class as usize];
    if let Some(known) = map.get_mut(&key) {
        add_counts(known, &one);
        return;
    }
    if map.len() < bound {
        map.insert(key, one);
        return;
    }
    let (host_print, dest_print) = (s.keys.hash_one(&d.host), s.keys.hash_one((&d.host, d.port)));
    let (omitted, distinct) = match d.action {
        Action::Allow => (&mut s.log.omitted.allowed, &mut s.distinct[0]),
        Action::Review => (&mut s.log.omitted.undecided, &mut s.distinct[1]),
        Action::Deny => (&mut s.log.omitted.denied, &mut s.distinct[2]),
    };
    omitted.attempts += 1;
    omitted.connected += one.connected;
    omitted.in_flight_at_exit += one.in_flight_at_exit;
    omitted.bytes_up += one.bytes_up;
    omitted.bytes_down += one.bytes_down;
    count_frequent(&mut omitted.frequent, &d.host, d.port);
    if distinct.hosts.len() >= MAX_DISTINCT {
        omitted.distinct_capped = true;
        return;
    }
    // 64-bit fingerprints: enough to count distinct hosts without keeping their names.
    if distinct.hosts.insert(host_print) {
        omitted.hosts += 1;
    }
    if distinct.destinations.insert(dest_print) {
        omitted.destinations += 1;
    }
}

/// One Space-Saving step: count `host:port`, or replace the least counted destination when
/// [`MAX_FREQUENT`] are tracked (the newcomer inherits its count as the possible error).
fn count_frequent(list: &mut Vec<Frequent>, host: &str, port: u16) {
    if let Some(f) = list.iter_mut().find(|f| f.port == port && f.host == host) {
        f.attempts += 1;
        f.min_attempts += 1;
    } else if list.len() < MAX_FREQUENT {
        list.push(Frequent {
            host: host.to_owned(),
            port,
            attempts: 1,
            min_attempts: 1,
        });
    } else if let Some(least) = list.iter_mut().min_by_key(|f| f.attempts) {
        *least = Frequent {
            host: host.to_owned(),
            port,
            attempts: least.attempts + 1,
            min_attempts: 1,
        };
    }
    // Most first, so readers and findings can take the head.
    list.sort_by(|a, b| b.attempts.cmp(&a.attempts).then(a.host.cmp(&b.host)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(host: &str, port: u16, action: Action) -> EgressDecision {
        EgressDecision {
            action,
            host: host.to_owned(),
            port,
            rule: "r".to_owned(),
            pattern: None,
            reason: "why".to_owned(),
        }
    }

    fn attempt(r: &Recorder, d: &EgressDecision, outcome: Outcome, up: u64) {
        let slot = r.start(Protocol::Connect, d);
        let mut end = End::new(d.clone(), outcome);
        end.bytes_up = up;
        r.finish(slot, end);
    }

    /// A flood of refused hosts first, then repeats to one refused host, then an allowed
    /// connection that moves bytes: the allowed one is listed with its bytes, the totals and
    /// the omitted counts are exact, and repeats cost no entry.
    #[test]
    fn a_refused_flood_never_hides_an_allowed_connection_or_its_bytes() {
        let r = Recorder::new(Bounds {
            max_records: 5,
            max_destinations: 10,
        });
        for i in 0..25 {
            attempt(
                &r,
                &decision(&format!("junk{i}.test"), 443, Action::Deny),
                Outcome::Refused,
                0,
            );
        }
        for _ in 0..30 {
            attempt(
                &r,
                &decision("paste.test", 443, Action::Deny),
                Outcome::Refused,
                0,
            );
        }
        for _ in 0..3 {
            attempt(
                &r,
                &decision("junk0.test", 443, Action::Deny),
                Outcome::Refused,
                0,
            );
        }
        attempt(
            &r,
            &decision("pub.test", 443, Action::Allow),
            Outcome::Relayed,
            190_000,
        );
        let log = r.snapshot();
        assert_eq!((log.total, log.denied, log.allowed), (59, 58, 1));
        assert_eq!(log.bytes_up, 190_000);
        let pub_ = log
            .destinations
            .iter()
            .find(|d| d.host == "pub.test")
            .unwrap();
        assert_eq!(
            (pub_.attempts, pub_.connected, pub_.bytes_up),
            (1, 1, 190_000)
        );
        let junk0 = log
            .destinations
            .iter()
            .find(|d| d.host == "junk0.test")
            .unwrap();
        assert_eq!(junk0.attempts, 4);
        // 10 refused destinations listed; 15 junk hosts and paste.test (30 attempts) omitted.
        assert_eq!(log.destinations.len(), 11);
        let o = &log.omitted.denied;
        assert_eq!((o.attempts, o.hosts, o.destinations), (45, 16, 16));
        // The host the flood repeats beyond the bound is still named, with its count.
        assert_eq!(
            (o.frequent[0].host.as_str(), o.frequent[0].min_attempts),
            ("paste.test", 30)
        );
        assert!(log.omitted.allowed.is_empty());
        // Records: the first 5 refused, and the allowed one in a bound of its own.
        assert_eq!(log.records.len(), 6);
        assert_eq!(log.records_omitted, 53);
        assert_eq!(log.records[5].host, "pub.test");
        let listed: u64 = log.destinations.iter().map(|d| d.attempts).sum();
        assert_eq!(listed + o.attempts, log.total);
    }

    /// Allowed attempts that never connected cannot push out ones that did.
    #[test]
    fn failed_allowed_attempts_have_their_own_bound() {
        let r = Recorder::new(Bounds {
            max_records: 1,
            max_destinations: 2,
        });
        for i in 0..5 {
            attempt(
                &r,
                &decision(&format!("nx{i}.test"), 80, Action::Allow),
                Outcome::Failed,
                0,
            );
        }
        attempt(
            &r,
            &decision("real.test", 80, Action::Allow),
            Outcome::ClosedAtExit,
            7,
        );
        let log = r.snapshot();
        assert!(log
            .destinations
            .iter()
            .any(|d| d.host == "real.test" && d.bytes_up == 7));
        assert_eq!(log.omitted.allowed.attempts, 3);
        assert_eq!(log.omitted.allowed.hosts, 3);
        assert_eq!(log.omitted.allowed.bytes_up, 0);
    }

    /// The attempt is in the log from its start; an undecided one ends as `review`.
    #[test]
    fn an_attempt_is_counted_from_its_start_and_ends_with_its_final_decision() {
        let r = Recorder::new(Bounds {
            max_records: 10,
            max_destinations: 10,
        });
        let d = decision("slow.test", 443, Action::Allow);
        let slot = r.start(Protocol::Socks5, &d);
        let live = r.snapshot();
        assert_eq!((live.total, live.records.len()), (1, 1));
        assert_eq!(live.records[0].outcome, None);
        let mut undecided = d.clone();
        undecided.action = Action::Review;
        r.finish(slot, End::new(undecided, Outcome::InFlightAtExit));
        let log = r.snapshot();
        assert_eq!(
            (log.undecided, log.in_flight_at_exit, log.allowed),
            (1, 1, 0)
        );
        let rec = &log.records[0];
        assert_eq!(
            (rec.action, rec.outcome),
            (Action::Review, Some(Outcome::InFlightAtExit))
        );
        assert_eq!(log.destinations[0].in_flight_at_exit, 1);
    }
}

#[cfg(test)]
mod compat_tests {
    use super::*;

    /// A version-2 log (per-host counts) still reads: its totals and records are kept, its
    /// hosts are not listed as destinations.
    #[test]
    fn a_version_2_log_reads() {
        let v2 = r#"{"total": 3, "allowed": 1, "denied": 2, "malformed": 0, "over_capacity": 0,
            "records": [{"host": "a.test", "port": 443, "protocol": "connect", "action": "deny",
                "rule": "network.egress.default", "reason": "r", "bytes_up": 0,
                "bytes_down": 0, "started_at": "t", "ended_at": "t"}],
            "records_omitted": 2,
            "hosts": [{"host": "a.test", "allowed": 1, "denied": 2, "bytes_up": 5,
                "bytes_down": 6}],
            "hosts_omitted": 0}"#;
        let log: EgressLog = serde_json::from_str(v2).unwrap();
        assert_eq!((log.total, log.denied, log.records.len()), (3, 2, 1));
        assert_eq!(log.records[0].outcome, None);
        assert!(log.destinations.is_empty() && log.omitted.denied.is_empty());
    }
}

#[cfg(test)]
mod frequent_tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Space-Saving's promise: a destination with more than 1/MAX_FREQUENT of the attempts
        /// is listed, and its true count lies between `min_attempts` and `attempts`.
        #[test]
        fn a_repeated_destination_survives_any_junk(
            junk in prop::collection::vec(0u32..5000, 0..2000),
            repeats in 1usize..200,
            every in 1usize..50,
        ) {
            let mut list = Vec::new();
            let mut truth = 0u64;
            for (i, j) in junk.iter().enumerate() {
                count_frequent(&mut list, &format!("junk{j}"), 443);
                if i % every == 0 && (truth as usize) < repeats {
                    count_frequent(&mut list, "target", 443);
                    truth += 1;
                }
            }
            let total = junk.len() as u64 + truth;
            prop_assert!(list.len() <= MAX_FREQUENT);
            let found = list.iter().find(|f| f.host == "target");
            if truth * MAX_FREQUENT as u64 > total {
                prop_assert!(found.is_some(), "{} of {}", truth, total);
            }
            if let Some(f) = found {
                prop_assert!(f.min_attempts <= truth && truth <= f.attempts, "{:?} {}", f, truth);
            }
        }
    }
}
