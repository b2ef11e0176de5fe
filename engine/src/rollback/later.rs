//! Changes later runs recorded: rollback must not remove a file a later run recorded a change
//! to, even when its content happens to equal what this run left (the later run re-created or
//! rewrote it identically). Removing it would silently undo that run's work, and that run's own
//! capsule would then describe a tree that no longer exists.
//!
//! "Later" is by the recorded `started_at` (runs in one root never overlap: they hold the project
//! lock). For a session capsule the caller passes its `finished_at` instead: the shell calls of the
//! session are runs inside it, part of what it recorded, not later work. Runs that cannot be read, or were interrupted before recording their result, are not
//! consulted: their changes are unknown. A path the later run's own latest rollback already put
//! back is no longer that run's work and does not count.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::apply::Outcome;
use super::report::Report;
use agentdiff_store::{RecoveryArtifact, Store};

/// Path → id of the first later run that recorded a change to it.
pub(crate) fn later_changes(
    root: &Path,
    run_id: &str,
    started_at: &str,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(store) = Store::open_existing(root) else {
        return out;
    };
    let Ok(listings) = store.list_runs() else {
        return out;
    };
    for listing in listings {
        if listing.id.as_str() == run_id {
            continue;
        }
        let Ok(capsule) = store.open_run(listing.id.as_str()) else {
            continue;
        };
        let Ok(result) = capsule.result() else {
            continue;
        };
        if result.started_at.as_str() <= started_at {
            continue;
        }
        let undone: BTreeSet<String> = capsule
            .read_recovery::<Report>(RecoveryArtifact::RollbackResult)
            .map(|r| {
                r.items
                    .into_iter()
                    .filter(|i| {
                        matches!(
                            i.outcome,
                            Outcome::Restored
                                | Outcome::Removed
                                | Outcome::Recreated
                                | Outcome::AlreadyRestored
                        )
                    })
                    .map(|i| i.path)
                    .collect()
            })
            .unwrap_or_default();
        for change in result.changes {
            if !undone.contains(&change.path) {
                out.entry(change.path)
                    .or_insert_with(|| result.run_id.clone());
            }
        }
    }
    out
}
