//! A run's host process tree as a backend that lost its command finds it, and the
//! identity-checked cleanup every backend whose processes are ordinary host processes uses.

use std::time::Duration;

use agentdiff_backend_api::{CleanupMechanism, CleanupReport, ProcessIdentity};

/// Identity-checked cleanup of host processes (pidfd where available) off the async threads: the
/// one helper every backend whose processes are ordinary host processes uses in `cleanup_run`.
pub async fn cleanup_host_processes(ids: &[ProcessIdentity], grace: Duration) -> CleanupReport {
    let owned = ids.to_vec();
    // Cleanup sleeps through grace periods: keep it off the async threads.
    match tokio::task::spawn_blocking(move || crate::cleanup_identities(&owned, grace)).await {
        Ok(report) => report,
        Err(e) => CleanupReport {
            mechanism: CleanupMechanism::Pidfd,
            grace_ms: grace.as_millis() as u64,
            records: Vec::new(),
            errors: vec![format!("cleanup did not complete: {e}")],
            resources_removed: Vec::new(),
        },
    }
}

/// At most this many processes are collected by [`process_tree`] (a fork bomb ends the walk).
const MAX_TREE: usize = 4096;

/// The live processes of the tree rooted at `root`: `root` itself while it still has its
/// identity, then every descendant found through `/proc/PID/task/TID/children`, each identity read
/// when it is found (so cleanup signals only what was seen). Used when a backend lost its
/// command: taken before the root is ended, since the root's children re-parent away when it
/// dies. Not found: a descendant that already re-parented (a daemon whose parent exited).
pub fn process_tree(root: &ProcessIdentity) -> Vec<ProcessIdentity> {
    if !matches!(
        agentdiff_host::process_identity::still_matches(root),
        Ok(true)
    ) {
        return Vec::new();
    }
    let mut found = vec![root.clone()];
    let mut queue = vec![root.pid];
    while let Some(pid) = queue.pop() {
        for child in children_of(pid) {
            if found.len() >= MAX_TREE || found.iter().any(|f| f.pid == child) {
                continue;
            }
            if let Ok(id) = crate::read_identity(child) {
                queue.push(child);
                found.push(id);
            }
        }
    }
    found
}

/// The children of every thread of `pid` (none where `/proc` does not list them).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}
