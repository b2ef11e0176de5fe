//! The process and port evidence of a run, arranged once for every surface: the process tree in
//! display order and each port's owner.

use std::collections::{BTreeMap, BTreeSet};

use agentdiff_backend_api::{CleanupOutcome, PortRecord, ProcessRecord, RunEvidence};

/// Deepest nesting shown; deeper processes are shown at this depth (a pid cycle in a hostile
/// record cannot recurse forever).
const MAX_DEPTH: usize = 64;

/// One process in tree order.
#[derive(Debug, Clone, Copy)]
pub struct ProcessRow<'a> {
    /// 0 for a root (the launched process, or one whose parent was not recorded).
    pub depth: usize,
    pub record: &'a ProcessRecord,
    /// What cleanup did to it, when it was still running after the command ended.
    pub cleanup: Option<CleanupOutcome>,
}

/// The recorded processes as a tree, parents before their children (pre-order), each record once.
pub fn process_tree(ev: &RunEvidence) -> Vec<ProcessRow<'_>> {
    let pids: BTreeSet<u32> = ev.processes.iter().map(|p| p.identity.pid).collect();
    let mut children: BTreeMap<u32, Vec<&ProcessRecord>> = BTreeMap::new();
    let mut roots = Vec::new();
    for p in &ev.processes {
        if pids.contains(&p.ppid) && p.ppid != p.identity.pid {
            children.entry(p.ppid).or_default().push(p);
        } else {
            roots.push(p);
        }
    }
    let mut rows = Vec::with_capacity(ev.processes.len());
    let mut seen = BTreeSet::new();
    let mut stack: Vec<(usize, &ProcessRecord)> = roots.into_iter().rev().map(|p| (0, p)).collect();
    while let Some((depth, p)) = stack.pop() {
        if !seen.insert(p as *const ProcessRecord) {
            continue;
        }
        rows.push(ProcessRow {
            depth,
            record: p,
            cleanup: ev
                .cleanup
                .records
                .iter()
                .find(|r| r.identity == p.identity)
                .map(|r| r.outcome),
        });
        if let Some(kids) = children.get(&p.identity.pid) {
            let d = (depth + 1).min(MAX_DEPTH);
            stack.extend(kids.iter().rev().map(|k| (d, *k)));
        }
    }
    // Records only reachable through a cycle (each other's parents) are still shown.
    for p in &ev.processes {
        if !seen.contains(&(p as *const ProcessRecord)) {
            rows.push(ProcessRow {
                depth: 0,
                record: p,
                cleanup: None,
            });
        }
    }
    rows
}

/// Who a listening socket belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortOwner<'a> {
    /// A process of the run (its executable when the process was recorded).
    Process {
        pid: u32,
        executable: Option<&'a str>,
    },
    /// Attributed to the run without a single owning process.
    Run,
    /// Seen during the run, not attributed to it.
    Unattributed,
}

/// The owner of `port`, as recorded.
pub fn port_owner<'a>(ev: &'a RunEvidence, port: &PortRecord) -> PortOwner<'a> {
    match &port.owner {
        Some(o) => PortOwner::Process {
            pid: o.pid,
            executable: ev
                .processes
                .iter()
                .find(|r| r.identity == *o)
                .map(|r| r.executable.as_str()),
        },
        None if port.attributed => PortOwner::Run,
        None => PortOwner::Unattributed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentdiff_backend_api::ProcessRelation;
    use agentdiff_process::ProcessIdentity;

    fn rec(pid: u32, ppid: u32) -> ProcessRecord {
        ProcessRecord {
            identity: ProcessIdentity {
                pid,
                start_time_ticks: 1,
                boot_id: "b".into(),
            },
            ppid,
            relation: ProcessRelation::Descendant,
            executable: format!("p{pid}"),
            first_seen_ms: 0,
            alive_after_root_exit: false,
            left_run_cgroup: None,
        }
    }

    #[test]
    fn children_follow_their_parent_and_cycles_end() {
        let ev = RunEvidence {
            processes: vec![
                rec(10, 1),
                rec(12, 11),
                rec(11, 10),
                rec(13, 10),
                rec(20, 21),
                rec(21, 20),
            ],
            ..RunEvidence::default()
        };
        let order: Vec<(usize, u32)> = process_tree(&ev)
            .iter()
            .map(|r| (r.depth, r.record.identity.pid))
            .collect();
        assert_eq!(&order[..4], &[(0, 10), (1, 11), (2, 12), (1, 13)]);
        assert_eq!(order.len(), 6);
    }
}
