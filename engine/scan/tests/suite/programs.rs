//! The sweep of excluded paths for programs, on real trees: what it records, what it never
//! follows, and what it leaves out.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use agentdiff_scan::programs::{changed_programs, ProgramChangeType, ProgramReason};
use agentdiff_scan::{scan, EntryKind, Manifest, ScanOptions};

fn write(root: &Path, rel: &str, body: &str, mode: u32) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(&p, body).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
}

fn swept(root: &Path) -> Manifest {
    scan(root, &ScanOptions::new()).unwrap()
}

fn programs(m: &Manifest) -> Vec<(String, ProgramReason)> {
    m.excluded_programs
        .as_ref()
        .expect("swept")
        .programs
        .iter()
        .map(|p| (p.path.clone(), p.reason))
        .collect()
}

#[test]
fn programs_below_excluded_directories_are_recorded_by_metadata_only() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    write(root, "src/main.rs", "fn main() {}\n", 0o644);
    write(root, ".venv/bin/agentdiff-backend-x", "#!/bin/sh\n", 0o755);
    write(
        root,
        ".venv/lib/site-packages/evil.pth",
        "import os\n",
        0o644,
    );
    write(
        root,
        ".venv/lib/site-packages/sitecustomize.py",
        "x=1\n",
        0o644,
    );
    write(
        root,
        ".venv/lib/site-packages/pkg/data.txt",
        "data\n",
        0o644,
    );
    write(root, "__pycache__/m.cpython-311.pyc", "\0\0", 0o644);
    write(root, "node_modules/pkg/cli.js", "//\n", 0o644);
    fs::create_dir_all(root.join("node_modules/.bin")).unwrap();
    symlink("../pkg/cli.js", root.join("node_modules/.bin/cli")).unwrap();
    // A symlink outside a command directory is not a program.
    symlink("pkg", root.join("node_modules/alias")).unwrap();
    let m = swept(root);
    assert_eq!(
        programs(&m),
        vec![
            (
                ".venv/bin/agentdiff-backend-x".to_owned(),
                ProgramReason::Executable
            ),
            (
                ".venv/lib/site-packages/evil.pth".to_owned(),
                ProgramReason::PythonStartup
            ),
            (
                ".venv/lib/site-packages/sitecustomize.py".to_owned(),
                ProgramReason::PythonStartup
            ),
            (
                "__pycache__/m.cpython-311.pyc".to_owned(),
                ProgramReason::PythonBytecode
            ),
            (
                "node_modules/.bin/cli".to_owned(),
                ProgramReason::CommandLink
            ),
        ]
    );
    let link = &m.excluded_programs.as_ref().unwrap().programs[4];
    assert_eq!(link.kind, EntryKind::Symlink);
    assert_eq!(link.symlink_target.as_deref(), Some("../pkg/cli.js"));
    // Nothing below an excluded directory became an entry, and nothing was hashed for the sweep.
    assert!(
        m.entries.keys().all(|k| !k.starts_with(".venv")),
        "{:?}",
        m.entries.keys()
    );
    assert_eq!(m.stats.bytes_hashed, "fn main() {}\n".len() as u64);
}

#[test]
fn the_sweep_follows_no_symlink_and_skips_object_stores() {
    let t = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    write(outside.path(), "tool", "#!/bin/sh\n", 0o755);
    let root = t.path();
    fs::create_dir_all(root.join("node_modules")).unwrap();
    // A linked directory is not descended into, whatever it holds.
    symlink(outside.path(), root.join("node_modules/linked")).unwrap();
    // An excluded path that is itself a symlink to a directory of programs.
    symlink(outside.path(), root.join("target")).unwrap();
    // A nested repository's object store is excluded and never swept; its hooks are scanned.
    write(root, "sub/.git/objects/ab/cdef", "blob", 0o755);
    write(root, "sub/.git/HEAD", "ref: refs/heads/main\n", 0o644);
    let m = swept(root);
    assert_eq!(programs(&m), vec![]);
    assert!(m.excluded_programs.as_ref().unwrap().incomplete.is_empty());
}

