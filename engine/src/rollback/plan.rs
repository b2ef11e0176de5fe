//! Building a rollback plan from a sealed capsule: every refusal happens here, before anything
//! is written.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::apply::{classify, classify_rollback, ApplyOp, OpKind, Transition};
use super::{RollbackError, Scope, Selection};
use crate::recovery::{RecordedRun, RecordedTree};
use crate::transaction::ChangeRecord;
use agentdiff_host::dir::{DirHandle, NodeKind};
use agentdiff_policy::Action;
use agentdiff_scan::{ChangeType, EntryKind};
use agentdiff_store::{Capsule, ObjectStore, StoreError};

/// What rollback will do with one recorded change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlannedStep {
    /// Check and write.
    Apply(Box<ApplyOp>),
    /// Reported, never touched (symlink, hardlink, no backup, outside `--safe-only`, ...).
    Skip(String),
    /// Refused before anything is written (e.g. its backup object fails verification).
    Fail(String),
    /// Preserved as a conflict before anything is written (a later run recorded a change to it).
    Conflict(String),
    /// Already in its target state, found before anything is written (what the run put below
    /// a symlink's place is gone because the link is back).
    Done(String),
}

/// One recorded change in the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanItem {
    pub path: String,
    pub change_type: ChangeType,
    pub entry_kind: EntryKind,
    pub decision: Action,
    /// Included only because a selected path below it needs it.
    pub implied: bool,
    pub step: PlannedStep,
}

/// A verified, validated plan. Build it with [`plan`], run it with [`super::execute`].
#[derive(Debug, Clone)]
pub struct Plan {
    pub run_id: String,
    /// The recorded (resolved) project root.
    pub root: PathBuf,
    pub scope: Scope,
    pub paths: Vec<String>,
    /// Sorted by path.
    pub items: Vec<PlanItem>,
    /// Recorded changes outside the selection.
    pub not_selected: usize,
    /// Dry run: show content diffs of sensitive files too (default: sizes and hashes only).
    pub show_secrets: bool,
    pub(crate) objects: ObjectStore,
    /// For a directory to be removed: names of its children whose own removal was not selected.
    pub(crate) unselected_children: BTreeMap<String, Vec<String>>,
}

pub(crate) use agentdiff_scan::parent_of;
pub use agentdiff_scan::validate_recorded_path;

/// Normalizes a `--path` argument (`./a/` → `a`; `.` → everything; an absolute path below the
/// root → relative to it). Shared with promote.
pub(crate) fn normalize_path_arg(arg: &str, root: &Path) -> Result<String, &'static str> {
    let arg = match Path::new(arg).strip_prefix(root) {
        Ok(rel) if Path::new(arg).is_absolute() => rel.to_str().ok_or("not valid UTF-8")?,
        _ => arg,
    };
    let mut s = arg.trim_end_matches('/');
    while let Some(rest) = s.strip_prefix("./") {
        s = rest.trim_start_matches('/');
    }
    if s == "." || s.is_empty() {
        return Ok(String::new());
    }
    validate_recorded_path(s)?;
    Ok(s.to_string())
}

/// A `--path` argument that selects nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PathArgError {
    /// Not a path below the project root.
    Invalid { arg: String, reason: &'static str },
    /// No recorded change is at or below it.
    Unknown { arg: String },
}

/// The normalized `--path` filters (see [`normalize_path_arg`]); each must name a recorded path
/// or a directory above one. Shared with promote.
pub(crate) fn path_filters(
    args: &[String],
    root: &Path,
    recorded: &[&str],
) -> Result<Vec<String>, PathArgError> {
    args.iter()
        .map(|arg| {
            let p = normalize_path_arg(arg, root).map_err(|reason| PathArgError::Invalid {
                arg: arg.clone(),
                reason,
            })?;
            if recorded.iter().any(|r| under(r, &p)) {
                Ok(p)
            } else {
                Err(PathArgError::Unknown { arg: arg.clone() })
            }
        })
        .collect()
}

/// `path` is `prefix` or below it (`""` is above everything).
pub(crate) fn under(path: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || path == prefix
        || (path.len() > prefix.len()
            && path.starts_with(prefix)
            && path.as_bytes()[prefix.len()] == b'/')
}

