//! Evidence findings: what the process, exec and container evidence says about the command's
//! conduct, independent of the file changes. A pure function of the evidence.
//!
//! - `left_run_cgroup` (deny): a process of the run moved itself out of the run cgroup, i.e. the
//!   command tried to escape observation. It was still tracked (as a descendant) and cleaned up.
//!   Not for a container's processes that its engine moved into the container's cgroup: a process
//!   counts as the container's when the engine names it as the main process of a container
//!   attributed to the run, or when it sits in that main process's cgroup; that container is a
//!   `container_started` finding instead.
//! - `container_started` (review): a container whose monitor or main process was one of the
//!   run's processes was created during the run. Containers merely created during the run window
//!   by someone are counted in the summary (`containers_started`) without a finding, since they
//!   are not attributable to the command.
//! - `egress_denied` (review, or deny under `network.egress.on_denied: deny`): the run's egress
//!   proxy refused connections to a host (`network.egress`); one finding per host for the
//!   [`MAX_EGRESS_HOSTS`] hosts with the most refused attempts, then one finding with the exact
//!   counts of the rest (listed in runtime.json, or beyond the log's bound and only counted).
//! - `egress_undecided` (review at least): connection attempts still being resolved when the
//!   command ended, so their addresses were never checked; never a silent pass.
//! - `egress_log_bound` (review): allowed attempts the connection log's bound left unnamed
//!   (their hosts, attempts and bytes are counted, not named).

use agentdiff_backend_api::RunEvidence;
use agentdiff_policy::Action;
pub use agentdiff_store::schema::EvidenceFinding;

/// The findings of one run's evidence, processes first.
pub fn evidence_findings(evidence: &RunEvidence) -> Vec<EvidenceFinding> {
    let mut out = Vec::new();
    let attributed = || {
        evidence
            .containers
            .iter()
            .flat_map(|c| &c.containers)
            .filter(|c| c.attributed)
    };
    let main_pids: Vec<u32> = attributed()
        .map(|c| c.main_pid)
        .filter(|p| *p > 0)
        .collect();
    let container_cgroups: Vec<&str> = evidence
        .processes
        .iter()
        .filter(|p| main_pids.contains(&p.identity.pid))
        .filter_map(|p| p.left_run_cgroup.as_deref())
        .collect();
    for p in &evidence.processes {
        if let Some(cg) = &p.left_run_cgroup {
            if main_pids.contains(&p.identity.pid) || container_cgroups.contains(&cg.as_str()) {
                continue;
            }
            // A child forked after its parent moved inherits the parent's cgroup: one finding,
            // for the mover.
            let inherited = evidence.processes.iter().any(|q| {
                q.identity.pid == p.ppid && q.left_run_cgroup.as_deref() == Some(cg.as_str())
            });
            if inherited {
                continue;
            }
            out.push(EvidenceFinding {
                kind: "left_run_cgroup".into(),
                action: Action::Deny,
                detail: format!(
                    "process {} ({}) moved itself out of the run cgroup into {cg}: an attempt to \
                     escape observation; it was tracked as a descendant and ended",
                    p.identity.pid,
                    agentdiff_host::redact::escape_terminal(&p.executable)
                ),
                process: Some(p.identity.clone()),
                container: None,
            });
        }
    }
    for c in attributed() {
        out.push(EvidenceFinding {
            kind: "container_started".into(),
            action: Action::Review,
            detail: format!(
                "the command started container {} (image {:?}, {}){}",
                short_id(&c.id),
                c.image,
                agentdiff_host::redact::escape_terminal(&c.command.join(" ")),
                if c.running_after_cleanup {
                    "; still running: `agentdiff cleanup RUN --containers` stops it"
                } else {
                    ""
                }
            ),
            process: None,
            container: Some(c.id.clone()),
        });
    }
    out
}

/// Hosts named one by one in `egress_denied` findings; the rest share one finding.
pub const MAX_EGRESS_HOSTS: usize = 20;

