//! `agentdiff hook install` against settings files it must not damage: an agentdiff hook of the
//! user's own with arguments the install would drop, a file made read-only on purpose, a file
//! owned by the project's user when root installs, a number JSON cannot carry, a deadline below
//! one millisecond. Each refusal leaves the file as it was.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Output;

use super::{agentdiff, assert_exit, text};

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join(".claude")).unwrap();
    dir
}

fn install(root: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["hook", "install", "--root", root.to_str().unwrap()];
    args.extend_from_slice(extra);
    agentdiff(root, &args)
}

fn settings(root: &Path) -> String {
    fs::read_to_string(root.join(".claude/settings.json")).unwrap()
}

/// The user's own agentdiff hook, with a policy of theirs.
const OWN_HOOK: &str = r#"{"hooks": {"PreToolUse": [{"matcher": "*", "hooks": [
  {"type": "command", "command": "/usr/local/bin/agentdiff hook pre-tool-use --policy strict.yaml", "timeout": 60}
]}]}}
"#;

#[test]
fn an_own_agentdiff_hook_with_other_arguments_is_kept_unless_carried_or_forced() {
    let dir = project();
    let root = dir.path();
    fs::write(root.join(".claude/settings.json"), OWN_HOOK).unwrap();
    let out = install(root, &["--runtime", "local"]);
    assert_exit(&out, 68);
    let err = text(&out.stderr);
    assert!(
        err.contains("--policy strict.yaml") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(settings(root), OWN_HOOK);
    assert!(!root.join("agentdiff.yaml").exists());

    // Carried by `--policy`, the argument stays (as an absolute path).
    let policy = root.join("strict.yaml");
    fs::write(&policy, "schema_version: 2\n").unwrap();
    let p = policy.to_str().unwrap();
    let out = install(root, &["--runtime", "local", "--policy", p]);
    // The new entry names the policy by its absolute path: the old relative one is dropped.
    assert_exit(&out, 68);
    let out = install(root, &["--runtime", "local", "--policy", p, "--force"]);
    assert_exit(&out, 0);
    let now = settings(root);
    assert!(now.contains(&format!("--policy '{p}'")), "{now}");
    assert!(!now.contains("--policy strict.yaml"), "{now}");
    // Installed with it, installing again with it changes nothing.
    let out = install(root, &["--runtime", "local", "--policy", p]);
    assert_exit(&out, 0);
    assert!(
        text(&out.stdout).contains("nothing changed"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn a_read_only_settings_file_is_refused_untouched() {
    let dir = project();
    let root = dir.path();
    let file = root.join(".claude/settings.json");
    fs::write(&file, "{\"model\": \"x\"}\n").unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o444)).unwrap();
    let out = install(root, &["--runtime", "local"]);
    assert_exit(&out, 68);
    assert!(
        text(&out.stderr).contains("read-only"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(settings(root), "{\"model\": \"x\"}\n");
    assert_eq!(fs::read_dir(root.join(".claude")).unwrap().count(), 1);
}

#[test]
fn numbers_json_cannot_carry_and_deadlines_below_a_millisecond_are_refused() {
    let dir = project();
    let root = dir.path();
    let big = "{\"bigNumber\": 12345678901234567890123}\n";
    fs::write(root.join(".claude/settings.json"), big).unwrap();
    let out = install(root, &["--runtime", "local"]);
    assert_exit(&out, 65);
    assert!(
        text(&out.stderr).contains("12345678901234567890123"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(settings(root), big);

    fs::write(root.join(".claude/settings.json"), "{}\n").unwrap();
    let out = install(root, &["--runtime", "local", "--deadline", "500us"]);
    assert_exit(&out, 64);
    assert_eq!(settings(root), "{}\n");
    // A fraction of a millisecond above one is rounded up, never down.
    let out = install(root, &["--runtime", "local", "--deadline", "1500us"]);
    assert_exit(&out, 0);
    assert!(
        settings(root).contains("--deadline 2ms"),
        "{}",
        settings(root)
    );
}

/// Root installing into a user's project leaves the settings file (and its backup, and a
/// `.claude` it had to create) the user's, so the user's own Claude Code still reads it.
#[test]
fn root_keeps_the_owner_of_the_settings_file() {
    if !nix::unistd::geteuid().is_root() {
        agentdiff_test_support::skip("changing a file's owner needs root");
        return;
    }
    let (uid, gid) = (4242, 4343);
    let dir = project();
    let root = dir.path();
    let file = root.join(".claude/settings.json");
    fs::write(&file, "{\"model\": \"y\"}\n").unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&file, Some(uid), Some(gid)).unwrap();
    let out = install(root, &["--runtime", "local"]);
    assert_exit(&out, 0);
    for entry in fs::read_dir(root.join(".claude")).unwrap() {
        let meta = entry.unwrap().metadata().unwrap();
        assert_eq!((meta.uid(), meta.gid()), (uid, gid));
        assert_eq!(meta.mode() & 0o777, 0o600);
    }

    // No `.claude` yet: the one created is the project owner's.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::os::unix::fs::chown(root, Some(uid), Some(gid)).unwrap();
    let out = install(root, &["--runtime", "local"]);
    assert_exit(&out, 0);
    for p in [root.join(".claude"), root.join(".claude/settings.json")] {
        let meta = fs::metadata(&p).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (uid, gid), "{}", p.display());
    }
}