/// Verifies the capsule and plans the rollback of `selection` below `root` (the project root the
/// user named; it must resolve to the root the run recorded).
pub fn plan(
    capsule: &Capsule,
    objects: &ObjectStore,
    root: &Path,
    selection: &Selection,
) -> Result<Plan, RollbackError> {
    // The capsule must be sealed and intact (problems with individual backup objects only refuse
    // the paths that need them, checked below), rollback must have been enabled by the run's
    // effective policy, the root must be the recorded one and every recorded path confined.
    let run = RecordedRun::open(capsule, objects, root, RecordedTree::InPlace, |c| {
        if c.policy_doc()?.effective.rollback.enabled {
            Ok(())
        } else {
            Err(RollbackError::Disabled {
                run_id: c.id().to_string(),
            })
        }
    })?;
    let (before, after, given) = (&run.before, &run.after, &run.root);
    let recorded = run.root.clone();

    // Selection.
    let filters = path_filters(&selection.paths, given, &run.paths()).map_err(|e| match e {
        PathArgError::Invalid { arg, reason } => RollbackError::InvalidPathArgument {
            path: arg,
            reason: reason.to_string(),
        },
        PathArgError::Unknown { arg } => RollbackError::UnknownPath { path: arg },
    })?;
    let by_path =
        |c: &ChangeRecord| filters.is_empty() || filters.iter().any(|f| under(&c.path, f));
    let in_scope = |c: &ChangeRecord| match selection.scope {
        Scope::All => true,
        Scope::SafeOnly => c.decision != Action::Allow,
        Scope::DeniedOnly => c.decision == Action::Deny,
    };

    let transition = |path: &str| Transition {
        path: path.to_string(),
        expected: after.entries.get(path).cloned(),
        target: before.entries.get(path).cloned(),
    };

    let mut chosen: BTreeMap<&str, (&ChangeRecord, bool)> = BTreeMap::new();
    let mut not_selected = 0usize;
    for c in run.changes() {
        if !by_path(c) {
            not_selected += 1;
        } else if in_scope(c) {
            chosen.insert(&c.path, (c, false));
        } else if !filters.is_empty() {
            // Named explicitly but outside --safe-only: say so rather than drop it silently.
            chosen.insert(&c.path, (c, false));
        } else {
            not_selected += 1;
        }
    }
    let records: BTreeMap<&str, &ChangeRecord> =
        run.changes().iter().map(|c| (c.path.as_str(), c)).collect();

    // A selected path that needs its parent back pulls in the parent's re-creation.
    let needs_parent: Vec<&str> = chosen
        .iter()
        .filter(|(_, (c, _))| in_scope(c) && before.entries.contains_key(&c.path))
        .map(|(p, _)| *p)
        .collect();
    for path in needs_parent {
        let mut cur = path;
        while let Some(parent) = parent_of(cur) {
            if let Some(rec) = records.get(parent) {
                let t = transition(parent);
                if !chosen.contains_key(parent) && classify(&t) == Ok(OpKind::CreateDir) {
                    chosen.insert(&rec.path, (rec, true));
                }
            }
            cur = parent;
        }
    }

    // Steps.
    // A session's own shell calls are runs inside it: only runs started after its end are later.
    let is_session = capsule
        .read_artifact::<agentdiff_store::schema::Metadata>(agentdiff_store::Artifact::Metadata)
        .is_ok_and(|m| m.session.is_some());
    let since = match is_session {
        true => &run.result.finished_at,
        false => &run.result.started_at,
    };
    let later = super::later::later_changes(&recorded, &run.run_id, since);
    let mut items = Vec::new();
    let mut verified: BTreeMap<String, Result<(), BackupObjectError>> = BTreeMap::new();
    for (path, (c, implied)) in &chosen {
        let step = if !implied && !in_scope(c) {
            PlannedStep::Skip(
                "allowed by the run's policy; --safe-only touches only review and deny changes \
                 (use --all to include it)"
                    .into(),
            )
        } else {
            restore_step(transition(path), objects, &mut verified, later.get(*path))
        };
        items.push(PlanItem {
            path: path.to_string(),
            change_type: c.change_type,
            entry_kind: c.entry_kind,
            decision: c.decision,
            implied: *implied,
            step,
        });
    }
    let unselected_children = unselected_children(&items, after);
    settle_below_restored_links(&recorded, &mut items, before);
    // Nothing may be written through a symlink that is in the tree right now.
    check_no_symlinks(&recorded, &items)?;

    Ok(Plan {
        run_id: run.run_id.clone(),
        root: recorded,
        scope: selection.scope,
        paths: selection.paths.clone(),
        items,
        not_selected,
        show_secrets: false,
        objects: objects.clone(),
        unselected_children,
    })
}

