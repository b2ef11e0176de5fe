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
//! - `egress_denied` (review): the run's egress proxy refused connections to a host
//!   (`network.egress`); one finding per host (the log's per-host counts are bounded, so are
//!   these), whatever the rule that refused it.

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

/// One `egress_denied` finding per host the egress proxy refused, and one more when refused
/// attempts went to hosts beyond the log's host bound; each at the level
/// `network.egress.on_denied` gives (`review` unless the policy says `deny`).
pub fn egress_findings(
    network: Option<&agentdiff_store::NetworkEvidence>,
    on_denied: agentdiff_policy::OnDenied,
) -> Vec<EvidenceFinding> {
    let action = on_denied.action();
    // Said only when the policy made it a deny, so the reader knows why.
    let why = match on_denied {
        agentdiff_policy::OnDenied::Deny => "; network.egress.on_denied makes it deny",
        agentdiff_policy::OnDenied::Review => "",
    };
    let Some(log) = network.map(|n| &n.egress) else {
        return Vec::new();
    };
    let mut out: Vec<EvidenceFinding> = log
        .hosts
        .iter()
        .filter(|h| h.denied > 0)
        .map(|h| {
            let rule = log
                .records
                .iter()
                .find(|r| r.host == h.host && r.action == Action::Deny)
                .map(|r| format!(" ({}: {})", r.rule, r.reason))
                .unwrap_or_default();
            EvidenceFinding {
                kind: "egress_denied".into(),
                action,
                detail: format!(
                    "{} connection attempt(s) to {} refused by network.egress{}{why}",
                    h.denied,
                    agentdiff_host::redact::escape_terminal(&h.host),
                    agentdiff_host::redact::escape_terminal(&rule)
                ),
                process: None,
                container: None,
            }
        })
        .collect();
    if log.hosts_omitted > 0 && log.denied > out.len() as u64 {
        out.push(EvidenceFinding {
            kind: "egress_denied".into(),
            action,
            detail: format!(
                "attempts to {} more host(s) beyond the log's bound; {} refused in all{why}",
                log.hosts_omitted, log.denied
            ),
            process: None,
            container: None,
        });
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

    #[test]
    fn each_refused_host_is_one_finding_at_the_level_on_denied_gives() {
        use agentdiff_egress::{EgressLog, HostCount};
        let host = |name: &str, allowed, denied| HostCount {
            host: name.into(),
            allowed,
            denied,
            ..HostCount::default()
        };
        let network = agentdiff_store::NetworkEvidence {
            egress: EgressLog {
                total: 6,
                allowed: 2,
                denied: 4,
                hosts: vec![
                    host("a.test", 2, 0),
                    host("b.test", 0, 3),
                    host("c.test", 0, 1),
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

    #[test]
    fn clean_evidence_has_no_findings() {
        assert!(evidence_findings(&RunEvidence::default()).is_empty());
    }
}
