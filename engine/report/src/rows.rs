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

/// Hosts listed at most on a surface; the rest are counted (runtime.json has them all, bounded).
pub const MAX_HOST_ROWS: usize = 10;

/// One host the run's egress proxy was asked for (recorded text, unescaped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRow {
    pub host: String,
    pub allowed: u64,
    pub denied: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// The rule that decided the host's first recorded refused attempt (its first allowed one
    /// when none was refused); `None` when the log's record bound left its attempts out.
    pub rule: Option<String>,
}

impl HostRow {
    /// `denied 2, allowed 1: example.com (10 B up, 2048 B down; rule network.egress.default)`.
    pub fn line(&self) -> String {
        format!(
            "denied {}, allowed {}: {} ({} B up, {} B down; rule {})",
            self.denied,
            self.allowed,
            self.host,
            self.bytes_up,
            self.bytes_down,
            self.rule_text()
        )
    }

    /// The rule, or `not recorded` when the record bound left it out.
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
    /// At most [`MAX_HOST_ROWS`], hosts with refused attempts first, then by attempts.
    pub hosts: Vec<HostRow>,
    /// Hosts not listed here (beyond the rows, or beyond the log's own bound).
    pub more_hosts: u64,
}

impl NetworkRows {
    /// `egress proxy: 5 connection attempts, 2 denied, 3 allowed`.
    pub fn headline(&self) -> String {
        format!(
            "egress proxy: {} connection attempt(s), {} denied, {} allowed",
            self.total, self.denied, self.allowed
        )
    }
}

/// The run's egress rows, when it had the proxy.
pub fn network_rows(runtime: Option<&agentdiff_store::RuntimeDoc>) -> Option<NetworkRows> {
    let network = runtime?.network()?;
    let log = &network.egress;
    let mut hosts: Vec<HostRow> = log
        .hosts
        .iter()
        .map(|h| HostRow {
            host: h.host.clone(),
            allowed: h.allowed,
            denied: h.denied,
            bytes_up: h.bytes_up,
            bytes_down: h.bytes_down,
            rule: host_rule(network, &h.host, h.denied > 0),
        })
        .collect();
    hosts.sort_by(|a, b| {
        (b.denied > 0)
            .cmp(&(a.denied > 0))
            .then((b.denied + b.allowed).cmp(&(a.denied + a.allowed)))
            .then(a.host.cmp(&b.host))
    });
    let beyond_rows = hosts.len().saturating_sub(MAX_HOST_ROWS) as u64;
    hosts.truncate(MAX_HOST_ROWS);
    Some(NetworkRows {
        total: log.total,
        allowed: log.allowed,
        denied: log.denied,
        hosts,
        more_hosts: beyond_rows + u64::from(log.hosts_omitted > 0),
    })
}

/// The rule of `host`'s first recorded refused attempt (`denied`), else of its first allowed one.
fn host_rule(network: &NetworkEvidence, host: &str, denied: bool) -> Option<String> {
    let wanted = if denied { Action::Deny } else { Action::Allow };
    network
        .egress
        .records
        .iter()
        .find(|r| r.host == host && r.action == wanted)
        .map(|r| r.rule.clone())
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

    fn record(host: &str, action: &str, rule: &str) -> serde_json::Value {
        serde_json::json!({
            "host": host, "port": 443, "protocol": "connect", "action": action, "rule": rule,
            "reason": "r", "bytes_up": 0, "bytes_down": 0, "started_at": "t",
        })
    }

    #[test]
    fn refused_hosts_come_first_with_the_rule_of_their_refused_attempt() {
        let network: NetworkEvidence = serde_json::from_value(serde_json::json!({ "egress": {
            "total": 4, "allowed": 2, "denied": 2, "malformed": 0, "over_capacity": 0,
            "records": [
                record("b.test", "allow", "network.egress.allow[0]"),
                record("b.test", "deny", "network.egress.deny[0]"),
                record("a.test", "allow", "network.egress.allow[1]"),
            ],
            "records_omitted": 1,
            "hosts": [
                {"host": "a.test", "allowed": 1, "denied": 0, "bytes_up": 1, "bytes_down": 2},
                {"host": "b.test", "allowed": 1, "denied": 1, "bytes_up": 0, "bytes_down": 0},
                {"host": "c.test", "allowed": 0, "denied": 1, "bytes_up": 0, "bytes_down": 0},
            ],
            "hosts_omitted": 0,
        }}))
        .unwrap();
        let doc = RuntimeDoc::launched(&RunEvidence::default(), &[], Some(network));
        let rows = network_rows(Some(&doc)).unwrap();
        let got: Vec<(&str, &str)> = rows
            .hosts
            .iter()
            .map(|h| (h.host.as_str(), h.rule_text()))
            .collect();
        // c.test's attempt is beyond the record bound: its rule is not recorded, not guessed.
        assert_eq!(
            got,
            [
                ("b.test", "network.egress.deny[0]"),
                ("c.test", "not recorded"),
                ("a.test", "network.egress.allow[1]"),
            ]
        );
        assert_eq!(refused_connections(Some(&doc)), Some(2));
        assert_eq!(refused_connections(None), None);
    }
}