/// The step that restores one path's before-state; a backup object is checked once however many
/// paths need it.
fn restore_step(
    t: Transition,
    objects: &ObjectStore,
    verified: &mut BTreeMap<String, Result<(), BackupObjectError>>,
    changed_later_by: Option<&String>,
) -> PlannedStep {
    let kind = match classify_rollback(&t) {
        Err(why) => return PlannedStep::Skip(why.to_string()),
        Ok(kind) => kind,
    };
    let needs_object = matches!(kind, OpKind::WriteFile | OpKind::CreateFile);
    let hex = t.target.as_ref().and_then(|e| e.sha256.clone());
    match (needs_object, hex) {
        (true, Some(hex)) => {
            let check = verified
                .entry(hex.clone())
                .or_insert_with(|| check_object(objects, &hex))
                .clone();
            match check {
                Ok(()) => PlannedStep::Apply(Box::new(op(t, kind))),
                Err(why) => PlannedStep::Fail(why.to_string()),
            }
        }
        (true, None) => PlannedStep::Skip("no recorded content hash".into()),
        (false, _) => match changed_later_by {
            Some(by) if matches!(kind, OpKind::RemoveFile | OpKind::RemoveLink) => {
                PlannedStep::Conflict(format!(
                "a later run ({by}) recorded a change to it; removing it would undo that run's \
                 work, so it was left as it is (roll back {by} first)"
                ))
            }
            _ => PlannedStep::Apply(Box::new(op(t, kind))),
        },
    }
}

/// For each directory to be removed: the names of children the run created that are not being
/// removed with it.
fn unselected_children(
    items: &[PlanItem],
    after: &agentdiff_scan::Manifest,
) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let applied: BTreeSet<&str> = items
        .iter()
        .filter(|i| matches!(i.step, PlannedStep::Apply(_)))
        .map(|i| i.path.as_str())
        .collect();
    for item in items {
        let removes_dir = |op: &ApplyOp| {
            op.kind == OpKind::RemoveDir
                || (op.kind == OpKind::ReplaceWithLink
                    && op
                        .expected
                        .as_ref()
                        .is_some_and(|e| e.kind == EntryKind::Directory))
        };
        if matches!(&item.step, PlannedStep::Apply(op) if removes_dir(op)) {
            let prefix = format!("{}/", item.path);
            let names: BTreeSet<String> = after
                .entries
                .range(prefix.clone()..)
                .take_while(|(p, _)| p.starts_with(&prefix))
                .filter(|(p, _)| !applied.contains(p.as_str()))
                .filter_map(|(p, _)| p[prefix.len()..].split('/').next().map(str::to_string))
                .collect();
            out.insert(item.path.clone(), names.into_iter().collect());
        }
    }
    out
}

/// A removal below a path that was a symlink before the run and is that same link again now (an
/// earlier rollback put it back where the run had made a directory) has nothing left to remove:
/// the directory it was in is gone. It is done, and nothing is ever opened through the link.
fn settle_below_restored_links(
    root: &Path,
    items: &mut [PlanItem],
    before: &agentdiff_scan::Manifest,
) {
    let Ok(root_dir) = DirHandle::open_root(root) else {
        return;
    };
    let restored: Vec<String> = items
        .iter()
        .filter(|i| matches!(&i.step, PlannedStep::Apply(op) if op.kind == OpKind::ReplaceWithLink))
        .filter(|i| link_is_back(&root_dir, &i.path, before))
        .map(|i| i.path.clone())
        .collect();
    for item in items.iter_mut() {
        let removal = matches!(&item.step, PlannedStep::Apply(op) if op.target.is_none());
        if let Some(link) = restored
            .iter()
            .find(|l| removal && under(&item.path, l) && item.path != **l)
        {
            item.step = PlannedStep::Done(format!(
                "{link} is the symlink it was before the run again; nothing below it remains"
            ));
        }
    }
}

/// Whether `path` is now the symlink the before manifest records there (reached without
/// following a link).
fn link_is_back(root: &DirHandle, path: &str, before: &agentdiff_scan::Manifest) -> bool {
    let Some(want) = before
        .entries
        .get(path)
        .filter(|e| e.kind == EntryKind::Symlink)
        .and_then(|e| e.symlink_target.as_deref())
    else {
        return false;
    };
    let (parent, name) = match path.rsplit_once('/') {
        Some((p, n)) => (p, n),
        None => ("", path),
    };
    let Ok(dir) = root.open_relative(parent) else {
        return false;
    };
    let name = OsStr::new(name);
    dir.stat(name)
        .is_ok_and(|m| m.is_some_and(|m| m.kind == NodeKind::Symlink))
        && dir.read_link(name).is_ok_and(|t| t.to_str() == Some(want))
}

