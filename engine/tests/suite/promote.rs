//! Promote through the library: plans and previews of recorded private-workspace runs.

use std::path::Path;

use agentdiff_engine::promote::*;
use agentdiff_policy::Action;
use agentdiff_store::{Capsule, Store};

/// Records a sealed private-workspace run the way the transaction does (the shared
/// fixture): the host captured before, `script` run in a copy of it (the workspace), the copy
/// captured after, every change allowed.
fn record_private_run(root: &Path, workspace: &Path, script: &str) -> (Store, Capsule) {
    let capsule = agentdiff_run_fixtures::Recording {
        workspace: Some(workspace),
        max_backup_bytes: 1 << 20,
        decide: &|_| Action::Allow,
        ..agentdiff_run_fixtures::Recording::new(script)
    }
    .record(root)
    .unwrap();
    (Store::open(root).unwrap(), capsule)
}

fn item<'r>(report: &'r Report, path: &str) -> &'r ItemReport {
    report
        .items
        .iter()
        .find(|i| i.path == path)
        .unwrap_or_else(|| panic!("{path} not in the report: {report:#?}"))
}

fn all() -> Selection {
    Selection {
        scope: Scope::All,
        paths: Vec::new(),
        force: false,
    }
}

#[test]
fn a_directory_removed_with_its_only_child_is_previewed_as_removed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("project");
    std::fs::create_dir_all(root.join("d")).unwrap();
    std::fs::write(root.join("d/f"), b"old\n").unwrap();
    std::fs::write(root.join("keep.txt"), b"keep\n").unwrap();
    let root = root.canonicalize().unwrap();
    let (store, capsule) = record_private_run(&root, &dir.path().join("workspace"), "rm -r d");

    // The dry run knows d/f would be gone before d is removed: d is not a conflict.
    let plan = plan(&capsule, store.objects(), &root, &all()).unwrap();
    let preview = execute(&capsule, &plan, true).unwrap();
    assert_eq!(item(&preview, "d/f").outcome, PromoteOutcome::WouldRemove);
    assert_eq!(
        item(&preview, "d").outcome,
        PromoteOutcome::WouldRemove,
        "{preview:#?}"
    );
    assert!(!preview.has_conflicts());
    assert!(root.join("d/f").exists(), "a dry run writes nothing");

    // An edit to d/f on the host keeps it, and with it d; d is kept because of that child,
    // not reported as holding entries added after the run.
    std::fs::write(root.join("d/f"), b"edited on the host\n").unwrap();
    let report = execute(&capsule, &plan, false).unwrap();
    assert_eq!(item(&report, "d/f").outcome, PromoteOutcome::Conflict);
    let d = item(&report, "d");
    assert_eq!(d.outcome, PromoteOutcome::Skipped, "{report:#?}");
    assert!(
        d.reason
            .as_deref()
            .unwrap_or("")
            .contains("not selected or kept"),
        "{d:?}"
    );
    assert_eq!(
        std::fs::read(root.join("d/f")).unwrap(),
        b"edited on the host\n"
    );

    // With the host back in the captured state, promote removes both.
    std::fs::write(root.join("d/f"), b"old\n").unwrap();
    let report = execute(&capsule, &plan, false).unwrap();
    assert_eq!(report.status, PromoteStatus::Promoted, "{report:#?}");
    assert_eq!(item(&report, "d").outcome, PromoteOutcome::Removed);
    assert!(!root.join("d").exists());
    assert!(root.join("keep.txt").exists());
}

#[test]
fn previews_name_the_promoted_side_and_absolute_path_arguments_select() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("project");
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join("src/a.txt"), b"before\n").unwrap();
    std::fs::write(root.join("b.txt"), b"b\n").unwrap();
    let root = root.canonicalize().unwrap();
    let (store, capsule) = record_private_run(
        &root,
        &dir.path().join("workspace"),
        "echo after > src/a.txt; echo b2 > b.txt",
    );
    let selection = Selection {
        paths: vec![root.join("src").display().to_string()],
        ..all()
    };
    let plan = plan(&capsule, store.objects(), &root, &selection).unwrap();
    assert_eq!(plan.paths, vec!["src".to_string()]);
    assert_eq!(plan.not_selected, 1);
    let preview = execute(&capsule, &plan, true).unwrap();
    let a = item(&preview, "src/a.txt");
    assert_eq!(a.outcome, PromoteOutcome::WouldApply);
    let diff = a.diff.as_deref().unwrap_or("");
    assert!(diff.contains("+++ src/a.txt (after promote)"), "{diff}");
    assert!(!diff.contains("rollback"), "{diff}");
}

