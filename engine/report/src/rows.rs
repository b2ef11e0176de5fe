//! The rows every surface shows for a run's findings, built once: what changed under
//! `.agentdiff/` during the run (capsule tampering, deny), the evidence findings, exceeded limits,
//! observation warnings, the containers started during the run, and the hosts the egress proxy
//! was asked for.
//!
//! Invariant: cells are the capsule's recorded text, unescaped; each surface passes every cell
//! through its one escaping function. No surface builds these rows itself, so a finding shown on
//! one surface is shown on all of them.

use agentdiff_backend_api::RunEvidence;
use agentdiff_policy::Action;
use agentdiff_store::schema::RunResult;
use agentdiff_store::NetworkEvidence;

/// How a finding row reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// A policy-level finding (deny, review or allow).
    Action(Action),
    /// An observation that could not be made, or a note about one (no policy level).
    Note,
}

impl Level {
    /// The plain word: `allow`, `review`, `deny`, `note`.
    pub fn word(self) -> &'static str {
        match self {
            Level::Action(a) => super::words::action_word(a),
            Level::Note => "note",
        }
    }
}

/// One finding, as recorded (unescaped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FindingRow {
    pub level: Level,
    pub kind: String,
    pub detail: String,
}

/// What changed under `.agentdiff/` while the command ran: deny rows, shown above the changes
/// (the changes list excludes `.agentdiff/`, so a tampering run can show no change at all).
pub fn tamper_rows(r: &RunResult) -> Vec<FindingRow> {
    r.capsule_tampered
        .iter()
        .map(|t| FindingRow {
            level: Level::Action(Action::Deny),
            kind: "capsule tampered".into(),
            detail: format!(".agentdiff/{} {}: {}", t.path, t.change, t.detail),
        })
        .collect()
}

/// The evidence findings, exceeded limits and observation warnings, in that order.
pub fn finding_rows(r: &RunResult) -> Vec<FindingRow> {
    let findings = r.evidence_findings.iter().map(|f| FindingRow {
        level: Level::Action(f.action),
        kind: f.kind.clone(),
        detail: f.detail.clone(),
    });
    let limits = r.limit_violations.iter().map(|l| FindingRow {
        level: Level::Action(Action::Review),
        kind: "limit exceeded".into(),
        detail: format!("{} = {} (limit {})", l.limit, l.observed, l.limit_value),
    });
    let warnings = r.observation_warnings.iter().map(|w| FindingRow {
        level: Level::Note,
        kind: "warning".into(),
        detail: w.clone(),
    });
    findings.chain(limits).chain(warnings).collect()
}

/// One container an engine created during the run window (recorded text, unescaped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRow {
    pub name: String,
    pub image: String,
    /// The first 12 characters of its id.
    pub short_id: String,
    /// Started by one of the run's processes.
    pub attributed: bool,
}

/// The containers of the run's evidence.
pub fn container_rows(ev: &RunEvidence) -> Vec<ContainerRow> {
    ev.containers
        .iter()
        .flat_map(|c| c.containers.iter())
        .map(|c| ContainerRow {
            name: c.name.clone(),
            image: c.image.clone(),
            short_id: c.id.chars().take(12).collect(),
            attributed: c.attributed,
        })
        .collect()
}

/// Hosts listed at most on a surface; the rest are counted (runtime.json lists those within
/// the log's bound, and counts the others).
pub const MAX_HOST_ROWS: usize = 10;

/// Finding lines the terminal prints at most; the rest are counted (result.json and the
/// markdown and HTML reports list them all).
pub const MAX_FINDING_LINES: usize = 25;

/// One host the run's egress proxy was asked for (recorded text, unescaped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRow {
    pub host: String,
    pub allowed: u64,
    pub denied: u64,
    /// Still being resolved when the run ended (`review`).
    pub undecided: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// The rule that decided the host's first refused attempt (its first allowed one when none
    /// was refused).
    pub rule: Option<String>,
}

impl HostRow {
    /// `denied 2, allowed 1: example.com (10 B up, 2048 B down; rule network.egress.default)`.
    pub fn line(&self) -> String {
        let undecided = match self.undecided {
            0 => String::new(),
            n => format!(", undecided at exit {n}"),
        };
        format!(
            "denied {}, allowed {}{undecided}: {} ({} B up, {} B down; rule {})",
            self.denied,
            self.allowed,
            self.host,
            self.bytes_up,
            self.bytes_down,
            self.rule_text()
        )
    }

    /// The rule, or `not recorded` when none was.
    pub fn rule_text(&self) -> &str {
        self.rule.as_deref().unwrap_or("not recorded")
    }
}

