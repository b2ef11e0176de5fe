//! Promote's plan: verify the capsule (sealed, intact, recorded by a private-workspace backend),
//! select the recorded changes and classify each path's write before anything is written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::recovery::{RecordedRun, RecordedTree};
use crate::rollback::apply::{self, ApplyOp, OpKind, Transition};
use crate::rollback::plan::{path_filters, under, PathArgError};
use crate::transaction::ChangeRecord;
use agentdiff_backend_api::WorkspaceMode;
use agentdiff_policy::Action;
use agentdiff_scan::parent_of;
use agentdiff_scan::{ChangeType, EntryKind};
use agentdiff_store::{Capsule, ObjectStore};

use super::{PlanItem, PromoteError, Scope, Selection, Step};

/// A verified plan; run it with [`execute`].
#[derive(Debug, Clone)]
pub struct Plan {
    pub run_id: String,
    pub root: PathBuf,
    pub scope: Scope,
    pub force: bool,
    pub paths: Vec<String>,
    pub items: Vec<PlanItem>,
    pub not_selected: usize,
    /// Dry run: show content diffs of sensitive files too (default: sizes and hashes only).
    pub show_secrets: bool,
    pub(super) objects: ObjectStore,
    pub(super) unselected_children: BTreeMap<String, Vec<String>>,
}

/// The workspace was written by the command: a setuid or setgid bit it set would become a
/// privileged file owned by whoever promotes. Such paths are reported, never written.
fn unsafe_target_mode(target: Option<&agentdiff_scan::Entry>) -> Option<String> {
    let mode = target?.mode;
    (mode & 0o6000 != 0).then(|| {
        format!(
            "the workspace gave it mode {:o} (setuid/setgid); promote never writes those bits — review it and apply it by hand",
            mode & 0o7777
        )
    })
}

/// Verify the capsule and plan the promotion of `selection` into `root`.
pub fn plan(
    capsule: &Capsule,
    objects: &ObjectStore,
    root: &Path,
    selection: &Selection,
) -> Result<Plan, PromoteError> {
    if selection.force && selection.paths.is_empty() {
        return Err(PromoteError::ForceWithoutPath);
    }
    let run = RecordedRun::open(
        capsule,
        objects,
        root,
        RecordedTree::PrivateWorkspace,
        |c| {
            let private = c
                .runtime()?
                .evidence()
                .is_some_and(|e| e.capabilities.workspace == WorkspaceMode::Private);
            if private {
                Ok(())
            } else {
                Err(PromoteError::NotPrivate {
                    run_id: c.id().to_string(),
                })
            }
        },
    )?;
    let (before, after) = (&run.before, &run.after);
    let filters = path_filters(&selection.paths, &run.root, &run.paths()).map_err(|e| match e {
        PathArgError::Invalid { arg, reason } => PromoteError::InvalidPathArgument {
            path: arg,
            reason: reason.to_string(),
        },
        PathArgError::Unknown { arg } => PromoteError::UnknownPath { path: arg },
    })?;
    let named = |c: &ChangeRecord| filters.iter().any(|f| under(&c.path, f));
    let by_path = |c: &ChangeRecord| filters.is_empty() || named(c);

    let transition = |path: &str| Transition {
        path: path.to_string(),
        expected: before.entries.get(path).cloned(),
        target: after.entries.get(path).cloned(),
    };

    let mut items: BTreeMap<String, PlanItem> = BTreeMap::new();
    let mut not_selected = 0usize;
    for c in run.changes() {
        if !by_path(c) {
            not_selected += 1;
            continue;
        }
        let in_scope = matches!(
            (c.decision, selection.scope),
            (Action::Allow, _) | (Action::Review, Scope::All)
        );
        let deny = c.decision == Action::Deny;
        let step = if deny && !(selection.force && named(c)) {
            if filters.is_empty() {
                Step::Skip(
                    "deny-classified: promoted only when named with --path and --force".into(),
                )
            } else {
                Step::Skip("deny-classified: add --force to promote a named deny change".into())
            }
        } else if deny || in_scope || !filters.is_empty() {
            // A named review change under --safe-only is promoted only with --all; say so.
            if c.decision == Action::Review && selection.scope == Scope::SafeOnly {
                Step::Skip("review-classified: use --all to promote it".into())
            } else if let Some(reason) = unsafe_target_mode(after.entries.get(&c.path)) {
                Step::Skip(reason)
            } else {
                match apply::classify(&transition(&c.path)) {
                    Ok(kind) => Step::Apply(Box::new(ApplyOp {
                        path: c.path.clone(),
                        kind,
                        expected: before.entries.get(&c.path).cloned(),
                        target: after.entries.get(&c.path).cloned(),
                    })),
                    Err(reason) => Step::Skip(reason.to_string()),
                }
            }
        } else {
            not_selected += 1;
            continue;
        };
        items.insert(
            c.path.clone(),
            PlanItem {
                path: c.path.clone(),
                change_type: c.change_type,
                entry_kind: c.entry_kind,
                decision: c.decision,
                implied: false,
                step,
            },
        );
    }

    add_created_parents(&mut items, &run);
    // Objects needed for writes must verify now, before anything is written.
    verify_objects(&mut items, objects);
    let unselected_children = unselected_children(&items, before);

    Ok(Plan {
        run_id: run.run_id.clone(),
        root: run.root.clone(),
        scope: selection.scope,
        force: selection.force,
        paths: filters,
        items: items.into_values().collect(),
        not_selected,
        show_secrets: false,
        objects: objects.clone(),
        unselected_children,
    })
}