#[test]
fn rolling_back_a_private_workspace_run_says_there_is_nothing_to_roll_back() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("project");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("a.txt"), b"alpha\n").unwrap();
    let root = root.canonicalize().unwrap();
    let (store, capsule) = record_private_run(&root, &dir.path().join("workspace"), "rm a.txt");
    let selection = agentdiff_engine::rollback::Selection {
        scope: agentdiff_engine::rollback::Scope::All,
        paths: Vec::new(),
    };
    // The recorded root is right: this used to be refused as a root mismatch naming the same
    // root twice.
    let err =
        agentdiff_engine::rollback::plan(&capsule, store.objects(), &root, &selection).unwrap_err();
    assert!(
        matches!(
            err,
            agentdiff_engine::rollback::RollbackError::PrivateWorkspace { .. }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("agentdiff promote"), "{err}");
    assert_eq!(std::fs::read(root.join("a.txt")).unwrap(), b"alpha\n");
}

/// Once promote wrote a private-workspace run's changes into the tree, rollback undoes them as
/// for a run in place: a promoted path goes back to its before-state, a path promote kept (it
/// had changed on the host) stays as the user left it, and a later edit of a promoted path is
/// kept as a conflict.
#[test]
fn a_promoted_run_rolls_back_what_promote_applied_and_keeps_later_edits() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("project");
    std::fs::create_dir_all(&root).unwrap();
    for (name, text) in [("a.txt", "a\n"), ("b.txt", "b\n"), ("c.txt", "c\n")] {
        std::fs::write(root.join(name), text).unwrap();
    }
    let root = root.canonicalize().unwrap();
    let (store, capsule) = record_private_run(
        &root,
        &dir.path().join("workspace"),
        "echo a2 > a.txt; echo b2 > b.txt; rm c.txt; echo n > new.txt",
    );
    // The user edits b.txt on the host before promoting: promote keeps it.
    std::fs::write(root.join("b.txt"), b"user\n").unwrap();
    let report = execute(
        &capsule,
        &plan(&capsule, store.objects(), &root, &all()).unwrap(),
        false,
    )
    .unwrap();
    assert_eq!(item(&report, "b.txt").outcome, PromoteOutcome::Conflict);
    assert_eq!(std::fs::read(root.join("a.txt")).unwrap(), b"a2\n");
    // Later, the user edits the promoted new.txt.
    std::fs::write(root.join("new.txt"), b"edited later\n").unwrap();

    use agentdiff_engine::rollback::{self, Outcome, Scope as RScope, Selection as RSelection};
    let selection = RSelection {
        scope: RScope::All,
        paths: Vec::new(),
    };
    let plan = rollback::plan(&capsule, store.objects(), &root, &selection).unwrap();
    let done = rollback::execute(&capsule, &plan, &Default::default()).unwrap();
    let outcome = |p: &str| {
        done.items
            .iter()
            .find(|i| i.path == p)
            .unwrap_or_else(|| panic!("{p}: {done:#?}"))
            .outcome
    };
    assert_eq!(outcome("a.txt"), Outcome::Restored);
    assert_eq!(outcome("c.txt"), Outcome::Recreated);
    assert_eq!(outcome("new.txt"), Outcome::Conflict);
    assert_eq!(outcome("b.txt"), Outcome::Conflict);
    assert_eq!(std::fs::read(root.join("a.txt")).unwrap(), b"a\n");
    assert_eq!(std::fs::read(root.join("c.txt")).unwrap(), b"c\n");
    assert_eq!(std::fs::read(root.join("b.txt")).unwrap(), b"user\n");
    assert_eq!(
        std::fs::read(root.join("new.txt")).unwrap(),
        b"edited later\n"
    );
}