/// The egress proxy's connections: totals, then the hosts with denied attempts first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkRows {
    pub total: u64,
    pub allowed: u64,
    pub denied: u64,
    /// Still being resolved when the run ended (`review`).
    pub undecided: u64,
    /// Bytes relayed over every attempt.
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// At most [`MAX_HOST_ROWS`], hosts with refused attempts first, then by attempts.
    pub hosts: Vec<HostRow>,
    /// Hosts runtime.json lists (`network.egress.destinations`) beyond these rows.
    pub more_hosts: u64,
    /// What the log's bound left unnamed: counted in runtime.json (`network.egress.omitted`).
    pub unnamed: Option<Unnamed>,
}

/// Attempts beyond the log's bound: counted, not named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unnamed {
    pub attempts: u64,
    /// Distinct hosts per decision, summed (a host with attempts of two decisions counts
    /// twice); a lower bound when `at_least`.
    pub hosts: u64,
    pub at_least: bool,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// The destinations seen most often among them (`host:port`, at least this many attempts).
    pub frequent: Vec<(String, u64)>,
}

impl NetworkRows {
    /// `egress proxy: 5 connection attempts, 2 denied, 3 allowed (10 B up, 20 B down)`.
    pub fn headline(&self) -> String {
        let undecided = match self.undecided {
            0 => String::new(),
            n => format!(", {n} undecided (still resolving when the run ended)"),
        };
        format!(
            "egress proxy: {} connection attempt(s), {} denied, {} allowed{undecided} ({} B up, \
             {} B down)",
            self.total, self.denied, self.allowed, self.bytes_up, self.bytes_down
        )
    }

    /// What is not among the rows and where it is, one line each (empty when all are).
    pub fn more_lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.more_hosts > 0 {
            out.push(format!(
                "{} more host(s) are listed in runtime.json (network.egress.destinations)",
                self.more_hosts
            ));
        }
        if let Some(u) = &self.unnamed {
            let frequent = if u.frequent.is_empty() {
                String::new()
            } else {
                let named: Vec<String> = u
                    .frequent
                    .iter()
                    .map(|(d, n)| format!("{d} (at least {n})"))
                    .collect();
                format!("; most often: {}", named.join(", "))
            };
            out.push(format!(
                "{} more attempt(s) to {}{} host(s) ({} B up, {} B down) are beyond the \
                 connection log's bound: counted in runtime.json (network.egress.omitted), not \
                 listed{frequent}",
                u.attempts,
                if u.at_least { "at least " } else { "" },
                u.hosts,
                u.bytes_up,
                u.bytes_down
            ));
        }
        out
    }
}

/// The run's egress rows, when it had the proxy.
pub fn network_rows(runtime: Option<&agentdiff_store::RuntimeDoc>) -> Option<NetworkRows> {
    let network = runtime?.network()?;
    let log = &network.egress;
    let mut hosts: Vec<HostRow> = Vec::new();
    for d in &log.destinations {
        let i = match hosts.iter().position(|h| h.host == d.host) {
            Some(i) => i,
            None => {
                hosts.push(HostRow {
                    host: d.host.clone(),
                    allowed: 0,
                    denied: 0,
                    undecided: 0,
                    bytes_up: 0,
                    bytes_down: 0,
                    rule: None,
                });
                hosts.len() - 1
            }
        };
        let h = &mut hosts[i];
        match d.action {
            Action::Allow => h.allowed += d.attempts,
            Action::Review => h.undecided += d.attempts,
            Action::Deny => h.denied += d.attempts,
        }
        h.bytes_up += d.bytes_up;
        h.bytes_down += d.bytes_down;
    }
    for h in &mut hosts {
        h.rule = host_rule(network, &h.host, h.denied > 0);
    }
    hosts.sort_by(|a, b| {
        (b.denied > 0)
            .cmp(&(a.denied > 0))
            .then((b.denied + b.allowed).cmp(&(a.denied + a.allowed)))
            .then(a.host.cmp(&b.host))
    });
    let beyond_rows = hosts.len().saturating_sub(MAX_HOST_ROWS) as u64;
    hosts.truncate(MAX_HOST_ROWS);
    let o = &log.omitted;
    let parts = [&o.allowed, &o.undecided, &o.denied];
    let unnamed = parts.iter().any(|p| !p.is_empty()).then(|| Unnamed {
        attempts: parts.iter().map(|p| p.attempts).sum(),
        hosts: parts.iter().map(|p| p.hosts).sum(),
        at_least: parts.iter().any(|p| p.distinct_capped),
        bytes_up: parts.iter().map(|p| p.bytes_up).sum(),
        bytes_down: parts.iter().map(|p| p.bytes_down).sum(),
        frequent: frequent(
            parts
                .iter()
                .flat_map(|p| &p.frequent)
                .map(|f| (f.host.as_str(), f.port, f.min_attempts)),
        ),
    });
    Some(NetworkRows {
        total: log.total,
        allowed: log.allowed,
        denied: log.denied,
        undecided: log.undecided,
        bytes_up: log.bytes_up,
        bytes_down: log.bytes_down,
        hosts,
        more_hosts: beyond_rows,
        unnamed,
    })
}