#[test]
fn ignored_paths_are_swept_and_the_run_store_is_not() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    write(root, ".agentdiffignore", "scratch/\n*.bin\n", 0o644);
    write(root, "scratch/run-me", "#!/bin/sh\n", 0o700);
    write(root, "tool.bin", "\x7fELF", 0o755);
    write(root, ".agentdiff/runs/x/hook", "#!/bin/sh\n", 0o755);
    let m = swept(root);
    assert_eq!(
        programs(&m),
        vec![
            ("scratch/run-me".to_owned(), ProgramReason::Executable),
            ("tool.bin".to_owned(), ProgramReason::Executable),
        ]
    );
}

#[test]
fn a_file_made_executable_a_rewrite_and_a_new_program_are_changes_and_a_deletion_is_not() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    write(root, "node_modules/a/run.sh", "#!/bin/sh\n", 0o644);
    write(root, "node_modules/a/keep", "#!/bin/sh\n", 0o755);
    write(root, "node_modules/a/rewrite", "#!/bin/sh\n", 0o755);
    write(root, "node_modules/a/gone", "#!/bin/sh\n", 0o755);
    let before = swept(root);
    fs::set_permissions(
        root.join("node_modules/a/run.sh"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    fs::write(root.join("node_modules/a/rewrite"), "#!/bin/sh\nevil\n").unwrap();
    fs::remove_file(root.join("node_modules/a/gone")).unwrap();
    write(root, "node_modules/.bin/new", "#!/bin/sh\n", 0o755);
    let after = swept(root);
    let got: Vec<(String, ProgramChangeType)> = changed_programs(
        before.excluded_programs.as_ref(),
        after.excluded_programs.as_ref(),
    )
    .into_iter()
    .map(|c| (c.program.path.clone(), c.change_type))
    .collect();
    assert_eq!(
        got,
        vec![
            (
                "node_modules/.bin/new".to_owned(),
                ProgramChangeType::Created
            ),
            (
                "node_modules/a/rewrite".to_owned(),
                ProgramChangeType::Modified
            ),
            // Made executable: it was no program before.
            (
                "node_modules/a/run.sh".to_owned(),
                ProgramChangeType::Created
            ),
        ]
    );
}

#[test]
fn an_unlistable_directory_makes_the_sweep_say_it_is_incomplete() {
    if nix::unistd::geteuid().is_root() {
        // Root lists a mode-000 directory anyway; the bound is checked through the depth instead.
        let t = tempfile::tempdir().unwrap();
        let mut rel = String::from("node_modules");
        for _ in 0..=agentdiff_scan::programs::MAX_SWEEP_DEPTH {
            rel.push_str("/d");
        }
        fs::create_dir_all(t.path().join(&rel)).unwrap();
        let m = swept(t.path());
        let inc = &m.excluded_programs.as_ref().unwrap().incomplete;
        assert_eq!(inc.len(), 1, "{inc:?}");
        assert!(inc[0].contains("deeper than"), "{inc:?}");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    write(t.path(), "node_modules/locked/x", "#!/bin/sh\n", 0o755);
    fs::set_permissions(
        t.path().join("node_modules/locked"),
        fs::Permissions::from_mode(0o000),
    )
    .unwrap();
    let m = swept(t.path());
    fs::set_permissions(
        t.path().join("node_modules/locked"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let inc = &m.excluded_programs.as_ref().unwrap().incomplete;
    assert_eq!(inc.len(), 1, "{inc:?}");
    assert!(inc[0].contains("node_modules/locked"), "{inc:?}");
}

#[test]
fn a_scan_asked_not_to_sweep_says_so() {
    let t = tempfile::tempdir().unwrap();
    write(t.path(), "node_modules/x", "#!/bin/sh\n", 0o755);
    let mut opts = ScanOptions::new();
    opts.sweep_excluded = false;
    let m = scan(t.path(), &opts).unwrap();
    assert!(m.excluded_programs.is_none());
}

/// A hand-made git directory (git's layout: `HEAD`, `refs/`, `objects/`) at `rel`.
fn git_layout(root: &Path, rel: &str) {
    write(
        root,
        &format!("{rel}/HEAD"),
        "ref: refs/heads/main\n",
        0o644,
    );
    fs::create_dir_all(root.join(rel).join("refs/heads")).unwrap();
    fs::create_dir_all(root.join(rel).join("objects/ab")).unwrap();
    write(root, &format!("{rel}/objects/ab/cdef"), "blob\n", 0o444);
}

fn changed(before: &Manifest, after: &Manifest) -> Vec<(String, ProgramChangeType)> {
    changed_programs(
        before.excluded_programs.as_ref(),
        after.excluded_programs.as_ref(),
    )
    .into_iter()
    .map(|c| (c.program.path.clone(), c.change_type))
    .collect()
}

#[test]
fn git_metadata_in_excluded_directories_is_swept_whatever_its_name() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    // `.git` directory, `.git` file, `.git` symlink, and a bare layout under another name.
    git_layout(root, "node_modules/evil/.git");
    write(root, "node_modules/evil/.git/config", "[core]\n", 0o644);
    write(root, "build/sub/.git", "gitdir: ../../x\n", 0o644);
    fs::create_dir_all(root.join("dist/l")).unwrap();
    symlink("/elsewhere", root.join("dist/l/.git")).unwrap();
    git_layout(root, "target/cache.bare");
    write(root, "target/cache.bare/config", "[core]\n", 0o644);
    write(root, ".cache/plain/HEAD", "x\n", 0o644);
    let m = swept(root);
    let got: Vec<(String, ProgramReason)> = programs(&m)
        .into_iter()
        .filter(|(_, r)| *r == ProgramReason::GitMetadata)
        .collect();
    let git = |p: &str| (p.to_owned(), ProgramReason::GitMetadata);
    // Object stores are not swept; a directory without git's layout is no repository.
    assert_eq!(
        got,
        vec![
            git("build/sub/.git"),
            git("dist/l/.git"),
            git("node_modules/evil/.git"),
            git("node_modules/evil/.git/HEAD"),
            git("node_modules/evil/.git/config"),
            git("target/cache.bare"),
            git("target/cache.bare/HEAD"),
            git("target/cache.bare/config"),
        ]
    );
    let link = m
        .excluded_programs
        .as_ref()
        .unwrap()
        .programs
        .iter()
        .find(|p| p.path == "dist/l/.git")
        .unwrap();
    assert_eq!(link.kind, EntryKind::Symlink);
    assert_eq!(link.symlink_target.as_deref(), Some("/elsewhere"));
    assert_eq!(
        m.git_layouts,
        vec!["node_modules/evil/.git", "target/cache.bare"]
    );
}

#[test]
fn a_repository_untouched_by_the_run_is_no_change_and_one_planted_or_edited_is() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    git_layout(root, "node_modules/dep/.git");
    write(root, "node_modules/dep/.git/config", "[core]\n", 0o644);
    git_layout(root, "node_modules/other/.git");
    let before = swept(root);
    assert!(changed(&before, &swept(root)).is_empty());
    // Edited config of a repository that was there, and a bare layout completed by the run
    // (its `HEAD` and `refs` were there before, not yet a repository).
    write(
        root,
        "node_modules/dep/.git/config",
        "[core]\n\tfsmonitor = evil\n",
        0o644,
    );
    write(root, "build/b/HEAD", "x\n", 0o644);
    fs::create_dir_all(root.join("build/b/refs")).unwrap();
    let before = swept(root);
    fs::write(
        root.join("node_modules/dep/.git/config"),
        "[core]\n\tfsmonitor = evil2\n",
    )
    .unwrap();
    fs::create_dir_all(root.join("build/b/objects")).unwrap();
    let after = swept(root);
    assert_eq!(
        changed(&before, &after),
        vec![
            ("build/b".to_owned(), ProgramChangeType::Created),
            ("build/b/HEAD".to_owned(), ProgramChangeType::Created),
            (
                "node_modules/dep/.git/config".to_owned(),
                ProgramChangeType::Modified
            ),
        ]
    );
}