/// A created path needs its created parent directories, even when they were not selected.
fn add_created_parents(items: &mut BTreeMap<String, PlanItem>, run: &RecordedRun) {
    let (before, after) = (&run.before, &run.after);
    let records: BTreeMap<&str, &ChangeRecord> =
        run.changes().iter().map(|c| (c.path.as_str(), c)).collect();
    let creating: Vec<String> = items
        .values()
        .filter(|i| matches!(&i.step, Step::Apply(op) if op.target.is_some()))
        .map(|i| i.path.clone())
        .collect();
    for path in creating {
        let mut p = path.as_str();
        while let Some(parent) = parent_of(p) {
            let needs = !before.entries.contains_key(parent)
                && after.entries.get(parent).map(|e| e.kind) == Some(EntryKind::Directory);
            if needs && !items.contains_key(parent) {
                let transition = Transition {
                    path: parent.to_string(),
                    expected: None,
                    target: after.entries.get(parent).cloned(),
                };
                let step = match unsafe_target_mode(after.entries.get(parent)) {
                    Some(reason) => Step::Skip(reason),
                    None => match apply::classify(&transition) {
                        Ok(kind) => Step::Apply(Box::new(ApplyOp {
                            path: parent.to_string(),
                            kind,
                            expected: None,
                            target: after.entries.get(parent).cloned(),
                        })),
                        Err(reason) => Step::Skip(reason.to_string()),
                    },
                };
                let decision = records.get(parent).map_or(Action::Allow, |c| c.decision);
                items.insert(
                    parent.to_string(),
                    PlanItem {
                        path: parent.to_string(),
                        change_type: ChangeType::Created,
                        entry_kind: EntryKind::Directory,
                        decision,
                        implied: true,
                        step,
                    },
                );
            }
            p = parent;
        }
    }
}

/// A write whose workspace object does not verify fails now, before anything is written.
fn verify_objects(items: &mut BTreeMap<String, PlanItem>, objects: &ObjectStore) {
    for item in items.values_mut() {
        if let Step::Apply(op) = &item.step {
            if matches!(op.kind, OpKind::WriteFile | OpKind::CreateFile) {
                if let Some(sha) = op.target.as_ref().and_then(|t| t.sha256.as_deref()) {
                    if let Err(e) = objects.verify_object(sha) {
                        item.step = Step::Fail(format!("its workspace object is unusable: {e}"));
                    }
                }
            }
        }
    }
}

/// Directories to remove: their children (in the before-state) whose removal is not applied.
fn unselected_children(
    items: &BTreeMap<String, PlanItem>,
    before: &agentdiff_scan::Manifest,
) -> BTreeMap<String, Vec<String>> {
    let removing: BTreeSet<&str> = items
        .values()
        .filter(|i| matches!(&i.step, Step::Apply(op) if op.target.is_none()))
        .map(|i| i.path.as_str())
        .collect();
    let mut out = BTreeMap::new();
    for item in items.values() {
        if let Step::Apply(op) = &item.step {
            if op.kind == OpKind::RemoveDir {
                let prefix = format!("{}/", op.path);
                let kids: Vec<String> = before
                    .entries
                    .keys()
                    .filter(|k| k.starts_with(&prefix) && !k[prefix.len()..].contains('/'))
                    .filter(|k| !removing.contains(k.as_str()))
                    .map(|k| k[prefix.len()..].to_string())
                    .collect();
                out.insert(op.path.clone(), kids);
            }
        }
    }
    out
}