/// The egress proxy's findings (see the module's list): refused hosts at the level
/// `network.egress.on_denied` gives (`review` unless the policy says `deny`), undecided
/// attempts and unnamed allowed ones at `review`.
pub fn egress_findings(
    network: Option<&agentdiff_store::NetworkEvidence>,
    on_denied: agentdiff_policy::OnDenied,
) -> Vec<EvidenceFinding> {
    let Some(log) = network.map(|n| &n.egress) else {
        return Vec::new();
    };
    let mut out = denied_findings(log, on_denied);
    let finding = |kind: &str, detail: String| EvidenceFinding {
        kind: kind.into(),
        action: Action::Review,
        detail,
        process: None,
        container: None,
    };
    if log.undecided > 0 {
        let hosts = hosts_of(log, Action::Review);
        out.push(finding(
            "egress_undecided",
            format!(
                "{} connection attempt(s) were still being resolved when the command ended, so \
                 the addresses they would have reached were never checked ({hosts})",
                log.undecided
            ),
        ));
    }
    let o = &log.omitted.allowed;
    if !o.is_empty() {
        out.push(finding(
            "egress_log_bound",
            format!(
                "{} allowed connection attempt(s) to {}{} host(s) ({} connected, {} B up, {} B \
                 down) are beyond the connection log's bound: counted in runtime.json \
                 (network.egress.omitted.allowed), not listed{}",
                o.attempts,
                at_least(o),
                o.hosts,
                o.connected,
                o.bytes_up,
                o.bytes_down,
                frequent_words(o)
            ),
        ));
    }
    out
}

/// `; most often beyond the bound: a.test:443 (at least 30), …`: the destinations a flood
/// repeated beyond the bound, so they are named although not listed (empty when none).
fn frequent_words(o: &agentdiff_egress::Omitted) -> String {
    let named: Vec<String> = o
        .frequent
        .iter()
        .filter(|f| f.min_attempts > 1)
        .take(3)
        .map(|f| {
            format!(
                "{}:{} (at least {})",
                agentdiff_host::redact::escape_terminal(&f.host),
                f.port,
                f.min_attempts
            )
        })
        .collect();
    if named.is_empty() {
        String::new()
    } else {
        format!("; most often beyond the bound: {}", named.join(", "))
    }
}

/// `at least ` when the omitted hosts were too many to count exactly.
fn at_least(o: &agentdiff_egress::Omitted) -> &'static str {
    if o.distinct_capped {
        "at least "
    } else {
        ""
    }
}