/// The 3 destinations seen most often beyond the bound, over every decision (only those
/// repeated: a destination seen once is junk like any other).
fn frequent<'a>(seen: impl Iterator<Item = (&'a str, u16, u64)>) -> Vec<(String, u64)> {
    let mut all: Vec<(String, u64)> = seen
        .filter(|(_, _, at_least)| *at_least > 1)
        .map(|(host, port, at_least)| {
            let target = match host.parse::<std::net::Ipv6Addr>() {
                Ok(_) => format!("[{host}]:{port}"),
                Err(_) => format!("{host}:{port}"),
            };
            (target, at_least)
        })
        .collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    all.truncate(3);
    all
}

/// The rule of `host`'s first refused destination (`denied`), else of its first allowed one.
fn host_rule(network: &NetworkEvidence, host: &str, denied: bool) -> Option<String> {
    let wanted = if denied { Action::Deny } else { Action::Allow };
    network
        .egress
        .destinations
        .iter()
        .find(|d| d.host == host && d.action == wanted)
        .map(|d| d.rule.clone())
}

/// Connection attempts the run's egress proxy refused (`None`: the run had no proxy).
pub fn refused_connections(runtime: Option<&agentdiff_store::RuntimeDoc>) -> Option<u64> {
    Some(runtime?.network()?.egress.denied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentdiff_backend_api::RunEvidence;
    use agentdiff_store::RuntimeDoc;

    fn destination(host: &str, action: &str, rule: &str, attempts: u64) -> serde_json::Value {
        serde_json::json!({
            "host": host, "port": 443, "action": action, "rule": rule, "reason": "r",
            "attempts": attempts, "connected": 0, "in_flight_at_exit": 0,
            "bytes_up": 1, "bytes_down": 2,
        })
    }

    #[test]
    fn refused_hosts_come_first_with_the_rule_of_their_refused_attempt() {
        let network: NetworkEvidence = serde_json::from_value(serde_json::json!({ "egress": {
            "total": 38, "allowed": 2, "denied": 36, "bytes_up": 190_003, "bytes_down": 6,
            "destinations": [
                destination("a.test", "allow", "network.egress.allow[1]", 1),
                destination("b.test", "allow", "network.egress.allow[0]", 1),
                destination("b.test", "deny", "network.egress.deny[0]", 1),
                destination("c.test", "deny", "network.egress.default", 5),
            ],
            "omitted": { "denied": { "attempts": 30, "hosts": 1, "destinations": 1,
                                     "frequent": [{ "host": "p.test", "port": 443,
                                                    "attempts": 30, "min_attempts": 30 }] },
                         "allowed": { "attempts": 1, "hosts": 1, "destinations": 1,
                                      "connected": 1, "bytes_up": 190_000 } },
        }}))
        .unwrap();
        let doc = RuntimeDoc::launched(&RunEvidence::default(), &[], Some(network));
        let rows = network_rows(Some(&doc)).unwrap();
        let got: Vec<(&str, u64, u64, &str)> = rows
            .hosts
            .iter()
            .map(|h| (h.host.as_str(), h.denied, h.allowed, h.rule_text()))
            .collect();
        assert_eq!(
            got,
            [
                ("c.test", 5, 0, "network.egress.default"),
                ("b.test", 1, 1, "network.egress.deny[0]"),
                ("a.test", 0, 1, "network.egress.allow[1]"),
            ]
        );
        assert_eq!(refused_connections(Some(&doc)), Some(36));
        assert_eq!(refused_connections(None), None);
        // What the bound left out is counted, with its bytes, and said to be unnamed.
        let more = rows.more_lines();
        assert_eq!(more.len(), 1, "{more:?}");
        assert!(
            more[0].starts_with("31 more attempt(s) to 2 host(s) (190000 B up, 0 B down)"),
            "{}",
            more[0]
        );
        assert!(
            more[0].ends_with("not listed; most often: p.test:443 (at least 30)"),
            "{}",
            more[0]
        );
        assert!(rows.headline().contains("(190003 B up, 6 B down)"));
    }
}
