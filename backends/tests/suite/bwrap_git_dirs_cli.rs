//! Git metadata wherever it lives, with the real bubblewrap: a separate git directory, a linked
//! worktree, a submodule-style `gitdir:` file pointing outside the root, and pointers the command
//! plants during a run (which agentdiff must not bind or trust as they say).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::bwrap_cli::{no_bwrap, Fixture};
use super::bwrap_controls_cli::{attempt, canonical, expect, mounts, var_tmp};

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The decision recorded for the change at `path`.
fn decision(result: &Value, path: &str) -> String {
    result["changes"]
        .as_array()
        .unwrap_or_else(|| panic!("no changes: {result:#}"))
        .iter()
        .find(|c| c["path"] == path)
        .unwrap_or_else(|| panic!("no change at {path}: {result:#}"))["decision"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The read-only re-binds of a run.
fn read_only(f: &Fixture, result: &Value) -> Vec<String> {
    mounts(&f.runtime_json(result))
        .into_iter()
        .filter(|(kind, _)| kind == "read_only")
        .map(|(_, p)| p)
        .collect()
}

/// A home for a fixture whose project is made elsewhere.
fn home() -> tempfile::TempDir {
    let home = var_tmp("agentdiff-bwrap-home-");
    fs::create_dir_all(home.path().join(".ssh")).unwrap();
    home
}

/// `git init --separate-git-dir=.repo`: the hook, `core.fsmonitor` and the `.git` pointer cannot
/// be written in the sandbox, and the same writes under the local backend are denied.
#[test]
fn a_separate_git_dir_is_read_only_and_its_changes_denied() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    fs::remove_dir_all(f.root().join(".git")).unwrap();
    let repo = f.root().join(".repo");
    git(
        f.root(),
        &["init", "-q", "--separate-git-dir", repo.to_str().unwrap()],
    );
    let tries = [
        ("hook", "echo x > .repo/hooks/pre-commit".to_string()),
        (
            "fsmonitor",
            "printf \"[core]\\n\\tfsmonitor = evil\\n\" >> .repo/config".into(),
        ),
        ("pointer", "echo gitdir: /var/tmp > .git".into()),
        ("inside", "echo x > inside.txt".into()),
    ];
    let tries: Vec<(&str, String)> = tries.iter().map(|(n, c)| (*n, c.clone())).collect();
    let (outcomes, result, _) = attempt(&f, &[], &[], &tries);
    expect(
        &outcomes,
        &[
            ("hook", false),
            ("fsmonitor", false),
            ("pointer", false),
            ("inside", true),
        ],
    );
    assert!(!repo.join("hooks/pre-commit").exists());
    assert!(!fs::read_to_string(repo.join("config"))
        .unwrap()
        .contains("evil"));
    assert!(
        read_only(&f, &result).contains(&canonical(&repo)),
        "{result:#}"
    );

    // Without a sandbox the writes happen; the policy denies them, whatever the directory's name.
    let out = super::cmd(
        f.root(),
        &[
            "run",
            "--runtime",
            "local",
            "--format",
            "json",
            "--fail-on",
            "never",
        ],
    )
    .args([
        "--",
        "sh",
        "-c",
        "echo x > .repo/hooks/pre-commit && echo y >> .repo/config",
    ])
    .env("HOME", f.home.path())
    .output()
    .unwrap();
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        decision(&result, ".repo/hooks/pre-commit"),
        "deny",
        "{result:#}"
    );
    assert_eq!(decision(&result, ".repo/config"), "deny", "{result:#}");
    assert_eq!(result["safety_outcome"], "deny", "{result:#}");
}