/// The first hosts with attempts of `action`, escaped, for a finding's detail.
fn hosts_of(log: &agentdiff_egress::EgressLog, action: Action) -> String {
    let mut hosts: Vec<&str> = log
        .destinations
        .iter()
        .filter(|d| d.action == action)
        .map(|d| d.host.as_str())
        .collect();
    hosts.dedup();
    let shown: Vec<String> = hosts
        .iter()
        .take(5)
        .map(|h| agentdiff_host::redact::escape_terminal(h))
        .collect();
    match hosts.len().saturating_sub(shown.len()) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

/// One `egress_denied` finding per refused host (most attempts first, at most
/// [`MAX_EGRESS_HOSTS`]), and one with the exact counts of every other refused attempt.
fn denied_findings(
    log: &agentdiff_egress::EgressLog,
    on_denied: agentdiff_policy::OnDenied,
) -> Vec<EvidenceFinding> {
    // Said only when the policy made it a deny, so the reader knows why.
    let why = match on_denied {
        agentdiff_policy::OnDenied::Deny => "; network.egress.on_denied makes it deny",
        agentdiff_policy::OnDenied::Review => "",
    };
    let finding = |detail: String| EvidenceFinding {
        kind: "egress_denied".into(),
        action: on_denied.action(),
        detail,
        process: None,
        container: None,
    };
    // Refused attempts per host over its ports; the rule is its first refused destination's.
    let mut hosts: Vec<(&str, u64, &agentdiff_egress::Destination)> = Vec::new();
    for d in log.destinations.iter().filter(|d| d.action == Action::Deny) {
        match hosts.iter_mut().find(|(h, _, _)| *h == d.host) {
            Some(entry) => entry.1 += d.attempts,
            None => hosts.push((&d.host, d.attempts, d)),
        }
    }
    hosts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let rest = hosts.split_off(hosts.len().min(MAX_EGRESS_HOSTS));
    let mut out: Vec<EvidenceFinding> = hosts
        .iter()
        .map(|(host, attempts, d)| {
            finding(format!(
                "{attempts} connection attempt(s) to {} refused by network.egress ({}: {}){why}",
                agentdiff_host::redact::escape_terminal(host),
                agentdiff_host::redact::escape_terminal(&d.rule),
                agentdiff_host::redact::escape_terminal(&d.reason)
            ))
        })
        .collect();
    let o = &log.omitted.denied;
    if !rest.is_empty() || !o.is_empty() {
        let listed: u64 = rest.iter().map(|(_, n, _)| n).sum();
        out.push(finding(format!(
            "{} more refused connection attempt(s): {listed} to {} host(s) listed in \
             runtime.json (network.egress.destinations), {} to {}{} host(s) beyond the log's \
             bound, counted in network.egress.omitted.denied, not listed{}; {} refused in \
             all{why}",
            listed + o.attempts,
            rest.len(),
            o.attempts,
            at_least(o),
            o.hosts,
            frequent_words(o),
            log.denied
        )));
    }
    out
}

/// The safety outcome `base` made at least as strict as the strictest finding.
pub fn with_findings(base: Action, findings: &[EvidenceFinding]) -> Action {
    findings
        .iter()
        .map(|f| f.action)
        .fold(base, Action::strictest)
}

fn short_id(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentdiff_backend_api::{ProcessIdentity, ProcessRecord, ProcessRelation};
    use agentdiff_process::containers::{ContainerEvidence, ContainerRecord};

    fn process(left: Option<&str>) -> ProcessRecord {
        ProcessRecord {
            identity: ProcessIdentity {
                pid: 7,
                start_time_ticks: 1,
                boot_id: "b".into(),
            },
            ppid: 1,
            relation: ProcessRelation::Descendant,
            executable: "sleep".into(),
            first_seen_ms: 0,
            alive_after_root_exit: true,
            left_run_cgroup: left.map(String::from),
        }
    }

    fn container(attributed: bool) -> ContainerRecord {
        ContainerRecord {
            id: "0123456789abcdef".into(),
            socket: "/run/podman/podman.sock".into(),
            name: "n".into(),
            image: "localhost/x:1".into(),
            command: vec!["sleep".into(), "800".into()],
            created: String::new(),
            attributed,
            main_pid: 9,
            running_at_end: true,
            running_after_cleanup: true,
            removed: false,
        }
    }

    #[test]
    fn an_escape_is_denied_and_an_attributed_container_reviewed() {
        let ev = RunEvidence {
            processes: vec![process(None), process(Some("/elsewhere"))],
            containers: Some(ContainerEvidence {
                containers: vec![container(true), container(false)],
                ..ContainerEvidence::default()
            }),
            ..RunEvidence::default()
        };
        let f = evidence_findings(&ev);
        assert_eq!(f.len(), 2, "{f:#?}");
        assert_eq!(
            (f[0].kind.as_str(), f[0].action),
            ("left_run_cgroup", Action::Deny)
        );
        assert!(f[0].detail.contains("/elsewhere"));
        assert_eq!(
            (f[1].kind.as_str(), f[1].action),
            ("container_started", Action::Review)
        );
        assert!(f[1].detail.contains("--containers"));
    }

    #[test]
    fn a_containers_own_processes_are_not_an_escape() {
        let mut main = process(Some("/libpod_parent/libpod-0123"));
        main.identity.pid = 9;
        let mut child = process(Some("/libpod_parent/libpod-0123"));
        child.identity.pid = 10;
        let ev = RunEvidence {
            processes: vec![main, child, process(Some("/"))],
            containers: Some(ContainerEvidence {
                containers: vec![container(true)],
                ..ContainerEvidence::default()
            }),
            ..RunEvidence::default()
        };
        let kinds: Vec<(String, u32)> = evidence_findings(&ev)
            .into_iter()
            .map(|f| (f.kind, f.process.map_or(0, |p| p.pid)))
            .collect();
        assert_eq!(
            kinds,
            [
                ("left_run_cgroup".to_string(), 7),
                ("container_started".to_string(), 0)
            ]
        );
    }

    #[test]
    fn findings_only_ever_tighten_the_outcome() {
        let f = evidence_findings(&RunEvidence {
            processes: vec![process(Some("/"))],
            ..RunEvidence::default()
        });
        assert_eq!(with_findings(Action::Allow, &f), Action::Deny);
        assert_eq!(with_findings(Action::Review, &[]), Action::Review);
        let review = EvidenceFinding {
            action: Action::Review,
            ..f[0].clone()
        };
        assert_eq!(with_findings(Action::Deny, &[review]), Action::Deny);
    }

    fn destination(host: &str, port: u16, action: Action, attempts: u64) -> Destination {
        Destination {
            host: host.into(),
            port,
            action,
            rule: "network.egress.default".into(),
            pattern: None,
            reason: "no pattern".into(),
            attempts,
            connected: 0,
            in_flight_at_exit: 0,
            bytes_up: 0,
            bytes_down: 0,
        }
    }

    use agentdiff_egress::{Destination, EgressLog, Omitted};

    #[test]
    fn each_refused_host_is_one_finding_at_the_level_on_denied_gives() {
        let network = agentdiff_store::NetworkEvidence {
            egress: EgressLog {
                total: 6,
                allowed: 2,
                denied: 4,
                destinations: vec![
                    destination("a.test", 443, Action::Allow, 2),
                    destination("b.test", 80, Action::Deny, 1),
                    destination("b.test", 443, Action::Deny, 2),
                    destination("c.test", 443, Action::Deny, 1),
                ],
                ..EgressLog::default()
            },
        };
        let f = egress_findings(Some(&network), agentdiff_policy::OnDenied::Review);
        let got: Vec<(&str, Action, bool)> = f
            .iter()
            .map(|f| (f.kind.as_str(), f.action, f.detail.starts_with("3 ")))
            .collect();
        assert_eq!(
            got,
            [
                ("egress_denied", Action::Review, true),
                ("egress_denied", Action::Review, false)
            ]
        );
        assert!(f[0].detail.contains("b.test") && f[1].detail.contains("c.test"));
        assert!(!f[0].detail.contains("on_denied"), "{}", f[0].detail);
        // The policy can make every refusal a deny, and says so in the detail.
        let f = egress_findings(Some(&network), agentdiff_policy::OnDenied::Deny);
        assert!(
            f.iter().all(|f| f.action == Action::Deny
                && f.detail.ends_with("network.egress.on_denied makes it deny")),
            "{f:?}"
        );
        assert_eq!(f.len(), 2);
        assert!(egress_findings(None, agentdiff_policy::OnDenied::Deny).is_empty());
    }

    /// A flood: the findings stay few, and the folded one states hosts and attempts apart
    /// (30 attempts to one omitted host are 30 attempts to 1 host, not 30 hosts).
    #[test]
    fn a_flood_folds_into_one_finding_with_exact_counts() {
        let destinations: Vec<Destination> = (0..25)
            .map(|i| destination(&format!("junk{i:02}.test"), 443, Action::Deny, 1))
            .collect();
        let network = agentdiff_store::NetworkEvidence {
            egress: EgressLog {
                total: 56,
                denied: 55,
                allowed: 1,
                destinations,
                omitted: agentdiff_egress::OmittedByDecision {
                    denied: Omitted {
                        attempts: 30,
                        hosts: 1,
                        destinations: 1,
                        frequent: vec![agentdiff_egress::Frequent {
                            host: "paste-site.test".into(),
                            port: 443,
                            attempts: 30,
                            min_attempts: 30,
                        }],
                        ..Omitted::default()
                    },
                    allowed: Omitted {
                        attempts: 1,
                        hosts: 1,
                        destinations: 1,
                        connected: 1,
                        bytes_up: 190_000,
                        ..Omitted::default()
                    },
                    ..Default::default()
                },
                ..EgressLog::default()
            },
        };
        let f = egress_findings(Some(&network), agentdiff_policy::OnDenied::Deny);
        assert_eq!(f.len(), MAX_EGRESS_HOSTS + 2, "{f:#?}");
        let folded = &f[MAX_EGRESS_HOSTS];
        assert_eq!(folded.action, Action::Deny);
        assert!(
            folded.detail.starts_with(
                "35 more refused connection attempt(s): 5 to 5 host(s) listed in runtime.json \
                 (network.egress.destinations), 30 to 1 host(s) beyond the log's bound"
            ),
            "{}",
            folded.detail
        );
        assert!(
            folded.detail.contains("55 refused in all"),
            "{}",
            folded.detail
        );
        assert!(
            folded
                .detail
                .contains("most often beyond the bound: paste-site.test:443 (at least 30)"),
            "{}",
            folded.detail
        );
        let bound = &f[MAX_EGRESS_HOSTS + 1];
        assert_eq!(
            (bound.kind.as_str(), bound.action),
            ("egress_log_bound", Action::Review)
        );
        assert!(bound.detail.contains("190000 B up"), "{}", bound.detail);
    }

    /// An attempt the run left still resolving is at least a review, never a silent pass.
    #[test]
    fn an_undecided_attempt_is_a_review() {
        let network = agentdiff_store::NetworkEvidence {
            egress: EgressLog {
                total: 1,
                undecided: 1,
                in_flight_at_exit: 1,
                destinations: vec![destination("slow.test", 443, Action::Review, 1)],
                ..EgressLog::default()
            },
        };
        let f = egress_findings(Some(&network), agentdiff_policy::OnDenied::Review);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(
            (f[0].kind.as_str(), f[0].action),
            ("egress_undecided", Action::Review)
        );
        assert!(f[0].detail.contains("slow.test"), "{}", f[0].detail);
        assert_eq!(with_findings(Action::Allow, &f), Action::Review);
    }

    #[test]
    fn clean_evidence_has_no_findings() {
        assert!(evidence_findings(&RunEvidence::default()).is_empty());
    }
}
