//! The execution loop rollback and promote share: both turn plan items into ordered [`ApplyOp`]s
//! and push them through one [`Applier`]; they differ only in which states are expected and
//! targeted (chosen when planning), in the labels, and in how they record events and reports.
//!
//! Keeping one loop matters for correctness, not just size: a directory removal is judged by
//! what happened to its children earlier in the same execution (kept, or — in a dry run —
//! would be removed), and that bookkeeping must be the same whichever way the tree is moved.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::apply::{self, Applier, ApplyOp, DirChildren, Interrupted, OpKind, OpResult, Outcome};
use super::diff_preview;
use super::plan::{PlanItem, PlannedStep};

/// What happened to one plan item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemResult {
    /// The write the item needed (`None` for items planned as skipped or failed).
    pub action: Option<OpKind>,
    pub result: OpResult,
}

/// The results of [`run`], one per plan item in plan order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Executed {
    pub items: Vec<ItemResult>,
    /// The injected test fault stopped the execution; items not reached are `failed`.
    pub interrupted: Option<Interrupted>,
}

/// Checks and writes (or, in a dry run, only checks) every `Apply` item of `items` in the order
/// [`apply::order`] gives, after removing temporary files an interrupted earlier execution left.
///
/// `unselected_children` names, for a directory to be removed, the children that stay because
/// their own change was not selected. Unless the applier is in a dry run, `on_start` is told
/// the number of operations before anything is written, and `on_path` is told every result that
/// wrote a path or preserved a difference; an error from either ends the execution with it.
pub fn run<E>(
    applier: &mut Applier<'_>,
    items: &[PlanItem],
    unselected_children: &BTreeMap<String, Vec<String>>,
    on_start: impl FnOnce(usize) -> Result<(), E>,
    mut on_path: impl FnMut(&ApplyOp, &OpResult) -> Result<(), E>,
) -> Result<Executed, E> {
    let dry_run = applier.dry_run();
    let ops = indexed_ops(items);
    let mut ordered: Vec<ApplyOp> = ops.iter().map(|(_, o)| o.clone()).collect();
    apply::order(&mut ordered);
    // Re-associate ordered ops with their items (path + kind is unique).
    let index: HashMap<(&str, OpKind), usize> = ops
        .iter()
        .map(|(i, o)| ((o.path.as_str(), o.kind), *i))
        .collect();

    if !dry_run {
        on_start(ordered.len())?;
    }
    applier.clean_stale_temps(&ordered);

    let mut results: Vec<Option<OpResult>> = vec![None; items.len()];
    let mut interrupted = None;
    // Paths whose removal did not happen (kept) or, in a dry run, would happen (gone); a
    // directory holding only such entries is not a conflict.
    let mut kept: BTreeSet<String> = BTreeSet::new();
    let mut gone: BTreeSet<String> = BTreeSet::new();
    for op in &ordered {
        let Some(&i) = index.get(&(op.path.as_str(), op.kind)) else {
            continue;
        };
        let children = if matches!(op.kind, OpKind::RemoveDir | OpKind::ReplaceWithLink) {
            let mut children = DirChildren {
                kept: names_below(&kept, &op.path),
                gone: names_below(&gone, &op.path),
            };
            children.kept.extend(
                unselected_children
                    .get(&op.path)
                    .into_iter()
                    .flatten()
                    .cloned(),
            );
            children
        } else {
            DirChildren::default()
        };
        let r = match applier.apply_with(op, &children) {
            Ok(r) => r,
            Err(stop) => {
                interrupted = Some(stop);
                break;
            }
        };
        if removes(op.kind) {
            match r.outcome {
                Outcome::Removed | Outcome::AlreadyRestored => {}
                Outcome::WouldRemove => {
                    gone.insert(op.path.clone());
                }
                _ => {
                    kept.insert(op.path.clone());
                }
            }
        }
        if op.kind == OpKind::SettleDirMode {
            // The final mode only matters to the report when it went wrong.
            if r.outcome.preserved_a_difference() {
                results[i] = Some(r);
            }
            continue;
        }
        if !dry_run
            && matches!(
                r.outcome,
                Outcome::Restored
                    | Outcome::Removed
                    | Outcome::Recreated
                    | Outcome::Conflict
                    | Outcome::Failed
            )
        {
            on_path(op, &r)?;
        }
        results[i] = Some(r);
    }

    let items = items
        .iter()
        .zip(results)
        .map(|(item, result)| match (&item.step, result) {
            (PlannedStep::Apply(op), Some(mut result)) => {
                if result.diff.is_some()
                    && !applier.show_secrets
                    && diff_preview::is_sensitive(&item.path, item.decision)
                {
                    result.diff = Some(diff_preview::withheld(
                        op.expected.as_ref(),
                        applier.expected_label,
                        op.target.as_ref(),
                        applier.target_label,
                    ));
                }
                ItemResult {
                    action: Some(op.kind),
                    result,
                }
            }
            (PlannedStep::Apply(op), None) => ItemResult {
                action: Some(op.kind),
                result: OpResult::with(Outcome::Failed, "was not processed"),
            },
            (PlannedStep::Skip(why), _) => ItemResult {
                action: None,
                result: OpResult::with(Outcome::Skipped, why.clone()),
            },
            (PlannedStep::Conflict(why), _) => ItemResult {
                action: None,
                result: OpResult::with(Outcome::Conflict, why.clone()),
            },
            (PlannedStep::Fail(why), _) => ItemResult {
                action: None,
                result: OpResult::with(Outcome::Failed, why.clone()),
            },
            (PlannedStep::Done(why), _) => ItemResult {
                action: None,
                result: OpResult::with(Outcome::AlreadyRestored, why.clone()),
            },
        })
        .collect();
    Ok(Executed { items, interrupted })
}

/// Every `Apply` op of `items` with its item's index, plus the final-mode step of each created
/// directory whose mode is more restrictive than the one it is filled with.
fn indexed_ops(items: &[PlanItem]) -> Vec<(usize, ApplyOp)> {
    let mut ops: Vec<(usize, ApplyOp)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        if let PlannedStep::Apply(op) = &item.step {
            ops.push((i, (**op).clone()));
            if op.kind == OpKind::CreateDir
                && op
                    .target
                    .as_ref()
                    .is_some_and(|t| apply::working_dir_mode(t.mode) != t.mode)
            {
                ops.push((
                    i,
                    ApplyOp {
                        kind: OpKind::SettleDirMode,
                        ..(**op).clone()
                    },
                ));
            }
        }
    }
    ops
}

/// The distinct first components of the entries of `set` below directory `dir`.
fn names_below(set: &BTreeSet<String>, dir: &str) -> Vec<String> {
    let prefix = format!("{dir}/");
    set.range(prefix.clone()..)
        .take_while(|p| p.starts_with(&prefix))
        .filter_map(|p| p[prefix.len()..].split('/').next().map(str::to_string))
        .collect()
}

/// Whether an op removes what is at its path (its outcome says whether a directory above it can
/// go too).
fn removes(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::RemoveFile | OpKind::RemoveDir | OpKind::RemoveLink
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_below_lists_direct_children_only_of_that_directory() {
        let set: BTreeSet<String> = ["a/x", "a/y/z", "ab/q", "a", "b/a/c"]
            .into_iter()
            .map(String::from)
            .collect();
        assert_eq!(names_below(&set, "a"), vec!["x", "y"]);
        assert!(names_below(&set, "c").is_empty());
    }
}