/// The project is a linked worktree (`git worktree add`) of a repository in a `writable` path:
/// the worktree's git directory and the shared one (its `commondir`) stay read-only.
#[test]
fn a_worktree_and_its_common_git_dir_are_read_only() {
    if no_bwrap() {
        return;
    }
    let base = var_tmp("agentdiff-bwrap-worktree-");
    let main = base.path().join("main");
    fs::create_dir_all(&main).unwrap();
    git(&main, &["init", "-q"]);
    git(&main, &["commit", "-q", "--allow-empty", "-m", "first"]);
    let project = tempfile::tempdir_in(base.path()).unwrap();
    git(
        &main,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "wt",
            project.path().to_str().unwrap(),
        ],
    );
    let f = Fixture {
        project,
        home: home(),
    };
    let common = main.join(".git");
    // git names the worktree's directory after the path (without a leading dot).
    let pointer = fs::read_to_string(f.root().join(".git")).unwrap();
    let own = std::path::PathBuf::from(pointer.trim().strip_prefix("gitdir: ").unwrap());
    assert!(own.starts_with(common.join("worktrees")), "{own:?}");
    let writable = format!("writable={}", main.display());
    let tries = [
        (
            "common_hook",
            format!("echo x > {}/hooks/pre-commit", common.display()),
        ),
        (
            "common_config",
            format!("echo x >> {}/config", common.display()),
        ),
        ("own_head", format!("echo x > {}/HEAD", own.display())),
        ("pointer", "echo gitdir: /var/tmp > .git".into()),
        ("main_file", format!("echo x > {}/free.txt", main.display())),
    ];
    let tries: Vec<(&str, String)> = tries.iter().map(|(n, c)| (*n, c.clone())).collect();
    let (outcomes, result, _) = attempt(&f, &["--backend-option", &writable], &[], &tries);
    expect(
        &outcomes,
        &[
            ("common_hook", false),
            ("common_config", false),
            ("own_head", false),
            ("pointer", false),
            ("main_file", true),
        ],
    );
    assert!(!common.join("hooks/pre-commit").exists());
    let ro = read_only(&f, &result);
    for p in [&common, &own] {
        assert!(ro.contains(&canonical(p)), "{p:?} not in {ro:?}");
    }
}

/// A submodule-style `sub/.git` file whose `gitdir:` lies outside the root, in a `writable` path.
#[test]
fn a_gitdir_file_pointing_outside_the_root_is_read_only() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let outside = var_tmp("agentdiff-bwrap-modules-");
    let module = outside.path().join("modules/sub");
    fs::create_dir_all(&module).unwrap();
    git(&module, &["init", "-q", "--bare"]);
    fs::create_dir_all(f.root().join("sub")).unwrap();
    fs::write(
        f.root().join("sub/.git"),
        format!("gitdir: {}\n", module.display()),
    )
    .unwrap();
    let writable = format!("writable={}", outside.path().display());
    let tries = [
        (
            "hook",
            format!("echo x > {}/hooks/post-checkout", module.display()),
        ),
        ("config", format!("echo x >> {}/config", module.display())),
        (
            "free",
            format!("echo x > {}/free.txt", outside.path().display()),
        ),
    ];
    let tries: Vec<(&str, String)> = tries.iter().map(|(n, c)| (*n, c.clone())).collect();
    let (outcomes, result, _) = attempt(&f, &["--backend-option", &writable], &[], &tries);
    expect(
        &outcomes,
        &[("hook", false), ("config", false), ("free", true)],
    );
    assert!(!module.join("hooks/post-checkout").exists());
    assert!(read_only(&f, &result).contains(&canonical(&module)));
}

/// Pointers the command plants are not followed during its run, are denied changes, and in the
/// next run protect only what is a git directory: a pointer to the root, to its parent or to a
/// plain directory binds nothing.
#[test]
fn gitdir_files_planted_by_the_command_bind_and_trust_nothing_arbitrary() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let w = var_tmp("agentdiff-bwrap-planted-");
    let wd = w.path().display();
    let writable = format!("writable={wd}");
    let plant = [
        (
            "to_root",
            "mkdir -p a && echo gitdir: .. > a/.git".to_string(),
        ),
        (
            "to_parent",
            "mkdir -p b && echo gitdir: ../.. > b/.git".into(),
        ),
        (
            "to_plain",
            format!("mkdir -p c && echo gitdir: {wd} > c/.git"),
        ),
        (
            "to_layout",
            format!(
                "mkdir -p d {wd}/g/refs {wd}/g/objects && echo ref > {wd}/g/HEAD && \
                 echo gitdir: {wd}/g > d/.git"
            ),
        ),
    ];
    let plant: Vec<(&str, String)> = plant.iter().map(|(n, c)| (*n, c.clone())).collect();
    let (outcomes, result, _) = attempt(&f, &["--backend-option", &writable], &[], &plant);
    expect(
        &outcomes,
        &[
            ("to_root", true),
            ("to_parent", true),
            ("to_plain", true),
            ("to_layout", true),
        ],
    );
    for p in ["a/.git", "b/.git", "c/.git", "d/.git"] {
        assert_eq!(decision(&result, p), "deny", "{p}: {result:#}");
    }
    let second = [
        ("inside", "echo x > inside.txt".to_string()),
        ("plain", format!("echo x > {wd}/free.txt")),
        (
            "layout_hook",
            format!("mkdir -p {wd}/g/hooks && echo x > {wd}/g/hooks/x"),
        ),
    ];
    let second: Vec<(&str, String)> = second.iter().map(|(n, c)| (*n, c.clone())).collect();
    let (outcomes, result, _) = attempt(&f, &["--backend-option", &writable], &[], &second);
    expect(
        &outcomes,
        &[("inside", true), ("plain", true), ("layout_hook", false)],
    );
    let ro = read_only(&f, &result);
    for p in [f.root(), f.root().parent().unwrap(), w.path()] {
        assert!(!ro.contains(&canonical(p)), "{p:?} in {ro:?}");
    }
    assert!(ro.contains(&canonical(&w.path().join("g"))), "{ro:?}");
}

