//! `agentdiff runs` says a seal is verified only when it authenticates here.

use std::fs;

use super::{agentdiff, cmd, json_of, text};

#[test]
fn runs_says_verified_only_for_an_authenticated_seal() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("proj");
    fs::create_dir_all(root.join(".git")).unwrap();
    let out = agentdiff(&root, &["run", "--", "sh", "-c", "echo x > a.txt"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    // Under the key that sealed it: authenticated.
    let runs = json_of(&agentdiff(&root, &["runs", "--format", "json"]));
    assert_eq!(runs[0]["seal"], "verified", "{runs:#}");
    assert_eq!(runs[0]["verdict"], "authenticated", "{runs:#}");
    assert!(text(&agentdiff(&root, &["runs"]).stdout).contains("seal verified"));

    // Another user's state directory (no key for this seal): intact, but not authenticated, and
    // the summary must not call it verified.
    let other = dir.path().join("other-state");
    fs::create_dir_all(&other).unwrap();
    let other_state = |args: &[&str]| {
        cmd(&root, args)
            .env("AGENTDIFF_STATE_DIR", &other)
            .output()
            .unwrap()
    };
    let runs = json_of(&other_state(&["runs", "--format", "json"]));
    assert_eq!(runs[0]["seal"], "verified", "{runs:#}");
    assert_eq!(runs[0]["verdict"], "intact_not_authenticated", "{runs:#}");
    let summary = text(&other_state(&["runs"]).stdout);
    assert!(!summary.contains("seal verified"), "{summary}");
    assert!(summary.contains("NOT authenticated"), "{summary}");
}
