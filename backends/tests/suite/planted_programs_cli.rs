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
    // Git metadata: one finding for the git directory, naming the hook.
    let got = planted(&r);
    assert_eq!(got, vec![(".git".to_owned(), Action::Deny)], "{r:#?}");
    let detail = &r.evidence_findings[0].detail;
    assert!(detail.contains("new .git/hooks/pre-commit"), "{detail}");
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

/// `git init` with a `core.fsmonitor` in `dir` (as a command would plant it; the sample hooks
/// made non-executable, so only the git metadata rule can see it).
fn plant_repo(dir: &str) -> String {
    format!(
        "git init -q {dir} && chmod -x {dir}/.git/hooks/* && \
         git -C {dir} config core.fsmonitor 'touch /tmp/agentdiff-pwned; false'"
    )
}

fn run_local(root: &Path, script: &str) -> (i32, RunResult) {
    let extra = ["--runtime", "local", "--fail-on", "deny"];
    let (code, json, _) = run_json(root, &extra, &["sh", "-c", script]);
    (code, serde_json::from_value(json).unwrap())
}

/// A repository planted in any excluded directory (or one there edited) is denied as git
/// metadata, its path named; one that was there and is left alone changes nothing.
#[test]
fn a_repository_planted_or_edited_in_an_excluded_directory_is_denied() {
    let t = project();
    let root = t.path();
    let init = std::process::Command::new("git")
        .args(["init", "-q", "node_modules/dep"])
        .current_dir(root)
        .status()
        .unwrap();
    assert!(init.success());
    let (code, r) = run_local(root, "true");
    assert_eq!((code, r.status), (0, Status::Passed), "{r:#?}");
    for dir in [
        "node_modules/evil",
        "build/x",
        "dist/x",
        "target/x",
        ".venv/x",
        ".cache/x",
    ] {
        let (code, r) = run_local(root, &plant_repo(dir));
        assert_eq!(code, 71, "{dir}: {r:#?}");
        assert_eq!(r.status, Status::Denied, "{dir}");
        // One finding per git directory, naming it and what changed in it.
        let git = (format!("{dir}/.git"), Action::Deny);
        assert_eq!(planted(&r), vec![git], "{dir}");
        let detail = &r.evidence_findings[0].detail;
        assert!(
            detail.contains(&format!("new {dir}/.git/config")),
            "{detail}"
        );
        fs::remove_dir_all(root.join(dir)).unwrap();
    }
    // A hand-made layout under another name, and an edit to the repository that was there.
    let (code, r) = run_local(
        root,
        "mkdir -p build/b/refs build/b/objects && echo 'ref: refs/heads/x' > build/b/HEAD && \
         printf '[core]\\n\\tpager = evil\\n' > build/b/config",
    );
    assert_eq!(code, 71, "{r:#?}");
    assert_eq!(planted(&r), vec![("build/b".to_owned(), Action::Deny)]);
    let (code, r) = run_local(root, "git -C node_modules/dep config core.pager evil");
    assert_eq!(code, 71, "{r:#?}");
    assert_eq!(
        planted(&r),
        vec![("node_modules/dep/.git".to_owned(), Action::Deny)]
    );
    assert!(r.evidence_findings[0]
        .detail
        .contains("changed node_modules/dep/.git/config"));
}

/// A bare repository made under another name outside the excluded directories: every path of
/// it is denied as git metadata, not merely reviewed.
#[test]
fn a_bare_repository_made_under_another_name_is_denied() {
    let t = project();
    let root = t.path();
    fs::create_dir_all(root.join("docs")).unwrap();
    fs::write(root.join("docs/readme"), "r\n").unwrap();
    let (code, r) = run_local(
        root,
        "git init -q --bare docs/tools && git --git-dir=docs/tools config core.pager evil && \
         mkdir -p src/refs src/objects && echo x > src/HEAD && echo '[core]' > src/config",
    );
    assert_eq!(code, 71, "{r:#?}");
    for path in [
        "docs/tools",
        "docs/tools/config",
        "docs/tools/HEAD",
        "src/config",
    ] {
        let c = r.changes.iter().find(|c| c.path == path);
        let c = c.unwrap_or_else(|| panic!("no change at {path}: {:#?}", r.changes));
        assert_eq!(c.decision, Action::Deny, "{path}: {c:?}");
    }
}

/// A project without `.git` turned into a bare repository at its root (`git init --bare .`):
/// git would run its `core.pager` there, so git's names at the root are denied; the project's
/// own files stay reviewed.
#[test]
fn a_bare_repository_made_at_the_project_root_is_denied() {
    let t = project();
    let root = t.path();
    let (code, r) = run_local(
        root,
        "git init -q --bare . && git --git-dir=. config core.pager evil && echo x >> README.md",
    );
    assert_eq!(code, 71, "{r:#?}");
    let decision = |p: &str| r.changes.iter().find(|c| c.path == p).map(|c| c.decision);
    assert_eq!(decision("config"), Some(Action::Deny), "{r:#?}");
    assert_eq!(decision("HEAD"), Some(Action::Deny));
    assert_eq!(decision("README.md"), Some(Action::Review));
}