/// Git metadata the command makes during a bwrap run, where no walk before the launch saw it:
/// a repository with a `core.fsmonitor` in an excluded directory (`build/`, `node_modules/`),
/// and a bare repository under another name. Both are denied as git metadata, naming the path.
#[test]
fn a_repository_made_in_the_run_is_denied_wherever_and_whatever_its_name() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    fs::remove_dir_all(f.root().join(".git")).unwrap();
    git(f.root(), &["init", "-q"]);
    let script = "git init -q build/x && chmod -x build/x/.git/hooks/* && \
                  git -C build/x config core.fsmonitor 'touch /tmp/pwned; false' && \
                  mkdir -p node_modules/e/.git/refs node_modules/e/.git/objects && \
                  echo 'ref: refs/heads/main' > node_modules/e/.git/HEAD && \
                  printf '[core]\\n\\tfsmonitor = evil\\n' > node_modules/e/.git/config && \
                  git init -q --bare docs/tools && git --git-dir=docs/tools config core.pager evil";
    let (code, result, out) = f.run(&["--fail-on", "never"], &["sh", "-c", script], &[]);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(result["status"], "denied", "{result:#}");
    assert_eq!(decision(&result, "docs/tools/config"), "deny", "{result:#}");
    let findings: Vec<(String, String)> = result["evidence_findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["kind"] == "excluded_program")
        .map(|x| {
            let path = x["detail"].as_str().unwrap().split(':').next().unwrap();
            (path.to_owned(), x["action"].as_str().unwrap().to_owned())
        })
        .collect();
    for path in ["build/x/.git", "node_modules/e/.git"] {
        assert!(
            findings.contains(&(path.to_owned(), "deny".to_owned())),
            "{path}: {findings:?}"
        );
    }
}

/// `ROOT/.git` as a symlink: the link itself is writable (only its target is re-bound), so the
/// command can repoint it; that change is denied and `rollback` puts the link back.
#[test]
fn a_repointed_git_symlink_is_denied_and_put_back_by_rollback() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    fs::remove_dir_all(f.root().join(".git")).unwrap();
    git(f.root(), &["init", "-q"]);
    fs::rename(f.root().join(".git"), f.root().join("gitstore")).unwrap();
    std::os::unix::fs::symlink("gitstore", f.root().join(".git")).unwrap();
    let script = "cp -r gitstore evil && git --git-dir=evil config core.fsmonitor evil && \
                  ln -sfn evil .git";
    let (_, result, out) = f.run(&["--fail-on", "never"], &["sh", "-c", script], &[]);
    assert_eq!(
        result["status"],
        "denied",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(decision(&result, ".git"), "deny", "{result:#}");
    let id = result["run_id"].as_str().unwrap();
    let back = super::agentdiff(f.root(), &["rollback", id, "--safe-only"]);
    super::assert_exit(&back, 0);
    assert_eq!(
        fs::read_link(f.root().join(".git")).unwrap(),
        Path::new("gitstore")
    );
    assert!(!f.root().join("evil/config").exists());
}
