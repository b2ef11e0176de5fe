//! `run --revert-denied`: once the run is sealed, the changes its policy denies are put back by
//! the rollback's rule (a path changes only while it is still in its recorded post-run state;
//! anything else is kept and reported), under the project lock the run still holds. The capsule
//! keeps the evidence of what the command did; the rollback's own record is added to it.
//!
//! Not defended: what a denied change did before it was reverted (a secret written to `.env` and
//! read by another process in the meantime), and a change the command's leftover processes make
//! after the revert (they were cleaned up with the run, or named in its evidence).

use std::path::Path;

use agentdiff_engine::rollback::{self, ExecuteOptions, Scope, Selection};
use agentdiff_host::redact::escape_terminal;
use agentdiff_policy::Action;
use agentdiff_store::schema::RunResult;
use agentdiff_store::Store;

/// The one line `run` prints about the revert, or `None` when there was nothing to revert.
pub fn revert_denied(store: &Store, root: &Path, result: &RunResult) -> Option<String> {
    // Changes made in a private workspace never reached this tree.
    let denied = result
        .changes
        .iter()
        .filter(|c| c.decision == Action::Deny && c.reversible)
        .count();
    if denied == 0 {
        return None;
    }
    let id = escape_terminal(&result.run_id);
    let attempt = store
        .open_run(&result.run_id)
        .map_err(|e| e.to_string())
        .and_then(|capsule| {
            let selection = Selection {
                scope: Scope::DeniedOnly,
                paths: Vec::new(),
            };
            let plan = rollback::plan(&capsule, store.objects(), root, &selection)
                .map_err(|e| e.to_string())?;
            let opts = ExecuteOptions {
                dry_run: false,
                fault: None,
            };
            rollback::execute(&capsule, &plan, &opts).map_err(|e| e.to_string())
        });
    Some(match attempt {
        Ok(report) => {
            let t = &report.totals;
            let reverted = t.restored + t.removed + t.recreated + t.already_restored;
            let kept = t.conflict + t.failed + t.skipped;
            let kept = match kept {
                0 => String::new(),
                n => format!(
                    "; {n} kept as they are now (changed again, or not recoverable): \
                     `agentdiff inspect {id}` lists them"
                ),
            };
            format!("agentdiff: run {id}: reverted {reverted} denied change(s){kept}")
        }
        Err(e) => format!(
            "agentdiff: run {id}: the denied changes were not reverted: {}; `agentdiff rollback \
             {id} --safe-only --dry-run` shows what a rollback would do",
            escape_terminal(&e)
        ),
    })
}
