//! Programs planted below excluded directories, through the binary: a run that writes one is a
//! review (a denied path stays denied), the finding is sealed with the run, and ordinary files
//! there stay invisible.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::Path;

use agentdiff_policy::Action;
use agentdiff_store::schema::{RunResult, Status};

use super::{agentdiff, assert_exit, run_json};

fn project() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("README.md"), "readme\n").unwrap();
    fs::create_dir_all(t.path().join("node_modules/pkg")).unwrap();
    fs::write(t.path().join("node_modules/pkg/package.json"), "{}\n").unwrap();
    fs::create_dir_all(t.path().join(".venv/bin")).unwrap();
    t
}

fn result(root: &Path, fail_on: &str, script: &str) -> (i32, RunResult) {
    let (code, json, _) = run_json(root, &["--fail-on", fail_on], &["sh", "-c", script]);
    (code, serde_json::from_value(json).unwrap())
}

/// The (path named first in the detail, action) of each `excluded_program` finding.
fn planted(r: &RunResult) -> Vec<(String, Action)> {
    r.evidence_findings
        .iter()
        .filter(|f| f.kind == "excluded_program")
        .map(|f| {
            let path = f.detail.split(':').next().unwrap().to_owned();
            (path, f.action)
        })
        .collect()
}

#[test]
fn planted_programs_in_excluded_directories_are_review_findings_sealed_with_the_run() {
    let t = project();
    let root = t.path();
    let (code, r) = result(
        root,
        "review",
        "printf '#!/bin/sh\\necho pwn\\n' > .venv/bin/agentdiff-backend-pwn; \
         chmod +x .venv/bin/agentdiff-backend-pwn; \
         mkdir -p __pycache__ node_modules/.bin; echo x > __pycache__/m.cpython-311.pyc; \
         echo 'import os' > node_modules/evil.pth; ln -s ../pkg/cli.js node_modules/.bin/cli; \
         echo '{\"v\":2}' > node_modules/pkg/package.json",
    );
    assert_eq!(code, 72, "{r:#?}");
    assert_eq!(r.status, Status::Review);
    assert!(r.changes.is_empty(), "{:?}", r.changes);
    assert_eq!(
        planted(&r),
        vec![
            (".venv/bin/agentdiff-backend-pwn".to_owned(), Action::Review),
            ("__pycache__/m.cpython-311.pyc".to_owned(), Action::Review),
            ("node_modules/.bin/cli".to_owned(), Action::Review),
            ("node_modules/evil.pth".to_owned(), Action::Review),
        ]
    );
    // The finding is part of the sealed result.
    let out = agentdiff(root, &["verify", &r.run_id]);
    assert_exit(&out, 0);
}

#[test]
fn a_program_in_an_unnamed_git_directory_is_decided_by_the_policy() {
    let t = project();
    let root = t.path();
    fs::create_dir_all(root.join(".git/hooks")).unwrap();
    fs::write(root.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    // A policy that does not name `.git`: the directory is excluded, and swept.
    fs::write(
        root.join("agentdiff.yaml"),
        "version: 1\nfilesystem:\n  deny: ['**/hooks/**']\n",
    )
    .unwrap();
    let (code, r) = result(
        root,
        "deny",
        "printf '#!/bin/sh\\n' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit",
    );
    let got = planted(&r);
    assert_eq!(
        got,
        vec![(".git/hooks/pre-commit".to_owned(), Action::Deny)],
        "{r:#?}"
    );
    assert_eq!(code, 71);
}

#[test]
fn ordinary_files_in_excluded_directories_stay_out_of_the_result() {
    let t = project();
    let root = t.path();
    let (code, r) = result(
        root,
        "review",
        "echo '{}' > node_modules/pkg/index.json; mkdir -p target/debug; echo x > target/debug/log.txt",
    );
    assert_eq!(code, 0, "{r:#?}");
    assert_eq!(r.status, Status::Passed);
    assert!(planted(&r).is_empty(), "{:?}", r.evidence_findings);
}