/// Refuses the whole plan when a path would be written through a symlink now in the tree.
fn check_no_symlinks(root: &Path, items: &[PlanItem]) -> Result<(), RollbackError> {
    let root_dir = DirHandle::open_root(root).map_err(|source| RollbackError::Io {
        action: "open the project root",
        path: root.to_path_buf(),
        source,
    })?;
    for item in items {
        if let PlannedStep::Apply(op) = &item.step {
            if let Some(parent) = parent_of(&op.path) {
                check_no_symlink(&root_dir, parent)?;
            }
        }
    }
    Ok(())
}

fn op(t: Transition, kind: OpKind) -> ApplyOp {
    ApplyOp {
        path: t.path,
        kind,
        expected: t.expected,
        target: t.target,
    }
}

/// Why a backup object cannot be restored from.
#[derive(Debug, Clone, thiserror::Error)]
enum BackupObjectError {
    #[error(
        "its backup object {hex} no longer matches its hash (content hashes to {actual}); \
         refusing to restore from it"
    )]
    Corrupt { hex: String, actual: String },
    #[error("its backup object {hex} is missing from the object store")]
    Missing { hex: String },
    #[error("its backup object cannot be checked: {0}")]
    Unreadable(#[source] Arc<StoreError>),
}

fn check_object(objects: &ObjectStore, hex: &str) -> Result<(), BackupObjectError> {
    match objects.verify_object(hex) {
        Ok(()) => Ok(()),
        Err(StoreError::ObjectCorrupt { actual, .. }) => Err(BackupObjectError::Corrupt {
            hex: hex.to_string(),
            actual,
        }),
        Err(StoreError::ObjectNotFound { .. }) => Err(BackupObjectError::Missing {
            hex: hex.to_string(),
        }),
        Err(e) => Err(BackupObjectError::Unreadable(Arc::new(e))),
    }
}

/// Walks `rel` from the root without following symlinks; a component that is a symlink now is a
/// refusal. A missing component ends the walk (it will be re-created or reported).
fn check_no_symlink(root: &DirHandle, rel: &str) -> Result<(), RollbackError> {
    let mut dir = match root.try_clone() {
        Ok(d) => d,
        Err(_) => return Ok(()),
    };
    let mut walked = String::new();
    for part in rel.split('/') {
        if !walked.is_empty() {
            walked.push('/');
        }
        walked.push_str(part);
        match dir.stat(OsStr::new(part)) {
            Ok(Some(m)) if m.kind == NodeKind::Symlink => {
                return Err(RollbackError::CrossesSymlink { path: walked })
            }
            Ok(Some(m)) if m.kind == NodeKind::Directory => match dir.open_dir(OsStr::new(part)) {
                Ok(d) => dir = d,
                Err(_) => return Ok(()),
            },
            _ => return Ok(()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_paths_are_confined() {
        for ok in ["a", "a/b.txt", "dir/.hidden", "a b/c"] {
            assert!(validate_recorded_path(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "a/",
            "./a",
            "a\0b",
            ".agentdiff/x",
            ".agentdiff",
        ] {
            assert!(validate_recorded_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn path_arguments_are_normalized() {
        let root = Path::new("/p/root");
        assert_eq!(normalize_path_arg("./dir/", root).unwrap(), "dir");
        assert_eq!(normalize_path_arg(".", root).unwrap(), "");
        assert_eq!(normalize_path_arg("/p/root/a/b", root).unwrap(), "a/b");
        assert_eq!(normalize_path_arg("/p/root", root).unwrap(), "");
        assert!(normalize_path_arg("/p/rootx/a", root).is_err());
        assert!(normalize_path_arg("/etc/passwd", root).is_err());
        assert!(normalize_path_arg("../x", root).is_err());
        assert!(under("dir/a", "dir"));
        assert!(!under("dirx/a", "dir"));
        assert!(under("anything", ""));
    }

    #[test]
    fn path_filters_must_select_a_recorded_change() {
        let root = Path::new("/p/root");
        let recorded = ["dir/a", "b.txt"];
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            path_filters(&args(&["./dir/", "/p/root/b.txt"]), root, &recorded).unwrap(),
            vec!["dir", "b.txt"]
        );
        assert_eq!(
            path_filters(&args(&["dir", "di"]), root, &recorded),
            Err(PathArgError::Unknown { arg: "di".into() })
        );
        assert!(matches!(
            path_filters(&args(&["../x"]), root, &recorded),
            Err(PathArgError::Invalid { .. })
        ));
    }
}
